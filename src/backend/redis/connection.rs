//! The connection to Redis, and one call over it with a deadline.
//!
//! **Standalone**: one multiplexed connection, replaced by quotad itself
//! (the client library reconnects only on errors it deems unrecoverable,
//! so a half-open TCP connection would stall every call until the kernel
//! gives up, minutes later):
//! - at once on a broken connection (I/O error, reset, EOF), on `READONLY`
//!   (a failover behind the same name: the connection reaches a replica)
//!   and on refused credentials;
//! - after [`RedisSettings::reconnect_after_timeouts`] consecutive calls
//!   timed out (a partition, a blackholed or half-open connection);
//! - TCP keepalive probes every few seconds find a dead peer even when no
//!   call is waiting.
//!
//! While no connection is up, a call tries to connect once (one attempt at a
//! time; a refused connection fails at once) and a failed attempt is not
//! repeated for [`RETRY_CONNECT_AFTER`]: calls in between fail at once with
//! its error instead of waiting out their timeout.
//!
//! **Cluster**: the client library's cluster connection, one multiplexed
//! connection per node, each call bounded by its own timeout, so a stalled
//! node holds up only the calls routed to it. Requests are never retried by
//! the library: a script whose reply was lost may have run.
//!
//! A call that times out is answered as failed at once, and its reply is
//! still awaited in the background (for [`LATE_REPLY_WAIT`] at most) to
//! count what Redis did with it: refused as late, or run (the residual
//! window `docs/redis.md` describes).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::io::tcp::{TcpSettings, socket2::TcpKeepalive};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, RedisError, RedisResult,
    ServerErrorKind, Value,
};

use super::deadline::Offsets;
use super::errors::{Class, classify, to_backend_error};
use super::{RedisSettings, RedisTarget, redact};
use crate::backend::BackendError;
use crate::backend::Deadline;

/// How long a failed connection attempt stands before a call tries again.
pub(super) const RETRY_CONNECT_AFTER: Duration = Duration::from_millis(50);

/// How long the reply to a call that timed out is still awaited, to count
/// what Redis did with it.
pub(super) const LATE_REPLY_WAIT: Duration = Duration::from_secs(30);

/// TCP keepalive: first probe after this much idle time, then one every
/// [`KEEPALIVE_INTERVAL`], the connection dropped after 3 unanswered.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);

/// Counts the backend reports for the metrics.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) connects: AtomicU64,
    pub(super) connect_failures: AtomicU64,
    pub(super) late_refused: AtomicU64,
    pub(super) late_counted: AtomicU64,
    pub(super) corrupt: AtomicU64,
}

/// How a call failed.
#[derive(Debug)]
pub(super) enum CallError {
    /// No answer within the timeout; the reply is awaited in the background.
    TimedOut,
    /// Redis (or the connection) answered an error.
    Failed(BackendError),
    /// `EVALSHA` of a script Redis has not loaded.
    NoScript(BackendError),
}

impl CallError {
    /// The backend error a caller answers with, for a call bounded by
    /// `bound`.
    pub(super) fn into_backend(self, bound: &Bound) -> BackendError {
        match self {
            CallError::TimedOut => bound.timed_out(),
            CallError::Failed(e) | CallError::NoScript(e) => e,
        }
    }
}

/// How long one call may wait for its reply: until the store's own timeout
/// or the caller's deadline, whichever comes first.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bound {
    /// When the call began.
    pub(super) started: Instant,
    /// Local wall-clock ms since the epoch, read just before `started`.
    pub(super) started_ms: u64,
    /// When quotad stops waiting and answers the call as failed.
    pub(super) until: Instant,
    /// The store's own timeout, unless the caller's deadline is earlier.
    timeout: Duration,
    /// Whether `until` is the store's own timeout (not a caller's deadline):
    /// only those timeouts count towards replacing the connection.
    own: bool,
}

impl Bound {
    fn new(timeout: Duration, deadline: Deadline) -> Self {
        let started_ms = local_ms();
        let started = Instant::now();
        let own = started.checked_add(timeout);
        let (until, is_own) = match (deadline.instant(), own) {
            (Some(d), Some(o)) if d < o => (d, false),
            (Some(d), None) => (d, false),
            (_, Some(o)) => (o, true),
            // Neither fits in an Instant: a century will do.
            (None, None) => (started + Duration::from_secs(3_153_600_000), true),
        };
        Bound {
            started,
            started_ms,
            until,
            timeout,
            own: is_own,
        }
    }

    /// The wall-clock ms at which quotad gives up: never later than the
    /// moment it does, as `started_ms` was read first and ms are floored.
    pub(super) fn give_up_ms(&self) -> u64 {
        let span =
            u64::try_from(self.until.duration_since(self.started).as_millis()).unwrap_or(u64::MAX);
        self.started_ms.saturating_add(span)
    }

    fn left(&self) -> Duration {
        self.until.saturating_duration_since(Instant::now())
    }

    fn timed_out(&self) -> BackendError {
        if self.own {
            timed_out(self.timeout)
        } else {
            BackendError::Unavailable(format!(
                "redis did not answer within the caller's deadline ({:?})",
                self.until.duration_since(self.started)
            ))
        }
    }
}

/// What the background wait learns from a reply that came too late.
pub(super) type LateReply = Box<dyn FnOnce(&RedisResult<Value>) + Send>;

pub(super) struct Connections {
    kind: Kind,
    timeout: Duration,
    replace_after: u32,
    consecutive_timeouts: AtomicU32,
    pub(super) offsets: Offsets,
    pub(super) counts: std::sync::Arc<Counts>,
}

enum Kind {
    Standalone(Box<Standalone>),
    Cluster(ClusterConnection),
}

struct Standalone {
    client: redis::Client,
    config: AsyncConnectionConfig,
    link: Mutex<Link>,
    /// Held while connecting, so one attempt runs at a time.
    connecting: tokio::sync::Mutex<()>,
}

enum Link {
    Up(MultiplexedConnection),
    Down {
        error: BackendError,
        at: Option<Instant>,
    },
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Standalone(_) => "standalone",
            Kind::Cluster(_) => "cluster",
        };
        f.debug_struct("Connections")
            .field("kind", &kind)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true).set_keepalive(
        TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(3),
    )
}

fn unavailable(e: &RedisError) -> BackendError {
    BackendError::Unavailable(redact(&format!("redis: {e}")))
}

/// Local wall-clock milliseconds since the epoch.
pub(super) fn local_ms() -> u64 {
    use quotad_core::Clock as _;
    quotad_core::SystemClock.now_ms()
}

impl Connections {
    /// Connects and reads the time of every primary.
    pub(super) async fn connect(settings: &RedisSettings) -> Result<Self, BackendError> {
        let timeout = settings.timeout;
        let kind = match &settings.target {
            RedisTarget::Standalone(url) => {
                let info = url
                    .as_str()
                    .into_connection_info()
                    .map_err(|e| unavailable(&e))?
                    .set_tcp_settings(tcp_settings());
                let client = if settings.tls.is_set() {
                    redis::Client::build_with_tls(info, settings.tls.load()?)
                } else {
                    redis::Client::open(info)
                }
                .map_err(|e| unavailable(&e))?;
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(None)
                    .set_pipeline_buffer_size(1024);
                Kind::Standalone(Box::new(Standalone {
                    client,
                    config,
                    link: Mutex::new(Link::Down {
                        error: BackendError::Unavailable("redis: not connected yet".to_owned()),
                        at: None,
                    }),
                    connecting: tokio::sync::Mutex::new(()),
                }))
            }
            RedisTarget::Cluster(nodes) => {
                let mut builder = ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(0)
                    .tcp_settings(tcp_settings());
                if settings.tls.is_set() {
                    builder = builder.certs(settings.tls.load()?);
                }
                let client = builder.build().map_err(|e| unavailable(&e))?;
                let connect = client.get_async_connection();
                let connection = tokio::time::timeout(timeout, connect)
                    .await
                    .map_err(|_| timed_out(timeout))?
                    .map_err(|e| unavailable(&e))?;
                Kind::Cluster(connection)
            }
        };
        let connections = Connections {
            kind,
            timeout,
            replace_after: settings.reconnect_after_timeouts,
            consecutive_timeouts: AtomicU32::new(0),
            offsets: Offsets::default(),
            counts: std::sync::Arc::default(),
        };
        let started = Instant::now();
        match &connections.kind {
            Kind::Standalone(s) => {
                connections.standalone(s, started).await?;
            }
            Kind::Cluster(c) => {
                connections.probe_all(c.clone()).await?;
            }
        }
        Ok(connections)
    }

    /// The bound of a call starting now, for a caller whose deadline is
    /// `deadline`.
    pub(super) fn bound(&self, deadline: Deadline) -> Bound {
        Bound::new(self.timeout, deadline)
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.kind, Kind::Cluster(_))
    }

    /// The standalone connection, connecting first if there is none (and a
    /// recent attempt has not just failed).
    async fn standalone(
        &self,
        s: &Standalone,
        started: Instant,
    ) -> Result<MultiplexedConnection, BackendError> {
        if let Some(conn) = s.up() {
            return Ok(conn);
        }
        let left = self.timeout.saturating_sub(started.elapsed());
        let _guard = tokio::time::timeout(left, s.connecting.lock())
            .await
            .map_err(|_| timed_out(self.timeout))?;
        // Someone else may have connected, or failed, while we waited.
        {
            let link = s.link.lock().unwrap_or_else(|p| p.into_inner());
            match &*link {
                Link::Up(conn) => return Ok(conn.clone()),
                Link::Down {
                    error,
                    at: Some(at),
                } if at.elapsed() < RETRY_CONNECT_AFTER => return Err(error.clone()),
                Link::Down { .. } => {}
            }
        }
        self.counts.connects.fetch_add(1, Ordering::Relaxed);
        let left = self.timeout.saturating_sub(started.elapsed());
        let attempt = async {
            let mut conn = s
                .client
                .get_multiplexed_async_connection_with_config(&s.config)
                .await
                .map_err(|e| to_backend_error(classify(&e), &e))?;
            // The first reply's clock: every script after it carries a
            // deadline in this server's time.
            let sent = local_ms();
            let time: (u64, u64) = redis::cmd("TIME")
                .query_async(&mut conn)
                .await
                .map_err(|e| to_backend_error(classify(&e), &e))?;
            self.offsets.clear();
            self.offsets.record(0, redis_ms(time), local_ms().max(sent));
            Ok::<_, BackendError>(conn)
        };
        let result = match tokio::time::timeout(left, attempt).await {
            Ok(result) => result,
            Err(_) => Err(timed_out(self.timeout)),
        };
        let mut link = s.link.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(conn) => {
                tracing::info!("connected to redis");
                self.consecutive_timeouts.store(0, Ordering::Relaxed);
                *link = Link::Up(conn.clone());
                Ok(conn)
            }
            Err(error) => {
                self.counts.connect_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "cannot connect to redis");
                *link = Link::Down {
                    error: error.clone(),
                    at: Some(Instant::now()),
                };
                Err(error)
            }
        }
    }

    /// Reads `TIME` from every primary of a Cluster, as the bound for slots
    /// that have not answered yet.
    async fn probe_all(&self, mut c: ClusterConnection) -> Result<(), BackendError> {
        let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let reply =
            tokio::time::timeout(self.timeout, c.route_command(redis::cmd("TIME"), routing))
                .await
                .map_err(|_| timed_out(self.timeout))?
                .map_err(|e| to_backend_error(classify(&e), &e))?;
        let received = local_ms();
        let mut times = Vec::new();
        collect_times(&reply, &mut times);
        if times.is_empty() {
            return Err(BackendError::Internal(format!(
                "redis cluster answered TIME with {reply:?}"
            )));
        }
        for (i, t) in times.into_iter().enumerate() {
            // Pseudo-slots past the last real one: they stand only for slots
            // with no reply of their own.
            let probe = 16_384 + u16::try_from(i).unwrap_or(0);
            self.offsets.record(probe, t, received);
        }
        Ok(())
    }

    /// Reads `TIME` from the node serving `slot`.
    async fn probe_slot(&self, slot: u16, bound: &Bound) -> Result<(), CallError> {
        let sent = local_ms();
        let reply = match &self.kind {
            Kind::Standalone(_) => self.call(redis::cmd("TIME"), bound, None).await?,
            Kind::Cluster(c) => {
                let mut c = c.clone();
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(slot, SlotAddr::Master),
                ));
                tokio::time::timeout(bound.left(), c.route_command(redis::cmd("TIME"), routing))
                    .await
                    .map_err(|_| CallError::TimedOut)?
                    .map_err(|e| CallError::Failed(to_backend_error(classify(&e), &e)))?
            }
        };
        let mut times = Vec::new();
        collect_times(&reply, &mut times);
        let t = times.first().copied().ok_or_else(|| {
            CallError::Failed(BackendError::Internal(format!(
                "redis answered TIME with {reply:?}"
            )))
        })?;
        self.offsets.record(slot, t, local_ms().max(sent));
        Ok(())
    }

    /// The deadline, in Redis's clock, for a call to `slot` bounded by
    /// `bound`; reads the node's clock first if none is known.
    pub(super) async fn deadline(&self, slot: u16, bound: &Bound) -> Result<u64, CallError> {
        let give_up_ms = bound.give_up_ms();
        if let Some(d) = self.offsets.deadline(slot, give_up_ms) {
            return Ok(d);
        }
        self.probe_slot(slot, bound).await?;
        self.offsets
            .deadline(slot, give_up_ms)
            .ok_or(CallError::TimedOut)
    }

    /// Sends `cmd` and waits for its reply until `bound.until`. On a
    /// timeout the reply is awaited in the background and handed to `late`.
    ///
    /// Connecting, when no connection is up, is bounded by the store's own
    /// timeout alone: a caller's short deadline must not fail an attempt
    /// that other calls then reuse.
    pub(super) async fn call(
        &self,
        cmd: Cmd,
        bound: &Bound,
        late: Option<LateReply>,
    ) -> Result<Value, CallError> {
        let mut request = match &self.kind {
            Kind::Standalone(s) => {
                let conn = self
                    .standalone(s, bound.started)
                    .await
                    .map_err(CallError::Failed)?;
                send(conn, cmd)
            }
            Kind::Cluster(c) => send(c.clone(), cmd),
        };
        match tokio::time::timeout(bound.left(), &mut request).await {
            Ok(Ok(value)) => {
                self.consecutive_timeouts.store(0, Ordering::Relaxed);
                Ok(value)
            }
            Ok(Err(e)) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.consecutive_timeouts.store(0, Ordering::Relaxed);
                Err(CallError::NoScript(BackendError::Internal(format!(
                    "redis: {e}"
                ))))
            }
            Ok(Err(e)) => {
                let class = classify(&e);
                if let Class::Outage { replace: true } = class {
                    self.replace(&e.to_string());
                }
                if class == Class::Corrupt {
                    self.counts.corrupt.fetch_add(1, Ordering::Relaxed);
                }
                Err(CallError::Failed(to_backend_error(class, &e)))
            }
            Err(_) => {
                // A caller's deadline says nothing of the connection.
                if bound.own {
                    let timeouts = self.consecutive_timeouts.fetch_add(1, Ordering::Relaxed) + 1;
                    if timeouts >= self.replace_after {
                        self.replace(&format!("{timeouts} calls in a row timed out"));
                    }
                }
                if let Some(late) = late {
                    tokio::spawn(async move {
                        if let Ok(reply) = tokio::time::timeout(LATE_REPLY_WAIT, request).await {
                            late(&reply);
                        }
                    });
                }
                Err(CallError::TimedOut)
            }
        }
    }

    /// Whether Redis serves now: a `PING` answered within the timeout. A
    /// standalone server is pinged over the connection calls use (made
    /// first if none is up); a Cluster is healthy when every primary
    /// answers, since a primary that does not leaves its share of the keys
    /// undecidable.
    pub(super) async fn ping(&self) -> Result<(), BackendError> {
        let bound = self.bound(Deadline::NONE);
        match &self.kind {
            Kind::Standalone(_) => self
                .call(redis::cmd("PING"), &bound, None)
                .await
                .map(drop)
                .map_err(|e| e.into_backend(&bound)),
            Kind::Cluster(c) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                tokio::time::timeout(
                    self.timeout,
                    c.clone().route_command(redis::cmd("PING"), routing),
                )
                .await
                .map_err(|_| timed_out(self.timeout))?
                .map(drop)
                .map_err(|e| to_backend_error(classify(&e), &e))
            }
        }
    }

    /// Drops the standalone connection so the next call makes a new one.
    fn replace(&self, why: &str) {
        if let Kind::Standalone(s) = &self.kind {
            let mut link = s.link.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(*link, Link::Up(_)) {
                tracing::warn!(reason = %redact(why), "replacing the redis connection");
                *link = Link::Down {
                    error: BackendError::Unavailable("redis: reconnecting".to_owned()),
                    at: None,
                };
                self.consecutive_timeouts.store(0, Ordering::Relaxed);
            }
        }
    }
}

impl Standalone {
    fn up(&self) -> Option<MultiplexedConnection> {
        match &*self.link.lock().unwrap_or_else(|p| p.into_inner()) {
            Link::Up(conn) => Some(conn.clone()),
            Link::Down { .. } => None,
        }
    }
}

/// One request as an owned future, so that it can outlive the caller.
fn send<C: ConnectionLike + Send + 'static>(
    mut conn: C,
    cmd: Cmd,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = RedisResult<Value>> + Send>> {
    Box::pin(async move { conn.req_packed_command(&cmd).await?.extract_error() })
}

fn timed_out(after: Duration) -> BackendError {
    BackendError::Unavailable(format!("redis did not answer within {after:?}"))
}

/// `TIME`'s seconds and microseconds, as milliseconds.
pub(super) fn redis_ms((secs, micros): (u64, u64)) -> u64 {
    secs * 1_000 + micros / 1_000
}

/// Every `TIME` reply in `value` (one, or one per node), as milliseconds.
fn collect_times(value: &Value, out: &mut Vec<u64>) {
    let number = |v: &Value| -> Option<u64> {
        match v {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    };
    match value {
        Value::Array(items) if items.len() == 2 && items.iter().all(|v| number(v).is_some()) => {
            if let (Some(s), Some(us)) = (number(&items[0]), number(&items[1])) {
                out.push(redis_ms((s, us)));
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_times(v, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(_, v)| collect_times(v, out)),
        _ => {}
    }
}
