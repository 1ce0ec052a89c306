"""Following each request through a batching server's forward calls (several in flight).

Where the server's scheduler is one the tap knows (:mod:`.identity`: mlx_lm.server's
BatchGenerator), every row carries its request's id and one admission line ties that id to
the reply's ``id``: a labelled row belongs to the track of its label, a reply to the track
admitted under its id (``Found.attribution == "id"``), and nothing below is used for them (a
labelled row that starts elsewhere than its track ended puts the track in doubt:
``guessed``, with the reason). The rest of this docstring is the fallback for rows without a
label (an unknown server): ``sequential`` when one track alone answered the prompt and no
other request's rows ran in its calls or between them, else ``guessed``.

A server that batches concurrent requests runs one forward call for many rows, moves rows
between batches (a prompt batch split off to decode, a decode batch extended with newcomers,
finished rows filtered out) and pads short prompts. :class:`TapLedger` reads the records of
one server (:class:`.TapReader`) and builds one :class:`Track` per request the server
computed: the rows of its prefill chunks, the row that produced its first generated token and
one row per decode step. A row continues a track when its KV offset before the call equals
the real positions the track holds, and (for a one-position call after a decode step) its
input token is the track's greedy next token; rows of a batch keep their order when the batch
is filtered or split, so the tracks live on a batch take its rows in order; rows joining a
batch from others are taken by those tracks in the order they were last run (vllm-mlx 0.6.0's
MLLM batch joins its prompts, each prefilled alone, in order: two with the same length and the
same first token could otherwise cross). Any other row starts a track: a prefill the server
received.

:meth:`TapLedger.find` attributes a reply to a track: the first unpadded row whose KV offset
after the call is the prompt length, on a track whose real input ids are the prompt's (when
the client knows the prompt's ids), the earliest such track first (among tracks the ids do
not tell apart, the one whose greedy tokens agree furthest with the reply's, then the one
whose reuse is closest to the reply's own figure); a track is claimed by one reply only. The
track's number is the order the server took the requests in (``Outcome.served``);
:attr:`TapLedger.received` counts the prefills it received.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

from . import TapReader, TapRecord
from .rows import Found, Track, answer, in_order, padding_only, past_the_prompt, shown

__all__ = ["INFERRED_COUNT", "Found", "TapLedger", "Track"]  # Found and Track live in .rows

#: What a count mismatch says when some of the prefills it counted are inferred tracks of
#: requests that ran interleaved with others (no scheduler label): the count is a guess then,
#: to be confirmed one request at a time before it may fail (DESIGN.md, rule 5).
INFERRED_COUNT = "inferred among requests in flight"

#: Records kept for the message naming why no record matched.
_RECENT = 256


class TapLedger:
    """The tracks of one tapped server, built from its records; thread-safe.

    ``sent`` counts the requests the server answered (the adapter adds them), ``unanswered``
    those posted that got no reply (an error status, a timeout, a broken connection: the model
    may have run them or not), ``warmup`` the prefills it ran before the first request (a
    server that warms its cache at start)."""

    def __init__(self, reader: TapReader) -> None:
        self.reader = reader
        self.lock = threading.Lock()
        self.tracks: list[Track] = []
        self.recent: list[TapRecord] = []
        self.sent = 0
        self.unanswered = 0
        self.warmup = 0
        self.warm: list[Track] = []
        """The tracks of the warm-up of the latest start (emptied by a reset endpoint)."""
        self.excused = 0
        """Prefills a reported mismatch left over (negative: missing ones)."""
        self.reported = 0
        self._judged = 0  # the tracks the latest count_problem judged
        self._order = 0
        self._by_key: dict[str, list[Track]] = {}
        self._key_last: dict[str, int] = {}
        self._by_label: dict[str, Track] = {}
        self._prev: dict[int, Track] = {}  # the tracks of the latest call, by id

    @property
    def installed(self) -> list[str] | None:
        return self.reader.installed

    @property
    def received(self) -> int:
        """Prefills the server ran since it started, its warm-up left out."""
        return len(self.tracks) - self.warmup

    def started(self) -> None:
        """The server (re)started: what it computed beyond the requests sent is its warm-up."""
        with self.lock:
            self._ingest()
            old = self.warmup
            self.warmup = max(self.warmup, len(self.tracks) - self.sent)
            self.warm = self.tracks[len(self.tracks) - (self.warmup - old) :]

    def warmup_prompts(self) -> list[tuple[int, ...]]:
        """The prompt ids of the prefills the server ran on its own at its latest start (its
        warm-up, :meth:`started`), read from their rows; one whose ids the tap could not read
        (embeddings) is left out."""
        with self.lock:
            out = []
            for t in self.warm:
                prompt = [r for (_, r), kind in zip(t.rows, t.kinds) if kind != "step"]
                if prompt and all(r.real_ids is not None for r in prompt):
                    out.append(tuple(i for r in prompt for i in r.real_ids or ()))
            return out

    def refresh(self) -> None:
        """Read the records written since the last read."""
        with self.lock:
            self._ingest()

    def count_sent(self) -> None:
        """A request the server answered (it must have run one prefill)."""
        with self.lock:
            self.sent += 1

    def count_unanswered(self) -> None:
        """A request posted that got no reply: refused (e.g. oMLX's 503 when its memory gate
        closes: no prefill), failed after its prefill, or still running: 0 or 1 prefill."""
        with self.lock:
            self.unanswered += 1

    def count_problem(self) -> str:
        """Why the prefills counted do not fit the requests ('' when they do): fewer than
        the requests answered, or more than those and every unanswered one together. A
        mismatch is reported once: the next call judges only what came after it (a wave
        after a faulty one, e.g. Hypothesis shrinking on the same server, is judged alone).
        When some of the tracks counted since the last call were inferred among requests in
        flight, the message says so (:data:`INFERRED_COUNT`): a guess, not a count."""
        with self.lock:
            self._ingest()
            got = self.received - self.excused
            low, high = self.sent, self.sent + self.unanswered
            new, self._judged = self.tracks[self._judged :], len(self.tracks)
            if low <= got <= high:
                return ""
            self.excused += got - min(max(got, low), high)
        told = f"answered {low} request(s)"
        if high > low:
            told += f" (and left {high - low} unanswered, which may or may not have run)"
        since = " since the last mismatch reported" if self.reported else ""
        self.reported += 1
        guessed = sum(t.label is None and t.interleaved for t in new)
        how = f"; {guessed} of them {INFERRED_COUNT}, no scheduler label" if guessed else ""
        return f"{told} but its model ran {got} prefill(s){since} (the logit tap's count{how})"

    def _ingest(self) -> None:
        for rec in self.reader.read_new():
            self._order += 1
            self.recent.append(rec)
            self._add(rec, self._order)
        del self.recent[:-_RECENT]

    def _live(self, t: Track) -> bool:
        """Whether ``t`` ran in the latest call on its batch (a row filtered out did not)."""
        return self._key_last.get(t.key) == t.last_order

    def _add(self, rec: TapRecord, order: int) -> None:
        rows = rec.row_list()
        n = rec.n_inputs
        owner: dict[int, Track] = {}
        for i, row in enumerate(rows):  # a row the scheduler labelled is its request's
            t = self._by_label.get(row.label) if row.label is not None else None
            if t is None:
                continue
            if row.before >= 0 and row.real_before != t.last.real_after and not t.doubt:
                held = f" ({row.held} of them padding it held)" if row.held else ""
                t.doubt = (
                    f"a row labelled {row.label!r} starts at KV offset {row.before}{held} where "
                    f"that request's rows ended at {t.last.real_after} (call {rec.seq})"
                )
            owner[i] = t
        # the tracks live on this batch take its rows in order (filtering keeps the order)
        here = sorted(
            (t for t in self._by_key.get(rec.cache, ()) if self._live(t) and t.label is None),
            key=lambda t: t.row,
        )
        free = [i for i, row in enumerate(rows) if i not in owner and row.label is None]
        owner.update(in_order(here, [rows[i] for i in free], n, free))
        # rows moved from another batch (split off, or extended into this one), in order
        taken = {id(t) for t in owner.values()}
        for i, row in enumerate(rows):
            if i in owner or row.before < 0 or row.label is not None:
                continue
            moved = [
                t
                for key, ts in self._by_key.items()
                if key != rec.cache and key.split(":")[0] == rec.cache.split(":")[0]
                for t in ts
                if t.label is None and id(t) not in taken and self._live(t) and t.follows(row, n)
            ]
            if moved:  # a batch takes the prompts it was handed in the order they were run
                t = min(moved, key=lambda t: (t.claimed, t.last_order, t.row))
                owner[i] = t
                taken.add(id(t))
        ran_list: list[Track] = []
        for i, row in enumerate(rows):
            if i in owner:
                t = owner[i]
            else:  # a prefill the server received
                t = Track(len(self.tracks), rec.pid, rec.cache, i, order, label=row.label)
                self.tracks.append(t)
                self._by_key.setdefault(rec.cache, []).append(t)
                if row.label is not None:
                    self._by_label[row.label] = t
            if t.key != rec.cache:
                left = self._by_key.get(t.key, [])
                if t in left:  # (a labelled track may come back to a batch that went on)
                    left.remove(t)
                self._by_key.setdefault(rec.cache, []).append(t)
            t.key, t.row, t.last_order = rec.cache, i, order
            t.add(row, n)
            ran_list.append(t)
        self._key_last[rec.cache] = order
        ran = {id(t): t for t in ran_list}
        if len(ran) > 1:
            for t in ran.values():
                t.interleaved = True
        resumed = [t for t in ran.values() if id(t) not in self._prev and len(t.rows) > 1]
        if resumed and self._prev:  # a track continues after another request's call
            for t in (*ran.values(), *self._prev.values()):
                t.interleaved = True
        self._prev = ran
        # a row missing from its batch's latest call was filtered out: it never runs again
        self._by_key[rec.cache] = [t for t in self._by_key[rec.cache] if t.last_order == order]

    def find(
        self,
        prompt_tokens: int,
        ids: Sequence[int] | None,
        steps: int,
        said: int | None = None,
        fits: Callable[[Sequence[int]], int] | None = None,
        reply_id: str | Sequence[str] | None = None,
    ) -> Found | None:
        """The earliest unclaimed track that answers a ``prompt_tokens`` long prompt (with the
        prompt's ``ids``, when given): reads the new records first; None when none does yet.
        Among tracks the ids do not tell apart (two identical prompts in flight), the one whose
        reuse is closest to ``said`` (the reply's own figure) first: the model computed both,
        and which reply got which is not in the records, so the reply is read the way that
        contradicts it least. Closest, not equal: an engine that says one token more than it
        reused on every hit (rapid-mlx 0.16.10's exact repeat) agrees with no track, and the
        earliest one, the cold prefill a repeat waited for, would give its hit reply the cold
        track and the cold reply the hit's (an over-claim of the whole prompt and an
        under-claim of the same size, where the engine's error is one token). Before that,
        ``fits``: how far a track's greedy tokens agree with the reply's own (its generated
        text or tokens), the furthest first: two prompts with the same ids but other images
        (their image pads are the same tokens) are told apart by what the model answered each;
        the answer is not ``settled`` while such a track still runs short of ``steps``.

        All of that is the fallback: when the server's scheduler admitted a request under
        ``reply_id`` (the reply's ``id``, or the client's header: one id or several to try),
        the reply gets that request's labelled track and
        nothing is inferred (``Found.attribution``); tracks admitted under other ids are never
        guessed for it."""
        with self.lock:
            self._ingest()
            tried = (reply_id,) if isinstance(reply_id, str) else tuple(reply_id or ())
            admitted = self.reader.admitted
            label = next((admitted[i] for i in tried if i in admitted), None)
            if label is not None:
                return self._by_id(label, prompt_tokens, ids, steps)
            others = set(self.reader.admitted.values())
            answers = [
                (t, found)
                for t in self.tracks
                if not t.claimed
                and t.label not in others
                and (found := answer(t, prompt_tokens, ids, steps)) is not None
            ]
            # the reply's own tokens or text rank tracks only when there is more than one (a
            # decode per track and poll otherwise, for a choice already made)
            fitting = fits if len(answers) > 1 else None
            ranked: list[tuple[tuple[int, int, int, int], Found]] = []
            for t, found in answers:
                off = 0 if said is None else abs(found.reused - said)
                own = 0 if fitting is None else fitting(found.greedy)
                rank = ({True: 0, None: 1, False: 2}[found.ids_checked], -own, off, t.index)
                ranked.append((rank, found))
            if not ranked:
                return None
            rank, best = min(ranked, key=lambda r: r[0])
            running = any(
                r[0] == rank[0] and f is not best and len(f.steps) < steps and self._live(f.track)
                for r, f in ranked
            )
            alone = len(answers) == 1 and not best.track.interleaved
            how = "sequential" if alone else "guessed"
            return dataclasses.replace(best, settled=not (fits and running), attribution=how)

    def _by_id(
        self, label: str, prompt_tokens: int, ids: Sequence[int] | None, steps: int
    ) -> Found | None:
        """The labelled track ``label`` answering the prompt; None while its rows are not
        read yet (or were claimed). A track a labelled row contradicted (``Track.doubt``) is
        still this reply's by its id, but its rows are in doubt: attributed ``guessed``."""
        t = self._by_label.get(label)
        if t is None or t.claimed:
            return None
        found = answer(t, prompt_tokens, ids, steps)
        if found is None:
            return None
        how = "guessed" if t.doubt else "id"
        return dataclasses.replace(found, attribution=how, note=t.doubt)

    def claim(self, found: Found) -> bool:
        """Give ``found``'s track to one reply; False when another reply took it first."""
        with self.lock:
            if found.track.claimed:
                return False
            found.track.claimed = True
            return True

    def kv_end(self, served: int) -> int | None:
        """The KV offset after the latest row of the request the server took ``served``-th
        (its track, as a reply's ``Outcome.served`` names it), read now: how many positions
        its model computed for that request, the prompt and every generated token fed back
        (rows written after the reply count); None when there is no such track."""
        with self.lock:
            self._ingest()
            if not 0 <= served < len(self.tracks):
                return None
            return self.tracks[served].last.real_after

    def records(self) -> list[TapRecord]:
        """The latest records read (at most ``_RECENT``: for a message, not for attribution,
        which reads the tracks); :attr:`calls` counts them all."""
        with self.lock:
            return list(self.recent)

    @property
    def calls(self) -> int:
        """Forward calls read since the server started (all of them, not only the recent)."""
        return self._order

    def explain(self, prompt_tokens: int, reply_id: str | Sequence[str] | None = None) -> str:
        """Why :meth:`find` gives no track to a ``prompt_tokens`` long reply, from the tracks
        (every call read, not a window of records): the request the server admitted the reply
        under and its rows, or the tracks whose rows end at the prompt length and who holds
        them; '' when no track has a row ending there (:func:`.missing_reason` tells why)."""
        with self.lock:
            self._ingest()
            tried = (reply_id,) if isinstance(reply_id, str) else tuple(reply_id or ())
            label = next(
                (self.reader.admitted[i] for i in tried if i in self.reader.admitted), None
            )
            if label is not None:
                t = self._by_label.get(label)
                if t is None:
                    return (
                        f"the server admitted the reply as {label!r} but no row carried that label"
                    )
                if t.claimed:
                    return f"the track of {label!r} (the reply's admission) was claimed already"
                rows = ", ".join(shown(n, r) for n, r in t.rows[:12])
                more = f" ... ({len(t.rows)} rows)" if len(t.rows) > 12 else ""
                said = (
                    f"the reply was admitted as {label!r}, whose rows (input positions: KV "
                    f"offset before->after, +padding) are {rows}{more}: none unpadded ends at "
                    f"the prompt length {prompt_tokens}"
                )
                return said + (padding_only(t, prompt_tokens) or past_the_prompt(t, prompt_tokens))
            ending = [
                t
                for t in self.tracks
                if any(r.after == prompt_tokens and not r.padded for _, r in t.rows)
            ]
            if not ending:
                return ""
            claimed = sum(t.claimed for t in ending)
            return (
                f"{len(ending)} track(s) have an unpadded row ending at the prompt length "
                f"{prompt_tokens} ({claimed} claimed by other replies, the rest not this "
                f"prompt's: other ids, a decode step, or admitted under another reply's id)"
            )
