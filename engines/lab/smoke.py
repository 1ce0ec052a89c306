"""One chat request through an opt-in test module's preset: cached, cached again, cold; a line
each with the prompt tokens, the cached tokens and the generated tokens (``run.sh smoke`` of
engines/llama and engines/vllm).

    python engines/lab/smoke.py MODULE MODE_VARIABLE

MODULE (e.g. ``test_llama_server``) must be importable and have ``IMAGES`` and ``preset()``;
the environment variable MODE_VARIABLE (e.g. ``LLAMA_MODE``) names its mode. An image request
when the mode has images, else a text one.
"""

from __future__ import annotations

import importlib
import os
import sys

from adapter_support import SYSTEM, img, req, user


def main(module_name: str, mode_variable: str) -> None:
    module = importlib.import_module(module_name)
    parts = (
        (img(1), "What is in this image?")
        if module.IMAGES
        else ("Tell me a long story about cats.",)
    )
    request = req(SYSTEM, user(*parts))
    with module.preset() as engine:
        for use_cache in (True, True, False):
            o = engine.run(request, use_cache=use_cache)
            print(
                f"{os.environ[mode_variable]}: use_cache={use_cache} "
                f"prompt_tokens={o.prompt_tokens} cached_tokens={o.cached_tokens} tokens={o.tokens}"
            )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
