// scripts/test.sh's client steps: a Node.js older than 20.10 (or none) fails
// with a message saying how to get it, and every step has a time bound that
// stops a hung step and names it.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmodSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { REPO } from "./support.mjs";

const CHECK = join(REPO, "scripts", "check-node.sh");
const BOUNDED = join(REPO, "scripts", "bounded.sh");

/** Runs check-node.sh with `node` reporting `version` (undefined: no node at all) first on PATH. */
function checkWith(version) {
  const dir = mkdtempSync(join(tmpdir(), "quotad-fake-node-"));
  try {
    if (version !== undefined) {
      writeFileSync(join(dir, "node"), `#!/bin/sh\necho ${version}\n`);
      chmodSync(join(dir, "node"), 0o755);
    }
    writeFileSync(join(dir, "npm"), "#!/bin/sh\nexit 0\n");
    chmodSync(join(dir, "npm"), 0o755);
    // Only the fake tools and what the script itself needs (bash is run by path).
    return spawnSync("/bin/bash", [CHECK], { env: { PATH: `${dir}:/nonexistent` }, encoding: "utf8" });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("a Node.js older than 20.10 fails the check, saying how to get a newer one", () => {
  for (const old of ["20.9.0", "18.20.4", "v-weird"]) {
    const r = checkWith(old);
    assert.equal(r.status, 1, `${old}: ${r.stderr}`);
    assert.match(r.stderr, /Node\.js 20\.10 or later/);
    assert.match(r.stderr, /nodejs\.org\/en\/download/);
  }
  const none = checkWith(undefined);
  assert.equal(none.status, 1);
  assert.match(none.stderr, /node not found.*20\.10 or later.*nodejs\.org/);
});

test("Node.js 20.10 and later pass the check", () => {
  for (const ok of ["20.10.0", "20.19.1", "22.1.0"]) {
    const r = checkWith(ok);
    assert.equal(r.status, 0, `${ok}: ${r.stderr}`);
  }
});

test("a step over its time bound is stopped, fails, and names itself", { timeout: 30_000 }, () => {
  const r = spawnSync(BOUNDED, ["1", "/tmp", "sleep", "60"], { encoding: "utf8" });
  assert.equal(r.status, 124);
  assert.match(r.stderr, /timed out after 1s \(in \/tmp\): sleep 60/);
  const fine = spawnSync(BOUNDED, ["30", "/tmp", "sh", "-c", "exit 3"], { encoding: "utf8" });
  assert.equal(fine.status, 3, "a step's own failure passes through");
  // Only the step's elapsed time, no time-out.
  assert.match(fine.stderr, /^bounded: sh -c exit 3 \(in \/tmp\) took \d+s of 30s\n$/);
});

test("scripts/test.sh checks Node.js first and bounds every client step", () => {
  const script = readFileSync(join(REPO, "scripts", "test.sh"), "utf8");
  const clientPart = script.slice(script.indexOf("# --- Node"));
  const lines = clientPart.split("\n").filter((l) => /\b(npm|pytest|ruff|mypy|pip)\b/.test(l) && !l.trimStart().startsWith("#"));
  assert.ok(lines.length >= 9, `the client steps: ${lines.join("\n")}`);
  for (const line of lines) {
    if (line.includes("apt-get")) continue;
    // A step of a group is indented in its function.
    assert.match(line, /^\s*scripts\/bounded\.sh \d+ /, `unbounded step: ${line}`);
  }
  assert.ok(clientPart.indexOf("scripts/check-node.sh") < clientPart.indexOf("npm ci"), "the check comes before npm");
});

test("the Go and Java examples' builds fail without their toolchains, saying what to install", () => {
  for (const [example, packages] of [
    ["go", /apt-get install --no-install-recommends golang-go golang-google-grpc-dev .*protoc-gen-go-grpc/],
    ["java", /apt-get install --no-install-recommends default-jdk-headless libgrpc-java .*libperfmark-java/],
  ]) {
    // No go, javac, protoc or plugins on PATH: only what the script runs before its check.
    const bin = mkdtempSync(join(tmpdir(), "quotad-no-toolchain-"));
    symlinkSync("/usr/bin/dirname", join(bin, "dirname"));
    const r = spawnSync("/bin/bash", [join(REPO, "examples", example, "build.sh"), "/nonexistent/out"], {
      env: { PATH: bin },
      encoding: "utf8",
    });
    rmSync(bin, { recursive: true, force: true });
    assert.equal(r.status, 1, `${example}: ${r.stderr}`);
    assert.match(r.stderr, new RegExp(`the ${example === "go" ? "Go" : "Java"} example needs:`));
    assert.match(r.stderr, packages);
  }
});
