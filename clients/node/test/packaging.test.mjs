// Packaging, with a real `npm pack` and an install of the tarball into an
// empty app (dependencies from the npm registry): what a user of the package
// gets. express, fastify and @types/express are optional peers: an app
// without them installs and runs the client, and the tarball says so.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), "..");
const npm = (args, cwd) =>
  execFileSync("npm", [...args, "--no-audit", "--no-fund"], { cwd, encoding: "utf8", timeout: 300_000 });

test("npm pack + install into an empty app: types shipped, optional peers (@types/express too) not required", async () => {
  const dir = mkdtempSync(join(tmpdir(), "quotad-node-pack-"));
  try {
    const [packed] = JSON.parse(npm(["pack", "--json", "--pack-destination", dir], PACKAGE));
    const files = packed.files.map((f) => f.path);
    for (const f of ["dist/index.js", "dist/index.d.ts", "dist/express.d.ts", "proto/quotad/v1/quota.proto"]) {
      assert.ok(files.includes(f), `${f} in the tarball`);
    }
    const app = join(dir, "app");
    execFileSync("mkdir", [app]);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", type: "module", private: true }));
    npm(["install", join(dir, packed.filename)], app);

    const installed = JSON.parse(readFileSync(join(app, "node_modules", "@quotad", "client", "package.json"), "utf8"));
    for (const peer of ["@types/express", "express", "fastify"]) {
      assert.ok(peer in installed.peerDependencies, `${peer} is a peer`);
      assert.equal(installed.peerDependenciesMeta[peer]?.optional, true, `${peer} is optional`);
    }
    assert.ok(!("@types/express" in (installed.dependencies ?? {})), "not a dependency");
    // Optional peers are not installed, and nothing is missing without them.
    for (const peer of ["@types/express", "express"]) {
      assert.throws(() => readFileSync(join(app, "node_modules", ...peer.split("/"), "package.json")), `${peer} not installed`);
    }
    npm(["ls", "--all"], app);
    writeFileSync(
      join(app, "main.mjs"),
      [
        'import { Client } from "@quotad/client";',
        'const c = new Client("http://127.0.0.1:1", { deadlineMs: 50, onUnavailable: "fail_open" });',
        'const d = await c.check({ policy: "login", key: "k" });',
        "console.log(d.reason);",
        "await c.close();",
      ].join("\n"),
    );
    assert.equal(execFileSync("node", ["main.mjs"], { cwd: app, encoding: "utf8", timeout: 30_000 }).trim(), "fail_open");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
