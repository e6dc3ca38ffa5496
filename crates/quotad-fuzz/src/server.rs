//! Arbitrary request bytes through the real server: codec, request
//! conversion, policy lookup, store, response.
//!
//! The server's request conversion is crate-private, so the target reaches
//! it the way a caller does: [`quotad::run`] serves on a loopback port in
//! this process, on a current-thread runtime that the target drives, and
//! each input is sent as the body of one gRPC call, framed by tonic but
//! not encoded by it. The clock is a [`FakeClock`] moved one second per
//! input, so a run is repeatable and windows pass.
//!
//! The first byte picks the method (`Check`, `CheckBatch`, `Peek`,
//! `Reset`); the rest is the request message. The answer must be a
//! decision that keeps its rules, or `INVALID_ARGUMENT` / `NOT_FOUND`
//! (unknown policy); bytes that prost refuses must be `INVALID_ARGUMENT`.
//! A panic anywhere in the server aborts the process (libFuzzer's panic
//! hook; in tests, [`Server`] checks the server task is still running).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prost::Message;
use prost::bytes::{Buf, BufMut};
use quotad::{Config, Listeners};
use quotad_core::{Decision, FakeClock, Reason};
use quotad_proto::v1 as pb;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::invariants::check_decision;

/// The server's configuration: one named policy per algorithm, inline
/// policies allowed (their bounds apply), a small store that fills and
/// evicts, no file to poll.
pub const CONFIG: &str = r#"
[server]
config_poll_interval = "0s"

[store]
max_keys = 4096
shards = 4
on_full = "evict"
sweep_interval = "1s"

[policies.fixed]
algorithm = "fixed_window"
limit = 10
window = "1m"

[policies.sliding]
algorithm = "sliding_window"
limit = 100
window = "10s"

[policies.token]
algorithm = "token_bucket"
limit = 10
window = "1s"
burst = 20

[policies.leaky]
algorithm = "leaky_bucket"
limit = 5
window = "1s"
burst = 3

[policies.log]
algorithm = "sliding_log"
limit = 50
window = "1m"
"#;

/// The first instant of the fake clock: 2026-01-01T00:00:00Z.
const START_MS: u64 = 1_767_225_600_000;

/// A `quotad.v1.Quota` method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `Check(CheckRequest)`.
    Check,
    /// `CheckBatch(CheckBatchRequest)`.
    CheckBatch,
    /// `Peek(CheckRequest)`.
    Peek,
    /// `Reset(ResetRequest)`.
    Reset,
}

impl Method {
    /// The method a fuzz input's first byte names.
    pub fn from_byte(byte: u8) -> Method {
        match byte % 4 {
            0 => Method::Check,
            1 => Method::CheckBatch,
            2 => Method::Peek,
            _ => Method::Reset,
        }
    }

    fn path(self) -> &'static str {
        match self {
            Method::Check => "/quotad.v1.Quota/Check",
            Method::CheckBatch => "/quotad.v1.Quota/CheckBatch",
            Method::Peek => "/quotad.v1.Quota/Peek",
            Method::Reset => "/quotad.v1.Quota/Reset",
        }
    }
}

/// quotad serving on loopback in this process, and a channel to it.
#[derive(Debug)]
pub struct Server {
    runtime: Runtime,
    channel: Channel,
    clock: Arc<FakeClock>,
    task: JoinHandle<Result<(), quotad::Error>>,
    _stop: oneshot::Sender<()>,
}

impl Server {
    /// Starts quotad with [`CONFIG`] on 127.0.0.1 (ports chosen by the OS).
    ///
    /// # Panics
    ///
    /// When the runtime, the listeners or the connection cannot be made:
    /// nothing can be fuzzed then.
    pub fn start() -> Server {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime builds");
        let clock = Arc::new(FakeClock::new(START_MS));
        let config = Config::from_toml(CONFIG)
            .expect("the fuzzed server's configuration is valid")
            .with_clock(clock.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let (task, channel) = runtime.block_on(async {
            let grpc = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a loopback port binds");
            let addr = grpc.local_addr().expect("a bound listener has an address");
            let admin = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a loopback port binds");
            let listeners = Listeners {
                grpc: grpc.into(),
                admin,
            };
            let task = tokio::spawn(quotad::run(config, listeners, async {
                let _ = stopped.await;
            }));
            let channel = Endpoint::from_shared(format!("http://{addr}"))
                .expect("a loopback address is a valid URI")
                .connect()
                .await
                .expect("the server accepts on loopback");
            (task, channel)
        });
        Server {
            runtime,
            channel,
            clock,
            task,
            _stop: stop,
        }
    }

    /// The server every input of this process goes to.
    pub fn shared() -> &'static Server {
        static SERVER: OnceLock<Server> = OnceLock::new();
        SERVER.get_or_init(Server::start)
    }

    /// Sends `body` as the request message of `method`; returns the
    /// response message's bytes or the status.
    ///
    /// # Panics
    ///
    /// When the server task has stopped (it panicked or failed).
    pub fn call(&self, method: Method, body: &[u8]) -> Result<Vec<u8>, Status> {
        self.clock.advance(Duration::from_secs(1));
        let result = self.runtime.block_on(async {
            let mut grpc = tonic::client::Grpc::new(self.channel.clone());
            grpc.ready()
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            let path = http::uri::PathAndQuery::from_static(method.path());
            grpc.unary(tonic::Request::new(body.to_vec()), path, RawCodec)
                .await
                .map(tonic::Response::into_inner)
        });
        assert!(!self.task.is_finished(), "the server stopped");
        result
    }
}

/// Sends `data[1..]` to the method `data[0]` names, and checks the answer.
pub fn run(data: &[u8]) {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    check_answer(
        Method::from_byte(first),
        body,
        Server::shared().call(Method::from_byte(first), body),
    );
}

/// Panics unless `answer` is one quotad may give to `body` sent to
/// `method`.
pub fn check_answer(method: Method, body: &[u8], answer: Result<Vec<u8>, Status>) {
    let decodes = match method {
        Method::Check | Method::Peek => pb::CheckRequest::decode(body).is_ok(),
        Method::CheckBatch => pb::CheckBatchRequest::decode(body).is_ok(),
        Method::Reset => pb::ResetRequest::decode(body).is_ok(),
    };
    let bytes = match answer {
        Ok(bytes) => bytes,
        Err(status) => {
            let allowed = [Code::InvalidArgument, Code::NotFound];
            assert!(
                allowed.contains(&status.code()),
                "{method:?} answered {:?}: {}",
                status.code(),
                status.message()
            );
            assert!(
                decodes || status.code() == Code::InvalidArgument,
                "bytes that are not a request answered {:?}",
                status.code()
            );
            assert!(!status.message().is_empty(), "a refusal says why");
            return;
        }
    };
    assert!(decodes, "{method:?} answered OK to bytes prost refuses");
    match method {
        Method::Check | Method::Peek => {
            let request = pb::CheckRequest::decode(body).expect("decoded above");
            let response =
                pb::CheckResponse::decode(bytes.as_slice()).expect("the server's response decodes");
            let decision = response.decision.expect("an OK check carries a decision");
            check_wire_decision(&decision, request.cost.unwrap_or(1));
        }
        Method::CheckBatch => {
            let request = pb::CheckBatchRequest::decode(body).expect("decoded above");
            let response = pb::CheckBatchResponse::decode(bytes.as_slice())
                .expect("the server's response decodes");
            assert_eq!(
                response.decisions.len(),
                request.items.len(),
                "one decision per item"
            );
            let decisions: Vec<Decision> = response
                .decisions
                .iter()
                .zip(&request.items)
                .map(|(d, item)| check_wire_decision(d, item.cost.unwrap_or(1)))
                .collect();
            if request.mode == i32::from(pb::BatchMode::AllOrNothing) {
                let admitted = decisions.iter().filter(|d| d.allowed).count();
                assert!(
                    admitted == 0 || admitted == decisions.len(),
                    "an all-or-nothing batch admitted {admitted} of {}",
                    decisions.len()
                );
                if admitted == 0 {
                    assert!(
                        decisions.iter().all(|d| d.reason != Reason::WithinLimit),
                        "{decisions:?}"
                    );
                }
            }
        }
        Method::Reset => {
            pb::ResetResponse::decode(bytes.as_slice()).expect("the server's response decodes");
        }
    }
}

/// Converts a wire decision (its reason must be known) and checks it.
fn check_wire_decision(wire: &pb::Decision, cost: u64) -> Decision {
    let decision = Decision::try_from(wire).expect("the server answers known reasons");
    check_decision(&decision, decision.limit, cost);
    decision
}

/// Request bytes sent as they are; response bytes returned as they are.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut bytes = vec![0; src.remaining()];
        src.copy_to_slice(&mut bytes);
        Ok(Some(bytes))
    }
}
