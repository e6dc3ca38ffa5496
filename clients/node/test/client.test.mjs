// The Client against a real quotad, a closed port and a stalled one.
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { Client, QuotadError } from "../dist/index.js";
import { closedPort, stalledServer, startQuotad } from "./support.mjs";

const CONFIG = fileURLToPath(new URL("quotad.toml", import.meta.url));
let quotad;
let closed;
let stalled;
let n = 0;
/** A key no other test uses. */
const fresh = () => `node-client-test-${process.pid}-${++n}`;

before(async () => {
  [quotad, closed, stalled] = await Promise.all([startQuotad({ config: CONFIG }), closedPort(), stalledServer()]);
});
after(async () => {
  await Promise.all([quotad?.stop(), closed?.stop(), stalled?.stop()]);
});

/** Asserts a promise rejects with a QuotadError of this kind and code; returns it. */
async function rejects(promise, kind, codeName) {
  const error = await promise.then(
    (v) => assert.fail(`expected ${codeName}, got ${JSON.stringify(v)}`),
    (e) => e,
  );
  assert.ok(error instanceof QuotadError, `not a QuotadError: ${error}`);
  assert.equal(error.kind, kind, error.message);
  assert.equal(error.codeName, codeName, error.message);
  return error;
}

describe("decisions", () => {
  test("a named policy allows with exact remaining, then denies with retry and reset times", async () => {
    const client = new Client(quotad.url, { denyCache: 0 });
    const key = fresh();
    for (const remaining of [2, 1, 0]) {
      const d = await client.check({ policy: "login", key });
      assert.deepEqual(
        { allowed: d.allowed, limit: d.limit, remaining: d.remaining, retryAfterMs: d.retryAfterMs, reason: d.reason },
        { allowed: true, limit: 3, remaining, retryAfterMs: 0, reason: "within_limit" },
      );
    }
    const denied = await client.check({ policy: "login", key });
    assert.equal(denied.allowed, false);
    assert.equal(denied.reason, "limit_exceeded");
    // One token a 20 minutes: the wait is at most that, the reset at most an hour.
    assert.ok(denied.retryAfterMs > 1_190_000 && denied.retryAfterMs <= 1_200_000, `${denied.retryAfterMs}`);
    assert.ok(denied.resetAfterMs > 3_590_000 && denied.resetAfterMs <= 3_600_000, `${denied.resetAfterMs}`);
    client.close();
  });

  test("an inline policy is counted apart from a named one, and cost spends that many units", async () => {
    const client = new Client(quotad.url);
    const key = fresh();
    const inline = { algorithm: "fixed_window", limit: 10, windowMs: 3_600_000 };
    assert.equal((await client.check({ policy: inline, key, cost: 4 })).remaining, 6);
    assert.equal((await client.check({ policy: "login", key })).remaining, 2);
    const over = await client.check({ policy: inline, key, cost: 11 });
    assert.deepEqual(
      [over.allowed, over.reason, over.retryAfterMs, over.remaining],
      [false, "cost_exceeds_capacity", 0, 6],
      "a cost above the capacity consumes nothing and has no retry time",
    );
    const bucket = { algorithm: "token_bucket", limit: 1, windowMs: 3_600_000, burst: 4 };
    assert.deepEqual(await client.check({ policy: bucket, key, cost: 4 }).then((d) => [d.limit, d.remaining]), [4, 0]);
    client.close();
  });

  test("peek consumes nothing and reset gives the key a fresh budget", async () => {
    const client = new Client(quotad.url);
    const key = fresh();
    for (let i = 0; i < 3; i++) assert.equal((await client.peek({ policy: "login", key })).remaining, 3);
    await client.check({ policy: "login", key, cost: 3 });
    const peeked = await client.peek({ policy: "login", key });
    assert.equal(peeked.allowed, false);
    assert.equal(peeked.reason, "limit_exceeded");
    await client.reset({ policy: "login", key });
    assert.equal((await client.check({ policy: "login", key })).remaining, 2);
    await client.reset({ policy: "login", key: fresh() }); // a key with no state
    client.close();
  });

  test("an all_or_nothing batch takes nothing when one item is denied; an independent one decides each alone", async () => {
    const client = new Client(quotad.url);
    const full = fresh();
    const other = fresh();
    await client.check({ policy: "login", key: full, cost: 3 });
    const all = await client.checkBatch(
      [
        { policy: "login", key: other },
        { policy: "login", key: full },
      ],
      { mode: "all_or_nothing" },
    );
    assert.deepEqual(
      all.map((d) => [d.allowed, d.reason]),
      [
        [false, "batch_rejected"],
        [false, "limit_exceeded"],
      ],
    );
    assert.equal((await client.peek({ policy: "login", key: other })).remaining, 3, "nothing was taken");
    const each = await client.checkBatch([
      { policy: "login", key: other },
      { policy: "login", key: full },
    ]);
    assert.deepEqual(
      each.map((d) => [d.allowed, d.remaining]),
      [
        [true, 2],
        [false, 0],
      ],
    );
    client.close();
  });
});

describe("refusals", () => {
  test("bad input is INVALID_ARGUMENT naming the field, and consumes nothing", async () => {
    const client = new Client(quotad.url, { onUnavailable: "fail_open" });
    const key = fresh();
    const empty = await rejects(client.check({ policy: "login", key: "" }), "rejected", "INVALID_ARGUMENT");
    assert.equal(empty.field, "key");
    assert.equal(empty.code, 3);
    const zero = await rejects(client.check({ policy: "login", key, cost: 0 }), "rejected", "INVALID_ARGUMENT");
    assert.equal(zero.field, "cost");
    const limit = await rejects(
      client.check({ policy: { algorithm: "fixed_window", limit: 0, windowMs: 1_000 }, key }),
      "rejected",
      "INVALID_ARGUMENT",
    );
    assert.equal(limit.field, "inline_policy.limit");
    const item = await rejects(
      client.checkBatch([{ policy: "login", key }, { policy: "login", key, cost: 0 }]),
      "rejected",
      "INVALID_ARGUMENT",
    );
    assert.equal(item.field, "items[1].cost");
    // A number the wire would truncate or wrap is refused here, naming the field, before any call.
    const calls = client.stats().checkCalls;
    for (const [bad, field] of [
      [{ policy: "login", key, cost: 1.5 }, "cost"],
      [{ policy: "login", key, cost: -1 }, "cost"],
      [{ policy: "login", key, cost: 2 ** 53 }, "cost"],
      [{ policy: { algorithm: "token_bucket", limit: 2.5, windowMs: 1_000 }, key }, "inline_policy.limit"],
      [{ policy: "login", key: 42 }, "key"],
    ]) {
      const e = await rejects(client.check(bad), "rejected", "INVALID_ARGUMENT");
      assert.equal(e.field, field);
    }
    const batch = await rejects(client.checkBatch([{ policy: "login", key }, { policy: "login", key, cost: 0.5 }]), "rejected", "INVALID_ARGUMENT");
    assert.equal(batch.field, "items[1].cost");
    assert.equal(client.stats().checkCalls, calls, "nothing sent");
    assert.equal((await client.peek({ policy: "login", key })).remaining, 3, "nothing consumed");
    client.close();
  });

  test("an unknown policy is NOT_FOUND naming policy_name, whatever the failure policy", async () => {
    const client = new Client(quotad.url, { onUnavailable: "fail_open" });
    const e = await rejects(client.check({ policy: "no-such-policy", key: fresh() }), "rejected", "NOT_FOUND");
    assert.equal(e.field, "policy_name");
    await rejects(client.reset({ policy: "no-such-policy", key: fresh() }), "rejected", "NOT_FOUND");
    client.close();
  });

  test("an address that cannot be used is refused when the client is built", () => {
    assert.throws(() => new Client("ftp://127.0.0.1:1"), (e) => e instanceof QuotadError && e.field === "address");
    assert.throws(() => new Client("http://127.0.0.1:1", { tls: {} }), (e) => e.field === "tls");
    assert.throws(() => new Client("https://127.0.0.1:1", { tls: { ca: "not a pem" } }), (e) => e.field === "tls.ca");
    assert.throws(() => new Client("https://127.0.0.1:1", { tls: { cert: "x" } }), (e) => e.field === "tls.key");
    assert.throws(() => new Client("unix:///tmp/q.sock", { tls: {} }), (e) => e.field === "tls");
  });
});

describe("failure policy", () => {
  for (const [name, server] of [
    ["closed", () => closed],
    ["stalled", () => stalled],
  ]) {
    test(`against a ${name} port each policy answers within the deadline`, async () => {
      const deadlineMs = 200;
      const base = new Client(server().url, { deadlineMs });
      const key = fresh();
      for (const policy of ["fail_open", "fail_closed", "error"]) {
        const client = base.withFailurePolicy(policy);
        for (const call of ["check", "peek", "checkBatch"]) {
          const started = performance.now();
          const run =
            call === "checkBatch"
              ? client.checkBatch([{ policy: "login", key }, { policy: "login", key }])
              : client[call]({ policy: "login", key });
          if (policy === "error") {
            const e = await rejects(run, "unavailable", name === "closed" ? "UNAVAILABLE" : "DEADLINE_EXCEEDED");
            assert.equal(e.field, undefined);
          } else {
            const answer = await run;
            const decisions = Array.isArray(answer) ? answer : [answer];
            assert.equal(decisions.length, call === "checkBatch" ? 2 : 1);
            for (const d of decisions) {
              assert.deepEqual(d, {
                allowed: policy === "fail_open",
                limit: 0,
                remaining: 0,
                retryAfterMs: 0,
                resetAfterMs: 0,
                reason: policy,
              });
            }
          }
          const elapsed = performance.now() - started;
          // The bound under test is the deadline; the slack is the timer's, on a loaded machine.
          assert.ok(elapsed < deadlineMs + 300, `${policy} ${call}: ${elapsed.toFixed(0)} ms`);
        }
        // reset is never answered by the failure policy.
        await rejects(client.reset({ policy: "login", key }), "unavailable", name === "closed" ? "UNAVAILABLE" : "DEADLINE_EXCEEDED");
      }
      assert.deepEqual(base.stats().unavailable, { fail_open: 3, fail_closed: 3, error: 3 });
      base.close();
    });
  }

  test("a per-call deadline overrides the client's", async () => {
    const client = new Client(stalled.url, { deadlineMs: 5_000, onUnavailable: "fail_closed" });
    const started = performance.now();
    const d = await client.check({ policy: "login", key: fresh() }, { deadlineMs: 100 });
    assert.equal(d.reason, "fail_closed");
    assert.ok(performance.now() - started < 1_000);
    client.close();
  });

  test("a failure is logged once per interval, with the count kept quiet", async () => {
    const lines = [];
    const client = new Client(closed.url, { onUnavailable: "fail_open", logger: { warn: (m, f) => lines.push([m, f]) } });
    for (let i = 0; i < 3; i++) await client.check({ policy: "login", key: fresh() });
    assert.equal(lines.length, 1);
    assert.equal(lines[0][0], "quotad unavailable");
    assert.equal(lines[0][1].outcome, "fail_open");
    assert.equal(lines[0][1].code, "UNAVAILABLE");
    client.close();
  });
});

describe("reconnecting", () => {
  test("after quotad restarts on the same address, the client connects again by itself", async () => {
    const first = await startQuotad({ config: CONFIG });
    const client = new Client(first.url, { onUnavailable: "fail_closed" });
    const key = fresh();
    assert.equal((await client.check({ policy: "login", key })).reason, "within_limit");
    await first.stop();
    assert.equal((await client.check({ policy: "login", key })).reason, "fail_closed", "quotad is down");
    const second = await startQuotad({ config: CONFIG, grpcAddr: first.addr });
    try {
      // Bounded by grpc-js's reconnect back-off, capped at 2 s (plus its jitter).
      const end = Date.now() + 10_000;
      let d;
      do {
        d = await client.check({ policy: "login", key });
        if (d.reason === "fail_closed") await new Promise((r) => setTimeout(r, 50));
      } while (d.reason === "fail_closed" && Date.now() < end);
      assert.equal(d.reason, "within_limit", "connected again");
      assert.equal(d.remaining, 2, "a fresh memory store");
    } finally {
      client.close();
      await second.stop();
    }
  });
});

describe("AbortSignal", () => {
  test("aborting a call rejects with the signal's reason at once, not with the failure policy", async () => {
    const client = new Client(stalled.url, { deadlineMs: 5_000, onUnavailable: "fail_open" });
    const controller = new AbortController();
    const started = performance.now();
    const pending = client.check({ policy: "login", key: fresh() }, { signal: controller.signal });
    setTimeout(() => controller.abort(new Error("caller gave up")), 50);
    await assert.rejects(pending, /caller gave up/);
    assert.ok(performance.now() - started < 2_000);
    await assert.rejects(
      client.peek({ policy: "login", key: fresh() }, { signal: AbortSignal.abort() }),
      (e) => e.name === "AbortError",
    );
    assert.deepEqual(client.stats().unavailable, { fail_open: 0, fail_closed: 0, error: 0 });
    assert.equal(client.stats().checkCalls, 1, "a signal aborted before the call sends nothing");
    client.close();
  });

  test("AbortSignal.timeout bounds a call too", async () => {
    const client = new Client(stalled.url, { deadlineMs: 5_000 });
    await assert.rejects(
      client.check({ policy: "login", key: fresh() }, { signal: AbortSignal.timeout(50) }),
      (e) => e.name === "TimeoutError",
    );
    client.close();
  });

  test("a signal that never fires leaves a call to its answer", async () => {
    const client = new Client(quotad.url);
    const d = await client.check({ policy: "login", key: fresh() }, { signal: new AbortController().signal });
    assert.equal(d.remaining, 2);
    client.close();
  });
});

describe("deny cache", () => {
  test("a limit_exceeded denial is answered locally until its retry time", async () => {
    let now = 1_000_000;
    const client = new Client(quotad.url, { clock: () => now });
    const key = fresh();
    await client.check({ policy: "login", key, cost: 3 });
    const first = await client.check({ policy: "login", key });
    assert.equal(first.reason, "limit_exceeded");
    assert.equal(client.stats().checkCalls, 2);
    now += 1_000;
    const local = await client.check({ policy: "login", key });
    assert.equal(client.stats().checkCalls, 2, "no call");
    assert.equal(client.stats().localDenials, 1);
    assert.deepEqual([local.allowed, local.reason, local.limit, local.remaining], [false, "limit_exceeded", 3, 0]);
    // The wait it reports counts from the answer's arrival, plus the margin.
    assert.ok(local.retryAfterMs >= first.retryAfterMs - 1_000, `${local.retryAfterMs} vs ${first.retryAfterMs}`);
    assert.ok(local.retryAfterMs <= first.retryAfterMs - 1_000 + 1 + Math.floor(first.retryAfterMs / 1_000));
    assert.equal((await client.check({ policy: "login", key, cost: 3 })).reason, "limit_exceeded");
    assert.equal(client.stats().checkCalls, 2, "a larger cost is denied locally too");
    await client.check({ policy: "login", key, cost: 4 });
    assert.equal(client.stats().checkCalls, 3, "a cost above the capacity asks quotad");
    // Past the retry time (less the margin), quotad is asked again.
    now += first.retryAfterMs;
    await client.check({ policy: "login", key });
    assert.equal(client.stats().checkCalls, 4);
    client.close();
  });

  test("a reset through the client drops its cached denial; peek and batches always ask", async () => {
    const client = new Client(quotad.url);
    const key = fresh();
    await client.check({ policy: "login", key, cost: 3 });
    await client.check({ policy: "login", key });
    assert.equal((await client.peek({ policy: "login", key })).allowed, false);
    await client.checkBatch([{ policy: "login", key }]);
    assert.equal(client.stats().batchCalls, 1);
    await client.reset({ policy: "login", key });
    assert.equal((await client.check({ policy: "login", key })).remaining, 2);
    client.close();
  });

  test("handles made with withDeadline share the cache; a cache of 0 is off", async () => {
    const client = new Client(quotad.url);
    const key = fresh();
    await client.check({ policy: "login", key, cost: 3 });
    await client.check({ policy: "login", key });
    const other = client.withDeadline(1_000);
    assert.equal(other.deadlineMs, 1_000);
    await other.check({ policy: "login", key });
    assert.equal(client.stats().localDenials, 1);
    const off = new Client(quotad.url, { denyCache: 0 });
    await off.check({ policy: "login", key });
    await off.check({ policy: "login", key });
    assert.deepEqual([off.stats().checkCalls, off.stats().localDenials], [2, 0]);
    client.close();
    off.close();
  });
});
