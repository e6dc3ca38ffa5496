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
  const client = new Client(quotad.url, { leases: { want: 4 } });
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
  const after = new Client(quotad.url);
  assert.equal((await after.peek({ policy: "leased", key })).remaining, 8);
  assert.equal(client.leaseStats().returned, 1);
  assert.equal(client.leaseStats().returnedUnits, 3);
  after.close();
});

test("renewal asks for the next lease while the current one is spent on, and settles the old one with the next call", async () => {
  const client = new Client(quotad.url, { leases: { want: 4 } });
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
  const other = new Client(quotad.url);
  // 1 direct + 3 from the first lease + 1 from the second: 5 admitted, 5 left.
  assert.equal((await other.peek({ policy: "leased", key })).remaining, 5);
  other.close();
});

test("across clients with leases the global bound holds exactly, and near the end quotad answers direct", async () => {
  // Repeated, with each round's checks in flight together: lease calls and
  // direct checks of three clients interleave differently each time.
  for (let repeat = 0; repeat < 5; repeat++) {
    const key = fresh();
    const clients = [0, 1, 2].map(() => new Client(quotad.url, { leases: { want: 4, directBackoffMs: 20 } }));
    let allowed = 0;
    for (let round = 0; round < 12; round++) {
      const answers = await Promise.all(clients.flatMap((c) => [c, c].map((x) => x.check({ policy: "leased", key }))));
      allowed += answers.filter((d) => d.allowed).length;
      await new Promise((r) => setTimeout(r, 5));
    }
    assert.ok(allowed <= 10, `${allowed} admitted of a limit of 10`);
    await Promise.all(clients.map((c) => c.close()));
    const check = new Client(quotad.url);
    assert.equal((await check.peek({ policy: "leased", key })).remaining, 10 - allowed, "every unspent unit went back");
    assert.ok(clients.some((c) => c.leaseStats().direct > 0), "quotad answered direct near the end");
    check.close();
  }
});

test("a policy without lease settings is remembered: its checks go one by one, with no lease call each", async () => {
  const client = new Client(quotad.url, { leases: { want: 4 } });
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

test("an inline policy with lease terms is leased", async () => {
  const client = new Client(quotad.url, { leases: { want: 5 } });
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
  const client = new Client(quotad.url, { leases: { want: 4 }, clock: () => now });
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
