//! Writes the seed corpora of the fuzz targets: real requests, rules and
//! configurations, the kind the tests, docs and examples of the repository
//! send and load.
//!
//! ```text
//! cargo run -p quotad-fuzz --example seeds -- crates/quotad-fuzz/seeds
//! ```
//!
//! `scripts/fuzz.sh` adds the repository's configuration files
//! (`config/*.toml`, `deploy/quotad.toml`) to the `config` corpus itself.

use std::path::PathBuf;

use prost::Message;
use quotad_proto::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use quotad_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use quotad_proto::v1 as pb;

fn main() -> std::io::Result<()> {
    let out = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("crates/quotad-fuzz/seeds"));
    let write = |target: &str, name: &str, bytes: &[u8]| -> std::io::Result<()> {
        let dir = out.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)
    };

    for (name, request) in checks() {
        let body = request.encode_to_vec();
        write("wire", &format!("check-{name}"), &body)?;
        for (byte, method) in [(0u8, "check"), (2, "peek")] {
            write("server", &format!("{method}-{name}"), &framed(byte, &body))?;
        }
    }
    for (name, batch) in batches() {
        let body = batch.encode_to_vec();
        write("wire", &format!("batch-{name}"), &body)?;
        write("server", &format!("batch-{name}"), &framed(1, &body))?;
    }
    for (name, reset) in resets() {
        let body = reset.encode_to_vec();
        write("wire", &format!("reset-{name}"), &body)?;
        write("server", &format!("reset-{name}"), &framed(3, &body))?;
    }
    let decision = pb::CheckResponse {
        decision: Some(pb::Decision {
            allowed: false,
            limit: 10,
            remaining: 0,
            retry_after_ms: 1_500,
            reset_after_ms: 30_000,
            reason: pb::Reason::LimitExceeded.into(),
            ..pb::Decision::default()
        }),
    };
    write("wire", "check-response", &decision.encode_to_vec())?;

    let request = rls_request();
    write("wire", "rls-request", &request.encode_to_vec())?;
    for (name, yaml) in RULES {
        let mut input = yaml.as_bytes().to_vec();
        input.push(0);
        input.extend(request.encode_to_vec());
        write("rls", name, &input)?;
    }

    for (name, toml) in CONFIGS {
        write("config", name, toml.as_bytes())?;
    }
    write(
        "config",
        "fuzzed-server.toml",
        quotad_fuzz::server::CONFIG.as_bytes(),
    )?;

    // The structured targets read their input through `arbitrary`; any
    // bytes are an input. These start them on many steps rather than few.
    for target in ["decide", "store"] {
        for seed in 0..4u64 {
            write(target, &format!("bytes-{seed}"), &pseudo_random(seed, 512))?;
        }
    }
    eprintln!("seeds written to {}", out.display());
    Ok(())
}

/// A method byte, then the request message.
fn framed(method: u8, body: &[u8]) -> Vec<u8> {
    let mut input = vec![method];
    input.extend_from_slice(body);
    input
}

fn named(key: &str, cost: Option<u64>, policy: &str) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.to_owned(),
        cost,
        policy: Some(pb::check_request::Policy::PolicyName(policy.to_owned())),
    }
}

fn inline(key: &str, algorithm: pb::Algorithm, limit: u64, window_ms: u64) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.to_owned(),
        cost: Some(2),
        policy: Some(pb::check_request::Policy::InlinePolicy(pb::Policy {
            algorithm: algorithm.into(),
            limit,
            window_ms,
            burst: matches!(
                algorithm,
                pb::Algorithm::TokenBucket | pb::Algorithm::LeakyBucket
            )
            .then_some(limit * 2),
            ..Default::default()
        })),
    }
}

fn checks() -> Vec<(&'static str, pb::CheckRequest)> {
    vec![
        ("named", named("user:42", None, "fixed")),
        ("named-cost", named("user:42", Some(5), "token")),
        ("sliding", named("10.0.0.1", Some(1), "sliding")),
        ("leaky", named("tenant-a", Some(3), "leaky")),
        ("log", named("alice", None, "log")),
        ("unknown-policy", named("alice", None, "nope")),
        ("empty-key", named("", None, "fixed")),
        ("zero-cost", named("alice", Some(0), "fixed")),
        ("huge-cost", named("alice", Some(u64::MAX), "fixed")),
        ("over-capacity", named("alice", Some(11), "fixed")),
        ("bad-name", named("alice", None, "inline:x")),
        (
            "inline-fixed",
            inline("k", pb::Algorithm::FixedWindow, 10, 1_000),
        ),
        (
            "inline-sliding",
            inline("k", pb::Algorithm::SlidingWindow, 100, 60_000),
        ),
        (
            "inline-token",
            inline("k", pb::Algorithm::TokenBucket, 5, 1_000),
        ),
        (
            "inline-leaky",
            inline("k", pb::Algorithm::LeakyBucket, 5, 1_000),
        ),
        (
            "inline-log",
            inline("k", pb::Algorithm::SlidingLog, 20, 10_000),
        ),
        (
            "inline-unspecified",
            inline("k", pb::Algorithm::Unspecified, 5, 1_000),
        ),
        (
            "inline-too-wide",
            inline("k", pb::Algorithm::FixedWindow, 1 << 40, 1 << 20),
        ),
        ("no-policy", pb::CheckRequest::default()),
    ]
}

fn batches() -> Vec<(&'static str, pb::CheckBatchRequest)> {
    let items = vec![
        named("user:42", None, "fixed"),
        named("user:42", Some(2), "token"),
        inline("user:42", pb::Algorithm::SlidingLog, 3, 1_000),
    ];
    vec![
        (
            "independent",
            pb::CheckBatchRequest {
                items: items.clone(),
                mode: pb::BatchMode::Independent.into(),
            },
        ),
        (
            "all-or-nothing",
            pb::CheckBatchRequest {
                items,
                mode: pb::BatchMode::AllOrNothing.into(),
            },
        ),
        (
            "same-key-twice",
            pb::CheckBatchRequest {
                items: vec![named("k", Some(6), "fixed"), named("k", Some(6), "fixed")],
                mode: pb::BatchMode::AllOrNothing.into(),
            },
        ),
        (
            "unknown-mode",
            pb::CheckBatchRequest {
                items: vec![named("k", None, "fixed")],
                mode: 7,
            },
        ),
        ("empty", pb::CheckBatchRequest::default()),
    ]
}

fn resets() -> Vec<(&'static str, pb::ResetRequest)> {
    vec![
        (
            "named",
            pb::ResetRequest {
                key: "user:42".to_owned(),
                policy: Some(pb::reset_request::Policy::PolicyName("fixed".to_owned())),
            },
        ),
        (
            "inline",
            pb::ResetRequest {
                key: "k".to_owned(),
                policy: Some(pb::reset_request::Policy::InlinePolicy(pb::Policy {
                    algorithm: pb::Algorithm::TokenBucket.into(),
                    limit: 5,
                    window_ms: 1_000,
                    burst: Some(10),
                    ..Default::default()
                })),
            },
        ),
    ]
}

fn rls_request() -> RateLimitRequest {
    let entry = |key: &str, value: &str| rate_limit_descriptor::Entry {
        key: key.to_owned(),
        value: value.to_owned(),
    };
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![
            RateLimitDescriptor {
                entries: vec![entry("remote_address", "10.0.0.1")],
                limit: None,
                hits_addend: None,
            },
            RateLimitDescriptor {
                entries: vec![entry("path", "/api/users"), entry("user", "alice")],
                limit: Some(rate_limit_descriptor::RateLimitOverride {
                    requests_per_unit: 20,
                    unit: 2,
                }),
                hits_addend: Some(3),
            },
        ],
        hits_addend: 1,
    }
}

/// RLS rules in the reference's format, with quotad's extension.
const RULES: [(&str, &str); 2] = [
    (
        "edge.yaml",
        r#"domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: path
    value: /api/*
    descriptors:
      - key: user
        rate_limit:
          name: per_user
          unit: minute
          requests_per_unit: 60
        metadata:
          quotad:
            algorithm: token_bucket
            burst: 20
  - key: path
    value: /health
    rate_limit:
      unlimited: true
"#,
    ),
    (
        "messaging.yaml",
        // The unit test that loads every field of the format.
        include_str!("../../../src/policy/rls/tests/every_field.yaml"),
    ),
];

/// Configurations beside the repository's own files: each store backend,
/// TLS files (relative names, which the fuzzer's empty working directory
/// does not hold), snapshots, limits and authorization.
const CONFIGS: [(&str, &str); 5] = [
    (
        "redis.toml",
        r#"[store]
backend = "redis"
on_error = "fail_open"

[store.redis]
url = "redis://127.0.0.1:6379/0"
timeout = "50ms"
key_prefix = "quotad"

[policies.login]
algorithm = "fixed_window"
limit = 5
window = "1m"
on_error = "fail_closed"
"#,
    ),
    (
        "cluster.toml",
        r#"[store]
backend = "redis"

[store.redis]
cluster_nodes = ["127.0.0.1:7000", "127.0.0.1:7001"]
"#,
    ),
    (
        "tls.toml",
        r#"[server]
grpc_addr = "127.0.0.1:50051"

[server.tls]
cert = "tls/server.pem"
key = "tls/server.key"
client_ca = "tls/clients-ca.pem"

[auth]
check = ["spiffe://example.org/app/*"]
reset = []
"#,
    ),
    (
        "memory.toml",
        r#"[server]
grpc_addr = "unix:///run/quotad/grpc.sock"
unix_socket_mode = "0660"
shutdown_delay = "5s"
worker_threads = 2

[store]
max_keys = 10_000
max_bytes = "64MiB"
shards = 16
on_full = "evict"
max_key_bytes = 128
sweep_interval = "500ms"

[store.snapshot]
path = "state/quotad.snapshot"
interval = "30s"
on_bad_file = "refuse"

[limits]
allow_inline_policies = true
allow_reset = false
max_inline_window = "1h"
max_inline_limit = 1000
max_inline_log_limit = 50

[transport]
max_concurrent_streams = 100
max_connections = 100
request_timeout = "2s"

[log]
format = "json"
level = "info,quotad=debug"

[policies.search]
algorithm = "token_bucket"
limit = 10
window = "1s"
burst = 20
on_error = "fail_open"

[policies.exact]
algorithm = "sliding_log"
limit = 100
window = "1m"
"#,
    ),
    (
        "invalid-limit.toml",
        "[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 0\nwindow = \"1m\"\n",
    ),
];

/// `len` bytes from a fixed generator (splitmix64), the same on every run.
fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..len).map(|_| next().to_le_bytes()[0]).collect()
}
