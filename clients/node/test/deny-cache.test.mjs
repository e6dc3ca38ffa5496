// The deny cache's rules, on explicit times (no sleeping): the same cases
// as the Rust client's deny_cache.rs.
import assert from "node:assert/strict";
import { test } from "node:test";
import { DenyCache, margin } from "../dist/denyCache.js";

const denial = (limit, retryAfterMs) => ({
  allowed: false,
  limit,
  remaining: 0,
  retryAfterMs,
  resetAfterMs: retryAfterMs * 2,
  reason: "limit_exceeded",
});
const allowed = (limit) => ({ allowed: true, limit, remaining: 3, retryAfterMs: 0, resetAfterMs: 1_000, reason: "within_limit" });
const check = (key, cost = 1, policy = "api") => ({ policy, key, cost });

test("a denial answers larger costs until its retry time from the send and reports it from the arrival", () => {
  const cache = new DenyCache(10);
  const c = check("k", 3);
  const sent = cache.sent(1_000);
  cache.record(c, denial(10, 500), sent, 1_050);
  const local = cache.lookup(c, 1_200);
  assert.ok(local, "denied locally");
  // Held until 1,499 (from the send, less the 1 ms margin); reported up to 1,551.
  assert.equal(local.retryAfterMs, 351);
  assert.equal(local.resetAfterMs, 851);
  assert.equal(local.reason, "limit_exceeded");
  assert.ok(cache.lookup(check("k", 7), 1_498));
  assert.equal(cache.lookup(check("k", 7), 1_499), undefined);
  assert.equal(cache.lookup(check("k", 2), 1_200), undefined, "smaller cost");
  assert.equal(cache.lookup(c, 1_500), undefined, "retry time reached");
  assert.equal(cache.lookup(check("k", 11), 1_200), undefined, "a cost above the capacity is quotad's cost_exceeds_capacity");
  assert.equal(cache.lookup(check("other", 3), 1_200), undefined);
  assert.equal(cache.lookup(check("k", 3, "web"), 1_200), undefined);
  const inline = { algorithm: "fixed_window", limit: 10, windowMs: 1000 };
  assert.equal(cache.lookup({ policy: inline, key: "k", cost: 3 }, 1_200), undefined, "an inline policy is another policy");
});

test("only limit_exceeded denials are cached", () => {
  const cache = new DenyCache(10);
  for (const reason of ["cost_exceeds_capacity", "capacity", "batch_rejected", "fail_closed"]) {
    cache.record(check("k"), { ...denial(10, 500), reason }, cache.sent(0), 0);
  }
  cache.record(check("k"), allowed(10), cache.sent(0), 0);
  assert.equal(cache.size, 0);
});

test("a reset drops the entry and denials decided before it", () => {
  const cache = new DenyCache(10);
  cache.record(check("k"), denial(10, 500), cache.sent(0), 0);
  const inFlight = cache.sent(10);
  cache.forget("api", "k");
  assert.equal(cache.lookup(check("k"), 20), undefined);
  cache.record(check("k"), denial(10, 500), inFlight, 15);
  assert.equal(cache.lookup(check("k"), 20), undefined, "decided before the reset");
  cache.record(check("k"), denial(10, 500), cache.sent(30), 30);
  assert.ok(cache.lookup(check("k"), 40), "decided after the reset");
});

test("another limit or an admitted larger cost drops the entry", () => {
  const cache = new DenyCache(10);
  cache.record(check("k", 5), denial(10, 500), cache.sent(0), 0);
  cache.record(check("k", 1), allowed(10), cache.sent(1), 1);
  assert.ok(cache.lookup(check("k", 5), 2), "a smaller cost proves nothing");
  cache.record(check("k", 1), allowed(20), cache.sent(3), 3);
  assert.equal(cache.lookup(check("k", 5), 4), undefined, "the limit was raised");
  cache.record(check("k", 5), denial(10, 500), cache.sent(10), 10);
  cache.record(check("k", 6), allowed(10), cache.sent(11), 11);
  assert.equal(cache.lookup(check("k", 5), 12), undefined, "room came early");
});

test("the cache holds at most its capacity and makes room from expired entries", () => {
  const cache = new DenyCache(2);
  for (const [key, retry] of [["a", 100], ["b", 1_000], ["c", 1_000]]) {
    cache.record(check(key), denial(10, retry), cache.sent(0), 0);
  }
  assert.equal(cache.size, 2);
  assert.equal(cache.lookup(check("c"), 1), undefined, "full");
  cache.record(check("c"), denial(10, 1_000), cache.sent(100), 100);
  assert.equal(cache.size, 2);
  assert.equal(cache.lookup(check("a"), 100), undefined);
  assert.ok(cache.lookup(check("b"), 100));
  assert.ok(cache.lookup(check("c"), 100));
});

test("making room under key churn looks at each entry about once", () => {
  const CAPACITY = 1_000;
  const cache = new DenyCache(CAPACITY);
  for (let i = 0; i < CAPACITY; i++) cache.record(check(`old${i}`), denial(10, 11 + i), cache.sent(0), 0);
  assert.equal(cache.size, CAPACITY);
  for (let j = 0; j < CAPACITY; j++) {
    const now = 10 + j;
    cache.record(check(`new${j}`), denial(10, 100_000), cache.sent(now), now);
    assert.ok(cache.lookup(check(`new${j}`), now), "room was made");
    assert.equal(cache.lookup(check(`old${j}`), now), undefined);
  }
  assert.equal(cache.size, CAPACITY);
  const records = 2 * CAPACITY;
  assert.ok(cache.examined <= 2 * records, `${cache.examined} index items looked at for ${records} records`);
});

test("a weaker denial does not replace a stronger one", () => {
  const cache = new DenyCache(10);
  cache.record(check("k"), denial(10, 1_000), cache.sent(0), 0);
  cache.record(check("k", 4), denial(10, 100), cache.sent(0), 0);
  assert.equal(cache.lookup(check("k"), 500)?.retryAfterMs, 500 + margin(1_000));
});

test("long waits end earlier by a rate margin and tiny ones are not cached", () => {
  assert.equal(margin(1), 1);
  assert.equal(margin(999), 1);
  assert.equal(margin(60_000), 61);
  assert.equal(margin(86_400_000), 86_401);
  const cache = new DenyCache(10);
  cache.record(check("k"), denial(10, 1), cache.sent(0), 0);
  assert.equal(cache.lookup(check("k"), 0), undefined, "1 ms is all margin");
  cache.record(check("k"), denial(10, 60_000), cache.sent(0), 0);
  assert.ok(cache.lookup(check("k"), 59_938));
  assert.equal(cache.lookup(check("k"), 59_939), undefined);
});

test("an inline policy's absent burst is its limit, as quotad reads it", () => {
  const cache = new DenyCache(10);
  const a = { algorithm: "token_bucket", limit: 5, windowMs: 1000 };
  const b = { algorithm: "token_bucket", limit: 5, windowMs: 1000, burst: 5 };
  cache.record({ policy: a, key: "k" }, denial(5, 500), cache.sent(0), 0);
  assert.ok(cache.lookup({ policy: b, key: "k" }, 1));
});
