"""Blocks announced by requests in flight: who is writing what, and waiting for a writer.

A cached request announces, at admission, the first block it will compute and store (the one
after the chain it reused). A later request whose next block is announced by a request still
in flight waits for that writer to finish (``IN_FLIGHT_WAIT`` at most), then looks up again
and reuses what it stored; it never reads a block before its writer stored it, since the
pool only holds blocks whose rows are written. After a wait that timed out it computes its
own rows. Only requests admitted earlier are waited for (a request announces after its own
wait), so two requests never wait for each other.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

__all__ = ["IN_FLIGHT_WAIT", "InFlight"]

#: Seconds a request waits for an earlier request in flight to store the block it needs.
IN_FLIGHT_WAIT = 30.0


class InFlight:
    """Digests announced by requests in flight, each with the event its writer sets when done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writers: dict[bytes, threading.Event] = {}
        self.waits = 0
        """Times a request waited for a writer (counted by the engine)."""

    def writer(self, digest: bytes) -> threading.Event | None:
        """The event of the request in flight that announced ``digest``, or None."""
        with self._lock:
            return self._writers.get(digest)

    def announce(self, digests: Sequence[bytes]) -> list[bytes]:
        """Announce the blocks a request will write (those nobody announced yet); returns
        the digests it announced, for :meth:`done`."""
        event = threading.Event()
        mine = []
        with self._lock:
            for d in digests:
                if d not in self._writers:
                    self._writers[d] = event
                    mine.append(d)
        return mine

    def done(self, digests: Sequence[bytes]) -> None:
        """The writer of ``digests`` is done (stored, or failed): wake whoever waits."""
        with self._lock:
            events = {id(e): e for e in (self._writers.pop(d, None) for d in digests) if e}
        for event in events.values():
            event.set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._writers)
