"""Leases held by the client: the settings, the table of what is held per
(policy, key), the local spend, and what a lease call does with its answer.

The rules are the Rust client's (``crates/quotad-client/src/lease.rs`` and
``lessee.rs``, docs/leases.md): a lease is a share of a key's budget quotad
charged when it granted it; the client admits with it locally, without a
call, until its units run out or its time does (its send time + ``ttl_ms`` x
(1 - 1/1000) less a margin, on the client's monotonic clock, so never after
quotad's own end). A check that finds no lease goes to quotad as usual while
a lease is acquired in the background. A lease is renewed at half spent or
half its TTL: the renewal asks for the next lease while the current one is
still spent; when the new one is installed the old one is stopped, and what
was spent of it is settled with the *next* lease call, so a lease that can
still be spent is never settled. ``direct`` from quotad (near the end of the
budget) sends the key's checks one by one for a back-off; a policy quotad
will not lease is not asked again for a minute, and neither is a key quotad
refuses (a refusal naming ``key``: too long, empty), while the policy's other
keys keep leasing. Closing the client returns what is unspent.

An inline policy is leased only when it carries lease terms
(``Policy(..., lease=LeaseTerms(...))``), as the Rust client's
``Check::lease_terms``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import grpc

from ._types import Decision, Policy, PolicyLike, Reason
from ._wire import policy_proto
from .errors import field_of
from .v1 import lease_pb2

MAX_LEASE_WANT = 1 << 53
NOT_LEASABLE_RECHECK_MS = 60_000
"""How long a policy quotad refused leases for goes unleased before asking again."""


@dataclass(frozen=True)
class LeaseOptions:
    """Leases of up to ``want`` units each (quotad may grant fewer).

    ``margin_ms``: how much earlier than its send time + TTL less 0.1% a
    lease stops being spent (default 5). ``direct_backoff_ms``: how long a key
    answered ``direct`` (or whose lease call failed) is checked call by call
    before asking again (default 1,000). ``max_keys``: the most keys leases
    are held for (default 10,000); past it a new key is checked call by call.
    """

    want: int
    margin_ms: int = 5
    direct_backoff_ms: int = 1_000
    max_keys: int = 10_000

    def __post_init__(self) -> None:
        if not 1 <= self.want <= MAX_LEASE_WANT:
            raise ValueError(f"leases.want: must be from 1 to 2^53 (got {self.want})")
        if self.max_keys < 1:
            raise ValueError("leases.max_keys: must be at least 1")

    def end_ms(self, sent_ms: int, ttl_ms: int) -> int:
        """The last instant (exclusive) a lease sent at ``sent_ms`` may be spent."""
        drift = -(-ttl_ms // 1_000)
        return max(sent_ms + ttl_ms - drift - self.margin_ms, 0)


@dataclass(frozen=True)
class LeaseStats:
    """What the client's leases have done since it was made."""

    local_admissions: int = 0
    acquired: int = 0
    renewed: int = 0
    returned: int = 0
    returned_units: int = 0
    direct: int = 0
    not_leasable: int = 0
    failed: int = 0
    held: int = 0


@dataclass
class Taken:
    """A lease stopped for good: what settling it reports."""

    id: str
    spent: int
    left: int


@dataclass
class Slot:
    """What is held for one (policy, key). Its ``calling`` flag makes one caller
    at a time the one that talks to quotad about it."""

    policy: PolicyLike
    key: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    held_id: str | None = None
    units: int = 0
    left: int = 0
    end_ms: int = 0
    renew_at_ms: int = 0
    renew_below: int = 0
    limit: int = 0
    reset_until_ms: int = 0
    direct_until_ms: int = 0
    calling: bool = True
    stopped: Taken | None = None

    def claim_locked(self) -> bool:
        if self.calling:
            return False
        self.calling = True
        return True

    def claim(self) -> bool:
        with self.lock:
            return self.claim_locked()

    def release(self) -> None:
        with self.lock:
            self.calling = False

    def take(self, now_ms: int) -> Taken | None:
        """Stops the lease held, for good: what was spent of it, unless it has
        ended (then nothing is left to settle)."""
        with self.lock:
            held_id, self.held_id = self.held_id, None
            left, self.left = self.left, 0
            if held_id is None or now_ms >= self.end_ms:
                return None
            return Taken(held_id, self.units - left, left)

    def holds(self, now_ms: int) -> bool:
        with self.lock:
            return self.held_id is not None and now_ms < self.end_ms

    def install(
        self, lease_id: str, units: int, end_ms: int, renew_at_ms: int, limit: int, reset_ms: int
    ) -> None:
        with self.lock:
            self.held_id, self.units, self.left = lease_id, units, units
            self.end_ms, self.renew_at_ms, self.renew_below = end_ms, renew_at_ms, units // 2
            self.limit, self.reset_until_ms = limit, reset_ms

    def hold_off(self, until_ms: int) -> None:
        with self.lock:
            self.direct_until_ms = until_ms

    def idle(self, now_ms: int) -> bool:
        with self.lock:
            return not self.calling and now_ms >= self.end_ms and now_ms >= self.direct_until_ms


@dataclass
class Spent:
    """A local admission (``decision``), or a miss; ``call`` is a slot the caller
    claimed and must start a lease call for."""

    decision: Decision | None
    call: Slot | None


class LeaseTable:
    """Every slot, the policies quotad refused, and the counts."""

    def __init__(self, options: LeaseOptions) -> None:
        self.options = options
        self._lock = threading.Lock()
        self._slots: dict[tuple[PolicyLike, str], Slot] = {}
        self._refused: dict[PolicyLike, int] = {}
        self.closed = False
        self.counts = {
            "local_admissions": 0,
            "acquired": 0,
            "renewed": 0,
            "returned": 0,
            "returned_units": 0,
            "direct": 0,
            "not_leasable": 0,
            "failed": 0,
        }

    def bump(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def spend(self, policy: PolicyLike, key: str, cost: int, now_ms: int) -> Spent:
        if self.closed or (isinstance(policy, Policy) and policy.lease is None):
            return Spent(None, None)
        if cost < 1:
            # quotad's to refuse (INVALID_ARGUMENT naming the cost), never a
            # free local admission.
            return Spent(None, None)
        with self._lock:
            slot = self._slots.get((policy, key))
            if slot is None:
                if now_ms < self._refused.get(policy, 0):
                    return Spent(None, None)
                if len(self._slots) >= self.options.max_keys:
                    for k in [k for k, s in self._slots.items() if s.idle(now_ms)]:
                        del self._slots[k]
                    if len(self._slots) >= self.options.max_keys:
                        return Spent(None, None)
                # Born claimed: this caller starts the acquisition.
                slot = Slot(policy, key)
                self._slots[(policy, key)] = slot
                return Spent(None, slot)
        with slot.lock:
            if now_ms < slot.end_ms and slot.held_id is not None and slot.left >= cost:
                slot.left -= cost
                decision = Decision(
                    allowed=True,
                    limit=slot.limit,
                    remaining=slot.left,
                    retry_after_ms=0,
                    reset_after_ms=max(slot.reset_until_ms - now_ms, 0),
                    reason=Reason.WITHIN_LIMIT,
                )
                due = slot.left <= slot.renew_below or now_ms >= slot.renew_at_ms
                renew = due and now_ms >= slot.direct_until_ms and slot.claim_locked()
                local = True
            else:
                renew = now_ms >= slot.direct_until_ms and slot.claim_locked()
                local = False
        if local:
            self.bump("local_admissions")
            return Spent(decision, slot if renew else None)
        return Spent(None, slot if renew else None)

    def refuse(self, policy: PolicyLike, until_ms: int) -> None:
        with self._lock:
            self._refused[policy] = until_ms

    def slots(self) -> list[Slot]:
        with self._lock:
            return list(self._slots.values())

    def stats(self, now_ms: int) -> LeaseStats:
        with self._lock:
            counts = dict(self.counts)
        held = sum(1 for s in self.slots() if s.holds(now_ms))
        return LeaseStats(**counts, held=held)


def lease_request(slot: Slot, want: int, settle: Taken | None) -> lease_pb2.LeaseRequest:
    request = lease_pb2.LeaseRequest(key=slot.key, want=want)
    if isinstance(slot.policy, Policy):
        assert slot.policy.lease is not None, "only inline policies with terms are leased"
        request.inline_policy.CopyFrom(policy_proto(slot.policy))
        terms = slot.policy.lease
        request.inline_terms.max_units = terms.max_units
        request.inline_terms.min_units = terms.min_units
        request.inline_terms.max_ttl_ms = terms.max_ttl_ms
    else:
        request.policy_name = slot.policy
    if settle is not None:
        request.settle.lease_id = settle.id
        request.settle.spent = settle.spent
    return request


# What a lease call that failed with one of these codes means: quotad will
# not lease this policy (no lease settings, an unknown name, not allowed).
_REFUSED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


class Plan:
    """One lease call for a slot: built by :func:`plan`, finished by
    :func:`answered` or :func:`failed`. ``give_back`` lists leases to return
    (want 0) instead, when the client is closing."""

    def __init__(
        self, request: lease_pb2.LeaseRequest | None, stopped: Taken | None, renewal: bool
    ) -> None:
        self.request = request
        self.stopped = stopped
        self.renewal = renewal
        self.give_back: list[Taken] = []
        # What the call did, counted by the lessee last of all, once the slot
        # is held off and released: whoever sees a count sees its effect.
        self.events: list[str] = []


def plan(table: LeaseTable, slot: Slot, now_ms: int) -> Plan:
    with slot.lock:
        stopped, slot.stopped = slot.stopped, None
    if table.closed:
        p = Plan(None, None, False)
        p.give_back = [t for t in (stopped, slot.take(now_ms)) if t is not None]
        return p
    renewal = slot.holds(now_ms)
    return Plan(lease_request(slot, table.options.want, stopped), stopped, renewal)


def settled(table: LeaseTable, answer: lease_pb2.LeaseResponse) -> None:
    if answer.settled == lease_pb2.SETTLED_RETURNED:
        table.bump("returned_units", answer.returned)


def answered(
    table: LeaseTable,
    slot: Slot,
    p: Plan,
    answer: lease_pb2.LeaseResponse,
    sent_ms: int,
    received_ms: int,
) -> Taken | None:
    """Installs the lease quotad granted (stopping the old one, kept to settle with
    the next call), or backs off after ``direct``. Returns a lease to give back:
    one that arrived too late to be spent."""
    settled(table, answer)
    options = table.options
    lease = answer.lease if answer.HasField("lease") else None
    if answer.direct or lease is None or lease.units == 0:
        backoff = options.direct_backoff_ms
        wait = backoff if answer.reset_after_ms == 0 else min(answer.reset_after_ms, backoff)
        slot.hold_off(received_ms + wait)
        p.events.append("direct")
        return None
    end_ms = options.end_ms(sent_ms, lease.ttl_ms)
    if end_ms <= received_ms or table.closed:
        slot.hold_off(received_ms + options.direct_backoff_ms)
        return Taken(lease.lease_id, 0, lease.units)
    renew_at_ms = min(sent_ms + lease.ttl_ms // 2, end_ms)
    old = slot.take(received_ms)
    with slot.lock:
        slot.stopped = old
    slot.install(
        lease.lease_id,
        lease.units,
        end_ms,
        renew_at_ms,
        answer.limit,
        received_ms + answer.reset_after_ms,
    )
    # Counted once installed: whoever sees the count can spend the lease.
    p.events.append("renewed" if p.renewal else "acquired")
    return None


def failed(
    table: LeaseTable, slot: Slot, p: Plan, code: grpc.StatusCode, details: str, now_ms: int
) -> None:
    if code is grpc.StatusCode.NOT_FOUND and p.stopped is not None:
        # quotad no longer holds the lease settled (it ended, or the key was
        # reset): nothing to settle; ask again at once.
        slot.hold_off(now_ms)
        p.events.append("failed")
    elif code is grpc.StatusCode.INVALID_ARGUMENT and field_of(details) == "key":
        # quotad refuses this key (too long, empty), not the policy: only this
        # key goes unleased until the recheck; the policy's other keys lease.
        slot.hold_off(now_ms + NOT_LEASABLE_RECHECK_MS)
        p.events.append("failed")
    elif code in _REFUSED:
        until = now_ms + NOT_LEASABLE_RECHECK_MS
        table.refuse(slot.policy, until)
        slot.hold_off(until)
        p.events.append("not_leasable")
    else:
        # Unreachable: keep the stopped lease to settle with the next call;
        # the lease held is spent on until its end.
        with slot.lock:
            slot.stopped = p.stopped
        slot.hold_off(now_ms + table.options.direct_backoff_ms)
        p.events.append("failed")
