// Coalescing against a real quotad, counting the calls quotad decided from
// its own metrics (one store call per Check or CheckBatch): concurrent
// checks beyond the in-flight slots leave as one CheckBatch, answered as
// the Rust client answers them (crates/quotad-client/tests/client/coalescing.rs).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { Client } from "../dist/index.js";
import { decidingCalls, stalledServer, startQuotad } from "./support.mjs";

const CONFIG = fileURLToPath(new URL("quotad.toml", import.meta.url));
let quotad;
let n = 0;
const fresh = () => `node-coalesce-${process.pid}-${++n}`;
// Twenty an hour, counted from the request: every answer is exact.
const TWENTY = { algorithm: "token_bucket", limit: 20, windowMs: 3_600_000 };

before(async () => {
  quotad = await startQuotad({ config: CONFIG });
});
after(async () => {
  await quotad?.stop();
});

/** The answers of `count` checks of one key sent at once. */
async function burst(client, count, key, policy = TWENTY) {
  return Promise.all(Array.from({ length: count }, () => client.check({ policy, key })));
}

/** What 50 checks of a limit of 20 answer, whichever order quotad decides them in. */
function assertExact(answers) {
  const allowed = answers.filter((d) => d.allowed);
  assert.equal(allowed.length, 20);
  assert.deepEqual(
    allowed.map((d) => d.remaining).sort((a, b) => a - b),
    Array.from({ length: 20 }, (_, i) => i),
    "each admission took one unit",
  );
  for (const d of answers.filter((x) => !x.allowed)) {
    assert.deepEqual([d.reason, d.limit, d.remaining], ["limit_exceeded", 20, 0]);
    assert.ok(d.retryAfterMs > 0 && d.retryAfterMs <= 180_000, `retry ${d.retryAfterMs}`);
  }
}

test("a lone check goes out at once as a Check", async () => {
  const client = new Client(quotad.url, { deadlineMs: 5_000, coalescing: { maxInFlight: 1 } });
  const before = await decidingCalls(quotad);
  const d = await client.check({ policy: TWENTY, key: fresh() });
  assert.deepEqual([d.allowed, d.remaining], [true, 19]);
  assert.equal((await decidingCalls(quotad)) - before, 1);
  assert.deepEqual([client.stats().checkCalls, client.stats().batchCalls], [1, 0]);
  await client.close();
});

test("with one slot, 50 concurrent checks are 2 calls: the first alone, the rest one CheckBatch", async () => {
  for (let repeat = 0; repeat < 5; repeat++) {
    const client = new Client(quotad.url, { deadlineMs: 5_000, coalescing: { maxInFlight: 1 }, denyCache: 0 });
    const before = await decidingCalls(quotad);
    assertExact(await burst(client, 50, fresh()));
    assert.equal((await decidingCalls(quotad)) - before, 2, "calls quotad decided");
    const s = client.stats();
    assert.deepEqual([s.checkCalls, s.batchCalls, s.coalescedBatches, s.coalescedChecks], [1, 1, 1, 49]);
    await client.close();
  }
});

test("with the default 8 slots, 50 concurrent checks are 8 Checks and one CheckBatch of the other 42", async () => {
  for (let repeat = 0; repeat < 5; repeat++) {
    const client = new Client(quotad.url, { deadlineMs: 5_000, denyCache: 0 });
    const before = await decidingCalls(quotad);
    assertExact(await burst(client, 50, fresh()));
    assert.equal((await decidingCalls(quotad)) - before, 9);
    assert.deepEqual([client.stats().checkCalls, client.stats().coalescedChecks], [8, 42]);
    await client.close();
  }
});

test("without coalescing every check is its own call", async () => {
  const client = new Client(quotad.url, { deadlineMs: 5_000, coalescing: false, denyCache: 0 });
  const before = await decidingCalls(quotad);
  assertExact(await burst(client, 50, fresh()));
  assert.equal((await decidingCalls(quotad)) - before, 50);
  await client.close();
});

test("a batch bound of 10 items sends the queue as batches of 10", async () => {
  const client = new Client(quotad.url, { deadlineMs: 5_000, coalescing: { maxInFlight: 1, maxBatchItems: 10 }, denyCache: 0 });
  const before = await decidingCalls(quotad);
  assertExact(await burst(client, 50, fresh()));
  // 1 alone, then 49 queued leave as 10 + 10 + 10 + 10 + 9, one after another on the one slot.
  assert.equal((await decidingCalls(quotad)) - before, 6);
  assert.equal(client.stats().coalescedBatches, 5);
  await client.close();
});

test("a refusal naming an item of a coalesced batch is that caller's own error; the others are decided", async () => {
  const client = new Client(quotad.url, { deadlineMs: 5_000, coalescing: { maxInFlight: 1 }, denyCache: 0 });
  const key = fresh();
  const results = await Promise.allSettled([
    client.check({ policy: TWENTY, key }),
    client.check({ policy: TWENTY, key }),
    client.check({ policy: "no-such-policy", key }),
    client.check({ policy: TWENTY, key }),
  ]);
  assert.deepEqual(
    results.map((r) => r.status),
    ["fulfilled", "fulfilled", "rejected", "fulfilled"],
  );
  const refused = results[2].reason;
  assert.deepEqual([refused.codeName, refused.field], ["NOT_FOUND", "policy_name"], refused.details);
  assert.ok(!refused.details.startsWith("items["), "without the batch's prefix");
  const remaining = results.filter((r) => r.status === "fulfilled").map((r) => r.value.remaining);
  assert.deepEqual(remaining.sort((a, b) => a - b), [17, 18, 19], "each of the others counted once");
  await client.close();
});

test("queued checks against a stalled quotad each get the failure policy within their deadline", async () => {
  const stalled = await stalledServer();
  const client = new Client(stalled.url, { coalescing: { maxInFlight: 1 }, deadlineMs: 200, onUnavailable: "fail_open" });
  try {
    const started = performance.now();
    const answers = await burst(client, 5, fresh());
    const elapsed = performance.now() - started;
    assert.deepEqual(
      answers.map((d) => d.reason),
      ["fail_open", "fail_open", "fail_open", "fail_open", "fail_open"],
    );
    assert.ok(elapsed < 500, `answered in ${elapsed.toFixed(0)} ms, the deadline is 200`);
  } finally {
    await client.close();
    await stalled.stop();
  }
});

test("coalescing settings out of range are refused naming the setting", () => {
  assert.throws(() => new Client(quotad.url, { deadlineMs: 5_000, coalescing: { maxInFlight: 0 } }), /coalescing\.max_in_flight/);
  assert.throws(() => new Client(quotad.url, { deadlineMs: 5_000, coalescing: { maxBatchItems: 1_001 } }), /coalescing\.max_batch_items/);
});
