//! Generates the tonic clients and servers for `proto/quotad/v1/quota.proto`,
//! `proto/quotad/v1/lease.proto`, Envoy's rate limit service (`proto/envoy/service/ratelimit/v3/rls.proto`)
//! and its rate limit quota service (`proto/envoy/service/rate_limit_quota/v3/rlqs.proto`,
//! vendored with the files it imports), with one descriptor set for both.
//!
//! `protoc` comes from `protoc-bin-vendored`, so building needs no system
//! protobuf install. Its path goes to prost-build through
//! `Config::protoc_executable` rather than the `PROTOC` environment variable,
//! which a build script could only set with `unsafe`.

use std::error::Error;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR is not set")?,
    );
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    // Inside the package, so the published crate builds from its own files.
    let proto_root = manifest_dir.join("proto");
    let quota_proto = proto_root.join("quotad/v1/quota.proto");
    let lease_proto = proto_root.join("quotad/v1/lease.proto");
    let concurrency_proto = proto_root.join("quotad/v1/concurrency.proto");
    let admin_proto = proto_root.join("quotad/v1/admin.proto");
    let rls_proto = proto_root.join("envoy/service/ratelimit/v3/rls.proto");
    let rlqs_proto = proto_root.join("envoy/service/rate_limit_quota/v3/rlqs.proto");

    // Naming build.rs below turns off cargo's default of rerunning on any
    // change in the package, so the protos must be named too; neither
    // prost-build nor tonic-prost-build emits these lines.
    println!("cargo:rerun-if-changed={}", proto_root.display());
    println!("cargo:rerun-if-changed=build.rs");

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);

    tonic_prost_build::configure()
        // quotad's own codec: undecodable requests are the caller's error.
        .codec_path("crate::codec::QuotadCodec")
        .build_client(true)
        .build_server(true)
        .file_descriptor_set_path(out_dir.join("quotad_descriptor.bin"))
        .compile_with_config(
            config,
            &[
                quota_proto,
                lease_proto,
                concurrency_proto,
                admin_proto,
                rls_proto,
                rlqs_proto,
            ],
            // The vendored well-known types (google/protobuf/*.proto), so
            // protos that import them build without a system install.
            &[proto_root, protoc_bin_vendored::include_path()?],
        )?;
    Ok(())
}
