// Leases against a real quotad: local spending, renewal while the old
// lease is spent on, settling, `direct`, policies without leases, and the
// global bound across clients.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { Client } from "../dist/index.js";
import { startQuotad } from "./support.mjs";

const CONFIG = fileURLToPath(new URL("quotad.toml", import.meta.url));
let quotad;
let n = 0;
const fresh = () => `node-lease-${process.pid}-${++n}`;

before(async () => {
  quotad = await startQuotad({ config: CONFIG });
});
after(async () => {
  await quotad?.stop();
});

/** Waits for a condition the client reaches in the background (a lease call's answer), at most 5 s. */
async function until(what, condition) {
  const end = Date.now() + 5_000;
  while (!condition()) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

test("the first check goes to quotad; the lease acquired then admits locally, without calls", async () => {
  const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4 } });
  const key = fresh();
  const first = await client.check({ policy: "leased", key });
  assert.equal(first.allowed, true);
  // The lease call leaves beside the check; quotad may decide either first.
  assert.ok([9, 5].includes(first.remaining), `remaining ${first.remaining}`);
  assert.equal(client.stats().checkCalls, 1);
  await until("a lease", () => client.leaseStats().acquired === 1);
  const local = await client.check({ policy: "leased", key });
  assert.deepEqual([local.allowed, local.limit, local.remaining, local.reason], [true, 10, 3, "within_limit"]);
  assert.equal(client.stats().checkCalls, 1, "no Check call");
  assert.equal(client.leaseStats().localAdmissions, 1);
  // quotad charged the lease when it granted it: 1 direct + 4 leased.
  assert.equal((await client.peek({ policy: "leased", key })).remaining, 5);
  await client.close();
  // Closing returned the 3 unspent units.
  const after = new Client(quotad.url, { deadlineMs: 2_000 });
  assert.equal((await after.peek({ policy: "leased", key })).remaining, 8);
  assert.equal(client.leaseStats().returned, 1);
  assert.equal(client.leaseStats().returnedUnits, 3);
  after.close();
});

test("renewal asks for the next lease while the current one is spent on, and settles the old one with the next call", async () => {
  const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4 } });
  const key = fresh();
  await client.check({ policy: "leased", key });
  await until("a lease", () => client.leaseStats().acquired === 1);
  // Spend 2 of 4: half spent starts a renewal; the lease held still admits meanwhile.
  await client.check({ policy: "leased", key });
  await client.check({ policy: "leased", key });
  const meanwhile = await client.check({ policy: "leased", key });
  assert.equal(meanwhile.reason, "within_limit");
  await until("a renewal", () => client.leaseStats().renewed === 1);
  const s = client.leaseStats();
  assert.equal(s.localAdmissions, 3);
  assert.equal(client.stats().checkCalls, 1);
  // The new lease is spent from now; the old one (3 of 4 spent) is settled
  // with the next lease call or at close, never while it could be spent.
  // (quotad grants a fair share of what is left, so its size is quotad's.)
  const fromNew = await client.check({ policy: "leased", key });
  assert.equal(fromNew.reason, "within_limit");
  assert.equal(client.stats().checkCalls, 1, "spent from the new lease");
  await client.close();
  const other = new Client(quotad.url, { deadlineMs: 2_000 });
  // 1 direct + 3 from the first lease + 1 from the second: 5 admitted, 5 left.
  assert.equal((await other.peek({ policy: "leased", key })).remaining, 5);
  other.close();
});

test("across clients with leases the global bound holds exactly, and near the end quotad answers direct", async () => {
  // Repeated, with each round's checks in flight together: lease calls and
  // direct checks of three clients interleave differently each time.
  for (let repeat = 0; repeat < 5; repeat++) {
    const key = fresh();
    const clients = [0, 1, 2].map(() => new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4, directBackoffMs: 20 } }));
    let allowed = 0;
    for (let round = 0; round < 12; round++) {
      const answers = await Promise.all(clients.flatMap((c) => [c, c].map((x) => x.check({ policy: "leased", key }))));
      allowed += answers.filter((d) => d.allowed).length;
      await new Promise((r) => setTimeout(r, 5));
    }
    assert.ok(allowed <= 10, `${allowed} admitted of a limit of 10`);
    await Promise.all(clients.map((c) => c.close()));
    const check = new Client(quotad.url, { deadlineMs: 2_000 });
    assert.equal((await check.peek({ policy: "leased", key })).remaining, 10 - allowed, "every unspent unit went back");
    assert.ok(clients.some((c) => c.leaseStats().direct > 0), "quotad answered direct near the end");
    check.close();
  }
});

test("a policy without lease settings is remembered: its checks go one by one, with no lease call each", async () => {
  const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4 } });
  await client.check({ policy: "login", key: fresh() });
  await until("the refusal", () => client.leaseStats().notLeasable === 1);
  for (let i = 0; i < 3; i++) await client.check({ policy: "login", key: fresh() });
  assert.equal(client.stats().leaseCalls, 1);
  assert.equal(client.stats().checkCalls, 4);
  // An inline policy without terms is never leased.
  await client.check({ policy: { algorithm: "fixed_window", limit: 5, windowMs: 60_000 }, key: fresh() });
  assert.equal(client.stats().leaseCalls, 1);
  await client.close();
});

test("a policy quotad will not lease is not asked for again for exactly 60 s, on the client's clock", { timeout: 20_000 }, async (t) => {
  let now = 1_000_000;
  const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4 }, clock: () => now });
  t.after(() => client.close());
  await client.check({ policy: "login", key: fresh() });
  await until("the refusal", () => client.leaseStats().notLeasable === 1);
  // A lease call starts within the check that asks for it, so the count
  // after the check says whether one was asked for.
  now += 59_999;
  await client.check({ policy: "login", key: fresh() });
  assert.equal(client.stats().leaseCalls, 1, "no key of the policy asked for within 60 s");
  now += 1;
  await client.check({ policy: "login", key: fresh() });
  assert.equal(client.stats().leaseCalls, 2, "asked again at 60 s");
  await until("refused again", () => client.leaseStats().notLeasable === 2);
  await client.close();
});

test("an inline policy with lease terms is leased", async () => {
  const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 5 } });
  const key = fresh();
  const policy = { algorithm: "token_bucket", limit: 20, windowMs: 3_600_000 };
  const leaseTerms = { maxUnits: 5, minUnits: 1, maxTtlMs: 10_000 };
  await client.check({ policy, key, leaseTerms });
  await until("a lease", () => client.leaseStats().acquired === 1);
  assert.equal((await client.check({ policy, key, leaseTerms })).remaining, 4);
  assert.equal(client.stats().checkCalls, 1);
  await client.close();
});

test("a lease is never spent past its end: with a fake clock past send + ttl, checks go to quotad again", async () => {
  let now = 1_000_000;
  const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4 }, clock: () => now });
  const key = fresh();
  await client.check({ policy: "leased", key });
  await until("a lease", () => client.leaseStats().acquired === 1);
  await client.check({ policy: "leased", key });
  assert.equal(client.stats().checkCalls, 1);
  // 10 s TTL: the lease ends at send + 10,000 - 10 - 5.
  now += 9_985;
  await client.check({ policy: "leased", key });
  assert.equal(client.stats().checkCalls, 2, "the lease had ended");
  await client.close();
});

test("a lease is renewed at half its TTL though little of it was spent", async () => {
  let now = 1_000_000;
  const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4 }, clock: () => now });
  const key = fresh();
  await client.check({ policy: "leased", key });
  await until("a lease", () => client.leaseStats().acquired === 1);
  await client.check({ policy: "leased", key });
  assert.equal(client.stats().leaseCalls, 1, "1 of 4 spent: no renewal yet");
  // Half the 10 s TTL later (send time + 5,000), a spend starts the renewal.
  now += 5_000;
  const d = await client.check({ policy: "leased", key });
  assert.equal(d.reason, "within_limit");
  await until("a renewal", () => client.leaseStats().renewed === 1);
  assert.equal(client.stats().checkCalls, 1, "both spends were local");
  await client.close();
});

test("a check of cost 0 goes to quotad (and is refused) even with a lease held", async () => {
  const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4 } });
  const key = fresh();
  await client.check({ policy: "leased", key });
  await until("a lease", () => client.leaseStats().acquired === 1);
  await assert.rejects(client.check({ policy: "leased", key, cost: 0 }), (e) => e.codeName === "INVALID_ARGUMENT" && e.field === "cost");
  assert.equal(client.stats().checkCalls, 2);
  assert.equal(client.leaseStats().localAdmissions, 0, "nothing admitted for nothing");
  await client.close();
});

test("a refusal naming the key stops leasing for that key only: the policy's other keys keep leasing", async () => {
  const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4 } });
  // Longer than quotad's store.max_key_bytes (256): the check and its lease call are refused, naming `key`.
  const bad = `${fresh()}-${"x".repeat(300)}`;
  await assert.rejects(client.check({ policy: "leased", key: bad }), (e) => e.field === "key");
  await until("the key's lease refused", () => client.leaseStats().failed === 1);
  assert.equal(client.leaseStats().notLeasable, 0, "the key, not the policy");
  const key = fresh();
  await client.check({ policy: "leased", key });
  await until("the other key holds a lease", () => client.leaseStats().acquired === 1);
  const local = await client.check({ policy: "leased", key });
  assert.equal(local.reason, "within_limit");
  assert.equal(client.stats().checkCalls, 2, "the good key's second check was local");
  // The refused key is not asked for again within the recheck.
  await assert.rejects(client.check({ policy: "leased", key: bad }));
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(client.stats().leaseCalls, 2);
  await client.close();
});

test("a refused key is not asked for again for exactly 60 s, on the client's clock, while other keys lease", { timeout: 20_000 }, async (t) => {
  let now = 1_000_000;
  const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4 }, clock: () => now });
  t.after(() => client.close());
  const bad = `${fresh()}-${"x".repeat(300)}`;
  await assert.rejects(client.check({ policy: "leased", key: bad }), (e) => e.field === "key");
  await until("the key's lease refused", () => client.leaseStats().failed === 1);
  assert.equal(client.stats().leaseCalls, 1);
  // A lease call starts within the check that asks for it, so the count
  // after the check says whether one was asked for.
  now += 59_999;
  await assert.rejects(client.check({ policy: "leased", key: bad }));
  assert.equal(client.stats().leaseCalls, 1, "not asked again within 60 s");
  const key = fresh();
  await client.check({ policy: "leased", key });
  assert.equal(client.stats().leaseCalls, 2, "another key leases meanwhile");
  await until("the other key holds a lease", () => client.leaseStats().acquired === 1);
  now += 1;
  await assert.rejects(client.check({ policy: "leased", key: bad }));
  assert.equal(client.stats().leaseCalls, 3, "asked again at 60 s");
  await until("refused again", () => client.leaseStats().failed === 2);
  await client.close();
});

test("many concurrent checks of one key admit exactly the lease's units locally", async () => {
  for (let repeat = 0; repeat < 5; repeat++) {
    const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4 } });
    const key = fresh();
    await client.check({ policy: "leased", key });
    await until("a lease", () => client.leaseStats().acquired === 1);
    // Checks sent to quotad: alone, or coalesced into a batch.
    const sent = () => client.stats().checkCalls + client.stats().coalescedChecks;
    const before = sent();
    const answers = await Promise.all(Array.from({ length: 30 }, () => client.check({ policy: "leased", key })));
    const local = client.leaseStats().localAdmissions;
    assert.equal(answers.length - (sent() - before), local, "each check local or sent, never both");
    assert.ok(answers.filter((d) => d.allowed).length <= 9, "never more than the 9 left after the first");
    await client.close();
    const other = new Client(quotad.url, { deadlineMs: 2_000 });
    const admitted = 1 + answers.filter((d) => d.allowed).length;
    assert.equal((await other.peek({ policy: "leased", key })).remaining, 10 - admitted, "every unspent unit went back");
    other.close();
  }
});

test("while quotad is unreachable a lease is spent to its end, then the failure policy answers", async () => {
  const own = await startQuotad({ config: CONFIG });
  const client = new Client(own.url, { leases: { want: 4 }, onUnavailable: "fail_closed", deadlineMs: 300 });
  const key = fresh();
  try {
    await client.check({ policy: "leased", key });
    await until("a lease", () => client.leaseStats().acquired === 1);
    process.kill(own.pid, "SIGSTOP");
    // The lease's 4 units were charged: spent locally with quotad stopped.
    const held = [];
    for (let i = 0; i < 4; i++) held.push(await client.check({ policy: "leased", key }));
    assert.deepEqual(held.map((d) => d.reason), ["within_limit", "within_limit", "within_limit", "within_limit"]);
    const after = await client.check({ policy: "leased", key });
    assert.deepEqual([after.allowed, after.reason], [false, "fail_closed"]);
  } finally {
    process.kill(own.pid, "SIGCONT");
    await client.close();
    await own.stop();
  }
});

test("a lease that arrives too late to spend goes straight back", async () => {
  // The client's clock jumps 20 s once the lease call has left: its answer
  // arrives after the lease's 10 s TTL, counted from the send.
  let client;
  const now = 1_000_000;
  client = new Client(quotad.url, {
    deadlineMs: 2_000,
    leases: { want: 4 },
    clock: () => (client !== undefined && client.stats().leaseCalls >= 1 ? now + 20_000 : now),
  });
  const key = fresh();
  assert.equal((await client.check({ policy: "leased", key })).allowed, true);
  await until("the lease given back", () => client.leaseStats().returned === 1);
  const s = client.leaseStats();
  assert.deepEqual([s.acquired, s.held, s.returnedUnits], [0, 0, 4], "never installed, all 4 units back");
  const other = new Client(quotad.url, { deadlineMs: 2_000 });
  assert.equal((await other.peek({ policy: "leased", key })).remaining, 9, "only the direct check counted");
  await Promise.all([client.close(), other.close()]);
});

test("a direct answer sends each check to quotad until the back-off ends, then asks again", async () => {
  let now = 1_000_000;
  const client = new Client(quotad.url, { deadlineMs: 2_000, leases: { want: 4, directBackoffMs: 1_000 }, clock: () => now });
  const key = fresh();
  // `scarce`: two an hour, leases of at least three: never enough to lease.
  assert.equal((await client.check({ policy: "scarce", key })).allowed, true);
  await until("direct", () => client.leaseStats().direct === 1);
  const second = await client.check({ policy: "scarce", key });
  assert.deepEqual([second.allowed, second.remaining], [true, 0], "decided by quotad");
  assert.equal(client.stats().leaseCalls, 1, "no lease call within the back-off");
  now += 999;
  await client.check({ policy: "scarce", key });
  assert.equal(client.stats().leaseCalls, 1, "still within it");
  now += 1;
  await client.check({ policy: "scarce", key });
  await until("asked again", () => client.stats().leaseCalls === 2 && client.leaseStats().direct === 2);
  assert.equal(client.leaseStats().held, 0);
  await client.close();
});
