// Express and Fastify middleware against a real quotad, over real HTTP.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import express from "express";
import Fastify from "fastify";
import { Client } from "../dist/index.js";
import { rateLimit as expressRateLimit, retryAfterSecs } from "../dist/express.js";
import { rateLimit as fastifyRateLimit } from "../dist/fastify.js";
import { Limiter } from "../dist/http.js";
import { httpGet, startQuotad } from "./support.mjs";

const CONFIG = fileURLToPath(new URL("quotad.toml", import.meta.url));
let quotad;
let client;
let n = 0;
const fresh = () => `node-mw-${process.pid}-${++n}`;

before(async () => {
  quotad = await startQuotad({ config: CONFIG });
  client = new Client(quotad.url);
});
after(async () => {
  client?.close();
  await quotad?.stop();
});

const apps = {
  async express(options) {
    const app = express();
    app.get("/open", (_req, res) => res.send("open\n"));
    app.use(expressRateLimit(options));
    app.get(/.*/, (_req, res) => res.send("ok\n"));
    app.use((err, _req, res, _next) => res.status(500).send(`error: ${err.message}\n`));
    const server = app.listen(0, "127.0.0.1");
    await new Promise((r) => server.once("listening", r));
    return { port: server.address().port, stop: () => new Promise((r) => server.close(r)) };
  },
  async fastify(options) {
    const app = Fastify();
    app.setErrorHandler((err, _req, reply) => reply.code(500).send(`error: ${err.message}\n`));
    app.get("/open", async () => "open\n");
    app.get("/*", { onRequest: fastifyRateLimit(options) }, async () => "ok\n");
    await app.listen({ port: 0, host: "127.0.0.1" });
    return { port: app.server.address().port, stop: () => app.close() };
  },
};

for (const [framework, serve] of Object.entries(apps)) {
  describe(framework, () => {
    test("200s then 429 with Retry-After, RateLimit and X-RateLimit headers; unlimited routes untouched", async () => {
      const app = await serve({ client, policy: "login", key: { header: "x-api-key" }, windowSecs: 3600 });
      const key = fresh();
      try {
        for (const r of [2, 1, 0]) {
          const res = await httpGet(app.port, "/x", { "x-api-key": key });
          assert.equal(res.status, 200);
          assert.equal(res.body, "ok\n");
          assert.equal(res.headers["ratelimit-policy"], '"login";q=3;w=3600');
          assert.match(res.headers.ratelimit, new RegExp(`^"login";r=${r};t=\\d+$`));
          assert.equal(res.headers["x-ratelimit-remaining"], String(r));
          assert.equal(res.headers["retry-after"], undefined);
        }
        const denied = await httpGet(app.port, "/x", { "x-api-key": key });
        assert.equal(denied.status, 429);
        assert.equal(denied.body, "too many requests\n");
        assert.equal(denied.headers["content-type"], "text/plain; charset=utf-8");
        const retry = Number(denied.headers["retry-after"]);
        assert.ok(retry >= 1_190 && retry <= 1_201, `retry-after ${retry}`);
        assert.equal(denied.headers["x-ratelimit-limit"], "3");
        assert.equal(denied.headers["x-ratelimit-remaining"], "0");
        const open = await httpGet(app.port, "/open", {});
        assert.equal(open.status, 200);
        assert.equal(open.headers["ratelimit"], undefined);
      } finally {
        await app.stop();
      }
    });

    test("a key quotad refuses (too long) is 400; no key is 400; headers switch off", async () => {
      const app = await serve({ client, policy: "login", key: { header: "x-api-key" }, standardHeaders: false, legacyHeaders: false });
      try {
        assert.equal((await httpGet(app.port, "/x", { "x-api-key": "k".repeat(300) })).status, 400);
        const none = await httpGet(app.port, "/x", {});
        assert.equal(none.status, 400);
        assert.equal(none.body, "no rate-limit key in the request\n");
        const ok = await httpGet(app.port, "/x", { "x-api-key": fresh() });
        assert.equal(ok.status, 200);
        assert.equal(ok.headers["ratelimit"], undefined);
        assert.equal(ok.headers["x-ratelimit-limit"], undefined);
      } finally {
        await app.stop();
      }
    });

    test("a key function and a price per request", async () => {
      const key = fresh();
      const app = await serve({
        client,
        policy: "api",
        key: () => key,
        cost: (req) => ((req.url ?? "").startsWith("/search") ? 5 : 1),
      });
      try {
        assert.equal((await httpGet(app.port, "/a", {})).headers["x-ratelimit-remaining"], "4");
        const search = await httpGet(app.port, "/search", {});
        assert.equal(search.status, 429);
        assert.ok(search.headers["retry-after"] !== undefined);
      } finally {
        await app.stop();
      }
    });

    test("a handler answers the 429 instead, with the headers already set", async () => {
      const handler =
        framework === "express"
          ? (_req, res, _next, d) => res.json({ denied: d.reason, wait: d.retryAfterMs > 0 })
          : (_req, reply, d) => reply.send({ denied: d.reason, wait: d.retryAfterMs > 0 });
      const app = await serve({ client, policy: "login", key: { header: "x-api-key" }, handler });
      const key = fresh();
      try {
        for (let i = 0; i < 3; i++) assert.equal((await httpGet(app.port, "/x", { "x-api-key": key })).status, 200);
        const denied = await httpGet(app.port, "/x", { "x-api-key": key });
        assert.equal(denied.status, 429);
        assert.deepEqual(JSON.parse(denied.body), { denied: "limit_exceeded", wait: true });
        assert.match(denied.headers["content-type"], /^application\/json/);
        assert.ok(denied.headers["retry-after"] !== undefined);
        assert.equal(denied.headers["x-ratelimit-remaining"], "0");
      } finally {
        await app.stop();
      }
    });

    test("a throwing handler reaches the framework's error handler and the server keeps serving", { timeout: 10_000 }, async () => {
      const handler = () => {
        throw new Error("handler broke");
      };
      const app = await serve({ client, policy: "login", key: { header: "x-api-key" }, handler });
      const key = fresh();
      try {
        for (let i = 0; i < 3; i++) assert.equal((await httpGet(app.port, "/x", { "x-api-key": key })).status, 200);
        for (let i = 0; i < 2; i++) {
          const broken = await httpGet(app.port, "/x", { "x-api-key": key });
          assert.equal(broken.status, 500);
          assert.equal(broken.body, "error: handler broke\n");
        }
        assert.equal((await httpGet(app.port, "/x", { "x-api-key": fresh() })).status, 200);
      } finally {
        await app.stop();
      }
    });

    test("a trusted proxy's X-Forwarded-For keys each client apart", async () => {
      const app = await serve({ client, policy: "login", key: { forwardedFor: { trusted: ["127.0.0.0/8"] } } });
      const a = `198.18.${n % 250}.1`;
      const b = `198.18.${n % 250}.2`;
      n++;
      try {
        for (let i = 0; i < 3; i++) assert.equal((await httpGet(app.port, "/x", { "x-forwarded-for": `9.9.9.9, ${a}` })).status, 200);
        assert.equal((await httpGet(app.port, "/x", { "x-forwarded-for": a })).status, 429);
        assert.equal((await httpGet(app.port, "/x", { "x-forwarded-for": b })).status, 200);
      } finally {
        await app.stop();
      }
    });
  });
}

test("a peer-keyed limiter on a request without a peer address answers 500", async () => {
  const limiter = new Limiter({ client, policy: "login" });
  const outcome = await limiter.decide({ peer: undefined, rawHeaders: [] }, {});
  assert.deepEqual([outcome.pass, outcome.status, outcome.body], [false, 500, "rate limiter misconfigured\n"]);
});

test("Retry-After rounds up to whole seconds and is at least one", () => {
  assert.deepEqual([0, 1, 1_000, 1_001, 29_999].map(retryAfterSecs), [1, 1, 1, 2, 30]);
});
