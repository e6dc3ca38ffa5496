import { status } from "@grpc/grpc-js";

/** gRPC status codes, by name. */
export const grpc = status;
