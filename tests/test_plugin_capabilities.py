"""Engines that say ``supports_images = False`` or ``supports_namespaces = False`` get only
requests they can serve; corpus scenarios they cannot serve are skipped with the reason."""

from __future__ import annotations

import pytest
from plugin_support import run_suite, with_fakes

pytest_plugins = ["pytester"]

TEXT_ONLY = """
from fakeengines import FakeEngine


class TextOnly(FakeEngine):
    supports_images = False
    supports_namespaces = False

    def run(self, request, *, use_cache):
        if request.images:
            raise RuntimeError("sent an image to a text-only engine")
        if request.namespace:
            raise RuntimeError("sent a namespace to an engine without namespaces")
        return super().run(request, use_cache=use_cache)


def text_only():
    return TextOnly()


def text_only_broken():
    return TextOnly(ignore_namespace=True, never_store=True)
"""


def test_text_only_engine_gets_text_only_streams(pytester: pytest.Pytester) -> None:
    with_fakes(pytester)
    pytester.makepyfile(textonly=TEXT_ONLY)
    result = run_suite(pytester, "x", "--prefixcache-engine=textonly:text_only", "-rs")
    result.stdout.fnmatch_lines(
        [
            "*scenario three_images_red_blue_green.json has images and the engine says "
            "supports_images = False*"
        ]
    )
    result.stdout.no_fnmatch_line("*sent an image*")
    result.stdout.no_fnmatch_line("*sent a namespace*")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 2


def test_text_only_engine_is_still_checked(pytester: pytest.Pytester) -> None:
    """Negative control: restricting the streams must not switch the checks off."""
    with_fakes(pytester)
    pytester.makepyfile(textonly=TEXT_ONLY)
    result = run_suite(pytester, "x", "--prefixcache-engine=textonly:text_only_broken")
    result.stdout.fnmatch_lines(["*positive control*"])
    assert result.parseoutcomes().get("failed", 0) >= 1
