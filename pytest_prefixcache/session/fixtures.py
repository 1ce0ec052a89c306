"""Fixtures for engine authors and the built-in suite, and loading the engine.

``prefixcache_engine`` (session) builds the engine named by ``--prefixcache-engine``, the
``prefixcache_engine`` ini key, or the default reference engine; override it in conftest.py
to build yours. ``prefixcache_verify`` (session) runs a stream, or one request after a history,
through every check. ``prefixcache_images`` (session) is a deterministic image factory.
``prefixcache_config`` (session) is the engine configuration under test (its
:class:`~.slots.Slot`): in a matrix run the tests that use the engine are parametrized by it,
and its engine is closed before the next configuration's is built; ``prefixcache_settings`` is
that configuration's options.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..checks.equivalence import Tolerance
from ..checks.references import CacheDesign
from ..errors import EngineError
from ..images import ImageFactory
from ..traits import check_traits, optional_method, traits_of
from ..types import Engine, Request, ShortRepr
from ..verify.audit import Audit, fresh_share
from ..verify.decode_kv import last_kv_of
from ..verify.verifier import Step, Verifier, VerifyOptions
from ..verify.worker import CallTimedOut
from .run_record import RunRecord
from .settings import DEFAULT_ENGINE, Settings
from .slots import Slot, slots_of
from .stash import PROGRESS_KEY, START_KEY

__all__ = [
    "VerifyFunction",
    "load_engine",
    "load_engine_with_audit",
    "prefixcache_config",
    "prefixcache_engine",
    "prefixcache_images",
    "prefixcache_settings",
    "prefixcache_verifier",
    "prefixcache_verify",
    "with_model",
]

#: How long building the engine may take (loading weights is slower than one request).
BUILD_TIMEOUT_MIN = 600.0


def _is_engine(obj: object) -> bool:
    return (
        not isinstance(obj, type)
        and callable(getattr(obj, "run", None))
        and callable(getattr(obj, "reset", None))
    )


def _resolve(spec: str, search_dirs: Sequence[Path]) -> Any:
    """The object ``MODULE:ATTR`` names (``search_dirs`` go on ``sys.path`` first)."""
    module_name, _, attr = spec.partition(":")
    for d in reversed(search_dirs):
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        hint = ""
        if spec == DEFAULT_ENGINE:
            hint = (
                "; the default reference engine needs the mlx extra "
                "(pip install 'pytest-prefixcache[mlx]'), or name yours with "
                "--prefixcache-engine=MODULE:ATTR"
            )
        raise EngineError(
            f"cannot import {module_name!r} for engine {spec!r}: {exc}{hint}"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise EngineError(f"engine {spec!r}: {obj!r} has no attribute {part!r}") from None
    if not _is_engine(obj) and not callable(obj):
        raise EngineError(
            f"engine {spec!r} is a {type(obj).__name__}: expected an object with run() and "
            "reset(), or a zero-argument callable returning one"
        )
    return obj


#: The parameter through which an engine factory is given ``--prefixcache-model``'s directory.
MODEL_PARAMETER = "model_dir"


def _build(spec: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> Engine:
    made = factory(**kwargs)
    if not _is_engine(made):
        raise EngineError(
            f"engine {spec!r}() returned a {type(made).__name__}, which has no run() and "
            "reset() methods"
        )
    return made  # type: ignore[no-any-return]


def _check_kwargs(spec: str, obj: Any, kwargs: dict[str, Any]) -> None:
    """A matrix configuration's args and flags need a factory that takes them."""
    if not kwargs:
        return
    if _is_engine(obj):
        raise EngineError(
            f"engine {spec!r} is an instance: the configuration's args/flags "
            f"({', '.join(kwargs)}) need a factory that takes them"
        )
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [k for k in kwargs if k not in params]
    if missing:
        raise EngineError(
            f"engine {spec!r} takes no keyword argument {', '.join(map(repr, missing))} "
            "(the configuration gives it; flags need a 'flags' parameter)"
        )


def load_engine(spec: str, *search_dirs: Path) -> Engine:
    """Import ``MODULE:ATTR`` and return the engine (ATTR is one, or builds one when called).

    ``search_dirs`` (the invocation directory and the rootdir) are put on ``sys.path`` first.
    """
    return load_engine_with_audit(spec, *search_dirs)[0]


def with_model(factory: Any, kwargs: dict[str, Any], model: str | None) -> dict[str, Any]:
    """``kwargs`` with ``model_dir=model`` when ``factory`` declares a ``model_dir`` parameter
    and ``kwargs`` (a matrix configuration's) does not set it already: the way
    ``--prefixcache-model`` reaches an in-process factory. A factory without the parameter
    still finds the model in ``PREFIXCACHE_MODEL`` (set for the session, and the only way
    it reaches a server subprocess)."""
    if model is None or MODEL_PARAMETER in kwargs or _is_engine(factory):
        return kwargs
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return kwargs
    if MODEL_PARAMETER not in params:
        return kwargs
    return {**kwargs, MODEL_PARAMETER: model}


def load_engine_with_audit(
    spec: str,
    *search_dirs: Path,
    kwargs: dict[str, Any] | None = None,
    model: str | None = None,
) -> tuple[Engine, Audit]:
    """The engine ``MODULE:ATTR`` names, and its baseline audit: when ATTR builds the engine,
    it builds a fresh instance for every audited request. ``kwargs`` (a matrix
    configuration's args and flags) go to the factory, and ``model`` (the session's model
    directory) as its ``model_dir`` when it takes one (:func:`with_model`)."""
    obj = _resolve(spec, search_dirs)
    kwargs = kwargs or {}
    _check_kwargs(spec, obj, kwargs)
    kwargs = with_model(obj, kwargs, model)
    if _is_engine(obj):
        check_traits(obj, spec)
        return obj, Audit(None, "engine given as an instance")  # type: ignore[return-value]
    engine = _build(spec, obj, kwargs)
    traits = check_traits(engine, spec)  # a misspelled trait is an error here, at load
    if traits.supports_fresh_instances is False:
        why = traits.fresh_instances_missing
        return engine, Audit(None, why or "the engine opts out (supports_fresh_instances = False)")
    share = fresh_share(engine)
    fresh = optional_method(engine, "fresh_instance")  # cheaper than the factory (one server)
    if fresh is not None:
        return engine, Audit(fresh, share=share)
    return engine, Audit(functools.partial(_build, spec, obj, kwargs), share=share)


@pytest.fixture(scope="session")
def prefixcache_config(request: pytest.FixtureRequest) -> Iterator[Slot]:
    """The engine configuration under test: in a matrix run, the suite's tests are
    parametrized by it (one configuration at a time, its environment set)."""
    slot = slots_of(request.config)[getattr(request, "param", "")]
    slot.used = True
    with slot.environment():
        yield slot


@pytest.fixture(scope="session")
def prefixcache_settings(prefixcache_config: Slot) -> Settings:
    """The options of the configuration under test."""
    return prefixcache_config.settings


@pytest.fixture(scope="session")
def prefixcache_engine(pytestconfig: pytest.Config, prefixcache_config: Slot) -> Iterator[Engine]:
    """The engine under test (override this fixture in conftest.py to build your own)."""
    __tracebackhide__ = True  # an engine that cannot be built shows its error, not this code
    slot = prefixcache_config
    s = slot.settings
    kwargs = {} if slot.target is None else slot.target.factory_kwargs()
    try:
        res = slot.worker.call(
            lambda: load_engine_with_audit(
                s.engine, s.invocation_dir, pytestconfig.rootpath, kwargs=kwargs, model=s.model
            ),
            timeout=max(s.timeout, BUILD_TIMEOUT_MIN),
            what=f"building the engine {s.engine}",
        )
    except CallTimedOut as exc:
        slot.report.engine_error = str(exc)
        raise
    if res.error is not None:
        # one error for the session: the first test that needs the engine shows it, the
        # others are skipped (plugin.pytest_runtest_setup), and the run exits 2
        if isinstance(res.error, EngineError):  # our own words (a server's log included)
            slot.report.engine_error = str(res.error)
            raise EngineError(str(res.error)) from None
        kind = type(res.error).__name__
        slot.report.engine_error = f"building the engine {s.engine!r} raised {kind}: {res.error}"
        # its message is printed once, by its own traceback just above this line
        raise EngineError(
            f"building the engine {s.engine!r} raised {kind} (the error above)"
        ) from _without_our_frames(res.error)
    engine, audit = res.value
    slot.built = (engine, audit)
    slot.report.server = traits_of(engine).coverage_hints == "server"
    yield engine
    if slot.worker.dead is None:  # the audit's held fresh instance (fresh_instance_share)
        slot.worker.call(audit.close, timeout=s.timeout, what="closing the audit's instance")
    close = optional_method(engine, "close")
    if slot.target is not None and callable(close) and slot.worker.dead is None:
        # a matrix configuration's engine (its servers) goes before the next one starts
        slot.worker.call(close, timeout=s.timeout, what="engine.close()")


def _without_our_frames(exc: BaseException) -> BaseException:
    """``exc`` with the plugin's own leading frames (the worker thread, the loader) dropped
    from its traceback, so that it starts in the user's factory; unchanged when every frame
    is the plugin's."""
    package = str(Path(__file__).resolve().parent.parent)
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(package):
        tb = tb.tb_next
    return exc if tb is None else exc.with_traceback(tb)


def make_verifier(config: pytest.Config, engine: Engine, slot: Slot | None = None) -> Verifier:
    slot = slot or slots_of(config)[""]
    s = slot.settings
    tolerance = engine_tolerance(Tolerance(s.atol, s.rtol, s.kl), engine)
    if tolerance.atol != s.atol:
        rule = traits_of(engine).tolerance_rule or ENGINE_RULE
        slot.report.tolerance = f"{tolerance.describe()} ({rule})"
    try:
        design = CacheDesign.of(engine)
    except EngineError as exc:
        slot.report.engine_error = str(exc)
        raise
    last_kv = last_kv_of(engine, functools.partial(_probe_call, slot, s.timeout))
    design = dataclasses.replace(design, last_kv=last_kv.computed)
    slot.report.last_kv = last_kv.line()
    built, audit = slot.built or (None, None)
    conftest = built is not engine or audit is None  # a conftest.py override
    slot.run = RunRecord(s, slot.report, conftest=conftest)
    options = VerifyOptions(
        design=design,
        tolerance=tolerance,
        timeout=s.timeout,
        min_efficiency=s.min_efficiency,
        min_speedup=s.min_speedup,
        strict_render=s.strict_render,
        failures_dir=s.failures_dir,
        replay_command=slot.run.replay_command,
        started=config.stash.get(START_KEY, time.monotonic()),  # a first failure's clock
    )
    if audit is None or conftest:  # a conftest.py override of prefixcache_engine
        audit = Audit(None, "engine from a conftest.py fixture")
        _overridden(config, engine, slot)
    verifier = Verifier(engine, slot.worker, options, slot.report, audit=audit)
    slot.report.run = slot.run.to_json()  # the engine's rules known (tolerance, decode)
    progress = config.stash.get(PROGRESS_KEY, None)
    if progress is not None and progress.every > 0:
        verifier.on_step = progress.on_step
    return verifier


def _probe_call(slot: Slot, timeout: float, what: str, fn: Callable[[], object]) -> object:
    """One engine call of the decode-KV probe on the configuration's worker: its value, or
    the exception it raised (a timeout leaves the worker dead, as in any verification)."""
    res = slot.worker.call(fn, timeout=timeout, what=what)
    if res.error is not None:
        raise res.error
    return res.value


#: How the report names a tolerance that came from the engine rather than the options.
ENGINE_RULE = "the engine's own rule: its atol; --prefixcache-atol/--rtol/--kl override it"


def engine_tolerance(options: Tolerance, engine: object) -> Tolerance:
    """The tolerance to judge ``engine`` by: the options' when any was given, else the
    engine's own ``atol`` when it declares one above 0 (a preset's measured rule, e.g.
    ``presets.llama_server``), else exact."""
    atol = traits_of(engine).atol
    if not options.exact or isinstance(atol, bool) or not isinstance(atol, (int, float)):
        return options
    return Tolerance(float(atol), 0.0, None) if atol > 0 else options


def _overridden(config: pytest.Config, engine: Engine, slot: Slot) -> None:
    """A conftest.py fixture built the engine: name it in the report, and refuse an explicit
    engine option it would silently beat."""
    s = slot.settings
    kind = f"{type(engine).__module__}.{type(engine).__qualname__}"
    if s.engine_source in ("option", "--prefixcache-server-cmd", "matrix"):
        flag = {"option": "--prefixcache-engine", "matrix": "--prefixcache-matrix"}.get(
            s.engine_source, s.engine_source
        )
        pytest.exit(
            f"{flag} names the engine ({s.engine}), but a prefixcache_engine fixture (in "
            f"conftest.py) builds another ({kind}), and the fixture would win: remove the "
            "option, or the fixture",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )
    slot.report.engine = f"{kind} (the prefixcache_engine fixture of conftest.py)"


@pytest.fixture(scope="session")
def prefixcache_verifier(
    pytestconfig: pytest.Config, prefixcache_engine: Engine, prefixcache_config: Slot
) -> Verifier:
    """The session's :class:`~pytest_prefixcache.verify.Verifier` for ``prefixcache_engine``."""
    return make_verifier(pytestconfig, prefixcache_engine, prefixcache_config)


@dataclass
class VerifyFunction(ShortRepr):
    """``verify(stream)`` or ``verify(request, history=[...])``: reset the engine, run every
    request cached and uncached in order, and raise a readable failure if a check breaks.
    Returns the :class:`~pytest_prefixcache.verify.Step` of each request."""

    verifier: Verifier

    def __call__(
        self,
        requests: Request | Sequence[Request],
        *,
        history: Sequence[Request] = (),
        reset: bool = True,
    ) -> list[Step]:
        stream = [requests] if isinstance(requests, Request) else list(requests)
        steps = self.verifier.run([*history, *stream], reset=reset)
        return steps[len(history) :]


@pytest.fixture(scope="session")
def prefixcache_verify(prefixcache_verifier: Verifier) -> VerifyFunction:
    """Run a request stream (or one request after a history) through all the checks."""
    return VerifyFunction(prefixcache_verifier)


@pytest.fixture(scope="session")
def prefixcache_images() -> ImageFactory:
    """A deterministic image factory: solid, gradient, noise and text-like patterns."""
    return ImageFactory()
