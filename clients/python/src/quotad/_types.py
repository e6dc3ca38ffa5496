"""The values a caller passes and gets back, mirroring the Rust client's."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Reason(str, enum.Enum):
    """Why a decision came out the way it did (``quotad.v1.Reason``)."""

    WITHIN_LIMIT = "within_limit"
    """Allowed: the cost fits in what remains."""
    LIMIT_EXCEEDED = "limit_exceeded"
    """Denied: the cost does not fit now, but will after ``retry_after_ms``."""
    COST_EXCEEDS_CAPACITY = "cost_exceeds_capacity"
    """Denied: the cost is larger than the policy's capacity; no wait helps."""
    CAPACITY = "capacity"
    """Denied: quotad's key table is full and it denies new keys."""
    BATCH_REJECTED = "batch_rejected"
    """Denied (all-or-nothing batch): this item fit, another did not."""
    FAIL_OPEN = "fail_open"
    """Allowed without counting: quotad (or its store) could not be reached."""
    FAIL_CLOSED = "fail_closed"
    """Denied without counting: quotad (or its store) could not be reached."""
    UNAVAILABLE = "unavailable"
    """Not decided (independent batch): the store failed for this item."""
    LOCAL_FALLBACK = "local_fallback"
    """Allowed or denied by one quotad replica alone, against its share of
    the limit, while the store is down."""


class Algorithm(str, enum.Enum):
    """How an inline policy counts (``quotad.v1.Algorithm``)."""

    FIXED_WINDOW = "fixed_window"
    SLIDING_WINDOW = "sliding_window"
    TOKEN_BUCKET = "token_bucket"
    LEAKY_BUCKET = "leaky_bucket"
    SLIDING_LOG = "sliding_log"


class BatchMode(str, enum.Enum):
    """How the items of a batch affect each other."""

    INDEPENDENT = "independent"
    """Each item decided alone, as separate checks."""
    ALL_OR_NOTHING = "all_or_nothing"
    """Every item allowed and consumed, or none consumed."""


class FailurePolicy(str, enum.Enum):
    """What a call answers when quotad cannot be reached within the deadline."""

    FAIL_OPEN = "fail_open"
    """Allow; the decision's reason is :attr:`Reason.FAIL_OPEN`."""
    FAIL_CLOSED = "fail_closed"
    """Deny; the decision's reason is :attr:`Reason.FAIL_CLOSED`."""
    ERROR = "error"
    """Raise :class:`~quotad.UnavailableError` and let the caller decide."""


@dataclass(frozen=True)
class Decision:
    """The outcome of one check, as quotad's ``Decision`` (and the Rust client's)."""

    allowed: bool
    """Whether the request may proceed; when true (and not a peek) its cost was consumed."""
    limit: int
    """The capacity: the largest cost that can ever be admitted at once."""
    remaining: int
    """How many unit-cost requests would be allowed now, after this decision."""
    retry_after_ms: int
    """0 when allowed; for ``LIMIT_EXCEEDED`` the exact smallest wait that makes room."""
    reset_after_ms: int
    """How long until the key's state is back to fresh."""
    reason: Reason
    """Why."""


@dataclass(frozen=True)
class LeaseTerms:
    """How quotad may lease budget of an inline policy to a client with leases on
    (``inline_terms`` of ``Leases.Lease``; the server bounds them by its
    ``[limits]``). An inline policy without them is never leased."""

    max_units: int
    min_units: int
    max_ttl_ms: int


@dataclass(frozen=True)
class Policy:
    """A policy given with the request instead of a name in quotad's config.

    quotad validates it and answers ``INVALID_ARGUMENT`` naming the field
    (``inline_policy.limit``, ...) when a rule is broken. ``lease``: the
    terms a client with leases on asks quotad to lease it under.
    """

    algorithm: Algorithm
    limit: int
    window_ms: int
    burst: int | None = None
    lease: LeaseTerms | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "algorithm", Algorithm(self.algorithm))


PolicyLike = str | Policy
"""A policy name from quotad's config, or an inline :class:`Policy`."""


@dataclass(frozen=True)
class Check:
    """One item of :meth:`Client.check_batch`: ``cost`` units of ``key`` under ``policy``."""

    key: str
    policy: PolicyLike
    cost: int = 1
