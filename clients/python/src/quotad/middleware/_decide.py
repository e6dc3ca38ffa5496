"""What the middleware answers for a decision or an error: the Rust layer's statuses,
bodies and headers."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from .._types import Decision, Reason
from ..errors import QuotadError, RejectedError


def retry_after_secs(retry_after_ms: int) -> int:
    """``Retry-After`` in whole seconds: rounded up, at least 1."""
    return max(-(-retry_after_ms // 1000), 1)


@dataclass(frozen=True)
class Outcome:
    """Either pass the request on (adding ``headers`` to the app's response), or
    answer ``status`` with ``body`` and ``headers`` without calling the app."""

    passes: bool
    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


PLAIN = ("content-type", "text/plain; charset=utf-8")


def plain(status: int, body: str, headers: tuple[tuple[str, str], ...] = ()) -> Outcome:
    return Outcome(False, status, body.encode(), (PLAIN, *headers))


NO_KEY = plain(400, "no rate-limit key in the request\n")
MISCONFIGURED = plain(500, "rate limiter misconfigured\n")
UNAVAILABLE = plain(503, "rate limiter unavailable\n")


def missing_key(needs_peer: bool) -> Outcome:
    """No key: the server gave no peer address (a setup error), or the request has none."""
    return MISCONFIGURED if needs_peer else NO_KEY


def rate_limit_headers(
    policy: str, decision: Decision, window_secs: int | None
) -> tuple[tuple[str, str], ...]:
    """The IETF ``RateLimit-Policy`` / ``RateLimit`` fields and the legacy ``X-RateLimit-*``."""
    reset = -(-decision.reset_after_ms // 1000)
    quota = f'"{policy}";q={decision.limit}'
    if window_secs is not None:
        quota += f";w={window_secs}"
    return (
        ("ratelimit-policy", quota),
        ("ratelimit", f'"{policy}";r={decision.remaining};t={reset}'),
        ("x-ratelimit-limit", str(decision.limit)),
        ("x-ratelimit-remaining", str(decision.remaining)),
        ("x-ratelimit-reset", str(reset)),
    )


def outcome(
    policy: str, decision: Decision, window_secs: int | None, headers: bool = True
) -> Outcome:
    """A decision: allowed passes (with headers), fail-open passes bare, fail-closed
    is 503, any other denial 429 (``Retry-After`` when waiting makes room)."""
    if decision.reason is Reason.FAIL_OPEN:
        return Outcome(True)
    if decision.reason is Reason.FAIL_CLOSED:
        return UNAVAILABLE
    fields = rate_limit_headers(policy, decision, window_secs) if headers else ()
    if decision.allowed:
        return Outcome(True, headers=fields)
    if decision.reason is Reason.LIMIT_EXCEEDED:
        fields = (*fields, ("retry-after", str(retry_after_secs(decision.retry_after_ms))))
    return plain(429, "too many requests\n", fields)


def failure(error: QuotadError) -> Outcome:
    """An error: a key quotad refused is the request's fault (400); any other refusal
    is the app's setup (500); an unreachable quotad 503."""
    if isinstance(error, RejectedError):
        if error.code is grpc.StatusCode.INVALID_ARGUMENT and error.message.startswith("key:"):
            return plain(400, "invalid rate-limit key\n")
        return MISCONFIGURED
    return UNAVAILABLE
