// Coalescing's rules against a scripted in-process quotad, on a clock the
// test drives, as the Rust client's (crates/quotad-client/src/coalesce.rs):
// the batch-refusal back-off and its length, checks of a refused batch sent
// again alone, undecided items sent again (at most eight), the deny cache
// timed from the batch's send, abandoned batches cancelled, and closing that
// drains.
import assert from "node:assert/strict";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import { Client } from "../dist/index.js";
import { services } from "../dist/grpc.js";

const NOON = 1_000_000;
const WITHIN = { allowed: true, limit: 100, remaining: 50, retry_after_ms: 0, reset_after_ms: 0, reason: "REASON_WITHIN_LIMIT" };
const UNDECIDED = { allowed: false, limit: 0, remaining: 0, retry_after_ms: 0, reset_after_ms: 0, reason: "REASON_UNAVAILABLE" };

/** Polls (bounded) for a state the client or the fake reaches in the background. */
async function until(what, condition, ms = 5_000) {
  const end = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > end) assert.fail(`never: ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

/**
 * A quotad that records every call (["Check", key] or ["CheckBatch", "a,b"]);
 * a Check of a key in `hold` waits until the test calls its release; a
 * batch can be held (`holdBatches`), refused (`refuseBatches`), or decided
 * per item (`decideInBatch`).
 */
async function scripted(t) {
  const fake = {
    calls: [],
    cancelled: [],
    hold: new Map(),
    holdBatches: false,
    // A batch waits for `batchGate.release()` (when given), then is decided.
    batchGate: undefined,
    refuseBatches: undefined,
    decide: () => WITHIN,
    decideInBatch: undefined,
    clients: [],
  };
  const server = new grpc.Server();
  server.addService(services().Quota.service, {
    Check(call, callback) {
      fake.calls.push(["Check", call.request.key]);
      const gate = fake.hold.get(call.request.key);
      const answer = () => callback(null, { decision: fake.decide(call.request) });
      if (gate === undefined) answer();
      else gate.waiters.push(answer);
    },
    CheckBatch(call, callback) {
      const keys = call.request.items.map((i) => i.key).join(",");
      fake.calls.push(["CheckBatch", keys]);
      if (fake.holdBatches) {
        call.on("cancelled", () => fake.cancelled.push(keys));
        return;
      }
      if (fake.refuseBatches !== undefined) return callback(fake.refuseBatches);
      const decide = fake.decideInBatch ?? fake.decide;
      const answer = () => callback(null, { decisions: call.request.items.map(decide) });
      if (fake.batchGate === undefined) answer();
      else fake.batchGate.waiters.push(answer);
    },
  });
  const port = await new Promise((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))),
  );
  fake.url = `http://127.0.0.1:${port}`;
  fake.stop = () => server.forceShutdown();
  // A failed assertion must not leave the server (or a client) holding the
  // test process open.
  t.after(async () => {
    for (const gate of [...fake.hold.values()]) gate.release();
    server.forceShutdown();
    await Promise.race([Promise.all(fake.clients.map((c) => c.close())), new Promise((r) => setTimeout(r, 1_000).unref())]);
  });
  fake.since = (mark) => fake.calls.slice(mark);
  fake.holdKey = (key) => {
    const gate = { waiters: [], release: () => { fake.hold.delete(key); for (const w of gate.waiters.splice(0)) w(); } };
    fake.hold.set(key, gate);
    return gate;
  };
  return fake;
}

function clientOf(fake, clock, options = {}) {
  const client = new Client(fake.url, { deadlineMs: 5_000, denyCache: 0, coalescing: { maxInFlight: 1 }, clock: () => clock.now, ...options });
  fake.clients.push(client);
  return client;
}

/** Holds the one in-flight slot with a check quotad keeps waiting, and queues a check of each key behind it. */
async function withSlotHeld(fake, client, hold, keys) {
  const gate = fake.holdKey(hold);
  const held = client.check({ policy: "api", key: hold });
  await until(`${hold} reached quotad`, () => fake.calls.some(([m, k]) => m === "Check" && k === hold));
  const queued = keys.map((key) => client.check({ policy: "api", key }));
  await until("the checks queued", () => client.shared.coalescer.queued === keys.length);
  return { gate, held, queued };
}

const sorted = (calls) => [...calls].sort((a, b) => a.join().localeCompare(b.join()));

test("a batch refused as such sends its checks alone, and batching stops for exactly 30 s", { timeout: 20_000 }, async (t) => {
  const fake = await scripted(t);
  const clock = { now: NOON };
  const client = clientOf(fake, clock);
  fake.refuseBatches = { code: grpc.status.PERMISSION_DENIED, details: "CheckBatch: not allowed" };
  let s = await withSlotHeld(fake, client, "h1", ["a", "b", "c"]);
  s.gate.release();
  const answers = await Promise.all([s.held, ...s.queued]);
  assert.ok(answers.every((d) => d.allowed), "every check decided, alone");
  assert.deepEqual(fake.calls.slice(0, 2), [["Check", "h1"], ["CheckBatch", "a,b,c"]]);
  assert.deepEqual(sorted(fake.calls.slice(2)), [["Check", "a"], ["Check", "b"], ["Check", "c"]]);

  // Within the back-off every check goes out alone though the slot is busy.
  clock.now = NOON + 29_999;
  let mark = fake.calls.length;
  const gate = fake.holdKey("h2");
  const held = client.check({ policy: "api", key: "h2" });
  await until("h2 reached quotad", () => fake.calls.length === mark + 1);
  const alone = await Promise.all(["d", "e"].map((key) => client.check({ policy: "api", key })));
  assert.ok(alone.every((d) => d.allowed));
  gate.release();
  await held;
  assert.deepEqual(sorted(fake.since(mark)), [["Check", "d"], ["Check", "e"], ["Check", "h2"]]);

  // At 30 s the next queue leaves as a batch again.
  clock.now = NOON + 30_000;
  fake.refuseBatches = undefined;
  mark = fake.calls.length;
  s = await withSlotHeld(fake, client, "h3", ["f", "g"]);
  s.gate.release();
  await Promise.all([s.held, ...s.queued]);
  assert.deepEqual(fake.since(mark), [["Check", "h3"], ["CheckBatch", "f,g"]]);
  await client.close();
  fake.stop();
});

test("a batch refused naming an item fails that item only, re-sends the others alone, and batching goes on", { timeout: 20_000 }, async (t) => {
  const fake = await scripted(t);
  const clock = { now: NOON };
  const client = clientOf(fake, clock);
  fake.refuseBatches = { code: grpc.status.INVALID_ARGUMENT, details: "items[1].key: too long" };
  let s = await withSlotHeld(fake, client, "h1", ["a", "b", "c"]);
  s.gate.release();
  await s.held;
  const [a, b, c] = await Promise.allSettled(s.queued);
  assert.equal(b.status, "rejected");
  assert.deepEqual([b.reason.codeName, b.reason.field, b.reason.details], ["INVALID_ARGUMENT", "key", "key: too long"]);
  assert.deepEqual([a.value.allowed, c.value.allowed], [true, true]);
  assert.deepEqual(sorted(fake.calls.slice(2)), [["Check", "a"], ["Check", "c"]]);
  fake.refuseBatches = undefined;
  const mark = fake.calls.length;
  s = await withSlotHeld(fake, client, "h2", ["d", "e"]);
  s.gate.release();
  await Promise.all([s.held, ...s.queued]);
  assert.deepEqual(fake.since(mark), [["Check", "h2"], ["CheckBatch", "d,e"]], "no back-off");
  await client.close();
  fake.stop();
});

test("at most eight undecided items of a batch are sent again alone; none when quotad decided none", { timeout: 20_000 }, async (t) => {
  const fake = await scripted(t);
  const clock = { now: NOON };
  const client = clientOf(fake, clock, { onUnavailable: "fail_closed" });
  const keys = Array.from({ length: 11 }, (_, i) => `k${i}`);
  fake.decideInBatch = (item) => (item.key === "k0" ? WITHIN : UNDECIDED);
  let s = await withSlotHeld(fake, client, "h1", keys);
  s.gate.release();
  await s.held;
  let answers = await Promise.all(s.queued);
  const resent = fake.calls.slice(2).filter(([m]) => m === "Check").map(([, k]) => k);
  assert.deepEqual(resent.sort(), keys.slice(1, 9), "the first eight undecided, each alone");
  assert.ok(answers.slice(0, 9).every((d) => d.allowed));
  assert.deepEqual(answers.slice(9).map((d) => d.reason), ["fail_closed", "fail_closed"], "past the eight: the failure policy");

  fake.decideInBatch = () => UNDECIDED;
  const mark = fake.calls.length;
  s = await withSlotHeld(fake, client, "h2", ["x", "y", "z"]);
  s.gate.release();
  await s.held;
  answers = await Promise.all(s.queued);
  assert.deepEqual(answers.map((d) => d.reason), ["fail_closed", "fail_closed", "fail_closed"]);
  assert.deepEqual(fake.since(mark), [["Check", "h2"], ["CheckBatch", "x,y,z"]], "nothing sent again");
  await client.close();
  fake.stop();
});

test("undecided items whose callers left take no place among the eight sent again", { timeout: 20_000 }, async (t) => {
  const fake = await scripted(t);
  const clock = { now: NOON };
  const client = clientOf(fake, clock, { onUnavailable: "fail_closed" });
  const keys = Array.from({ length: 11 }, (_, i) => `k${i}`);
  fake.decideInBatch = (item) => (item.key === "k0" ? WITHIN : UNDECIDED);
  const batchGate = { waiters: [], release: () => { for (const w of batchGate.waiters.splice(0)) w(); } };
  fake.batchGate = batchGate;
  const gate = fake.holdKey("h1");
  const held = client.check({ policy: "api", key: "h1" });
  await until("h1 reached quotad", () => fake.calls.length === 1);
  const leave = keys.map(() => new AbortController());
  const queued = keys.map((key, i) => client.check({ policy: "api", key }, { signal: leave[i].signal }).catch((e) => e));
  await until("the checks queued", () => client.shared.coalescer.queued === keys.length);
  gate.release();
  await held;
  await until("the batch reached quotad", () => batchGate.waiters.length === 1);
  // Three callers leave while their batch is out.
  for (const c of leave.slice(1, 4)) c.abort(new Error("gone"));
  await Promise.all(queued.slice(1, 4));
  batchGate.release();
  const answers = await Promise.all([queued[0], ...queued.slice(4)]);
  const resent = fake.calls.slice(2).filter(([m]) => m === "Check").map(([, k]) => k);
  assert.deepEqual(resent.sort(), keys.slice(4).sort(), "seven undecided with callers, each alone");
  assert.ok(answers.every((d) => d.allowed), JSON.stringify(answers));
  await client.close();
  fake.stop();
});

test("a denial from a batch is cached from when the batch left, not from the enqueue", { timeout: 20_000 }, async (t) => {
  const fake = await scripted(t);
  const clock = { now: NOON };
  const client = clientOf(fake, clock, { denyCache: 100 });
  // 10 s to wait: cached for 10,000 - (1 + 10) = 9,989 ms from the send.
  const denied = { allowed: false, limit: 5, remaining: 0, retry_after_ms: 10_000, reset_after_ms: 10_000, reason: "REASON_LIMIT_EXCEEDED" };
  fake.decide = (r) => (r.key === "k" ? denied : WITHIN);
  const s = await withSlotHeld(fake, client, "h1", ["k", "other"]);
  // The checks wait 5 s in the queue before their batch leaves.
  clock.now = NOON + 5_000;
  s.gate.release();
  await s.held;
  const [k] = await Promise.all(s.queued);
  assert.deepEqual([k.allowed, k.reason], [false, "limit_exceeded"]);
  assert.deepEqual(fake.calls[1], ["CheckBatch", "k,other"]);
  const sent = NOON + 5_000;
  const calls = fake.calls.length;
  clock.now = sent + 9_988;
  const local = await client.check({ policy: "api", key: "k" });
  assert.deepEqual([local.allowed, local.reason], [false, "limit_exceeded"]);
  assert.equal(fake.calls.length, calls, "still within send + retry - margin");
  clock.now = sent + 9_989;
  await client.check({ policy: "api", key: "k" });
  assert.deepEqual(fake.since(calls), [["Check", "k"]], "the cached window ended");
  await client.close();
  fake.stop();
});

test("a batch whose callers all left is cancelled, so quotad stops working on it; one whose callers left before it went is never sent", { timeout: 20_000 }, async (t) => {
  const fake = await scripted(t);
  const clock = { now: NOON };
  const client = clientOf(fake, clock);
  fake.holdBatches = true;
  const first = [new AbortController(), new AbortController()];
  let gate = fake.holdKey("h1");
  const held = client.check({ policy: "api", key: "h1" });
  await until("h1 reached quotad", () => fake.calls.length === 1);
  const queued = ["a", "b"].map((key, i) => client.check({ policy: "api", key }, { signal: first[i].signal }).catch((e) => e));
  await until("the checks queued", () => client.shared.coalescer.queued === 2);
  gate.release();
  await held;
  await until("the batch reached quotad", () => fake.calls.length === 2);
  first[0].abort(new Error("gone"));
  // A real bound, long enough for a cancel to reach quotad, so a client that
  // cancelled here would be seen.
  await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual(fake.cancelled, [], "one caller still waits");
  first[1].abort(new Error("gone"));
  // The batch's deadline is 5 s away: only the client's cancel ends it now.
  await until("quotad saw the batch cancelled", () => fake.cancelled.length === 1, 2_000);
  assert.deepEqual(fake.cancelled, ["a,b"]);
  await Promise.all(queued);

  fake.holdBatches = false;
  const mark = fake.calls.length;
  const later = [new AbortController(), new AbortController()];
  gate = fake.holdKey("h2");
  const held2 = client.check({ policy: "api", key: "h2" });
  await until("h2 reached quotad", () => fake.calls.length === mark + 1);
  const gone = ["c", "d"].map((key, i) => client.check({ policy: "api", key }, { signal: later[i].signal }).catch((e) => e));
  await until("the checks queued", () => client.shared.coalescer.queued === 2);
  for (const c of later) c.abort(new Error("gone"));
  await Promise.all(gone);
  gate.release();
  await held2;
  assert.ok((await client.check({ policy: "api", key: "e" })).allowed);
  assert.deepEqual(fake.since(mark), [["Check", "h2"], ["Check", "e"]]);
  await client.close();
  fake.stop();
});

test("closing drains the checks in flight and queued, then refuses new ones as an unreachable quotad", { timeout: 20_000 }, async (t) => {
  const fake = await scripted(t);
  const clock = { now: NOON };
  const client = clientOf(fake, clock, { onUnavailable: "fail_closed" });
  const s = await withSlotHeld(fake, client, "h1", ["a", "b"]);
  let closed = false;
  const closing = client.close().then(() => (closed = true));
  await new Promise((r) => setImmediate(r));
  assert.equal(closed, false, "close waits for the checks it was given");
  const late = await client.check({ policy: "api", key: "late" });
  assert.deepEqual([late.allowed, late.reason], [false, "fail_closed"]);
  await assert.rejects(client.reset({ policy: "api", key: "late" }), (e) => e.codeName === "UNAVAILABLE" && /the client is closed/.test(e.message));
  s.gate.release();
  const answers = await Promise.all([s.held, ...s.queued]);
  assert.deepEqual(answers.map((d) => [d.allowed, d.reason]), Array(3).fill([true, "within_limit"]));
  await closing;
  assert.deepEqual(fake.calls, [["Check", "h1"], ["CheckBatch", "a,b"]]);
  fake.stop();
});

test("closing a client without coalescing waits for its calls in flight", { timeout: 20_000 }, async (t) => {
  const fake = await scripted(t);
  const clock = { now: NOON };
  const client = clientOf(fake, clock, { coalescing: false, onUnavailable: "fail_closed" });
  const gate = fake.holdKey("h1");
  const held = client.check({ policy: "api", key: "h1" });
  await until("h1 reached quotad", () => fake.calls.length === 1);
  let closed = false;
  const closing = client.close().then(() => (closed = true));
  await new Promise((r) => setImmediate(r));
  assert.equal(closed, false);
  assert.equal((await client.check({ policy: "api", key: "late" })).reason, "fail_closed");
  gate.release();
  assert.equal((await held).reason, "within_limit");
  await closing;
  assert.deepEqual(fake.calls, [["Check", "h1"]]);
  fake.stop();
});

test("a closed client answers closed even where its deny cache would answer", { timeout: 20_000 }, async (t) => {
  const fake = await scripted(t);
  const clock = { now: NOON };
  const denied = { allowed: false, limit: 5, remaining: 0, retry_after_ms: 10_000, reset_after_ms: 10_000, reason: "REASON_LIMIT_EXCEEDED" };
  fake.decide = () => denied;
  const client = clientOf(fake, clock, { onUnavailable: "fail_closed", denyCache: 100 });
  assert.equal((await client.check({ policy: "api", key: "k" })).reason, "limit_exceeded");
  await client.close();
  const late = await client.check({ policy: "api", key: "k" });
  assert.deepEqual([late.allowed, late.reason], [false, "fail_closed"]);
  assert.deepEqual(fake.calls, [["Check", "k"]]);
  fake.stop();
});

test("a second close settles only when the first has finished", { timeout: 20_000 }, async (t) => {
  const fake = await scripted(t);
  const clock = { now: NOON };
  const client = clientOf(fake, clock);
  const s = await withSlotHeld(fake, client, "h1", ["a"]);
  let heldDone = false;
  const held = s.held.then((d) => { heldDone = true; return d; });
  void client.close();
  let secondDone = false;
  const second = client.close().then(() => { secondDone = true; });
  // A real bound: a second close that did not wait would have settled.
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(secondDone, false, "the second close waits for the check in flight");
  s.gate.release();
  await second;
  assert.ok(heldDone, "closed only once drained");
  assert.ok((await held).allowed);
  assert.ok((await s.queued[0]).allowed);
  fake.stop();
});

test("a fault while sending a batch reaches every caller of it, none waits for ever", { timeout: 20_000 }, async (t) => {
  const fake = await scripted(t);
  const clock = { now: NOON };
  const client = clientOf(fake, clock, { onUnavailable: "fail_closed" });
  const s = await withSlotHeld(fake, client, "h1", ["a", "b"]);
  // A fault of the client's own, not of quotad's answer.
  client.shared.coalescer.sendBatch = async () => {
    throw new Error("scripted fault");
  };
  s.gate.release();
  await s.held;
  const outcomes = await Promise.race([
    Promise.allSettled(s.queued),
    new Promise((r) => setTimeout(() => r("still waiting"), 2_000).unref()),
  ]);
  assert.notEqual(outcomes, "still waiting", "every caller heard of the fault");
  assert.equal(outcomes.length, 2);
  fake.stop();
});
