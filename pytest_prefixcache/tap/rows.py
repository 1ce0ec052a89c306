"""One request's rows in a tapped server's forward calls (:class:`Track`), and a reply's
answer read from them (:class:`Found`, :func:`answer`); :mod:`.tracks` builds the tracks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from . import TapRow

__all__ = ["Found", "Track", "answer", "in_order", "padding_only", "past_the_prompt", "shown"]


@dataclass(eq=False)
class Track:
    """One request's rows, in call order; ``index`` is its place among the server's prefills."""

    index: int
    pid: int
    key: str
    row: int
    last_order: int
    rows: list[tuple[int, TapRow]] = field(default_factory=list)
    """(input positions of the call, row) per call."""
    claimed: bool = False
    label: str | None = None
    """The server scheduler's id of the request (its rows' label), None for an inferred track."""
    doubt: str = ""
    """Why a labelled row contradicted this track's KV offsets ('' when none did)."""
    interleaved: bool = False
    """Another request's rows ran in the same call as this track's, or between two of its
    calls: an inferred attribution of it is a guess, not a sequence."""
    _greedy_of: TapRow | None = field(default=None, repr=False)
    _greedy_token: int | None = field(default=None, repr=False)
    """The greedy token after the row ``_greedy_of`` (the track's last): an argmax over the
    vocabulary, read once per row, not once per row of every call it might continue."""

    kinds: list[str] = field(default_factory=list)
    """Per row: ``prefill`` (the track's first row, a padded or several-position row, or a
    one-position prefill chunk that the next row showed to be one), ``prompt?`` (a
    one-position row after a prefill row, not fed its greedy token: a prompt token, the
    prompt's last one or a last chunk of one position) or ``step`` (fed its greedy token)."""

    @property
    def last(self) -> TapRow:
        return self.rows[-1][1]

    def follows(self, row: TapRow, n: int) -> bool:
        """Whether ``row`` (of a call with ``n`` input positions) continues this track: after
        a prefill row (``kinds``) or a prompt token, any row starting where its real positions
        end; after a decode step, a one-position row fed its greedy token."""
        last = self.last
        if row.before < 0 or row.real_before != last.real_after:
            return False
        if self.kinds[-1] != "step":
            return True
        if n != 1 or not row.ids:
            return n == 1 and row.ids is None
        return self._greedy(row)

    def add(self, row: TapRow, n: int) -> None:
        """Append ``row`` (that :meth:`follows`, or the first), classifying it (``kinds``);
        a one-position row not fed the greedy token of a prompt token confirms that one as a
        prefill chunk (vllm-mlx 0.6.0's chunked prefill ends 2 positions short with a chunk
        of one, then feeds the last prompt token to its first decode call)."""
        if not self.rows or n > 1 or row.padded:
            kind = "prefill"
        elif self.kinds[-1] == "step" or row.ids is None or self._greedy(row):
            kind = "step"
        else:
            kind = "prompt?"
            if self.kinds[-1] == "prompt?":
                self.kinds[-1] = "prefill"
        self.rows.append((n, row))
        self.kinds.append(kind)

    def _greedy(self, row: TapRow) -> bool:
        """Whether ``row`` is fed the greedy token of the track's last real position (a
        padded row's logits are padding's)."""
        last = self.rows[-1][1] if self.rows else None
        if last is None or self._greedy_of is not last:
            real = next((r for _, r in reversed(self.rows) if not r.padded), None)
            self._greedy_token = None if real is None else int(np.argmax(real.logprobs))
            self._greedy_of = last
        return (
            self._greedy_token is not None
            and row.ids is not None
            and int(row.ids[-1]) == self._greedy_token
        )


def in_order(
    tracks: Sequence[Track], rows: Sequence[TapRow], n: int, at: Sequence[int]
) -> dict[int, Track]:
    """The rows of a call (``n`` input positions) that the tracks last run on its batch take,
    as ``{at[k]: track}`` for ``rows[k]``: a batch keeps its rows' order when it filters
    finished ones out or extends with others, so the tracks (in their last row order) take
    rows in that order, as many as can continue a track (:meth:`Track.follows`); among
    assignments of that size, each track its earliest row. A first fit in order is not enough:
    a twin that finished (two requests with the same prompt, one filtered out after its last
    step) still follows its twin's row, and taking it leaves every track after it without its
    own (measured on mlx_lm.server 0.31.2, tiny-gemma3-text waves: 3 extra prefills counted
    for 140 requests)."""
    fits = [[t.follows(r, n) for r in rows] for t in tracks]
    # most[a][b]: the most pairs the tracks from a on can take among the rows from b on
    most = [[0] * (len(rows) + 1) for _ in range(len(tracks) + 1)]
    for a in range(len(tracks) - 1, -1, -1):
        for b in range(len(rows) - 1, -1, -1):
            take = most[a + 1][b + 1] + 1 if fits[a][b] else 0
            most[a][b] = max(take, most[a + 1][b], most[a][b + 1])
    out: dict[int, Track] = {}
    a = b = 0
    while a < len(tracks) and b < len(rows) and most[a][b]:
        if fits[a][b] and most[a + 1][b + 1] + 1 == most[a][b]:
            out[at[b]] = tracks[a]
            a, b = a + 1, b + 1
        elif most[a][b + 1] == most[a][b]:
            b += 1  # this track's row is a later one
        else:
            a += 1  # this track takes no row of the call
    return out


@dataclass(frozen=True)
class Found:
    """A reply's track: its first-token row and decode rows, the reuse it shows, its order."""

    track: Track
    steps: tuple[TapRow, ...]
    reused: int
    served: int
    ids_checked: bool | None
    """True: the track's input ids are the prompt's; None: not known; False: they differ."""
    settled: bool = True
    """False while another track the ids do not tell from this one still runs short of the
    steps asked for: what it generates may still fit the reply better."""
    attribution: str = "guessed"
    """How the track was given to the reply: ``id`` (the server's scheduler labelled its rows
    and admitted it under the reply's id), ``sequential`` (inferred, but it was the only track
    answering the prompt and no other request's rows ran while it did) or ``guessed``."""
    note: str = ""
    """Why an id did not settle it (a labelled row that contradicts the track), '' otherwise."""

    @property
    def greedy(self) -> tuple[int, ...]:
        """The greedy token of each step: what the model generated on this track."""
        return tuple(int(np.argmax(r.logprobs)) for r in self.steps)


def answer(t: Track, prompt_tokens: int, ids: Sequence[int] | None, steps: int) -> Found | None:
    """The track's answer to a ``prompt_tokens`` long prompt: its first unpadded row that ends
    there, right after the prefill (not a decode step); None when it has none."""
    first = next(
        (k for k, (_, r) in enumerate(t.rows) if r.after == prompt_tokens and not r.padded),
        None,
    )
    if first is None:
        return None
    # a decode step of a longer request, not a prompt's end (a labelled track is one request's
    # from its admission: what comes before its prompt's end is its prompt, whatever its
    # one-position chunks look like)
    if first and t.label is None and t.rows[first - 1][0] == 1 and t.kinds[first - 1] != "prefill":
        return None
    start = t.rows[0][1].real_before
    checked: bool | None = None
    if ids is not None and len(ids) == prompt_tokens:
        seen: list[int] = []
        for _, r in t.rows[: first + 1]:
            real = r.real_ids
            if real is None:
                seen = []
                break
            seen += real
        if seen or first == 0:
            checked = tuple(seen) == tuple(int(x) for x in ids[start:prompt_tokens])
    out = [t.rows[first][1]]
    for _, r in t.rows[first + 1 :]:
        if len(out) >= steps:
            break
        if r.padded and r.real_after == out[-1].real_after:
            continue  # the rest of a right-padded prefill, past the row's end: padding only
        if r.before == out[-1].real_after and r.after == r.before + 1 and not r.padded:
            out.append(r)
        else:
            break
    return Found(t, tuple(out), start, t.index, checked)


def padding_only(t: Track, prompt_tokens: int) -> str:
    """The server's own fault, read from ``t``'s rows (for :meth:`.TapLedger.explain`), when
    its prompt's tokens end at ``prompt_tokens`` inside a right-padded chunk and every call
    between that chunk and its first decode step feeds it only padding: those calls' logits
    are no position of the prompt's, yet the server sampled the first token after them (''
    when the rows show no such thing). Raw offsets and padding counts only (``held`` is left
    out: the tap reads it from the cache, which may already have dropped it)."""
    end = next(
        (k for k, (_, r) in enumerate(t.rows) if r.padded and r.after - r.pad == prompt_tokens),
        None,
    )
    step = next(  # its first decode step: the last prefill call may be one padded column
        (
            k
            for k, (n, r) in enumerate(t.rows)
            if n == 1 and r.before >= prompt_tokens and not r.padded
        ),
        None,
    )
    if end is None or step is None or step <= end + 1:
        return ""
    if not all(r.pad >= n for n, r in t.rows[end + 1 : step]):
        return ""
    chunk, last = t.rows[end][1], t.rows[step - 1][1]
    return (
        f"; the prompt ended at {prompt_tokens} inside the right-padded chunk "
        f"{chunk.before}->{chunk.after}+{chunk.pad}, and the call before its first decode step "
        f"({last.before}->{last.after}+{last.pad}) fed it only padding: the server sampled the "
        "request's first token after a call with no position of its prompt (an engine fault: "
        "its logits are padding's, or read out of the call's range)"
    )


def past_the_prompt(t: Track, prompt_tokens: int) -> str:
    """What ``t``'s rows say when its first row already starts at or past ``prompt_tokens``
    (for :meth:`.TapLedger.explain`; '' otherwise): no call of the request computed the
    prompt's last position, so the server either fed prompt tokens again on top of a cache that
    held the whole prompt (a duplicate position: the bug zoo's class 8, exact match with an
    empty suffix, e.g. rapid-mlx before 0.9.11) or answered the first token from logits it
    stored (which the tap cannot check). Either way the reply's first token is not evidence."""
    if not t.rows:
        return ""
    n, first = t.rows[0]
    if first.before < prompt_tokens or first.padded:
        return ""
    return (
        f"; its first row ({shown(n, first)}) starts at KV offset {first.before}, at or past "
        f"the prompt length {prompt_tokens}: the server resumed from a cache holding the whole "
        f"prompt and then fed {n} position(s) on top of it (a duplicate KV position: a reused "
        "prompt token computed again at the next position), or it answered the first token "
        "from stored logits, which no call shows"
    )


def shown(n: int, r: TapRow) -> str:
    """A row of a call of ``n`` input positions, for a message: ``n: before->after+pad``."""
    pad = f"+{r.pad}" if r.pad else ""
    return f"{n}: {r.before}->{r.after}{pad}"
