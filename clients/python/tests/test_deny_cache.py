"""The deny cache's rules, as the Rust client's unit tests hold them
(crates/quotad-client/src/deny_cache.rs)."""

from __future__ import annotations

from quotad import Algorithm, Decision, LeaseTerms, Policy, Reason
from quotad._deny_cache import DenyCache, margin
from quotad._settings import cache_key


def denial(limit: int, retry_after_ms: int) -> Decision:
    return Decision(False, limit, 0, retry_after_ms, retry_after_ms * 2, Reason.LIMIT_EXCEEDED)


def allowed(limit: int) -> Decision:
    return Decision(True, limit, 3, 0, 1_000, Reason.WITHIN_LIMIT)


K = ("api", "k")


def test_a_denial_holds_from_the_send_and_reports_its_wait_from_the_arrival() -> None:
    cache = DenyCache(10)
    sent = cache.sent(1_000)
    # Sent at 1,000, answered at 1,050: quotad decided in between.
    cache.record(K, 3, denial(10, 500), sent, 1_050)
    local = cache.lookup(K, 3, 1_200)
    assert local is not None
    # Held until 1,499 (from the send, less the 1 ms margin); reported up
    # to 1,551 (from the arrival, plus the margin).
    assert (local.retry_after_ms, local.reset_after_ms, local.reason) == (
        351,
        851,
        Reason.LIMIT_EXCEEDED,
    )
    assert cache.lookup(K, 7, 1_498) is not None
    assert cache.lookup(K, 7, 1_499) is None
    assert cache.lookup(K, 2, 1_200) is None, "smaller cost"
    assert cache.lookup(K, 3, 1_500) is None, "retry time reached"
    assert cache.lookup(K, 11, 1_200) is None, "above the capacity: COST_EXCEEDS_CAPACITY"
    assert cache.lookup(("api", "other"), 3, 1_200) is None
    assert cache.lookup(("web", "k"), 3, 1_200) is None


def test_only_limit_exceeded_denials_are_cached() -> None:
    cache = DenyCache(10)
    for reason in (
        Reason.COST_EXCEEDS_CAPACITY,
        Reason.CAPACITY,
        Reason.BATCH_REJECTED,
        Reason.FAIL_CLOSED,
    ):
        d = Decision(False, 10, 0, 500, 1_000, reason)
        cache.record(K, 1, d, cache.sent(0), 0)
    cache.record(K, 1, allowed(10), cache.sent(0), 0)
    assert len(cache) == 0


def test_a_reset_drops_the_entry_and_denials_decided_before_it() -> None:
    cache = DenyCache(10)
    cache.record(K, 1, denial(10, 500), cache.sent(0), 0)
    in_flight = cache.sent(10)
    cache.forget(K)
    assert cache.lookup(K, 1, 20) is None
    cache.record(K, 1, denial(10, 500), in_flight, 15)
    assert cache.lookup(K, 1, 20) is None, "decided before the reset"
    cache.record(K, 1, denial(10, 500), cache.sent(30), 30)
    assert cache.lookup(K, 1, 40) is not None, "decided after the reset"


def test_another_limit_or_an_admitted_larger_cost_drops_the_entry() -> None:
    cache = DenyCache(10)
    cache.record(K, 5, denial(10, 500), cache.sent(0), 0)
    cache.record(K, 1, allowed(10), cache.sent(1), 1)
    assert cache.lookup(K, 5, 2) is not None, "a smaller cost proves nothing"
    cache.record(K, 1, allowed(20), cache.sent(3), 3)
    assert cache.lookup(K, 5, 4) is None, "the limit was raised"
    cache.record(K, 5, denial(10, 500), cache.sent(10), 10)
    cache.record(K, 6, allowed(10), cache.sent(11), 11)
    assert cache.lookup(K, 5, 12) is None, "room came early"


def test_the_cache_holds_at_most_its_capacity_and_makes_room_from_expired_entries() -> None:
    cache = DenyCache(2)
    for key, retry in (("a", 100), ("b", 1_000), ("c", 1_000)):
        cache.record(("api", key), 1, denial(10, retry), cache.sent(0), 0)
    assert len(cache) == 2
    assert cache.lookup(("api", "c"), 1, 1) is None, "full"
    cache.record(("api", "c"), 1, denial(10, 1_000), cache.sent(100), 100)
    assert len(cache) == 2
    assert cache.lookup(("api", "a"), 1, 100) is None
    assert cache.lookup(("api", "b"), 1, 100) is not None
    assert cache.lookup(("api", "c"), 1, 100) is not None


def test_making_room_under_key_churn_keeps_the_index_bounded() -> None:
    capacity = 1_000
    cache = DenyCache(capacity)
    for i in range(capacity):
        cache.record(("api", f"old{i}"), 1, denial(10, 11 + i), cache.sent(0), 0)
    for j in range(capacity):
        now = 10 + j
        key = ("api", f"new{j}")
        cache.record(key, 1, denial(10, 100_000), cache.sent(now), now)
        assert cache.lookup(key, 1, now) is not None, "room was made"
        assert cache.lookup(("api", f"old{j}"), 1, now) is None
    assert len(cache) == capacity
    assert len(cache._expiry) <= 4 * capacity


def test_a_weaker_denial_does_not_replace_a_stronger_one() -> None:
    cache = DenyCache(10)
    cache.record(K, 1, denial(10, 1_000), cache.sent(0), 0)
    cache.record(K, 4, denial(10, 100), cache.sent(0), 0)
    local = cache.lookup(K, 1, 500)
    assert local is not None and local.retry_after_ms == 500 + margin(1_000)


def test_long_waits_end_earlier_by_a_rate_margin_and_tiny_ones_are_not_cached() -> None:
    assert [margin(ms) for ms in (1, 999, 60_000, 86_400_000)] == [1, 1, 61, 86_401]
    cache = DenyCache(10)
    cache.record(K, 1, denial(10, 1), cache.sent(0), 0)
    assert cache.lookup(K, 1, 0) is None, "1 ms is all margin"
    cache.record(K, 1, denial(10, 60_000), cache.sent(0), 0)
    assert cache.lookup(K, 1, 59_938) is not None
    assert cache.lookup(K, 1, 59_939) is None


def test_an_overwritten_or_forgotten_entry_frees_its_slot() -> None:
    cache = DenyCache(2)
    cache.record(K, 1, denial(10, 100), cache.sent(0), 0)
    cache.record(K, 1, denial(10, 1_000), cache.sent(1), 1)
    assert len(cache) == 1
    cache.record(("api", "other"), 1, denial(10, 1_000), cache.sent(200), 200)
    assert cache.lookup(K, 1, 200) is not None, "the longer denial replaced the first"
    cache.forget(K)
    assert len(cache) == 1
    cache.record(("api", "third"), 1, denial(10, 1_000), cache.sent(201), 201)
    assert cache.lookup(("api", "third"), 1, 201) is not None
    assert len(cache) == 2


def test_entries_ending_in_the_same_millisecond_under_different_policies_are_all_purged() -> None:
    from quotad import Algorithm, Policy

    cache = DenyCache(10)
    inline_a = Policy(Algorithm.FIXED_WINDOW, 10, 1_000)
    inline_b = Policy(Algorithm.FIXED_WINDOW, 10, 2_000)
    keys = [("api", "k"), (inline_a, "k"), (inline_b, "k"), ("web", "k"), (inline_a, "j")]
    # All sent at 0 with the same wait: every entry ends at the same ms,
    # so the expiry order has ties between a named and inline policies.
    for key in keys:
        cache.record(key, 1, denial(10, 500), cache.sent(0), 0)
    assert len(cache) == len(keys)
    end = 500 - margin(500)
    assert all(cache.lookup(key, 1, end - 1) is not None for key in keys)
    # A record after they all ended purges them; only the new one is left.
    cache.record(("api", "late"), 1, denial(10, 500), cache.sent(end), end)
    assert len(cache) == 1
    assert cache.lookup(("api", "late"), 1, end) is not None
    assert len(cache._expiry) == 1, "every expired item was popped"


def test_a_reset_of_an_inline_policy_finds_its_denial_whatever_its_lease_terms_or_burst() -> None:
    leased = Policy(Algorithm.TOKEN_BUCKET, 10, 1_000, lease=LeaseTerms(5, 1, 1_000))
    plain = Policy(Algorithm.TOKEN_BUCKET, 10, 1_000)
    burst_spelled = Policy(Algorithm.TOKEN_BUCKET, 10, 1_000, burst=10)
    cache = DenyCache(10)
    cache.record(cache_key(leased, "k"), 1, denial(10, 500), cache.sent(0), 0)
    for same in (plain, burst_spelled):
        assert cache.lookup(cache_key(same, "k"), 1, 10) is not None, same
    cache.forget(cache_key(plain, "k"))
    assert cache.lookup(cache_key(leased, "k"), 1, 20) is None, "the reset found the denial"
    # What the policy counts by still tells entries apart.
    cache.record(cache_key(plain, "k"), 1, denial(10, 500), cache.sent(30), 30)
    other = Policy(Algorithm.TOKEN_BUCKET, 10, 1_000, burst=20)
    assert cache.lookup(cache_key(other, "k"), 1, 40) is None
    assert cache.lookup(cache_key("api", "k"), 1, 40) is None
