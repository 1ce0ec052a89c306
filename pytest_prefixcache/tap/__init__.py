"""The logit tap: what an MLX server really computed, whatever its API says.

``python -m pytest_prefixcache.tap MODULE:FUNC ARGS...`` wraps ``__call__`` of the language
model classes of mlx-lm and mlx-vlm, then runs ``FUNC`` with ``sys.argv = [MODULE, *ARGS]``
in the same process. Every forward call appends one :class:`TapRecord` to the JSON-lines file
named by ``$PREFIXCACHE_TAP``: the number of input positions and, for every batch row
(:class:`TapRow`), its KV offsets before and after the call, its right padding, its input token
ids and the full-vocabulary log-softmax of its last position. The wrapper never raises into the
server. Where the server's scheduler is one :mod:`.identity` knows (mlx-lm's BatchGenerator),
each row also carries its request's scheduler id, and one admission line per request ties that
id to the reply's ``id``. :mod:`.tracks` follows each request's rows from call to call (several
in flight): by those ids, else by inference.
``$PREFIXCACHE_TAP_TARGETS`` (comma-separated ``module:Class``) replaces the default list of
wrapped classes (:data:`.wrap.DEFAULT_TARGETS`); each process's first line names the classes it
wrapped, so that a request with no matching record can say why (:func:`missing_reason`).

This module (the reader) needs numpy only; :mod:`.wrap` imports MLX when it installs.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ENV",
    "IDENTITY_ENV",
    "TARGETS_ENV",
    "TapReader",
    "TapRecord",
    "TapRow",
    "find_prompt_call",
    "missing_reason",
    "parse_record",
]

#: Environment variable naming the records file.
ENV = "PREFIXCACHE_TAP"
#: Environment variable replacing the wrapped classes (comma-separated ``module:Class``).
TARGETS_ENV = "PREFIXCACHE_TAP_TARGETS"
#: Environment variable: ``0`` leaves the batch rows unlabelled (no scheduler hooks).
IDENTITY_ENV = "PREFIXCACHE_TAP_IDENTITY"


@dataclass(frozen=True, eq=False)
class TapRow:
    """One batch row of a forward call.

    Attributes:
        before / after: the row's KV offset before and after the call (a left-padded row
            starts below 0; a right-padded one counts its padding until the batch is finalized).
        pad: positions of right padding in the row: its last positions are padding, so its
            logits are not a real position's (a padded prefill row, comparable with nothing).
        ids: the row's input token ids (padding included), or None when the call got embeddings.
        logprobs: the log-softmax of the row's last position, float32, full vocabulary.
        label: the server scheduler's id of the row's request (:mod:`.identity`), or None
            when the tap could not read it (an unknown server).
        held: padding already counted in the row's KV offset before the call (a right-padded
            row whose real tokens ended in an earlier chunk of its prefill): not real
            positions. 0 where the tapped layer rolls that padding out of its offset before
            each chunk (a ``BatchRotatingKVCache``: ``wrap._rolls_padding``).
    """

    before: int
    after: int
    pad: int
    ids: tuple[int, ...] | None
    logprobs: np.ndarray
    label: str | None = None
    held: int = 0

    @property
    def padded(self) -> bool:
        return self.pad > 0

    @property
    def real_ids(self) -> tuple[int, ...] | None:
        """The input ids of real positions (the padding cut off), None when unknown."""
        if self.ids is None:
            return None
        lead = min(len(self.ids), max(0, -self.before))  # left padding of a fresh batch
        tail = min(self.pad, len(self.ids) - lead)
        return self.ids[lead : len(self.ids) - tail]

    @property
    def real_before(self) -> int:
        """Real positions in the row's KV before the call."""
        return max(0, self.before - self.held)

    @property
    def real_after(self) -> int:
        """Real positions in the row's KV after the call (its padding left out)."""
        return self.after - self.held - self.pad


@dataclass(frozen=True, eq=False)
class TapRecord:
    """One forward call: which class, input positions, KV offset after it (the largest of its
    rows'), row 0's log-softmax, every row (:class:`TapRow`) and the batch's cache (``cache``:
    the process id and the tap's number of the cache object the call ran on)."""

    seq: int
    cls: str
    n_inputs: int
    batch: int
    offset: int
    logprobs: np.ndarray
    rows: tuple[TapRow, ...] = ()
    cache: str = ""
    pid: int = 0

    @property
    def start(self) -> int:
        """The KV offset before the call."""
        return self.offset - self.n_inputs

    def row_list(self) -> tuple[TapRow, ...]:
        """Its rows; a record written without them (one row) as its single row."""
        if self.rows:
            return self.rows
        return (TapRow(self.start, self.offset, 0, None, self.logprobs),)


def _lp(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.float32).copy()


def parse_record(line: str) -> TapRecord:
    d = json.loads(line)
    rows = tuple(
        TapRow(
            int(r["b"]),
            int(r["a"]),
            int(r.get("pad", 0)),
            None if r.get("ids") is None else tuple(int(t) for t in r["ids"]),
            _lp(r["lp"]),
            None if r.get("id") is None else str(r["id"]),
            int(r.get("pb", 0)),
        )
        for r in d.get("rows") or ()
    )
    lp = rows[0].logprobs if rows else _lp(d["lp"])
    pid = int(d.get("pid", 0))
    return TapRecord(
        d["seq"], d["cls"], d["n"], d["batch"], d["offset"], lp, rows, d.get("cache", ""), pid
    )


class TapReader:
    """Reads the records a tapped server appends, from where the last read stopped."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._pos = 0
        #: The classes the tapped process wrapped (its header line), None before it is read.
        self.installed: list[str] | None = None
        #: The scheduler methods that label batch rows with their request (:mod:`.identity`),
        #: None before that line is read ([]: the server's scheduler is not one it knows).
        self.identity: list[str] | None = None
        #: Reply id -> the scheduler's id of the request that answered it (admission lines).
        self.admitted: dict[str, str] = {}

    def read_new(self) -> list[TapRecord]:
        """Every complete record written since the last call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a partly written last line waits for the next read
        self._pos += end
        records = []
        for line in data[:end].decode().splitlines():
            if line.startswith('{"installed"'):
                self.installed = list(json.loads(line)["installed"])
            elif line.startswith('{"identity"'):  # one line per set of hooks installed
                self.identity = [*(self.identity or ()), *json.loads(line)["identity"]]
            elif line.startswith('{"admit"'):
                d = json.loads(line)
                self.admitted[str(d["reply"])] = str(d["admit"])
            elif line:
                records.append(parse_record(line))
        return records


def find_prompt_call(records: Sequence[TapRecord], prompt_tokens: int) -> int | None:
    """Index of the call that produced the first generated token of a ``prompt_tokens`` long
    prompt: the last call whose KV offset after it equals the prompt length."""
    for i in range(len(records) - 1, -1, -1):
        if records[i].offset == prompt_tokens:
            return i
    return None


def prefill_start(records: Sequence[TapRecord], index: int) -> int:
    """The KV offset before the prefill that ends at ``records[index]``: its chunks are the
    consecutive calls each starting where the previous one ended."""
    i = index
    while i > 0 and records[i - 1].offset == records[i].start and records[i - 1].n_inputs > 0:
        i -= 1
    return records[i].start


def decode_steps(records: Sequence[TapRecord], index: int, count: int) -> list[TapRecord]:
    """Up to ``count`` one-position calls continuing the prompt call at ``index``."""
    out = [records[index]]
    for r in records[index + 1 :]:
        if len(out) >= count:
            break
        if r.n_inputs == 1 and r.offset == out[-1].offset + 1:
            out.append(r)
    return out


def missing_reason(
    records: Sequence[TapRecord],
    prompt_tokens: int,
    installed: Sequence[str] | None,
    calls: int | None = None,
) -> str:
    """Why no record ends at ``prompt_tokens``: no call recorded (and which classes were
    wrapped), no KV offset readable, or the offsets that were seen instead. ``records`` may be
    the latest of ``calls`` records (a window kept for this message): the count says so."""
    hint = f"set ${TARGETS_ENV}=module:Class to the server's language-model class"
    if not records:
        if installed is None:
            return (
                f"the tap recorded nothing, not even the list of wrapped classes: is the server "
                f"started under 'python -m pytest_prefixcache.tap' with ${ENV} set?"
            )
        wrapped = ", ".join(installed) or "nothing"
        return (
            f"the tap recorded no forward call: none of the wrapped classes ran (wrapped: "
            f"{wrapped}); {hint}"
        )
    classes = sorted({r.cls for r in records})
    total = len(records) if calls is None else max(calls, len(records))
    count = f"{total} call(s)" + (
        f" (the latest {len(records)} shown)" if total > len(records) else ""
    )
    if all(r.offset < 0 for r in records):
        return (
            f"the tap recorded {count} of {', '.join(classes)} but could read no "
            "KV offset: none of the model's layer caches has an 'offset' attribute"
        )
    seen = sorted({r.offset for r in records if r.offset >= 0})
    shown = ("... " if len(seen) > 8 else "") + ", ".join(map(str, seen[-8:]))
    if prompt_tokens in seen:  # a call's largest row ends there, no row the reply can have
        return (
            f"the tap recorded {count} of {', '.join(classes)}, some ending at the prompt "
            f"length {prompt_tokens}, but no track of the ledger answers the reply there"
        )
    return (
        f"the tap recorded {count} of {', '.join(classes)} with KV offsets "
        f"{shown}, none equal to the prompt length {prompt_tokens} the server reported "
        "(a second model in the process, or a server that counts prompt tokens differently "
        f"from its cache); {hint} if the wrong class is tapped"
    )
