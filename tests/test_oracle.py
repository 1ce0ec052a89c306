"""The reuse oracle: placeholders match only the same image at the same offset."""

from __future__ import annotations

from pytest_prefixcache.checks.oracle import ReuseOracle, position_keys, shared_prefix

PAD = 9
A, B = "a" * 64, "b" * 64


def test_text_prefix_is_shared_up_to_the_first_difference() -> None:
    o = ReuseOracle()
    o.add(0, "", [1, 2, 3, 4, 5], [])
    m = o.match("", [1, 2, 3, 7, 8, 9], [])
    assert (m.max_reuse, m.shared, m.source) == (3, 3, 0)


def test_identical_prompt_is_capped_at_length_minus_one() -> None:
    o = ReuseOracle()
    o.add(0, "", [1, 2, 3, 4], [])
    m = o.match("", [1, 2, 3, 4], [])
    assert (m.max_reuse, m.shared) == (3, 4)


def test_same_size_images_with_identical_placeholders_do_not_match() -> None:
    o = ReuseOracle()
    o.add(0, "", [1, PAD, PAD, PAD, 2], [(1, 4, A)])
    assert o.match("", [1, PAD, PAD, PAD, 2], [(1, 4, B)]).max_reuse == 1
    assert o.match("", [1, PAD, PAD, PAD, 2, 3], [(1, 4, A)]).max_reuse == 5


def test_same_image_at_another_offset_does_not_match() -> None:
    o = ReuseOracle()
    o.add(0, "", [PAD, PAD, PAD, PAD], [(0, 2, A), (2, 4, A)])
    # one image of 4 placeholders vs two images of 2: offsets differ from position 2
    assert o.match("", [PAD, PAD, PAD, PAD, 1], [(0, 4, A)]).max_reuse == 2


def test_swapped_images_match_only_up_to_the_first_image() -> None:
    o = ReuseOracle()
    o.add(0, "", [1, PAD, PAD, PAD, PAD, 2], [(1, 3, A), (3, 5, B)])
    assert o.match("", [1, PAD, PAD, PAD, PAD, 2], [(1, 3, B), (3, 5, A)]).max_reuse == 1


def test_namespaces_never_share() -> None:
    o = ReuseOracle()
    o.add(0, "t1", [1, 2, 3, 4], [])
    m = o.match("t2", [1, 2, 3, 4, 5], [])
    assert (m.max_reuse, m.source) == (0, None)


def test_best_of_all_earlier_requests_and_reset() -> None:
    o = ReuseOracle()
    o.add(0, "", [1, 2, 9], [])
    o.add(1, "", [1, 2, 3, 4, 9], [])
    o.add(2, "", [5], [])
    m = o.match("", [1, 2, 3, 4, 5, 6], [])
    assert (m.max_reuse, m.source) == (4, 1)
    o.reset()
    assert o.match("", [1, 2, 3, 4, 5, 6], []).max_reuse == 0


def test_empty_and_single_token_prompts() -> None:
    o = ReuseOracle()
    o.add(0, "", [1], [])
    assert o.match("", [1], []).max_reuse == 0
    assert o.match("", [], []).max_reuse == 0


def test_position_keys_and_shared_prefix() -> None:
    keys = position_keys([1, PAD, PAD, 2], [(1, 3, A)])
    assert keys == [(1, "", -1), (PAD, A, 0), (PAD, A, 1), (2, "", -1)]
    assert shared_prefix(keys, keys[:2]) == 2
    assert shared_prefix([], keys) == 0
