"""The reference engine serves waves: requests in flight interleave, share in-flight prefix
blocks (a request waits for the writer of its next block) and stay bit-exact."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_prefixcache import Message, Request, Verifier
from pytest_prefixcache.images import make_image
from pytest_prefixcache.types import Wave
from pytest_prefixcache.verify.concurrent import CONCURRENT
from reference_engine.engine import Engine
from reference_engine.inflight import InFlight

SYSTEM = "You are a careful visual assistant. Describe every image precisely. " * 3


def _req(text: str, *images: Any, ns: str = "", new: int = 2) -> Request:
    return Request((Message("system", (SYSTEM,)), Message("user", (*images, text))), ns, new)


@pytest.mark.slow
def test_waves_of_shared_prefixes_are_bit_exact_and_served_in_order(model: Any) -> None:
    engine = Engine(model)
    assert engine.max_concurrency > 1
    red, blue = make_image("solid", 64, 64, seed=1), make_image("noise", 64, 64, seed=2)
    waves = (
        Wave((_req("describe it", red), _req("describe it", red), _req("and this", blue))),
        Wave(
            (_req("describe it", red), _req("compare", red, blue), _req("x", ns="b")),
            (0.0, 0.002, 0.004),
        ),
    )
    verifier = Verifier(engine)
    steps = verifier.run_waves(waves)
    assert verifier.report.worst_diff == 0.0
    assert verifier.report.coverage[CONCURRENT] == {"applied": 6}
    served = [s.cached.served for s in steps]
    assert len(set(served)) == 6 and None not in served
    # the duplicate in flight reused the prefix its twin wrote (waiting for it, or after it)
    assert max(s.cached.cached_tokens or 0 for s in steps[:2]) > 0


def test_in_flight_writers_are_waited_for_once_and_never_by_each_other() -> None:
    flight = InFlight()
    mine = flight.announce([b"a", b"b"])
    assert mine == [b"a", b"b"] and flight.announce([b"b", b"c"]) == [b"c"]
    event = flight.writer(b"a")
    assert event is not None and not event.is_set()
    flight.done(mine)
    assert event.is_set() and flight.writer(b"a") is None and len(flight) == 1
