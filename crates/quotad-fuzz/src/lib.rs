//! Fuzz targets for the inputs quotad does not control, and the load
//! driver of the soak test.
//!
//! Each target is a plain function from bytes to `()` that panics when an
//! input breaks a rule: the libFuzzer binaries in `fuzz_targets/` call it
//! (`scripts/fuzz.sh` builds them with coverage instrumentation, on the
//! stable toolchain), and `tests/corpus.rs` runs every seed and every
//! saved regression input through it in the ordinary test suite.
//!
//! | target | input | what must hold |
//! |---|---|---|
//! | [`wire::run`] | bytes | every request and response message of `quotad.v1` and Envoy's `RateLimitRequest` decodes or fails cleanly, and re-encodes to itself; the wire -> domain enum conversions never panic |
//! | [`server::run`] | method byte + request bytes | the real server (in this process, on loopback) answers a decision or `INVALID_ARGUMENT` / `NOT_FOUND`, never another code; bytes prost refuses are `INVALID_ARGUMENT`; decisions keep their invariants |
//! | [`config::run`] | TOML text | `Config::from_toml` accepts or names the problem, and accepting is repeatable |
//! | [`rls::run`] | RLS YAML, NUL, `RateLimitRequest` bytes | rules load or fail with file, field and position; a request resolves to store items that are valid |
//! | [`decide::run`] | structured | `decide` / `peek` on any policy, state, time and cost: no panic, capacity and retry rules, peek agrees with decide, denials consume nothing, retry and reset times exact |
//! | [`store::run`] | structured | a `MemoryStore` under any operation list on a `FakeClock`: decides exactly as `decide` would with room to spare, and stays within its key and byte budgets without |
//!
//! [`soak`] is the driver behind `scripts/soak.sh`: mixed load against a
//! release server, with the server's memory sampled and the budget of a
//! checker key verified every window.
//! [`chaos`] is the driver behind `scripts/chaos.sh`: three replicas on
//! Redis (Sentinel, then Cluster) under a seeded fault schedule, every
//! answer judged per key and window (docs/chaos.md).
//!
//! ```
//! // A request that is not protobuf: the decoders refuse it, nothing panics.
//! quotad_fuzz::wire::run(&[0xff, 0xff, 0xff]);
//! // A configuration with a bad limit: the error names the field.
//! quotad_fuzz::config::run(b"[policies.a]\nalgorithm = \"fixed_window\"\nlimit = 0\nwindow = \"1s\"\n");
//! ```

pub mod chaos;
pub mod config;
pub mod decide;
pub mod invariants;
pub mod rls;
pub mod server;
pub mod soak;
pub mod store;
pub mod wire;
