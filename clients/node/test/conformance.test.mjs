// The Node driver of the shared conformance suite (tests/clients/): every
// case runs through this package's Client (and, for `http` cases, its
// Express and Fastify middleware) against a real quotad, a closed port or a
// stalled one; a decision, error or header that differs fails the case by name.
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { before, describe, test } from "node:test";
import express from "express";
import Fastify from "fastify";
import { Client, QuotadError } from "../dist/index.js";
import { rateLimit as expressRateLimit } from "../dist/express.js";
import { rateLimit as fastifyRateLimit } from "../dist/fastify.js";
import { REPO, closedPort, httpGet, listen, stalledServer, startQuotad } from "./support.mjs";

const DIR = process.env.QUOTAD_CONFORMANCE_DIR ?? join(REPO, "tests", "clients");
const CASES = join(DIR, "cases.json");

/** The units a leasing client of a case asks for (tests/clients/README.md). */
const LEASE_WANT = 4;

/** A number expected exactly or as `{min, max}`. */
function expectNumber(actual, expected, what) {
  if (typeof expected === "object" && expected !== null) {
    assert.ok(
      actual >= (expected.min ?? -Infinity) && actual <= (expected.max ?? Infinity),
      `${what}: ${actual} is outside [${expected.min}, ${expected.max}]`,
    );
  } else {
    assert.equal(actual, expected, `${what}`);
  }
}

const reasonName = (r) => String(r).toUpperCase().replace(/^REASON_/, "");

function expectDecision(d, expect, what) {
  for (const [field, prop] of [
    ["allowed", "allowed"],
    ["limit", "limit"],
    ["remaining", "remaining"],
    ["retry_after_ms", "retryAfterMs"],
    ["reset_after_ms", "resetAfterMs"],
  ]) {
    if (field in expect) {
      if (field === "allowed") assert.equal(d.allowed, expect.allowed, `${what}: allowed`);
      else expectNumber(d[prop], expect[field], `${what}: ${field}`);
    }
  }
  if ("reason" in expect) assert.equal(reasonName(d.reason), reasonName(expect.reason), `${what}: reason`);
}

function policyOf(p) {
  if (p === undefined) return undefined;
  if ("name" in p) return p.name;
  const i = p.inline;
  return { algorithm: i.algorithm, limit: i.limit, windowMs: i.window_ms, burst: i.burst ?? null };
}

/** The lease stats an await_leases step can wait for. */
const LEASE_STATS = ["acquired", "renewed", "not_leasable", "failed", "held"];

/** Fails on a field this driver does not know: a case it cannot run must fail it, never be skipped. */
function known(object, fields, what) {
  for (const field of Object.keys(object ?? {})) {
    assert.ok(fields.includes(field), `${what}: unknown field ${JSON.stringify(field)} (this driver knows ${fields.join(", ")})`);
  }
}

function checkFields(c) {
  known(c, ["name", "server", "client", "steps", "http"], c.name);
  known(c.client, ["deadline_ms", "on_unavailable", "deny_cache", "leases"], `${c.name}: client`);
  for (const [i, step] of (c.steps ?? []).entries()) {
    const at = `${c.name}: step ${i}`;
    known(step, ["call", "key", "cost", "policy", "items", "mode", "via", "ms", "repeat", "pause_ms", "concurrently", "expect", "within_ms"], at);
    known(step.policy, ["name", "inline"], `${at}: policy`);
    known(step.policy?.inline, ["algorithm", "limit", "window_ms", "burst"], `${at}: policy.inline`);
    for (const item of step.items ?? []) known(item, ["key", "cost", "policy"], `${at}: item`);
    const decision = ["allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "reason"];
    known(step.expect, [...decision, "decisions", "ok", "error", "within_ms", "allowed_total", ...LEASE_STATS], `${at}: expect`);
    for (const d of step.expect?.decisions ?? []) known(d, decision, `${at}: expect.decisions`);
    known(step.expect?.error, ["code", "message_contains", "field"], `${at}: expect.error`);
    if (step.via !== undefined) assert.ok(["other", "peer", "both"].includes(step.via), `${at}: via ${step.via}`);
  }
  if (c.http !== undefined) {
    known(c.http, ["policy", "key", "cost", "requests", "window_secs"], `${c.name}: http`);
    known(c.http.key, ["header", "peer_ip", "forwarded_for"], `${c.name}: http.key`);
    for (const r of c.http.requests) {
      known(r, ["path", "headers", "expect_status", "expect_headers"], `${c.name}: http request`);
      for (const [name, e] of Object.entries(r.expect_headers ?? {})) {
        if (typeof e === "object") known(e, ["prefix", "params", "min", "max"], `${c.name}: expect_headers.${name}`);
      }
    }
  }
}

function clientFor(target, c) {
  return new Client(target.url, {
    deadlineMs: c.deadline_ms,
    onUnavailable: c.on_unavailable,
    denyCache: c.deny_cache === false ? 0 : undefined,
    ...(c.leases ? { leases: { want: LEASE_WANT } } : {}),
  });
}

/** The clients a step goes through: the one under test, `other`, its `peer`, or both. */
function targets(step, ctx) {
  if (step.via === "other") return [ctx.other];
  if (step.via === "peer") return [ctx.peer];
  if (step.via === "both") return [ctx.client, ctx.peer];
  return [ctx.client];
}

async function runStep(step, client, ctx, what) {
  const expect = step.expect ?? {};
  const k = (key) => (key === "" ? "" : `${ctx.prefix}${key}`);
  const started = performance.now();
  let result;
  let error;
  try {
    switch (step.call) {
      case "sleep":
        await new Promise((r) => setTimeout(r, step.ms));
        return;
      case "await_leases": {
        // Polls the lease stats until every value the step names is reached
        // (a background lease call has landed), for at most within_ms.
        const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
        const reached = () => Object.entries(step.expect).every(([name, v]) => client.leaseStats()[camel(name)] === v);
        while (!reached()) {
          if (performance.now() - started > step.within_ms) {
            assert.fail(`${what}: lease stats ${JSON.stringify(client.leaseStats())} after ${step.within_ms} ms, expected ${JSON.stringify(step.expect)}`);
          }
          await new Promise((r) => setTimeout(r, 2));
        }
        return;
      }
      case "check":
        result = await client.check({ key: k(step.key), policy: policyOf(step.policy), cost: step.cost });
        break;
      case "peek":
        result = await client.peek({ key: k(step.key), policy: policyOf(step.policy), cost: step.cost });
        break;
      case "reset":
        await client.reset({ key: k(step.key), policy: policyOf(step.policy) });
        result = { ok: true };
        break;
      case "check_batch":
        result = await client.checkBatch(
          step.items.map((i) => ({ key: k(i.key), policy: policyOf(i.policy), cost: i.cost })),
          { mode: step.mode ?? "independent" },
        );
        break;
      case "close":
        await client.close();
        return;
      default:
        throw new Error(`unknown call ${step.call}`);
    }
  } catch (e) {
    if (!(e instanceof QuotadError)) throw e;
    error = e;
  }
  const elapsed = performance.now() - started;
  if (expect.within_ms !== undefined) {
    assert.ok(elapsed <= expect.within_ms, `${what}: answered in ${elapsed.toFixed(0)} ms, more than ${expect.within_ms}`);
  }
  if (expect.error !== undefined) {
    assert.ok(error !== undefined, `${what}: expected ${expect.error.code}, got ${JSON.stringify(result)}`);
    // UNAVAILABLE names the failure (Rust's `Error::Unavailable`): quotad not
    // reached in time, whether the status says UNAVAILABLE or DEADLINE_EXCEEDED.
    const code = expect.error.code === "UNAVAILABLE" && error.kind === "unavailable" ? "UNAVAILABLE" : error.codeName;
    assert.equal(code, expect.error.code, `${what}: code (${error.message})`);
    if (expect.error.message_contains !== undefined) {
      assert.ok(error.details.includes(expect.error.message_contains), `${what}: message ${JSON.stringify(error.details)}`);
    }
    if (expect.error.field !== undefined) {
      assert.equal(error.field, expect.error.field, `${what}: field (${error.details})`);
    }
    return;
  }
  if (error !== undefined) throw new assert.AssertionError({ message: `${what}: unexpected error ${error.message}` });
  if (step.call === "check" && result.allowed) ctx.allowedTotal += 1;
  if (expect.ok !== undefined) assert.deepEqual(result, { ok: true }, `${what}: ok`);
  if (expect.decisions !== undefined) {
    assert.equal(result.length, expect.decisions.length, `${what}: decisions`);
    expect.decisions.forEach((e, i) => expectDecision(result[i], e, `${what}: decisions[${i}]`));
  } else if (step.call !== "reset") {
    expectDecision(result, expect, what);
  }
}

function expectHeader(actual, expected, what) {
  if (expected === "absent") return assert.equal(actual, undefined, `${what}: absent`);
  assert.notEqual(actual, undefined, `${what}: missing`);
  if (expected === "present") return;
  if (typeof expected === "string") return assert.equal(actual, expected, what);
  if ("prefix" in expected || "params" in expected) {
    assert.ok(actual.startsWith(expected.prefix ?? ""), `${what}: ${actual} does not start with ${expected.prefix}`);
    // The whole-number parameters of a structured field such as `"login";r=2;t=1200`.
    const params = Object.fromEntries(
      actual
        .split(";")
        .slice(1)
        .map((p) => p.trim().split("="))
        .filter(([, v]) => /^\d+$/.test(v ?? "")),
    );
    for (const [name, want] of Object.entries(expected.params ?? {})) {
      assert.ok(name in params, `${what}: no parameter ${name} in ${actual}`);
      expectNumber(Number(params[name]), want, `${what}: parameter ${name} of ${actual}`);
    }
    return;
  }
  expectNumber(Number(actual), expected, what);
}

function keySource(key) {
  if (key === undefined || key.peer_ip) return "peer_ip";
  if (key.header !== undefined) return { header: key.header };
  if (key.forwarded_for !== undefined) return { forwardedFor: { trusted: key.forwarded_for.trusted } };
  throw new Error(`unknown http key ${JSON.stringify(key)}`);
}

/** Serves one `ok` route behind the framework's middleware; resolves with its port and a stop. */
async function serve(framework, options) {
  if (framework === "express") {
    const app = express();
    app.use(expressRateLimit(options));
    app.get(/.*/, (_req, res) => res.send("ok\n"));
    const server = app.listen(0, "127.0.0.1");
    await new Promise((r) => server.once("listening", r));
    return { port: server.address().port, stop: () => new Promise((r) => server.close(r)) };
  }
  const app = Fastify();
  app.addHook("onRequest", fastifyRateLimit(options));
  app.get("/*", async () => "ok\n");
  await app.listen({ port: 0, host: "127.0.0.1" });
  return { port: app.server.address().port, stop: () => app.close() };
}

async function runHttp(spec, ctx, framework, what) {
  const options = {
    client: ctx.client,
    policy: spec.policy,
    key: keySource(spec.key),
    ...(spec.cost !== undefined ? { cost: () => spec.cost } : {}),
    ...(spec.window_secs !== undefined ? { windowSecs: spec.window_secs } : {}),
  };
  const app = await serve(framework, options);
  try {
    for (const [i, r] of spec.requests.entries()) {
      const headers = { ...r.headers };
      // Keys from a header are prefixed like every other key; addresses are not keys the driver chooses.
      if (spec.key?.header !== undefined && headers[spec.key.header]) {
        headers[spec.key.header] = `${ctx.prefix}${headers[spec.key.header]}`;
      }
      const res = await httpGet(app.port, r.path ?? "/", headers);
      const at = `${what}: request ${i}`;
      assert.equal(res.status, r.expect_status, `${at}: status (${res.body.trim()})`);
      for (const [name, expected] of Object.entries(r.expect_headers ?? {})) {
        expectHeader(res.headers[name.toLowerCase()], expected, `${at}: ${name}`);
      }
    }
  } finally {
    await app.stop();
  }
}

// In this repository the suite is always there: a missing tests/clients/
// fails, never skips. Only a copy of the client outside the repository
// (QUOTAD_CONFORMANCE_DIR unset and no ../../tests) runs without it.
const inRepo = existsSync(join(REPO, "Cargo.toml")) && existsSync(join(REPO, "crates", "quotad-client"));
const present = existsSync(DIR);
if (!present && (inRepo || process.env.QUOTAD_CONFORMANCE_DIR !== undefined)) {
  throw new Error(`no ${DIR}: the shared conformance suite (tests/clients/) is missing`);
}
const file = present ? JSON.parse(readFileSync(CASES, "utf8")) : { version: 1, cases: [] };
const run = `node-${process.pid}-${Date.now()}-`;

describe(
  "conformance (tests/clients/cases.json)",
  { skip: present ? false : `no ${DIR}: the shared conformance suite is not in this tree` },
  () => {
    const config = join(DIR, "quotad.toml");
    before(() => assert.equal(file.version, 1, "cases.json version"));

    file.cases.forEach((c, index) => {
      for (const framework of c.http !== undefined ? ["express", "fastify"] : ["express"]) {
        const name = c.http !== undefined ? `${c.name} [${framework}]` : c.name;
        test(name, async () => {
          checkFields(c);
          // One server per case, as the other drivers do: no state is shared between cases.
          const servers = { real: () => startQuotad({ config }), closed: closedPort, stalled: stalledServer };
          assert.ok(c.server in servers, `${c.name}: unknown server ${c.server}`);
          const target = await servers[c.server]();
          const ctx = {
            prefix: `${run}${index}-`,
            client: clientFor(target, c.client ?? {}),
            // Another replica of the application, set up as the client under test.
            peer: clientFor(target, c.client ?? {}),
            // Checks allowed so far in the case, by every client.
            allowedTotal: 0,
            // A change made elsewhere: a second client, 2 s deadline, no deny cache.
            other: new Client(target.url, { deadlineMs: 2_000, denyCache: 0 }),
          };
          try {
            for (const [i, step] of c.steps.entries()) {
              const at = (n) => `${c.name}: step ${i} (${step.call}${step.repeat ? ` #${n + 1}` : ""})`;
              if (step.concurrently) {
                // Concurrent callers of one client: every repeat through every target at once.
                const calls = [];
                for (let n = 0; n < (step.repeat ?? 1); n++) {
                  for (const client of targets(step, ctx)) calls.push(runStep(step, client, ctx, at(n)));
                }
                await Promise.all(calls);
              } else {
                for (let n = 0; n < (step.repeat ?? 1); n++) {
                  if (n > 0 && step.pause_ms !== undefined) await new Promise((r) => setTimeout(r, step.pause_ms));
                  for (const client of targets(step, ctx)) await runStep(step, client, ctx, at(n));
                }
              }
              if (step.expect?.allowed_total !== undefined) {
                expectNumber(ctx.allowedTotal, step.expect.allowed_total, `${c.name}: step ${i}: checks allowed so far`);
              }
            }
            if (c.http !== undefined) await runHttp(c.http, ctx, framework, c.name);
          } finally {
            await Promise.all([ctx.client.close(), ctx.peer.close(), ctx.other.close()]);
            await target.stop();
          }
        });
      }
    });
  },
);
