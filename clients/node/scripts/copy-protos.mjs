// Copies quotad's protos into the package, so an installed package carries
// the API it was built against. The source of truth stays in
// crates/quotad-proto/proto/; nothing here is checked in.
import { cpSync, existsSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const source = join(here, "..", "..", "..", "crates", "quotad-proto", "proto", "quotad");
const target = join(here, "..", "proto", "quotad");
if (!existsSync(source)) {
  if (existsSync(target)) {
    // An unpacked package: the protos came with it.
    process.exit(0);
  }
  console.error(`protos not found at ${source}`);
  process.exit(1);
}
rmSync(target, { recursive: true, force: true });
cpSync(source, target, { recursive: true });
