"""pytest-prefixcache: fuzz an inference engine's KV prefix cache against cold runs.

Importing this package is cheap: it never imports MLX, Hypothesis or the reference engine.
Strategies live in :mod:`pytest_prefixcache.strategies`, the state machine in
:mod:`pytest_prefixcache.stateful`.
"""

from __future__ import annotations

from .checks.equivalence import Tolerance
from .checks.oracle import ReuseOracle
from .checks.references import CacheDesign
from .errors import (
    EfficiencyFailure,
    EngineError,
    EngineFault,
    EngineTimeout,
    EquivalenceFailure,
    ImageError,
    MemoryBudgetFailure,
    PositiveControlFailure,
    PrefixCacheError,
    RenderStabilityFailure,
    RequestError,
    ReuseBoundFailure,
    ShapeFailure,
    SpeedupFailure,
    VerificationFailure,
)
from .images import ImageFactory, make_image, reencode
from .output.streams import load_stream, save_stream
from .traits import EngineTraits
from .types import Engine, Image, Message, Outcome, Request
from .verify.verifier import Step, Verifier, VerifyOptions

__version__ = "0.1.0"

__all__ = [
    "CacheDesign",
    "EfficiencyFailure",
    "Engine",
    "EngineError",
    "EngineFault",
    "EngineTimeout",
    "EngineTraits",
    "EquivalenceFailure",
    "Image",
    "ImageError",
    "ImageFactory",
    "MemoryBudgetFailure",
    "Message",
    "Outcome",
    "PositiveControlFailure",
    "PrefixCacheError",
    "RenderStabilityFailure",
    "Request",
    "RequestError",
    "ReuseBoundFailure",
    "ReuseOracle",
    "ShapeFailure",
    "SpeedupFailure",
    "Step",
    "Tolerance",
    "VerificationFailure",
    "Verifier",
    "VerifyOptions",
    "__version__",
    "load_stream",
    "make_image",
    "reencode",
    "save_stream",
]
