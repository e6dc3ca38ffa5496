// The gRPC stubs, loaded at run time from the protos the package carries
// (copied from crates/quotad-proto/proto/ at build time).
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

/** The folder holding `quotad/v1/*.proto` inside the installed package. */
export const PROTO_ROOT = fileURLToPath(new URL("../proto/", import.meta.url));

/** How the wire messages look to JavaScript: field names as in the protos, uint64 as numbers, enums as names. */
export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_ROOT],
};

type ServiceCtor = grpc.ServiceClientConstructor;

let loaded: { Quota: ServiceCtor; Leases: ServiceCtor } | undefined;

/** The `quotad.v1.Quota` and `quotad.v1.Leases` client constructors (loaded once). */
export function services(): { Quota: ServiceCtor; Leases: ServiceCtor } {
  if (loaded === undefined) {
    const definition = protoLoader.loadSync(["quotad/v1/quota.proto", "quotad/v1/lease.proto"], LOADER_OPTIONS);
    const pkg = grpc.loadPackageDefinition(definition) as unknown as {
      quotad: { v1: { Quota: ServiceCtor; Leases: ServiceCtor } };
    };
    loaded = { Quota: pkg.quotad.v1.Quota, Leases: pkg.quotad.v1.Leases };
  }
  return loaded;
}

/** A wire `Decision`. */
export interface WireDecision {
  allowed: boolean;
  limit: number;
  remaining: number;
  retry_after_ms: number;
  reset_after_ms: number;
  reason: string;
}
