"""Domain values <-> the generated protobuf messages, and how a failed call is read."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from ._types import Algorithm, BatchMode, Check, Decision, Policy, PolicyLike, Reason
from .errors import BadResponseError, QuotadError, RejectedError, UnavailableError
from .v1 import quota_pb2 as pb

_REASONS = {
    pb.REASON_WITHIN_LIMIT: Reason.WITHIN_LIMIT,
    pb.REASON_LIMIT_EXCEEDED: Reason.LIMIT_EXCEEDED,
    pb.REASON_COST_EXCEEDS_CAPACITY: Reason.COST_EXCEEDS_CAPACITY,
    pb.REASON_CAPACITY: Reason.CAPACITY,
    pb.REASON_BATCH_REJECTED: Reason.BATCH_REJECTED,
    pb.REASON_FAIL_OPEN: Reason.FAIL_OPEN,
    pb.REASON_FAIL_CLOSED: Reason.FAIL_CLOSED,
    pb.REASON_UNAVAILABLE: Reason.UNAVAILABLE,
    pb.REASON_LOCAL_FALLBACK: Reason.LOCAL_FALLBACK,
}

_ALGORITHMS = {
    Algorithm.FIXED_WINDOW: pb.ALGORITHM_FIXED_WINDOW,
    Algorithm.SLIDING_WINDOW: pb.ALGORITHM_SLIDING_WINDOW,
    Algorithm.TOKEN_BUCKET: pb.ALGORITHM_TOKEN_BUCKET,
    Algorithm.LEAKY_BUCKET: pb.ALGORITHM_LEAKY_BUCKET,
    Algorithm.SLIDING_LOG: pb.ALGORITHM_SLIDING_LOG,
}

# Codes that mean quotad was not reached or did not answer in time: the
# failure policy applies. Anything else is quotad refusing the request.
UNREACHABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
    }
)


def policy_proto(policy: Policy) -> pb.Policy:
    message = pb.Policy(
        algorithm=_ALGORITHMS[policy.algorithm], limit=policy.limit, window_ms=policy.window_ms
    )
    if policy.burst is not None:
        message.burst = policy.burst
    return message


MAX_UINT64 = (1 << 64) - 1


def valid_cost(cost: int, field: str = "cost") -> int:
    """A cost the wire can carry; quotad itself answers for 0 and above 2^53.
    A negative cost (which a u64 cannot be) is refused here, naming the field,
    before anything is sent or spent."""
    if not isinstance(cost, int) or isinstance(cost, bool) or not 0 <= cost <= MAX_UINT64:
        raise RejectedError(
            grpc.StatusCode.INVALID_ARGUMENT, f"{field}: must be from 1 to 2^53 (got {cost!r})"
        )
    return cost


def check_request(key: str, policy: PolicyLike, cost: int) -> pb.CheckRequest:
    if isinstance(policy, Policy):
        return pb.CheckRequest(key=key, cost=cost, inline_policy=policy_proto(policy))
    return pb.CheckRequest(key=key, cost=cost, policy_name=policy)


def batch_request(items: Sequence[Check], mode: BatchMode) -> pb.CheckBatchRequest:
    wire_mode = (
        pb.BATCH_MODE_ALL_OR_NOTHING
        if BatchMode(mode) is BatchMode.ALL_OR_NOTHING
        else pb.BATCH_MODE_INDEPENDENT
    )
    for i, c in enumerate(items):
        valid_cost(c.cost, f"items[{i}].cost")
    return pb.CheckBatchRequest(
        items=[check_request(c.key, c.policy, c.cost) for c in items], mode=wire_mode
    )


def reset_request(key: str, policy: PolicyLike) -> pb.ResetRequest:
    if isinstance(policy, Policy):
        return pb.ResetRequest(key=key, inline_policy=policy_proto(policy))
    return pb.ResetRequest(key=key, policy_name=policy)


def decision(message: pb.Decision) -> Decision:
    reason = _REASONS.get(message.reason)
    if reason is None:
        raise BadResponseError(f"unknown reason {message.reason}")
    return Decision(
        allowed=message.allowed,
        limit=message.limit,
        remaining=message.remaining,
        retry_after_ms=message.retry_after_ms,
        reset_after_ms=message.reset_after_ms,
        reason=reason,
    )


def failure_decision(reason: Reason) -> Decision:
    """What the failure policy answers for a check quotad did not decide."""
    return Decision(
        allowed=reason is Reason.FAIL_OPEN,
        limit=0,
        remaining=0,
        retry_after_ms=0,
        reset_after_ms=0,
        reason=reason,
    )


def classify(error: grpc.RpcError) -> QuotadError:
    """An unreachable quotad is :class:`UnavailableError`; anything else a refusal."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or ""
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        details = details or "no answer from quotad within the deadline"
    if code in UNREACHABLE:
        return UnavailableError(code, details)
    return RejectedError(code, details)
