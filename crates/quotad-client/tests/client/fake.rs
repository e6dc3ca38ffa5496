//! A small quotad for the client's own tests: real decisions from
//! quotad-core's memory store on a clock the test drives, a record of every
//! call it receives, a gate that holds calls in flight, and switches for
//! batch failures and transit time.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use quotad_core::{
    Algorithm, BatchMode, CheckItem, Clock, Decision, FakeClock, MemoryStore, OnFull, Policy,
    Reason, StoreConfig,
};
use quotad_proto::v1 as pb;
use quotad_proto::v1::check_request::Policy as PolicyField;
use quotad_proto::v1::quota_server::{Quota, QuotaServer};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// Noon UTC on a day: windows of a second or a minute start exactly here.
pub(crate) const NOON: u64 = 1_767_268_800_000;

/// A call as the server received it, by key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    Check(String),
    Batch(Vec<String>),
    Peek(String),
    Reset(String),
    /// A call whose client went away before it was answered: the server
    /// dropped its handler, and decided nothing for it.
    Abandoned(Vec<String>),
}

/// One decision the server made, in the order it made them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Decided {
    pub(crate) key: String,
    pub(crate) cost: u64,
    pub(crate) decision: Decision,
}

#[derive(Debug)]
pub(crate) struct Fake {
    pub(crate) clock: Arc<FakeClock>,
    store: MemoryStore,
    policies: HashMap<String, Policy>,
    calls: Mutex<Vec<Call>>,
    decided: Mutex<Vec<Decided>>,
    gate: watch::Sender<bool>,
    batch_gate: watch::Sender<bool>,
    batch_failure: Mutex<Option<Status>>,
    transit: Mutex<Duration>,
    /// Keys the backend fails for, with what a lone check of one answers.
    down: Mutex<HashMap<String, Status>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().expect("no test thread panicked holding it")
}

impl Fake {
    /// A server with the policy `api`: `limit` units per `window` (fixed
    /// window), on a clock at [`NOON`].
    pub(crate) fn new(limit: u64, window: Duration) -> Arc<Self> {
        let clock = Arc::new(FakeClock::new(NOON));
        let policy =
            Policy::try_new(Algorithm::FixedWindow, limit, window, None).expect("valid policy");
        let store = MemoryStore::new(
            StoreConfig::try_new(10_000, 4, OnFull::Deny).expect("valid store"),
            clock.clone(),
        );
        let (gate, _) = watch::channel(true);
        let (batch_gate, _) = watch::channel(true);
        Arc::new(Self {
            clock,
            store,
            policies: HashMap::from([("api".to_owned(), policy)]),
            calls: Mutex::new(Vec::new()),
            decided: Mutex::new(Vec::new()),
            gate,
            batch_gate,
            batch_failure: Mutex::new(None),
            transit: Mutex::new(Duration::ZERO),
            down: Mutex::new(HashMap::new()),
        })
    }

    /// Every call received so far.
    pub(crate) fn calls(&self) -> Vec<Call> {
        lock(&self.calls).clone()
    }

    /// Every decision made so far, in order.
    pub(crate) fn decided(&self) -> Vec<Decided> {
        lock(&self.decided).clone()
    }

    /// Calls that arrive from now on wait (recorded) until [`Fake::open`].
    pub(crate) fn hold(&self) {
        self.gate.send_replace(false);
    }

    /// Lets held calls, and all later ones, through.
    pub(crate) fn open(&self) {
        self.gate.send_replace(true);
    }

    /// `CheckBatch` calls that arrive from now on wait (recorded) until
    /// [`Fake::open_batches`]; other calls go on.
    pub(crate) fn hold_batches(&self) {
        self.batch_gate.send_replace(false);
    }

    /// Lets held batches, and all later ones, through.
    pub(crate) fn open_batches(&self) {
        self.batch_gate.send_replace(true);
    }

    /// Every `CheckBatch` fails with `status` from now on.
    pub(crate) fn fail_batches(&self, status: Status) {
        *lock(&self.batch_failure) = Some(status);
    }

    /// `CheckBatch` calls are decided again from now on.
    pub(crate) fn accept_batches(&self) {
        *lock(&self.batch_failure) = None;
    }

    /// The backend fails for `key` from now on, under a policy whose
    /// `on_error` is `error`: a lone check answers UNAVAILABLE, an item of
    /// a batch `REASON_UNAVAILABLE`, as quotad does.
    pub(crate) fn take_down(&self, key: &str) {
        lock(&self.down).insert(
            key.to_owned(),
            Status::unavailable("state store unavailable"),
        );
    }

    /// The state of `key` is corrupt from now on: a lone check answers
    /// INTERNAL, an item of a batch `REASON_UNAVAILABLE` (the others in the
    /// batch keep their decisions).
    pub(crate) fn corrupt(&self, key: &str) {
        lock(&self.down).insert(
            key.to_owned(),
            Status::internal("state store: the stored state of this key is corrupt"),
        );
    }

    /// What a lone check of `key` answers while its backend fails.
    fn lone_failure(&self, key: &str) -> Option<Status> {
        lock(&self.down).get(key).cloned()
    }

    fn is_down(&self, key: &str) -> bool {
        lock(&self.down).contains_key(key)
    }

    /// Each call advances the clock by `transit` before it is decided, as
    /// if the request spent that long on the way.
    pub(crate) fn set_transit(&self, transit: Duration) {
        *lock(&self.transit) = transit;
    }

    /// What a check of `cost` units of `key` under `api` would get now.
    pub(crate) fn peek(&self, key: &str, cost: u64) -> Decision {
        let item = CheckItem::new("api", self.policies["api"], key, cost).expect("valid item");
        self.store.peek(&item)
    }

    async fn arrive(&self, call: Call) {
        let batch = matches!(call, Call::Batch(_));
        lock(&self.calls).push(call);
        let mut gate = self.gate.subscribe();
        // The sender lives as long as the server: waiting cannot fail.
        let _ = gate.wait_for(|open| *open).await;
        if batch {
            let mut gate = self.batch_gate.subscribe();
            let _ = gate.wait_for(|open| *open).await;
        }
        let transit = *lock(&self.transit);
        self.clock.advance(transit);
    }

    /// Validates every item as quotad does (the error naming `items[i]` in
    /// a batch), then decides them in order.
    fn decide(&self, items: &[pb::CheckRequest], batch: bool) -> Result<Vec<Decision>, Status> {
        let mut resolved = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let at = if batch {
                format!("items[{i}].")
            } else {
                String::new()
            };
            if item.key.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "{at}key: must not be empty"
                )));
            }
            let cost = item.cost.unwrap_or(1);
            if cost == 0 {
                return Err(Status::invalid_argument(format!(
                    "{at}cost: must be at least 1"
                )));
            }
            let policy = match &item.policy {
                Some(PolicyField::PolicyName(name)) => {
                    *self.policies.get(name).ok_or_else(|| {
                        Status::not_found(format!("{at}policy_name: no policy named {name:?}"))
                    })?
                }
                _ => {
                    return Err(Status::invalid_argument(format!(
                        "{at}policy_name: required"
                    )));
                }
            };
            resolved.push((item.key.as_str(), cost, policy));
        }
        let mut decided = lock(&self.decided);
        let decisions = resolved
            .into_iter()
            .map(|(key, cost, policy)| {
                if self.is_down(key) {
                    return Decision {
                        allowed: false,
                        limit: policy.capacity(),
                        remaining: 0,
                        retry_after_ms: 0,
                        reset_after_ms: 0,
                        reason: Reason::Unavailable,
                    };
                }
                let item = CheckItem::new("api", policy, key, cost).expect("validated");
                let decision = self.store.check(&[item], BatchMode::Independent)[0];
                decided.push(Decided {
                    key: key.to_owned(),
                    cost,
                    decision,
                });
                decision
            })
            .collect();
        Ok(decisions)
    }
}

/// Records a call as abandoned if its handler is dropped before it
/// answers.
struct Answering<'a> {
    fake: &'a Fake,
    keys: Vec<String>,
    done: bool,
}

impl Answering<'_> {
    fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        if !self.done {
            lock(&self.fake.calls).push(Call::Abandoned(std::mem::take(&mut self.keys)));
        }
    }
}

/// The gRPC face of a [`Fake`].
#[derive(Debug)]
struct FakeQuota(Arc<Fake>);

#[tonic::async_trait]
impl Quota for FakeQuota {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let request = request.into_inner();
        let answering = Answering {
            fake: &self.0,
            keys: vec![request.key.clone()],
            done: false,
        };
        self.0.arrive(Call::Check(request.key.clone())).await;
        answering.done();
        if let Some(status) = self.0.lone_failure(&request.key) {
            return Err(status);
        }
        let decision = self.0.decide(std::slice::from_ref(&request), false)?[0];
        Ok(Response::new(pb::CheckResponse {
            decision: Some((&decision).into()),
        }))
    }

    async fn check_batch(
        &self,
        request: Request<pb::CheckBatchRequest>,
    ) -> Result<Response<pb::CheckBatchResponse>, Status> {
        let request = request.into_inner();
        let keys: Vec<String> = request.items.iter().map(|i| i.key.clone()).collect();
        let answering = Answering {
            fake: &self.0,
            keys: keys.clone(),
            done: false,
        };
        self.0.arrive(Call::Batch(keys)).await;
        answering.done();
        if let Some(status) = lock(&self.0.batch_failure).clone() {
            return Err(status);
        }
        let decisions = self.0.decide(&request.items, true)?;
        Ok(Response::new(pb::CheckBatchResponse {
            decisions: decisions.iter().map(pb::Decision::from).collect(),
        }))
    }

    async fn peek(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let request = request.into_inner();
        self.0.arrive(Call::Peek(request.key.clone())).await;
        let decision = self.0.peek(&request.key, request.cost.unwrap_or(1));
        Ok(Response::new(pb::CheckResponse {
            decision: Some((&decision).into()),
        }))
    }

    async fn reset(
        &self,
        request: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetResponse>, Status> {
        let request = request.into_inner();
        self.0.arrive(Call::Reset(request.key.clone())).await;
        self.0.store.reset("api", &request.key);
        Ok(Response::new(pb::ResetResponse {}))
    }
}

fn spawn(serve: impl Future<Output = Result<(), tonic::transport::Error>> + Send + 'static) {
    tokio::spawn(async move {
        serve
            .await
            .expect("the fake quotad serves until the test ends");
    });
}

/// Serves `fake` on 127.0.0.1, with TLS when `tls` is given.
pub(crate) async fn serve_tcp(fake: &Arc<Fake>, tls: Option<ServerTlsConfig>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let mut server = Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls).expect("server TLS config");
    }
    let router = server.add_service(QuotaServer::new(FakeQuota(Arc::clone(fake))));
    spawn(router.serve_with_incoming(TcpListenerStream::new(listener)));
    addr
}

/// Serves `fake` on a unix socket at `path`.
pub(crate) fn serve_unix(fake: &Arc<Fake>, path: &Path) {
    let listener = UnixListener::bind(path).expect("bind the socket");
    let router = Server::builder().add_service(QuotaServer::new(FakeQuota(Arc::clone(fake))));
    spawn(router.serve_with_incoming(UnixListenerStream::new(listener)));
}

/// Waits (bounded in steps, not asserting on time) until `done` holds.
pub(crate) async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("never happened: {what}");
}

/// The fake's clock, for a client's deny cache.
pub(crate) fn clock_of(fake: &Fake) -> Arc<dyn Clock> {
    fake.clock.clone()
}
