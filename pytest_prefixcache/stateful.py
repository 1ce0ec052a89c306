"""A RuleBasedStateMachine that drives the same checks one request at a time.

Each rule sends one request made from an earlier one (kept in the ``requests`` bundle, as
sent: closed-loop replies filled in) and checks it at once (``reply_and_next_turn`` sends
the engine's own reply to the earlier request back as the assistant turn); the model is the
verifier's reuse oracle. Use :func:`machine_for` to get a machine bound to a verifier (the
``prefixcache_verifier`` fixture gives one)::

    from hypothesis.stateful import run_state_machine_as_test
    run_state_machine_as_test(machine_for(prefixcache_verifier))

Given a :class:`~.verify.shrink_budget.ShrinkBudget`, a machine that starts once the budget is
spent never reaches the engine: it follows the failed runs step by step (their requests as they
were sent) and raises a failure again where it happened; one that leaves them is rejected at its
end.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from .strategies import image_pools
from .strategies._moves import StreamSpec, apply_move
from .types import Image, Request
from .verify.shrink_budget import FINISH, ShrinkBudget
from .verify.verifier import Verifier

__all__ = ["PrefixCacheMachine", "machine_for"]


class PrefixCacheMachine(RuleBasedStateMachine):
    """Sends generated requests to ``verifier.engine`` and checks each one.

    Subclasses set ``verifier`` (and may set ``spec``). The engine is reset when a machine
    starts, so runs are independent and shrink. Steps shrink toward fewer rules, exact
    repeats and short text turns.
    """

    verifier: ClassVar[Verifier | None] = None
    spec: ClassVar[StreamSpec] = StreamSpec()
    budget: ClassVar[ShrinkBudget | None] = None
    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        if self.verifier is None:
            raise TypeError(f"{type(self).__name__}.verifier is not set; use machine_for()")
        self.v: Verifier = self.verifier
        self.pool: tuple[Image, ...] = ()
        self.clean = True
        self.drawn: list[Request] = []
        """The requests the rules drew (before closed-loop replies are filled in)."""
        self.followed: list[Request] = []
        """Past the budget: the requests a failed run sent, step by step."""
        self.live = self.budget is None or self.budget.start()
        self.left = False
        """Past the budget: the drawn requests left every failed run (never sent)."""
        if self.live:
            self.v.reset()

    @property
    def stream(self) -> list[Request]:
        """The requests sent so far (past the budget: those the followed failed run sent)."""
        return self.v.stream if self.live else self.followed

    def _send(self, request: Request) -> Request:
        """Run ``request``; the request as sent (closed-loop replies filled in)."""
        self.drawn.append(request)
        if not self.live:  # past the budget: follow the failed runs, never send
            assert self.budget is not None
            sent = self.budget.follow(self.drawn) if not self.left else None
            self.left = sent is None
            self.followed.append(request if sent is None else sent)
            return self.followed[-1]
        self.clean = False
        try:
            sent = self.v.step(request).request
        except Exception as exc:
            if self.budget is not None:
                self.budget.failed(self.drawn, exc, self.v.stream[: len(self.drawn) - 1])
            raise
        self.clean = True
        return sent

    def _move(
        self, data: Any, move: str, base: Request | None = None, spec: StreamSpec | None = None
    ) -> Request:
        req = apply_move(data.draw, move, self.stream, self.pool, spec or self.spec, base)
        return self._send(req)

    @initialize(target=requests, pool=image_pools(min_size=2, max_size=4), data=st.data())
    def first_conversation(self, pool: tuple[Image, ...], data: Any) -> Request:
        self.pool = pool
        return self._move(data, "new")

    @rule(target=requests, data=st.data())
    def new_conversation(self, data: Any) -> Request:
        return self._move(data, "new")

    @rule(base=requests)
    def repeat(self, base: Request) -> None:
        self._send(base)

    @rule(target=requests, base=requests, data=st.data())
    def next_turn(self, base: Request, data: Any) -> Request:
        return self._move(data, "append", base)

    @rule(target=requests, base=requests, data=st.data())
    def reply_and_next_turn(self, base: Request, data: Any) -> Request:
        """The engine's own reply to ``base`` as the assistant turn (closed loop)."""
        return self._move(data, "append", base, dataclasses.replace(self.spec, closed_loop=True))

    @rule(target=requests, base=requests, data=st.data())
    def edit_turn(self, base: Request, data: Any) -> Request:
        return self._move(data, "edit", base)

    @precondition(lambda self: any(r.images for r in self.stream))
    @rule(target=requests, base=requests, data=st.data())
    def swap_or_reencode(self, base: Request, data: Any) -> Request:
        return self._move(data, data.draw(st.sampled_from(("swap", "reencode"))), base)

    @precondition(lambda self: len(self.spec.namespaces) > 1)
    @rule(target=requests, base=requests, data=st.data())
    def other_namespace(self, base: Request, data: Any) -> Request:
        return self._move(data, "namespace", base)

    @invariant()
    def engine_alive(self) -> None:
        assert self.v.dead is None, "the engine timed out"

    def teardown(self) -> None:
        if not self.clean:
            return
        if not self.live:  # a followed run's stream-level failure raised again, else rejected
            assert self.budget is not None
            self.budget.finish(self.drawn)
        elif self.v.dead is None and self.v.stream:
            try:
                self.v.finish()
            except Exception as exc:
                if self.budget is not None:
                    self.budget.failed([*self.drawn, FINISH], exc, self.v.stream)
                raise


def machine_for(
    verifier: Verifier, spec: StreamSpec | None = None, budget: ShrinkBudget | None = None
) -> type[PrefixCacheMachine]:
    """A :class:`PrefixCacheMachine` subclass bound to ``verifier`` (and to one run's shrink
    ``budget``: one :func:`~hypothesis.stateful.run_state_machine_as_test` call)."""
    attrs: dict[str, Any] = {"verifier": verifier, "budget": budget}
    if spec is not None:
        attrs["spec"] = spec
    return type("PrefixCacheMachineFor", (PrefixCacheMachine,), attrs)
