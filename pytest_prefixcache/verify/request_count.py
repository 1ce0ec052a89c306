"""The request count: an engine that counts the prefills its model ran (the HTTP adapter under
the logit tap, ``request_count_problems()``) is asked, with no request in flight, whether they
fit the requests it answered: one prefill per request answered.

Fewer prefills than replies means a reply served without the model (a stored answer, one
computation answering two requests); more than the replies and the unanswered requests
together means the model ran twice for one request (a prompt prefilled again to store its cache
entry, a retry) or another client used the server. The sequential path asks after every
request, the waves after every wave, the parallel streams after every group (their lanes have
requests in flight until then)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..checks import Problem
from .view import VerifierView

if TYPE_CHECKING:
    from .messages import Context

__all__ = ["REQUEST_COUNT", "request_count_problems"]

#: How a fault names a server that received more or fewer requests than sent (the tap's count).
REQUEST_COUNT = "request count"


def request_count_problems(verifier: VerifierView, ctx: Context) -> list[Problem]:
    """The fault of an engine whose prefills do not fit its replies ([] when they do, or when the
    engine counts nothing); call it with no request in flight."""
    __tracebackhide__ = True
    counted = getattr(verifier.engine, "request_count_problems", None)
    if not callable(counted):
        return []
    found = verifier._call("request_count_problems()", counted, ctx)
    if not isinstance(found, list) or not found:
        return []
    head = f"{REQUEST_COUNT}: {found[0]}; each request must run the model once"
    return [Problem("fault", head, tuple(map(str, found[1:])))]
