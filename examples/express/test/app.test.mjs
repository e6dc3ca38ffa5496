// Drives real HTTP requests through the example app, against a real quotad
// started with the example configuration: 200s, then 429s with the headers.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { request } from "node:http";
import { join, resolve } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { Client } from "@quotad/client";
import { createApp } from "../app.mjs";

const REPO = resolve(fileURLToPath(new URL(".", import.meta.url)), "..", "..", "..");
let quotad;
let server;
let client;

function startQuotad() {
  const bin = process.env.QUOTAD_BIN ?? join(REPO, "target", "debug", "quotad");
  const child = spawn(
    bin,
    ["serve", "--config", join(REPO, "config", "quotad.example.toml"), "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--config-poll-interval", "0s"],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  let log = "";
  return new Promise((ok, fail) => {
    child.on("error", fail);
    child.once("exit", (code) => fail(new Error(`quotad exited with ${code}:\n${log}`)));
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (c) => {
      log += c;
      const m = /quotad serving grpc_addr=([0-9.]+:\d+)/.exec(log.replace(/\x1b\[[0-9;]*m/g, ""));
      if (m) ok({ addr: m[1], child });
    });
  });
}

function get(path, headers) {
  return new Promise((ok, fail) => {
    const req = request({ host: "127.0.0.1", port: server.address().port, path, headers, agent: false }, (res) => {
      let body = "";
      res.on("data", (c) => (body += c));
      res.on("end", () => ok({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on("error", fail);
    req.end();
  });
}

before(async () => {
  quotad = await startQuotad();
  client = new Client(`http://${quotad.addr}`, { deadlineMs: 1_000 });
  server = createApp(client).listen(0, "127.0.0.1");
  await new Promise((r) => server.once("listening", r));
});
after(async () => {
  client?.close();
  await new Promise((r) => (server ? server.close(r) : r()));
  if (quotad) {
    const exited = new Promise((r) => quotad.child.once("exit", r));
    quotad.child.kill("SIGTERM");
    await exited;
  }
});

test("the limited route answers 200 five times, then 429 with Retry-After and the RateLimit headers", async () => {
  const key = `example-${process.pid}`;
  // The example's `login` is a fixed window aligned to the UTC minute: start
  // well inside one, so that all seven requests count in the same window.
  const left = 60_000 - (Date.now() % 60_000);
  if (left < 3_000) await new Promise((r) => setTimeout(r, left + 50));
  for (let remaining = 4; remaining >= 0; remaining--) {
    const res = await get("/api/limited", { "x-api-key": key });
    assert.equal(res.status, 200);
    assert.equal(res.body, "ok\n");
    assert.equal(res.headers["ratelimit-policy"], '"login";q=5;w=60');
    assert.match(res.headers.ratelimit, new RegExp(`^"login";r=${remaining};t=\\d+$`));
    assert.equal(res.headers["x-ratelimit-limit"], "5");
    assert.equal(res.headers["x-ratelimit-remaining"], String(remaining));
    assert.equal(res.headers["retry-after"], undefined);
  }
  for (let i = 0; i < 2; i++) {
    const res = await get("/api/limited", { "x-api-key": key });
    assert.equal(res.status, 429);
    const retry = Number(res.headers["retry-after"]);
    // A fixed one-minute window: the wait is to the next UTC minute.
    assert.ok(retry >= 1 && retry <= 61, `retry-after ${retry}`);
    assert.match(res.headers.ratelimit, /^"login";r=0;t=\d+$/);
    assert.equal(res.headers["x-ratelimit-remaining"], "0");
    assert.ok(Number(res.headers["x-ratelimit-reset"]) >= retry - 1);
  }
  const other = await get("/api/limited", { "x-api-key": `${key}-other` });
  assert.equal(other.status, 200, "another key has its own budget");
  const open = await get("/api/demo", {});
  assert.equal(open.status, 200);
  assert.equal(open.headers["ratelimit"], undefined);
  assert.equal((await get("/api/limited", {})).status, 400, "no key");
});
