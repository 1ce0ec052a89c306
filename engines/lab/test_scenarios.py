"""The lab's scenario files hold the requests the opt-in tests were written with: the same
images (by digest), texts and turns, and each image stream ends with the request it judges."""

from __future__ import annotations

from adapter_support import SYSTEM, assistant, img, req, user

from lab.scenarios import IMAGE, IMAGE_STREAMS, TEXT, TEXT_NEXT, image_streams, stream


def test_the_files_hold_the_requests_of_the_opt_in_tests() -> None:
    a, b = img(1), img(2)
    text = req(SYSTEM, user("Hello there, how are you today? Tell me a long story about cats."))
    image = req(SYSTEM, user(a, "What is in this image?"))
    assert (TEXT, TEXT_NEXT) == (text, req(*text.messages, assistant("fine"), user("and now?")))
    assert IMAGE == image
    assert stream("other-image-same-size") == (
        image,
        req(SYSTEM, user(b, "What is in this image?")),
    )
    swapped = stream("swapped-order")
    assert swapped == (
        req(SYSTEM, user(a, "and", b, "compare")),
        req(SYSTEM, user(b, "and", a, "compare")),
    )
    assert stream("next-turn")[-1] == req(
        *image.messages, assistant("a cat"), user("and the colour?")
    )
    assert stream("repeat") == (image, image)


def test_each_image_stream_is_one_parameter_named_after_its_file() -> None:
    params = image_streams()
    assert [p.id for p in params] == list(IMAGE_STREAMS)  # type: ignore[attr-defined]
    for p in params:
        history, final = p.values  # type: ignore[attr-defined]
        assert len(history) == 1 and final.images
