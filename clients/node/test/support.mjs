// Real servers for the tests: a quotad binary on a free loopback port, a
// port with nothing listening, and a listener that accepts and never answers.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
/** The repository's root (clients/node/test/../../..). */
export const REPO = resolve(here, "..", "..", "..");

/** The quotad binary: $QUOTAD_BIN, else the workspace's debug build. */
export function quotadBinary() {
  const bin = process.env.QUOTAD_BIN ?? join(REPO, "target", "debug", "quotad");
  if (!existsSync(bin)) {
    throw new Error(`quotad binary not found at ${bin}: run \`cargo build --bin quotad\` or set QUOTAD_BIN`);
  }
  return bin;
}

/**
 * Starts quotad on 127.0.0.1:0 (and its admin port on another free port)
 * and resolves once it serves, with the address it bound.
 */
export function startQuotad({ config, args = [], grpcAddr = "127.0.0.1:0" } = {}) {
  const argv = ["serve", "--grpc-addr", grpcAddr, "--admin-addr", "127.0.0.1:0", "--config-poll-interval", "0s"];
  if (config !== undefined) argv.push("--config", config);
  argv.push(...args);
  // As the other drivers: no QUOTAD_* setting from the caller's shell
  // changes the server, and the startup line the address is read from is
  // logged whatever RUST_LOG says.
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith("QUOTAD_")));
  env.RUST_LOG = "info";
  const child = spawn(quotadBinary(), argv, { stdio: ["ignore", "ignore", "pipe"], env });
  let log = "";
  return new Promise((resolvePromise, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`quotad did not start within 30 s:\n${log}`));
    }, 30_000);
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk) => {
      log += chunk;
      // eslint-disable-next-line no-control-regex
      const m = /quotad serving grpc_addr=(?:\x1b\[[0-9;]*m)*([0-9.]+:\d+)/.exec(log.replace(/\x1b\[[0-9;]*m/g, ""));
      if (m !== null) {
        clearTimeout(timer);
        const admin = /admin_addr=([0-9.]+:\d+)/.exec(log.replace(/\x1b\[[0-9;]*m/g, ""));
        resolvePromise({
          addr: m[1],
          adminAddr: admin?.[1],
          url: `http://${m[1]}`,
          pid: child.pid,
          log: () => log,
          stop: () =>
            new Promise((done) => {
              if (child.exitCode !== null) return done();
              child.once("exit", () => done());
              child.kill("SIGTERM");
            }),
        });
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`quotad exited with ${code} before serving:\n${log}`));
    });
  });
}

/**
 * A loopback port with nothing listening on it, held for the test: a socket
 * bound and never listened on, so connecting is refused and no other process
 * can take the port meanwhile. Node's net module cannot bind without
 * listening (and a listener would accept: that is the stalled server), so a
 * small python3 process (a prerequisite of scripts/test.sh) holds the socket
 * until stop().
 */
export async function closedPort() {
  const holder = spawn(
    "python3",
    ["-c", "import socket,sys\ns=socket.socket()\ns.bind(('127.0.0.1',0))\nprint(s.getsockname()[1],flush=True)\nsys.stdin.read()"],
    { stdio: ["pipe", "pipe", "inherit"] },
  );
  const port = await new Promise((resolvePromise, reject) => {
    let out = "";
    holder.stdout.setEncoding("utf8");
    holder.stdout.on("data", (chunk) => {
      out += chunk;
      if (out.includes("\n")) resolvePromise(Number(out.trim()));
    });
    holder.once("error", reject);
    holder.once("exit", (code) => reject(new Error(`the port holder (python3) exited with ${code}`)));
  });
  return {
    addr: `127.0.0.1:${port}`,
    url: `http://127.0.0.1:${port}`,
    stop: () =>
      new Promise((done) => {
        if (holder.exitCode !== null) return done();
        holder.once("exit", () => done());
        holder.stdin.end();
      }),
  };
}

/** A loopback listener that accepts connections and never answers (not even the HTTP/2 preface). */
export async function stalledServer() {
  const sockets = new Set();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => {});
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address();
  return {
    addr: `127.0.0.1:${port}`,
    url: `http://127.0.0.1:${port}`,
    stop: () =>
      new Promise((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

/** One HTTP request to a local server: status, headers and body. */
export async function httpGet(port, path, headers = {}) {
  const { request } = await import("node:http");
  return new Promise((resolvePromise, reject) => {
    const req = request({ host: "127.0.0.1", port, path, headers, agent: false }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c) => (body += c));
      res.on("end", () => resolvePromise({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

/** Listens on a free loopback port; resolves with the port. */
export function listen(server) {
  return new Promise((r) => {
    const s = server.listen(0, "127.0.0.1", () => r(s.address().port));
  });
}

/** The store calls a quotad made so far for `op` (`check`, `check_batch`, ...), from its /metrics. */
export async function storeOperations(quotad, op) {
  const text = await (await fetch(`http://${quotad.adminAddr}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith("quotad_store_operations_total{") && l.includes(`op="${op}"`));
  if (line === undefined) throw new Error(`no quotad_store_operations_total for op ${op}`);
  return Number(line.trim().split(/\s+/).pop());
}

/** The Check and CheckBatch calls quotad decided so far: one store call each. */
export async function decidingCalls(quotad) {
  return (await storeOperations(quotad, "check")) + (await storeOperations(quotad, "check_batch"));
}
