//! The connection to Redis, and one call over it with a deadline.
//!
//! Everything a call needs from one connection is a [`Link`]: the
//! connection itself, the clock bounds learnt from its replies and its
//! generation. A call takes the current link first and uses that one link
//! throughout (its deadline, its request, the bounds its reply records), so
//! nothing learnt from or about an old connection touches a new one.
//!
//! **Judged by silence.** A connection (a standalone server's, or one
//! Cluster node's) is replaced when requests have been outstanding on it
//! for [`RedisSettings::reconnect_after_timeouts`] times the store timeout
//! with no reply at all. Replies on one connection come in order, so that
//! silence means the oldest request has waited that long, whatever the
//! deadlines of the calls that sent them: callers with deadlines far
//! shorter than the store timeout (Envoy's 20 ms) still get a blackholed
//! connection replaced. A request whose caller gave up is still awaited in
//! the background (at most [`MAX_LATE_WAITS`] at once, each for at most
//! [`LATE_REPLY_WAIT`], also after its connection was replaced), both to
//! count what Redis did with it and to keep judging the connection: when
//! that wait ends with no reply (the Cluster library gives up on a request
//! after the silence and one timeout more; quotad after
//! [`LATE_REPLY_WAIT`]) and the request was sent at least the silence ago,
//! its connection is judged silent then, so a node called more seldom than
//! the library's bound is replaced too, while the evidence is fresh.
//!
//! **Standalone**: one multiplexed connection, replaced by quotad itself
//! (the client library reconnects only on errors it deems unrecoverable,
//! so a half-open TCP connection would stall every call until the kernel
//! gives up, minutes later):
//! - at once on a broken connection (I/O error, reset, EOF), on `READONLY`
//!   (a failover behind the same name: the connection reaches a replica)
//!   and on refused credentials, when the call that saw it went over the
//!   current connection (a late failure of an old one changes nothing);
//! - when silent, as above;
//! - the kernel drops a connection whose sent data goes unacknowledged for
//!   [`user_timeout`] (`TCP_USER_TIMEOUT`), and TCP keepalive probes find
//!   a dead peer of an idle one.
//!
//! While no connection is up, one attempt to connect runs at a time, as a
//! task of its own bounded by the store timeout: calls wait for it up to
//! their own deadline, and an attempt outlives the calls that started it,
//! so callers whose deadlines are all shorter than a connect (TLS, a far
//! region) still get connected. A failed attempt is not repeated for
//! [`RETRY_CONNECT_AFTER`]: calls in between fail at once with its error.
//!
//! **Cluster**: the client library's cluster connection, one multiplexed
//! connection per node, each call bounded by its own timeout, so a stalled
//! node holds up only the calls routed to it. Requests are never retried by
//! the library: a script whose reply was lost may have run. The library
//! follows `MOVED` and reconnects a node on I/O errors, but a node that
//! stops answering with its sockets open (a hung host, SIGSTOP) is never
//! replaced nor its failover followed: quotad keeps its own map of which
//! primary serves which slot, judges each primary by silence, and makes
//! the whole cluster connection anew (slot map included) when one is
//! silent, as a task of its own, the old one serving meanwhile.
//!
//! The link, its
//! generation, judging silence, reconnecting (for a Cluster, its slot map
//! rebuilt) and a call with its deadline are one state machine; split, each
//! part would need the others' invariants restated.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use futures_util::future::{BoxFuture, Shared};
use redis::aio::{ConnectionLike as _, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::io::tcp::{TcpSettings, socket2::TcpKeepalive};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, RedisError, RedisResult,
    ServerErrorKind, Value,
};

use super::deadline::{Offsets, ceil_ms, floor_ms};
use super::errors::{Class, classify, connect_error, to_backend_error};
use super::{RedisSettings, RedisTarget, redact};
use crate::backend::breaker::Backoff;
use crate::backend::{BackendError, Deadline, Fault, MayHaveRun, NotRun, Waited};

/// How long a failed connection attempt stands before a call tries again.
pub(super) const RETRY_CONNECT_AFTER: Duration = Duration::from_millis(50);

/// How long the reply to a call that timed out is still awaited, at most,
/// to count what Redis did with it.
pub(super) const LATE_REPLY_WAIT: Duration = Duration::from_secs(10);

/// Replies awaited in the background at once, at most: past it, a request
/// whose caller gave up is dropped with its command (its outcome is not
/// counted), so a dead Redis under heavy traffic cannot pile them up.
pub(super) const MAX_LATE_WAITS: usize = 4_096;

/// TCP keepalive: first probe after this much idle time, then one every
/// [`KEEPALIVE_INTERVAL`], the connection dropped after 3 unanswered.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);

/// The shortest `TCP_USER_TIMEOUT`: below a few seconds, a lost packet and
/// its retransmission could end a healthy connection.
const MIN_USER_TIMEOUT: Duration = Duration::from_secs(2);

/// Counts the backend reports for the metrics.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) connected: AtomicU64,
    pub(super) connect_failures: AtomicU64,
    pub(super) late_refused: AtomicU64,
    pub(super) late_counted: AtomicU64,
    pub(super) corrupt: AtomicU64,
}

/// How a call failed.
#[derive(Debug)]
pub(super) enum CallError {
    /// The deadline passed before the request was sent (waiting for a
    /// connection, or for the server's clock): it did not run.
    Unsent,
    /// Sent, and no answer within the timeout; the reply is awaited in the
    /// background. It may have run.
    TimedOut,
    /// Redis (or the connection) answered an error.
    Failed(BackendError),
    /// `EVALSHA` of a script Redis has not loaded.
    NoScript(BackendError),
    /// A key holds state the script cannot read; the detail names the key,
    /// so it is not for callers' eyes or logs as it is.
    Corrupt(String),
}

impl CallError {
    /// The backend error a caller answers with, for a call bounded by
    /// `bound`.
    pub(super) fn into_backend(self, bound: &Bound) -> BackendError {
        match self {
            CallError::Unsent => NotRun::NotSent(bound.waited()).into(),
            CallError::TimedOut => MayHaveRun::NoReply(bound.waited()).into(),
            CallError::Failed(e) | CallError::NoScript(e) => e,
            CallError::Corrupt(_) => Fault::Corrupt(CORRUPT_STATE.to_owned()).into(),
        }
    }

    /// This error of a request sent before the call's own (the `TIME` that
    /// reads the server's clock first), which therefore did not run: a
    /// timeout or a broken connection then is one before sending.
    fn before_sending(self) -> CallError {
        match self {
            CallError::TimedOut => CallError::Unsent,
            CallError::Failed(BackendError::Unavailable(crate::backend::Outage::MayHaveRun(
                MayHaveRun::Broken(e),
            ))) => CallError::Failed(NotRun::Connection(e).into()),
            CallError::Failed(BackendError::Unavailable(crate::backend::Outage::MayHaveRun(
                MayHaveRun::NoReply(waited),
            ))) => CallError::Failed(NotRun::NotSent(waited).into()),
            other => other,
        }
    }
}

/// The message of corrupt state, without the key (which may be a secret).
pub(super) const CORRUPT_STATE: &str = "redis holds state quotad cannot read";

/// How long one call may wait for its reply: until the store's own timeout
/// or the caller's deadline, whichever comes first.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bound {
    /// When the call began.
    started: Instant,
    /// When quotad stops waiting and answers the call as failed.
    until: Instant,
    /// The store's own timeout.
    timeout: Duration,
    /// Whether `until` is the store's own timeout (not a caller's deadline).
    own: bool,
}

impl Bound {
    fn new(timeout: Duration, deadline: Deadline) -> Self {
        let started = Instant::now();
        let own = started.checked_add(timeout);
        let (until, is_own) = match (deadline.instant(), own) {
            // Equal: the store's own timeout, for the message.
            (Some(d), Some(o)) if d < o => (d, false),
            (Some(d), None) => (d, false),
            (_, Some(o)) => (o, true),
            // Neither fits in an Instant: a century will do.
            (None, None) => (started + Duration::from_secs(3_153_600_000), true),
        };
        Bound {
            started,
            until,
            timeout,
            own: is_own,
        }
    }

    /// The local monotonic ms at which quotad gives up, rounded down: never
    /// later than the moment it does.
    pub(super) fn give_up_ms(&self) -> u64 {
        floor_ms(self.until)
    }

    fn left(&self) -> Duration {
        self.until.saturating_duration_since(Instant::now())
    }

    /// How long the call waited when it gave up at its bound.
    fn waited(&self) -> Waited {
        if self.own {
            Waited {
                after: self.timeout,
                callers: false,
            }
        } else {
            Waited {
                after: self.until.duration_since(self.started),
                callers: true,
            }
        }
    }
}

/// What the background wait learns from a reply that came too late.
pub(super) type LateReply = Box<dyn FnOnce(&RedisResult<Value>) + Send>;

/// How often a call may try a Cluster primary the client library has no
/// connection to ([`Health::moved_back`]); the calls in between fail at
/// once.
const UNREACHABLE_RETRY: Duration = Duration::from_secs(5);

/// Whether requests wait on a connection with no reply coming back, and,
/// for a Cluster primary, whether the client library can reach it at all.
#[derive(Debug, Default)]
struct Health {
    state: Mutex<Silence>,
}

#[derive(Debug, Default)]
struct Silence {
    /// Requests sent and neither answered nor given up.
    in_flight: u64,
    /// Local ms of the last reply, or of the first request sent after the
    /// connection was idle: the oldest request has waited since then.
    since: u64,
    /// The first reply since the last other one that came `MOVED` back
    /// to this primary ([`Health::moved_back`]).
    moved_back_since: Option<Instant>,
    /// When this primary was found unreachable (or a request was let
    /// through to try it again); `None` once it answers.
    unreachable_since: Option<Instant>,
}

impl Health {
    fn sent(&self) {
        let now = floor_ms(Instant::now());
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.in_flight == 0 {
            s.since = now;
        }
        s.in_flight += 1;
    }

    fn answered(&self) {
        let now = floor_ms(Instant::now());
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.in_flight = s.in_flight.saturating_sub(1);
        s.since = now;
        s.moved_back_since = None;
        s.unreachable_since = None;
    }

    /// A request for this Cluster primary came back `MOVED` to it: the
    /// client library sent it to another node. Each time, the library
    /// reads the slot map again and connects to every primary, holding all
    /// of its calls meanwhile. When it reaches this one, that takes
    /// moments and the requests after go to it (a failback, a slot moved
    /// back: the library's map was behind quotad's). When such answers
    /// still come `within` (the time a connection may take) after the
    /// first, the library cannot reach it, and each call would hold every
    /// other for up to that long: the primary is unreachable, its calls
    /// fail at once, and one goes through every [`UNREACHABLE_RETRY`].
    /// Returns whether this answer marked the primary unreachable.
    fn moved_back(&self, within: Duration) -> bool {
        let now = Instant::now();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.in_flight = s.in_flight.saturating_sub(1);
        s.since = floor_ms(now);
        match s.moved_back_since {
            None => s.moved_back_since = Some(now),
            Some(first) if now.saturating_duration_since(first) >= within => {
                let marked = s.unreachable_since.is_none();
                s.unreachable_since = Some(now);
                return marked;
            }
            Some(_) => {}
        }
        false
    }

    /// Whether a request may be sent now: always, unless the primary is
    /// unreachable, when one request per [`UNREACHABLE_RETRY`] may (it
    /// restarts the wait).
    fn may_send(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.unreachable_since {
            Some(at) if at.elapsed() < UNREACHABLE_RETRY => false,
            Some(_) => {
                s.unreachable_since = Some(Instant::now());
                true
            }
            None => true,
        }
    }

    fn abandoned(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.in_flight = s.in_flight.saturating_sub(1);
    }

    /// How long requests have waited with no reply; `None` when none waits.
    fn silent_for(&self) -> Option<Duration> {
        let now = floor_ms(Instant::now());
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (s.in_flight > 0).then(|| Duration::from_millis(now.saturating_sub(s.since)))
    }
}

/// Keeps [`Health`] right when a request is dropped unanswered.
struct InFlight(Option<Arc<Health>>);

impl InFlight {
    fn start(health: Option<Arc<Health>>) -> Self {
        if let Some(h) = &health {
            h.sent();
        }
        InFlight(health)
    }

    /// The request came back `MOVED` to the primary it was for
    /// ([`Health::moved_back`]).
    fn moved_back(mut self, within: Duration) -> bool {
        self.0.take().is_some_and(|h| h.moved_back(within))
    }

    fn finish(mut self, result: &RedisResult<Value>) {
        if let Some(h) = self.0.take() {
            match result {
                // No reply: the connection failed or the library gave up.
                Err(e)
                    if e.is_io_error()
                        || e.is_timeout()
                        || e.kind() == ErrorKind::ClusterConnectionNotFound =>
                {
                    h.abandoned();
                }
                _ => h.answered(),
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abandoned();
        }
    }
}

/// Which primary serves which slot, as `CLUSTER SLOTS` said.
#[derive(Debug, Default)]
struct SlotMap {
    /// (first slot, last slot, primary `host:port`), by first slot.
    ranges: Vec<(u16, u16, Arc<str>)>,
}

impl SlotMap {
    fn parse(reply: &Value) -> Option<SlotMap> {
        let Value::Array(entries) = reply else {
            return None;
        };
        let int = |v: &Value| match v {
            Value::Int(i) => u16::try_from(*i).ok(),
            _ => None,
        };
        let mut ranges = Vec::with_capacity(entries.len());
        for entry in entries {
            let Value::Array(parts) = entry else {
                return None;
            };
            let (Some(start), Some(end), Some(Value::Array(node))) = (
                parts.first().and_then(int),
                parts.get(1).and_then(int),
                parts.get(2),
            ) else {
                return None;
            };
            let host = match node.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => return None,
            };
            let port = match node.get(1) {
                Some(Value::Int(p)) => *p,
                _ => return None,
            };
            ranges.push((start, end, Arc::from(format!("{host}:{port}"))));
        }
        ranges.sort_by_key(|r| r.0);
        Some(SlotMap { ranges })
    }

    fn node(&self, slot: u16) -> Option<&Arc<str>> {
        let i = self
            .ranges
            .partition_point(|r| r.0 <= slot)
            .checked_sub(1)?;
        let (_, end, node) = &self.ranges[i];
        (slot <= *end).then_some(node)
    }

    /// Every primary, with the first slot it serves.
    fn primaries(&self) -> Vec<(u16, Arc<str>)> {
        let mut seen: Vec<(u16, Arc<str>)> = Vec::new();
        for (start, _, node) in &self.ranges {
            if !seen.iter().any(|(_, n)| n == node) {
                seen.push((*start, node.clone()));
            }
        }
        seen
    }
}

/// One connection and what was learnt through it.
pub(super) struct Link {
    generation: u64,
    conn: Conn,
    /// Bounds on Redis's clock from this connection's replies.
    pub(super) offsets: Offsets,
}

enum Conn {
    Standalone {
        conn: MultiplexedConnection,
        health: Arc<Health>,
    },
    Cluster {
        conn: ClusterConnection,
        map: SlotMap,
        /// Every primary of the map, by address.
        health: Arc<HashMap<Arc<str>, Arc<Health>>>,
    },
}

/// What a Cluster request's `MOVED` answer says, for a request sent for
/// the primary `node`: back to that very primary (the library has no
/// connection to it, [`Health::moved_back`]), or to another one (the slot
/// moved, and the library reads the slot map anew), with its address.
/// `ASK` (a slot being migrated) is not followed: known-limits.md.
enum Moved<'a> {
    Back,
    To(&'a str),
}

impl<'a> Moved<'a> {
    fn of(e: &'a RedisError, node: &str) -> Option<Self> {
        if e.kind() != ErrorKind::Server(ServerErrorKind::Moved) {
            return None;
        }
        let (to, _) = e.redirect_node()?;
        Some(if to == node {
            Moved::Back
        } else {
            Moved::To(to)
        })
    }
}

/// Settles a Cluster request for the primary `node` that came back with
/// `result`: a `MOVED` back to that primary is [`Health::moved_back`]
/// (logged when it marks the primary unreachable), anything else a reply
/// or its absence.
fn settle(
    in_flight: InFlight,
    node: Option<&str>,
    moved: Option<&Moved<'_>>,
    result: &RedisResult<Value>,
    moved_back_within: Duration,
) {
    if matches!(moved, Some(Moved::Back)) {
        if in_flight.moved_back(moved_back_within) {
            tracing::warn!(
                node = node.unwrap_or("?"),
                retry_every = ?UNREACHABLE_RETRY,
                "redis cluster primary unreachable from the client library: its keys fail at once, one call per retry_every tries it again"
            );
        }
    } else {
        in_flight.finish(result);
    }
}

impl Link {
    /// The primary serving `slot` (`None` on a standalone server, or for a
    /// slot the map does not cover), with its health.
    fn node(&self, slot: u16) -> Option<(&Arc<str>, &Arc<Health>)> {
        match &self.conn {
            Conn::Standalone { .. } => None,
            Conn::Cluster { map, health, .. } => {
                let node = map.node(slot)?;
                Some((node, health.get(node)?))
            }
        }
    }

    fn health(&self, slot: u16) -> Option<&Arc<Health>> {
        match &self.conn {
            Conn::Standalone { health, .. } => Some(health),
            Conn::Cluster { .. } => self.node(slot).map(|(_, h)| h),
        }
    }

    /// One request as an owned future, so that it can outlive the caller;
    /// on a Cluster, sent to the primary serving `slot`, and sent once more
    /// when it comes back `MOVED` to another primary of quotad's map, not
    /// marked unreachable, before `until` (the script did not run; the
    /// library has read the new slot map by then).
    /// `moved_back_within`: how long the library may take to connect to a
    /// node ([`Health::moved_back`]).
    fn request(
        &self,
        slot: u16,
        cmd: Cmd,
        moved_back_within: Duration,
        until: Instant,
    ) -> BoxFuture<'static, RedisResult<Value>> {
        let health = self.health(slot).cloned();
        match &self.conn {
            Conn::Standalone { conn, .. } => {
                let mut conn = conn.clone();
                Box::pin(async move {
                    let in_flight = InFlight::start(health);
                    let result = match conn.req_packed_command(&cmd).await {
                        Ok(v) => v.extract_error(),
                        Err(e) => Err(e),
                    };
                    in_flight.finish(&result);
                    result
                })
            }
            Conn::Cluster {
                conn,
                health: nodes,
                ..
            } => {
                let mut conn = conn.clone();
                let nodes = Arc::clone(nodes);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(slot, SlotAddr::Master),
                ));
                let node = self.node(slot).map(|(n, _)| Arc::clone(n));
                Box::pin(async move {
                    let in_flight = InFlight::start(health);
                    let result = match conn.route_command(cmd.clone(), routing.clone()).await {
                        Ok(v) => v.extract_error(),
                        Err(e) => Err(e),
                    };
                    let moved = match (&node, &result) {
                        (Some(node), Err(e)) => Moved::of(e, node),
                        _ => None,
                    };
                    settle(
                        in_flight,
                        node.as_deref(),
                        moved.as_ref(),
                        &result,
                        moved_back_within,
                    );
                    // Sent again only to a primary of quotad's map that is
                    // not marked unreachable: one whose requests come back
                    // `MOVED` to it would cost the library a slot-map read
                    // holding every call, twice a call.
                    if let Some(Moved::To(to)) = moved
                        && Instant::now() < until
                        && let Some((to, health)) = nodes.get_key_value(to)
                        && health.may_send()
                    {
                        let in_flight = InFlight::start(Some(Arc::clone(health)));
                        let again = match conn.route_command(cmd, routing).await {
                            Ok(v) => v.extract_error(),
                            Err(e) => Err(e),
                        };
                        let moved = again.as_ref().err().and_then(|e| Moved::of(e, to));
                        settle(
                            in_flight,
                            Some(to),
                            moved.as_ref(),
                            &again,
                            moved_back_within,
                        );
                        return again;
                    }
                    result
                })
            }
        }
    }
}

/// A connection attempt in progress, shared by every call waiting for it.
type Attempt = Shared<BoxFuture<'static, Result<Arc<Link>, BackendError>>>;

enum State {
    Up(Arc<Link>),
    Down {
        error: BackendError,
        at: Option<Instant>,
    },
}

enum Target {
    /// One connection to one server: a fixed one, or the master the
    /// sentinels name at each connection attempt.
    Standalone {
        client: Source,
        config: AsyncConnectionConfig,
    },
    Cluster(ClusterClient),
}

/// Where a standalone connection goes.
enum Source {
    Fixed(redis::Client),
    /// Asked of the sentinels at every attempt, so that a failover is
    /// followed by the next connection.
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
}

impl Source {
    async fn client(&self) -> Result<redis::Client, RedisError> {
        match self {
            Source::Fixed(client) => Ok(client.clone()),
            Source::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await,
        }
    }
}

struct Inner {
    target: Target,
    timeout: Duration,
    /// The bound of one connection attempt.
    connect_within: Duration,
    /// Silence after which a connection is replaced.
    silence: Duration,
    generations: AtomicU64,
    state: Mutex<State>,
    /// The attempt running now; locked before `state` when both are.
    attempt: Mutex<Option<Attempt>>,
    /// A Cluster's last failed attempt: the next waits for the timeout.
    failed_at: Mutex<Option<Instant>>,
    late_waits: AtomicUsize,
    counts: Arc<Counts>,
    /// Whether an outage has been logged and not yet its end: a failed
    /// attempt is logged once per outage, at `warn`, the rest at `debug`.
    outage_logged: std::sync::atomic::AtomicBool,
}

pub(super) struct Connections {
    inner: Arc<Inner>,
    pub(super) counts: Arc<Counts>,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.inner.target {
            Target::Standalone { .. } => "standalone",
            Target::Cluster(_) => "cluster",
        };
        f.debug_struct("Connections")
            .field("kind", &kind)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// `TCP_USER_TIMEOUT`: sent data unacknowledged this long ends the
/// connection in the kernel (a dead host, a partition), whether or not a
/// call is waiting. The silence that replaces a connection, and never less
/// than [`MIN_USER_TIMEOUT`].
pub(super) fn user_timeout(settings: &RedisSettings) -> Duration {
    silence(settings).max(MIN_USER_TIMEOUT)
}

/// The Cluster library's bound on one request: the silence, and one
/// timeout more.
fn library_timeout(settings: &RedisSettings) -> Duration {
    silence(settings).saturating_add(settings.timeout)
}

fn silence(settings: &RedisSettings) -> Duration {
    settings
        .timeout
        .saturating_mul(settings.reconnect_after_timeouts.max(1))
}

/// A standalone connection's settings: connecting bounded by `timeout`,
/// each call by quotad's own bound.
fn standalone_config(timeout: Duration) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None)
        .set_pipeline_buffer_size(1024)
}

/// The Sentinel client that finds the master named by `master`'s host,
/// with `master`'s credentials and database, through `sentinels` (with
/// theirs); TLS where the URLs say rediss://, with `store.redis.tls_*`.
fn sentinel_client(
    master: &str,
    sentinels: &[String],
    settings: &RedisSettings,
) -> Result<redis::sentinel::SentinelClient, BackendError> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    let master_info = master.into_connection_info().map_err(|e| unavailable(&e))?;
    let name = match master_info.addr() {
        redis::ConnectionAddr::Tcp(host, _) | redis::ConnectionAddr::TcpTls { host, .. } => {
            host.clone()
        }
        other => {
            return Err(NotRun::SentinelUrl(other.to_string()).into());
        }
    };
    let mut sentinel_info = Vec::with_capacity(sentinels.len());
    for url in sentinels {
        sentinel_info.push(
            url.as_str()
                .into_connection_info()
                .map_err(|e| unavailable(&e))?,
        );
    }
    let addrs = sentinel_info.iter().map(|info| info.addr().clone());
    let mut builder = SentinelClientBuilder::new(addrs, &name, SentinelServerType::Master)
        .map_err(|e| unavailable(&e))?
        .set_client_to_redis_db(master_info.redis_settings().db())
        .set_client_to_redis_tcp_settings(tcp_settings(settings))
        .set_client_to_sentinel_tcp_settings(tcp_settings(settings));
    if let Some(user) = master_info.redis_settings().username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = master_info.redis_settings().password() {
        builder = builder.set_client_to_redis_password(password);
    }
    // One set of sentinel credentials: the first URL's.
    if let Some(first) = sentinel_info.first() {
        if let Some(user) = first.redis_settings().username() {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = first.redis_settings().password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
    }
    if master.starts_with("rediss://") {
        builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
    }
    if sentinels.iter().any(|url| url.starts_with("rediss://")) {
        builder = builder.set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
    }
    if settings.tls.is_set() {
        builder = builder.set_client_to_redis_certificates(super::tls::load(&settings.tls)?);
    }
    builder.build().map_err(|e| unavailable(&e))
}

fn tcp_settings(settings: &RedisSettings) -> TcpSettings {
    TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(
            TcpKeepalive::new()
                .with_time(KEEPALIVE_IDLE)
                .with_interval(KEEPALIVE_INTERVAL)
                .with_retries(3),
        )
        .set_user_timeout(user_timeout(settings))
}

fn unavailable(e: &RedisError) -> BackendError {
    NotRun::Client(redact(&e.to_string())).into()
}

/// The arrival of a reply, in local monotonic ms rounded up: never earlier
/// than the moment it arrived.
pub(super) fn local_ms() -> u64 {
    ceil_ms(Instant::now())
}

/// Connects to a Redis that could not be reached at start, with back-off
/// ([`Backoff::DEFAULT`], which the local fallback's breaker waits by
/// between probes too), until a connection is up or the backend is
/// dropped. Calls meanwhile join the running attempt or fail at once, as
/// during any outage.
async fn connect_in_background(inner: std::sync::Weak<Inner>) {
    let mut backoff = Backoff::DEFAULT;
    loop {
        tokio::time::sleep(backoff.next()).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if matches!(
            &*inner.state.lock().unwrap_or_else(|p| p.into_inner()),
            State::Up(_)
        ) {
            return;
        }
        let attempt = {
            let mut running = inner.attempt.lock().unwrap_or_else(|p| p.into_inner());
            match &*running {
                Some(attempt) => attempt.clone(),
                None => Arc::clone(&inner).start_attempt(&mut running),
            }
        };
        drop(inner);
        if attempt.await.is_ok() {
            return;
        }
    }
}

impl Connections {
    /// Connects and reads the time of every primary; without
    /// `required_at_start`, a Redis that cannot be reached yet is connected
    /// to in the background instead ([`connect_in_background`]).
    pub(super) async fn connect(settings: &RedisSettings) -> Result<Self, BackendError> {
        let timeout = settings.timeout;
        let target = match &settings.target {
            RedisTarget::Standalone(url) => {
                let info = url
                    .as_str()
                    .into_connection_info()
                    .map_err(|e| unavailable(&e))?
                    .set_tcp_settings(tcp_settings(settings));
                let client = if settings.tls.is_set() {
                    redis::Client::build_with_tls(info, super::tls::load(&settings.tls)?)
                } else {
                    redis::Client::open(info)
                }
                .map_err(|e| unavailable(&e))?;
                Target::Standalone {
                    client: Source::Fixed(client),
                    config: standalone_config(timeout),
                }
            }
            RedisTarget::Sentinel { master, sentinels } => Target::Standalone {
                client: Source::Sentinel(tokio::sync::Mutex::new(sentinel_client(
                    master, sentinels, settings,
                )?)),
                config: standalone_config(timeout),
            },
            RedisTarget::Cluster(nodes) => {
                // The library's own bound on a request outlives the silence
                // that replaces a node by one timeout, so that a silent
                // node's requests are still waiting when it is judged.
                let mut builder = ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(library_timeout(settings))
                    .retries(0)
                    .tcp_settings(tcp_settings(settings));
                if settings.tls.is_set() {
                    builder = builder.certs(super::tls::load(&settings.tls)?);
                }
                Target::Cluster(builder.build().map_err(|e| unavailable(&e))?)
            }
        };
        let counts = Arc::new(Counts::default());
        let connect_within = match target {
            Target::Standalone { .. } => timeout,
            // Every seed node, the slot map, every primary: each step may
            // wait out the library's bound on a silent node, and the last
            // two the timeout.
            Target::Cluster(_) => timeout
                .saturating_add(library_timeout(settings))
                .saturating_mul(2)
                .saturating_add(timeout.saturating_mul(2)),
        };
        let inner = Arc::new(Inner {
            target,
            timeout,
            connect_within,
            silence: silence(settings),
            generations: AtomicU64::new(0),
            state: Mutex::new(State::Down {
                error: NotRun::NotConnected.into(),
                at: None,
            }),
            attempt: Mutex::new(None),
            failed_at: Mutex::new(None),
            late_waits: AtomicUsize::new(0),
            counts: Arc::clone(&counts),
            outage_logged: std::sync::atomic::AtomicBool::new(false),
        });
        match Arc::clone(&inner).attempt_now().await {
            Ok(_) => {}
            Err(error) if settings.required_at_start => return Err(error),
            Err(_) => {
                tokio::spawn(connect_in_background(Arc::downgrade(&inner)));
            }
        }
        Ok(Connections { inner, counts })
    }

    /// The bound of a call starting now, for a caller whose deadline is
    /// `deadline`.
    pub(super) fn bound(&self, deadline: Deadline) -> Bound {
        Bound::new(self.inner.timeout, deadline)
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.inner.target, Target::Cluster(_))
    }

    /// The link a call to `slot` goes over: the current one, or (with none
    /// up) the one the running connection attempt makes, waited for until
    /// `bound`. A link whose connection has gone silent is replaced first.
    pub(super) async fn link(&self, slot: u16, bound: &Bound) -> Result<Arc<Link>, CallError> {
        // The common case, without the attempt's lock: a link up and
        // answering.
        if let State::Up(link) = &*self.inner.state.lock().unwrap_or_else(|p| p.into_inner()) {
            let silent = link
                .health(slot)
                .and_then(|h| h.silent_for())
                .is_some_and(|s| s >= self.inner.silence);
            if !silent {
                return Ok(Arc::clone(link));
            }
        }
        let attempt = {
            let mut attempt = self.inner.attempt.lock().unwrap_or_else(|p| p.into_inner());
            let current = {
                let state = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
                match &*state {
                    State::Up(link) => Some(Arc::clone(link)),
                    State::Down {
                        error,
                        at: Some(at),
                    } if at.elapsed() < RETRY_CONNECT_AFTER => {
                        return Err(CallError::Failed(error.clone()));
                    }
                    State::Down { .. } => None,
                }
            };
            match current {
                Some(link) if !self.inner.judge(&link, slot, &mut attempt) => return Ok(link),
                // A Cluster keeps its old connection while a new one is
                // made: only the silent node's calls fail meanwhile.
                Some(link) if self.is_cluster() => return Ok(link),
                _ => {}
            }
            match &*attempt {
                Some(running) => running.clone(),
                None => Arc::clone(&self.inner).start_attempt(&mut attempt),
            }
        };
        match tokio::time::timeout(bound.left(), attempt).await {
            Ok(Ok(link)) => Ok(link),
            Ok(Err(e)) => Err(CallError::Failed(e)),
            Err(_) => Err(CallError::Unsent),
        }
    }

    /// The deadline, in Redis's clock, for a call to `slot` over `link`
    /// bounded by `bound`; reads the node's clock first if none is known.
    /// One millisecond early: the script compares whole milliseconds of a
    /// microsecond clock, so it may run until just before the next one.
    pub(super) async fn deadline(
        &self,
        link: &Arc<Link>,
        slot: u16,
        bound: &Bound,
    ) -> Result<u64, CallError> {
        let give_up_ms = bound.give_up_ms();
        if let Some(d) = link.offsets.deadline(slot, give_up_ms) {
            return Ok(d);
        }
        let reply = self
            .call(link, slot, redis::cmd("TIME"), bound, None)
            .await
            .map_err(CallError::before_sending)?;
        let t = first_time(&reply).map_err(CallError::Failed)?;
        link.offsets.record(slot, t, local_ms());
        link.offsets
            .deadline(slot, give_up_ms)
            .ok_or(CallError::Unsent)
    }

    /// Sends `cmd` over `link` (on a Cluster, to the primary serving
    /// `slot`) and waits for its reply until `bound.until`. On a timeout the
    /// reply is awaited in the background and handed to `late`.
    pub(super) async fn call(
        &self,
        link: &Arc<Link>,
        slot: u16,
        cmd: Cmd,
        bound: &Bound,
        late: Option<LateReply>,
    ) -> Result<Value, CallError> {
        if link.health(slot).is_some_and(|h| !h.may_send()) {
            let node = link.node(slot).map_or("?", |(n, _)| &**n);
            return Err(CallError::Failed(
                NotRun::Unreachable {
                    node: node.to_owned(),
                    every: UNREACHABLE_RETRY,
                }
                .into(),
            ));
        }
        let sent = Instant::now();
        let mut request = link.request(slot, cmd, self.inner.timeout, bound.until);
        match tokio::time::timeout(bound.left(), &mut request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.inner.failed(link, &e)),
            Err(_) => {
                {
                    let mut attempt = self.inner.attempt.lock().unwrap_or_else(|p| p.into_inner());
                    self.inner.judge(link, slot, &mut attempt);
                }
                Arc::clone(&self.inner).wait_late(Arc::clone(link), slot, sent, request, late);
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
        let failed = |e: CallError| e.into_backend(&bound);
        let link = self.link(0, &bound).await.map_err(failed)?;
        match &link.conn {
            Conn::Standalone { .. } => self
                .call(&link, 0, redis::cmd("PING"), &bound, None)
                .await
                .map(drop)
                .map_err(failed),
            Conn::Cluster { conn, .. } => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                tokio::time::timeout(
                    bound.left(),
                    conn.clone().route_command(redis::cmd("PING"), routing),
                )
                .await
                .map_err(|_| MayHaveRun::NoReply(bound.waited()))?
                .map(drop)
                .map_err(|e| to_backend_error(classify(&e), &e))
            }
        }
    }
}

impl Inner {
    /// Whether `link` must be replaced because the connection serving
    /// `slot` has gone silent; if so, replaces it (a standalone link at
    /// once, a Cluster by a new connection made in the background).
    fn judge(self: &Arc<Self>, link: &Arc<Link>, slot: u16, attempt: &mut Option<Attempt>) -> bool {
        let Some(silent) = link.health(slot).and_then(|h| h.silent_for()) else {
            return false;
        };
        self.silent_for(link, slot, silent, attempt)
    }

    /// Replaces `link` if the connection serving `slot` has been silent
    /// for `silent`, and that is the silence that replaces a connection.
    fn silent_for(
        self: &Arc<Self>,
        link: &Arc<Link>,
        slot: u16,
        silent: Duration,
        attempt: &mut Option<Attempt>,
    ) -> bool {
        if silent < self.silence {
            return false;
        }
        let node = link.node(slot).map(|(n, _)| n.to_string());
        let why = format!("no reply for {silent:?}");
        self.replace(link, &why, node.as_deref(), attempt);
        true
    }

    /// Replaces `link`, when it is still the current one (a failure seen on
    /// an older connection says nothing of the new one).
    fn replace(
        self: &Arc<Self>,
        link: &Arc<Link>,
        why: &str,
        node: Option<&str>,
        attempt: &mut Option<Attempt>,
    ) {
        let current = {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            matches!(&*state, State::Up(l) if l.generation == link.generation)
        };
        if !current {
            return;
        }
        match self.target {
            Target::Standalone { .. } => {
                tracing::warn!(reason = %redact(why), "replacing the redis connection");
                *self.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Down {
                    error: NotRun::Reconnecting.into(),
                    at: None,
                };
            }
            Target::Cluster(_) => {
                let recent = self
                    .failed_at
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_some_and(|at| at.elapsed() < self.timeout);
                if attempt.is_none() && !recent {
                    tracing::warn!(
                        node = node.unwrap_or("?"),
                        reason = %redact(why),
                        "redis cluster node silent: making the cluster connection again"
                    );
                    drop(Arc::clone(self).start_attempt(attempt));
                }
            }
        }
    }

    /// What a failed request means: the error to answer, the connection
    /// replaced when the error says it is broken.
    fn failed(self: &Arc<Self>, link: &Arc<Link>, e: &RedisError) -> CallError {
        if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) {
            return CallError::NoScript(
                Fault::Redis(crate::backend::Shared::new(e.clone())).into(),
            );
        }
        let class = classify(e);
        match class {
            // The library follows a Cluster's topology on these itself.
            Class::Outage { replace: true } if !self.is_cluster() => {
                let mut attempt = self.attempt.lock().unwrap_or_else(|p| p.into_inner());
                self.replace(link, &e.to_string(), None, &mut attempt);
            }
            Class::Corrupt => {
                self.counts.corrupt.fetch_add(1, Ordering::Relaxed);
                return CallError::Corrupt(e.detail().unwrap_or_default().to_owned());
            }
            _ => {}
        }
        CallError::Failed(to_backend_error(class, e))
    }

    fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// Awaits the reply to a request whose caller gave up, for at most
    /// [`LATE_REPLY_WAIT`]; hands it to `late`. A reply that is an error
    /// judges the request's own link (never a newer one), and so does the
    /// wait's end without a reply (the library's bound on the request, or
    /// this wait's): the connection to `slot`'s node has then been silent
    /// since the request was `sent`.
    fn wait_late(
        self: Arc<Self>,
        link: Arc<Link>,
        slot: u16,
        sent: Instant,
        request: BoxFuture<'static, RedisResult<Value>>,
        late: Option<LateReply>,
    ) {
        if self.late_waits.fetch_add(1, Ordering::Relaxed) >= MAX_LATE_WAITS {
            self.late_waits.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        tokio::spawn(async move {
            let reply = tokio::time::timeout(LATE_REPLY_WAIT, request).await;
            let unanswered = match &reply {
                Err(_) => true,
                Ok(reply) => reply.as_ref().is_err_and(RedisError::is_timeout),
            };
            if unanswered {
                let mut attempt = self.attempt.lock().unwrap_or_else(|p| p.into_inner());
                self.silent_for(&link, slot, sent.elapsed(), &mut attempt);
            }
            if let Ok(reply) = reply {
                if let Err(e) = &reply {
                    drop(self.failed(&link, e));
                }
                if let Some(late) = late {
                    late(&reply);
                }
            }
            self.late_waits.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// Starts a connection attempt as a task of its own, bounded by the
    /// store timeout, and records it as the running one.
    fn start_attempt(self: Arc<Self>, running: &mut Option<Attempt>) -> Attempt {
        let inner = Arc::clone(&self);
        let task = tokio::spawn(async move { inner.attempt_now().await });
        let attempt = async move {
            task.await.unwrap_or_else(|e| {
                Err(Fault::Bug(format!("redis connection attempt: {e}")).into())
            })
        }
        .boxed()
        .shared();
        *running = Some(attempt.clone());
        attempt
    }

    /// One connection attempt, counted, its outcome made the state.
    async fn attempt_now(self: Arc<Self>) -> Result<Arc<Link>, BackendError> {
        let within = self.connect_within;
        let result = match tokio::time::timeout(within, self.open()).await {
            Ok(result) => result,
            Err(_) => Err(NotRun::ConnectTimedOut(within).into()),
        };
        let mut attempt = self.attempt.lock().unwrap_or_else(|p| p.into_inner());
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &result {
            Ok(link) => {
                self.counts.connected.fetch_add(1, Ordering::Relaxed);
                if self.outage_logged.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        generation = link.generation,
                        "connected to redis: the outage is over"
                    );
                } else {
                    tracing::info!(generation = link.generation, "connected to redis");
                }
                *state = State::Up(Arc::clone(link));
            }
            Err(error) => {
                self.counts.connect_failures.fetch_add(1, Ordering::Relaxed);
                if self.outage_logged.swap(true, Ordering::Relaxed) {
                    tracing::debug!(error = %crate::log::Causes(error), "cannot connect to redis");
                } else {
                    tracing::warn!(
                        error = %crate::log::Causes(error),
                        "cannot connect to redis: checks answer their policy's on_error until it answers (logged once, until it does)"
                    );
                }
                match self.target {
                    Target::Standalone { .. } => {
                        *state = State::Down {
                            error: error.clone(),
                            at: Some(Instant::now()),
                        };
                    }
                    Target::Cluster(_) => {
                        *self.failed_at.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(Instant::now());
                    }
                }
            }
        }
        *attempt = None;
        result
    }

    /// Makes a connection and reads the clock through it.
    async fn open(&self) -> Result<Arc<Link>, BackendError> {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let error = |e: RedisError| connect_error(&e);
        match &self.target {
            Target::Standalone { client, config } => {
                let mut conn = client
                    .client()
                    .await
                    .map_err(error)?
                    .get_multiplexed_async_connection_with_config(config)
                    .await
                    .map_err(error)?;
                // The first reply's clock: every script after it carries a
                // deadline in this server's time.
                let time = redis::cmd("TIME")
                    .query_async::<Value>(&mut conn)
                    .await
                    .map_err(error)?;
                let received = local_ms();
                let offsets = Offsets::default();
                offsets.record(0, first_time(&time)?, received);
                Ok(Arc::new(Link {
                    generation,
                    conn: Conn::Standalone {
                        conn,
                        health: Arc::default(),
                    },
                    offsets,
                }))
            }
            Target::Cluster(client) => {
                let mut conn = client.get_async_connection().await.map_err(error)?;
                let map = self.slot_map(&mut conn).await?;
                let offsets = self.primaries_time(&conn, &map).await?;
                let health = Arc::new(
                    map.primaries()
                        .into_iter()
                        .map(|(_, node)| (node, Arc::default()))
                        .collect(),
                );
                Ok(Arc::new(Link {
                    generation,
                    conn: Conn::Cluster { conn, map, health },
                    offsets,
                }))
            }
        }
    }

    /// `CLUSTER SLOTS` from whichever primary answers first.
    async fn slot_map(&self, conn: &mut ClusterConnection) -> Result<SlotMap, BackendError> {
        let routing = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllMasters,
            Some(ResponsePolicy::OneSucceeded),
        ));
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let reply = tokio::time::timeout(self.timeout, conn.route_command(slots, routing))
            .await
            .map_err(|_| NotRun::ConnectTimedOut(self.timeout))?
            .map_err(|e| connect_error(&e))?;
        SlotMap::parse(&reply).ok_or_else(|| {
            Fault::Reply(format!(
                "redis cluster answered CLUSTER SLOTS with {reply:?}"
            ))
            .into()
        })
    }

    /// Reads `TIME` from every primary at once, each bounded by the
    /// timeout: the bound for slots that have not answered yet. Primaries
    /// that do not answer are logged; one answer is enough to serve.
    async fn primaries_time(
        &self,
        conn: &ClusterConnection,
        map: &SlotMap,
    ) -> Result<Offsets, BackendError> {
        let primaries = map.primaries();
        let reads = primaries.iter().map(|(slot, _)| {
            let mut conn = conn.clone();
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                *slot,
                SlotAddr::Master,
            )));
            async move {
                let reply = tokio::time::timeout(
                    self.timeout,
                    conn.route_command(redis::cmd("TIME"), routing),
                )
                .await
                .map_err(|_| NotRun::ConnectTimedOut(self.timeout))?
                .map_err(|e| connect_error(&e))?;
                let received = local_ms();
                Ok::<_, BackendError>((first_time(&reply)?, received))
            }
        });
        let replies = futures_util::future::join_all(reads).await;
        let offsets = Offsets::default();
        let mut missing = Vec::new();
        let mut last_error = None;
        for (i, ((_, node), reply)) in primaries.iter().zip(replies).enumerate() {
            match reply {
                // Pseudo-slots past the last real one: they stand only for
                // slots with no reply of their own.
                Ok((t, received)) => {
                    offsets.record(16_384 + u16::try_from(i).unwrap_or(0), t, received);
                }
                Err(e) => {
                    missing.push(node.to_string());
                    last_error = Some(e);
                }
            }
        }
        if missing.len() == primaries.len() {
            return Err(last_error.unwrap_or_else(|| NotRun::NoPrimary.into()));
        }
        if !missing.is_empty() {
            tracing::warn!(
                nodes = %missing.join(","),
                "redis cluster primaries did not answer TIME: their keys fail until they do, and their first scripts use the smallest clock bound of the others"
            );
        }
        Ok(offsets)
    }
}

/// `TIME`'s seconds and microseconds, as milliseconds.
pub(super) fn redis_ms((secs, micros): (u64, u64)) -> u64 {
    secs * 1_000 + micros / 1_000
}

/// The `TIME` in a reply, as milliseconds.
fn first_time(reply: &Value) -> Result<u64, BackendError> {
    let mut times = Vec::new();
    collect_times(reply, &mut times);
    times
        .first()
        .copied()
        .ok_or_else(|| Fault::Reply(format!("redis answered TIME with {reply:?}")).into())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn the_slot_map_finds_the_primary_of_every_slot_it_covers() {
        let node =
            |host: &str, port: i64| Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]);
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5_461),
                Value::Int(10_922),
                node("10.0.0.2", 7001),
                node("10.0.0.9", 7009),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5_460),
                node("10.0.0.1", 7000),
            ]),
            Value::Array(vec![
                Value::Int(12_000),
                Value::Int(16_383),
                node("10.0.0.1", 7000),
            ]),
        ]);
        let map = SlotMap::parse(&reply).expect("a slot map");
        assert_eq!(map.node(0).map(|n| &**n), Some("10.0.0.1:7000"));
        assert_eq!(map.node(5_461).map(|n| &**n), Some("10.0.0.2:7001"));
        assert_eq!(map.node(10_922).map(|n| &**n), Some("10.0.0.2:7001"));
        assert_eq!(map.node(11_000), None, "an uncovered slot");
        assert_eq!(map.node(16_383).map(|n| &**n), Some("10.0.0.1:7000"));
        let primaries: Vec<_> = map
            .primaries()
            .into_iter()
            .map(|(s, n)| (s, n.to_string()))
            .collect();
        assert_eq!(
            primaries,
            [
                (0, "10.0.0.1:7000".to_owned()),
                (5_461, "10.0.0.2:7001".to_owned())
            ]
        );
        assert!(SlotMap::parse(&bulk("no")).is_none());
    }

    #[test]
    fn a_connection_is_silent_only_while_requests_wait_unanswered() {
        let health = Health::default();
        assert_eq!(health.silent_for(), None);
        health.sent();
        health.sent();
        assert!(health.silent_for().is_some());
        health.answered();
        assert!(health.silent_for().is_some(), "one still waits");
        health.abandoned();
        assert_eq!(health.silent_for(), None);
        // A request dropped before its reply stops counting as waiting.
        let dropped = InFlight::start(Some(Arc::new(Health::default())));
        let h = dropped.0.clone().expect("health");
        assert!(h.silent_for().is_some());
        drop(dropped);
        assert_eq!(h.silent_for(), None);
    }

    #[test]
    fn a_primary_the_library_cannot_reach_is_tried_once_per_retry_period_until_it_answers() {
        // MOVED back to it, but the library had no time to reconnect yet
        // (a failback): nothing is marked.
        let health = Health::default();
        for _ in 0..3 {
            health.sent();
            health.moved_back(Duration::from_secs(3_600));
        }
        assert!(health.may_send());
        assert_eq!(health.silent_for(), None, "MOVED is a reply");
        // Another reply between two such answers starts over: the library
        // reached it meanwhile.
        let health = Health::default();
        health.sent();
        health.moved_back(Duration::ZERO);
        health.sent();
        health.answered();
        health.sent();
        health.moved_back(Duration::ZERO);
        assert!(health.may_send(), "the first since a reply");
        // MOVED back to it again once the library had that time: marked.
        let health = Health::default();
        health.sent();
        health.moved_back(Duration::ZERO);
        assert!(health.may_send(), "one such answer marks nothing");
        health.sent();
        health.moved_back(Duration::ZERO);
        assert!(!health.may_send(), "within the retry period");
        assert!(!health.may_send());
        // The period has passed: one request goes through, the next waits.
        let earlier = Instant::now()
            .checked_sub(UNREACHABLE_RETRY)
            .expect("a monotonic clock older than the retry period");
        health.state.lock().expect("unpoisoned").unreachable_since = Some(earlier);
        assert!(health.may_send(), "one try after the period");
        assert!(!health.may_send(), "the try restarted the period");
        // Any reply means the library reaches it again.
        health.sent();
        health.answered();
        assert!(health.may_send());
    }

    #[test]
    fn the_user_timeout_is_the_silence_that_replaces_a_connection_and_at_least_two_seconds() {
        let mut settings = RedisSettings::new(
            RedisTarget::Standalone("redis://127.0.0.1/".to_owned()),
            Duration::from_millis(100),
        );
        assert_eq!(user_timeout(&settings), MIN_USER_TIMEOUT);
        settings.timeout = Duration::from_secs(1);
        assert_eq!(user_timeout(&settings), Duration::from_secs(3));
    }

    #[test]
    fn a_callers_deadline_equal_to_the_timeout_is_the_stores_own() {
        let timeout = Duration::from_millis(100);
        let b = Bound::new(timeout, Deadline::after(Duration::from_secs(60)));
        assert!(b.own);
        let b = Bound::new(timeout, Deadline::after(Duration::from_millis(10)));
        assert!(!b.own);
    }
}
