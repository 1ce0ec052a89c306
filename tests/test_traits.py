"""Engine traits: one typed record, read through one module, checked at load."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from plugin_support import with_fakes

import pytest_prefixcache
from pytest_prefixcache import EngineError, EngineTraits
from pytest_prefixcache.traits import TRAIT_NAMES, check_traits, traits_of

PACKAGE = Path(pytest_prefixcache.__file__).parent
pytest_plugins = ["pytester"]
OPTIONAL_METHODS = {"cache_usage", "close", "fresh_instance", "restart"}


class Bare:
    def run(self, request: object, *, use_cache: bool) -> object: ...

    def reset(self) -> None: ...


def test_an_undeclared_trait_takes_its_default() -> None:
    assert traits_of(Bare()) == EngineTraits()
    assert check_traits(Bare()) == EngineTraits()


def test_a_traits_record_and_an_attribute_on_top_of_it() -> None:
    engine = Bare()
    engine.traits = EngineTraits(supports_images=False, max_concurrency=4)  # type: ignore[attr-defined]
    engine.max_concurrency = 2  # type: ignore[attr-defined]  # a preset adjusting one trait
    traits = check_traits(engine)
    assert traits.supports_images is False and traits.max_concurrency == 2


@pytest.mark.parametrize(
    ("name", "meant"),
    [("supports_image", "supports_images"), ("cache_capacity", "cache_capacity_tokens"),
     ("batch_invarient", "batch_invariant"), ("last_tokens_kv", "last_token_kv")],
)  # fmt: skip
def test_a_misspelled_trait_is_an_error_naming_the_nearest(name: str, meant: str) -> None:
    engine = Bare()
    setattr(engine, name, False)
    with pytest.raises(
        EngineError, match=f"attribute '{name}' is not a trait; did you mean '{meant}'"
    ):
        check_traits(engine, "mine:build")
    assert traits_of(engine) == EngineTraits()  # which is what a misspelling silently did


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [("max_concurrency", "4", "trait max_concurrency is '4'; expected int"),
     ("supports_images", 1, "trait supports_images is 1; expected bool"),
     ("reuse_reference", "blocks", "expected 'token', 'snapshot' or 'block'"),
     ("max_concurrency", 0, "at least 1")],
)  # fmt: skip
def test_a_trait_of_the_wrong_kind_is_an_error(name: str, value: object, needle: str) -> None:
    engine = Bare()
    setattr(engine, name, value)
    with pytest.raises(EngineError, match=needle):
        check_traits(engine)


def test_other_attributes_are_left_alone() -> None:
    engine = Bare()
    engine.model = "tiny"  # type: ignore[attr-defined]
    engine.rtol = 0.0  # type: ignore[attr-defined]
    engine.supports_adapters = True  # type: ignore[attr-defined]  # not near any trait
    engine.persist = object()  # type: ignore[attr-defined]  # near one, but no trait's value
    assert check_traits(engine) == EngineTraits()


def trait_reads(source: str) -> list[str]:
    """``getattr(x, "<trait or optional method>"...)`` calls in ``source``."""
    reads = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in {*TRAIT_NAMES, *OPTIONAL_METHODS}
        ):
            reads.append(f"line {node.lineno}: {ast.unparse(node)}")
    return reads


def test_traits_are_read_only_through_the_traits_module() -> None:
    found = {
        str(p.relative_to(PACKAGE)): reads
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "traits.py" and (reads := trait_reads(p.read_text(encoding="utf-8")))
    }
    assert found == {}, "read traits with pytest_prefixcache.traits.traits_of/optional_method"
    # negative control: the scan sees a read
    assert trait_reads('n = getattr(engine, "max_concurrency", 1)') == [
        "line 1: getattr(engine, 'max_concurrency', 1)"
    ]


def test_the_plugin_refuses_a_misspelled_trait_at_load(pytester: pytest.Pytester) -> None:
    """One error, exit 2, before any stream runs: the misspelling would have run the suite
    as if the engine served images."""
    with_fakes(pytester)
    pytester.makepyfile(
        typo="""
from fakeengines import good

def build():
    engine = good()
    engine.supports_image = False
    return engine
"""
    )
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--prefixcache-verify", "--prefixcache-engine=typo:build",
        "--prefixcache-database=none",
    )  # fmt: skip
    assert result.ret == 2
    result.stdout.fnmatch_lines(
        ["*attribute 'supports_image' is not a trait; did you mean 'supports_images'*"]
    )
