//! A small quotad for the client's own tests: real decisions from
//! quotad-core's memory store on a clock the test drives, a record of every
//! call it receives, a gate that holds calls in flight, and switches for
//! batch failures and transit time. It serves `quotad.v1.Leases` too, from
//! the same store, for the policy `api` when it is made with lease terms.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use quotad_core::{
    Algorithm, BatchMode, CheckItem, Clock, Decision, FakeClock, LeaseAnswer, LeaseAsk, LeaseError,
    LeaseTerms, MemoryStore, OnFull, Policy, Reason, Settle, Settled, StoreConfig,
};
use quotad_proto::v1 as pb;
use quotad_proto::v1::check_request::Policy as PolicyField;
use quotad_proto::v1::lease_request::Policy as LeasePolicyField;
use quotad_proto::v1::leases_server::{Leases, LeasesServer};
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

/// A `Lease` call as the server received and answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseCall {
    pub(crate) key: String,
    pub(crate) want: u64,
    /// The lease settled: its id and the units reported spent.
    pub(crate) settle: Option<(String, u64)>,
    /// The server's clock when it decided.
    pub(crate) at_ms: u64,
    /// What it answered.
    pub(crate) answer: Result<pb::LeaseResponse, tonic::Code>,
    /// The server-side end of the lease granted, if any.
    pub(crate) ends_at: Option<u64>,
}

impl LeaseCall {
    /// The lease granted, if any.
    pub(crate) fn granted(&self) -> Option<&pb::Lease> {
        self.answer.as_ref().ok().and_then(|a| a.lease.as_ref())
    }
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
    /// The lease terms of `api`; `None`: it has no lease settings.
    terms: Option<LeaseTerms>,
    leases: Mutex<Vec<LeaseCall>>,
    /// Lease ids handed out, with the store's id and end of each.
    granted: Mutex<HashMap<String, (u64, u64)>>,
    next_id: AtomicU64,
    /// Every `Lease` call fails with this from now on.
    lease_failure: Mutex<Option<Status>>,
    /// Time a `Lease` answer spends on its way back.
    lease_reply_delay: Mutex<Duration>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().expect("no test thread panicked holding it")
}

impl Fake {
    /// A server with the policy `api`: `limit` units per `window` (fixed
    /// window), on a clock at [`NOON`].
    pub(crate) fn new(limit: u64, window: Duration) -> Arc<Self> {
        Self::with_terms(limit, window, None)
    }

    /// As [`Fake::new`], with `api` leased on `terms`.
    pub(crate) fn leasing(limit: u64, window: Duration, terms: LeaseTerms) -> Arc<Self> {
        Self::with_terms(limit, window, Some(terms))
    }

    fn with_terms(limit: u64, window: Duration, terms: Option<LeaseTerms>) -> Arc<Self> {
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
            terms,
            leases: Mutex::new(Vec::new()),
            granted: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            lease_failure: Mutex::new(None),
            lease_reply_delay: Mutex::new(Duration::ZERO),
        })
    }

    /// Every `Lease` call received so far, with its answer.
    pub(crate) fn leases(&self) -> Vec<LeaseCall> {
        lock(&self.leases).clone()
    }

    /// Every `Lease` call fails with `status` from now on (`None`: they are
    /// answered again).
    pub(crate) fn fail_leases(&self, status: Option<Status>) {
        *lock(&self.lease_failure) = status;
    }

    /// Each `Lease` answer advances the clock by `delay` after it is
    /// decided, as if it spent that long on the way back.
    pub(crate) fn set_lease_reply_delay(&self, delay: Duration) {
        *lock(&self.lease_reply_delay) = delay;
    }

    /// `Check` calls received so far (each a server decision: leases are
    /// recorded apart, in [`Fake::leases`]).
    pub(crate) fn checks(&self) -> usize {
        self.calls()
            .iter()
            .filter(|c| matches!(c, Call::Check(_)))
            .count()
    }

    /// Settles and grants as quotad does, from the same store as `Check`.
    fn lease(
        &self,
        request: &pb::LeaseRequest,
    ) -> Result<(pb::LeaseResponse, Option<u64>), Status> {
        if let Some(status) = lock(&self.lease_failure).clone() {
            return Err(status);
        }
        if request.key.is_empty() {
            return Err(Status::invalid_argument("key: must not be empty"));
        }
        let Some(LeasePolicyField::PolicyName(name)) = &request.policy else {
            return Err(Status::invalid_argument("policy_name: required"));
        };
        let policy = *self
            .policies
            .get(name)
            .ok_or_else(|| Status::not_found(format!("policy_name: no policy named {name:?}")))?;
        let terms = self.terms.ok_or_else(|| {
            Status::invalid_argument(format!(
                "policy_name: policy {name:?} has no lease settings"
            ))
        })?;
        let settle = match &request.settle {
            Some(s) => {
                let (id, ends_at) = *lock(&self.granted)
                    .get(&s.lease_id)
                    .ok_or_else(|| Status::invalid_argument("settle.lease_id: malformed"))?;
                Some(Settle {
                    id,
                    ends_at,
                    spent: s.spent,
                })
            }
            None => None,
        };
        let ask = LeaseAsk {
            settle,
            want: request.want,
            new_id: self.next_id.fetch_add(1, Ordering::Relaxed),
        };
        let outcome = self
            .store
            .lease("api", &request.key, &policy, &terms, &ask)
            .map_err(|e| match e {
                LeaseError::UnknownLease => Status::not_found(format!("settle.lease_id: {e}")),
                LeaseError::Overspent { .. } => {
                    Status::invalid_argument(format!("settle.spent: {e}"))
                }
            })?;
        let now = self.clock.now_ms();
        let (lease, direct, ends_at) = match outcome.answer {
            LeaseAnswer::Granted(grant) => {
                let id = format!("L{}", grant.id);
                lock(&self.granted).insert(id.clone(), (grant.id, grant.ends_at));
                let lease = pb::Lease {
                    lease_id: id,
                    units: grant.units,
                    ttl_ms: grant.ends_at - now,
                };
                (Some(lease), false, Some(grant.ends_at))
            }
            LeaseAnswer::Direct => (None, true, None),
            LeaseAnswer::None => (None, false, None),
        };
        let (settled, returned) = match outcome.settled {
            None => (pb::Settled::Unspecified, 0),
            Some(Settled::Returned { returned }) => (pb::Settled::Returned, returned),
            Some(Settled::Ended) => (pb::Settled::Ended, 0),
        };
        Ok((
            pb::LeaseResponse {
                lease,
                direct,
                settled: settled.into(),
                returned,
                remaining: outcome.remaining,
                limit: outcome.limit,
                reset_after_ms: outcome.reset_after_ms,
            },
            ends_at,
        ))
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

/// The `Leases` face of a [`Fake`].
#[derive(Debug)]
struct FakeLeases(Arc<Fake>);

#[tonic::async_trait]
impl Leases for FakeLeases {
    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let request = request.into_inner();
        let fake = &self.0;
        let mut gate = fake.gate.subscribe();
        let _ = gate.wait_for(|open| *open).await;
        let transit = *lock(&fake.transit);
        fake.clock.advance(transit);
        let at_ms = fake.clock.now_ms();
        let result = fake.lease(&request);
        lock(&fake.leases).push(LeaseCall {
            key: request.key.clone(),
            want: request.want,
            settle: request
                .settle
                .as_ref()
                .map(|s| (s.lease_id.clone(), s.spent)),
            at_ms,
            answer: result
                .as_ref()
                .map(|(a, _)| a.clone())
                .map_err(Status::code),
            ends_at: result.as_ref().ok().and_then(|(_, e)| *e),
        });
        let delay = *lock(&fake.lease_reply_delay);
        fake.clock.advance(delay);
        result.map(|(answer, _)| Response::new(answer))
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
    let router = server
        .add_service(QuotaServer::new(FakeQuota(Arc::clone(fake))))
        .add_service(LeasesServer::new(FakeLeases(Arc::clone(fake))));
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
