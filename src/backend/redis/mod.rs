//! The Redis backend: quotad replicas become stateless and Redis owns the
//! state, standalone or as a Cluster.
//!
//! Every transition is one call of one Lua script (`quota.lua`), which loads
//! the state, brings it forward, decides, writes it back and sets its TTL
//! atomically, with the same integer arithmetic as quotad-core and the Redis
//! server's clock (`TIME`), so replicas with skewed clocks agree. The script
//! is called by SHA and loaded again transparently after `SCRIPT FLUSH` or a
//! restart (NOSCRIPT).
//!
//! Keys are `quotad:<policy>|{<key>}` (a key starting with `}` is written in
//! hex, `|h{...}`, so its tag is never empty). The braces make the rate-limit key the
//! Redis Cluster hash tag, so one key under several policies (say per second
//! and per day) lives in one slot and an `ALL_OR_NOTHING` batch over them is
//! one atomic script. Keys of different users live in different slots; a
//! batch spanning slots is refused with [`BackendError::CrossSlot`]. To
//! co-locate keys on purpose, give them a common tag of their own:
//! `{team-7}alice` and `{team-7}bob` share the slot of `{team-7`.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::{BatchMode, CheckItem, Clock, Decision};
use quotad_proto::convert;
use quotad_proto::v1 as pb;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Script};

use super::{Backend, BackendError, BackendStats, ItemResult};

const SCRIPT: &str = include_str!("quota.lua");

/// Where Redis is and how long a call may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisSettings {
    /// A standalone server (`redis://host:port/db`), or the seed nodes of a
    /// Cluster.
    pub target: RedisTarget,
    /// The longest one call may take, reconnecting included; past it the
    /// policy's `on_error` applies.
    pub timeout: Duration,
}

/// A standalone Redis or a Redis Cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (or a proxy) at this URL.
    Standalone(String),
    /// A Cluster, found through these seed node URLs.
    Cluster(Vec<String>),
}

#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The Redis state store.
#[derive(Clone)]
pub struct RedisBackend {
    connection: Connection,
    script: Arc<Script>,
    timeout: Duration,
    /// Tests only: a clock to decide by instead of Redis `TIME`.
    clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.connection {
            Connection::Standalone(_) => "standalone",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisBackend")
            .field("connection", &kind)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What the script is asked to do with a batch.
#[derive(Clone, Copy)]
enum Mode {
    Check,
    AllOrNothing,
    Peek,
}

impl Mode {
    fn as_arg(self) -> &'static str {
        match self {
            Mode::Check => "check",
            Mode::AllOrNothing => "all",
            Mode::Peek => "peek",
        }
    }
}

impl RedisBackend {
    /// Connects to Redis and loads the script.
    ///
    /// # Errors
    ///
    /// [`BackendError::Unavailable`] when Redis cannot be reached within the
    /// timeout.
    pub async fn connect(settings: &RedisSettings) -> Result<Self, BackendError> {
        let connect = async {
            match &settings.target {
                RedisTarget::Standalone(url) => {
                    let client = redis::Client::open(url.as_str())?;
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(settings.timeout))
                        .set_response_timeout(Some(settings.timeout))
                        .set_number_of_retries(1);
                    let manager = ConnectionManager::new_with_config(client, config).await?;
                    Ok::<_, RedisError>(Connection::Standalone(manager))
                }
                RedisTarget::Cluster(nodes) => {
                    let client = ClusterClient::builder(nodes.clone())
                        .connection_timeout(settings.timeout)
                        .response_timeout(settings.timeout)
                        .retries(1)
                        .build()?;
                    Ok(Connection::Cluster(client.get_async_connection().await?))
                }
            }
        };
        let connection = tokio::time::timeout(settings.timeout, connect)
            .await
            .map_err(|_| timed_out(settings.timeout))?
            .map_err(unavailable)?;
        Ok(Self {
            connection,
            script: Arc::new(Script::new(SCRIPT)),
            timeout: settings.timeout,
            clock: None,
        })
    }

    /// Decides by `clock` instead of the Redis server's `TIME`. For tests
    /// that compare backends at injected instants; never set by the server.
    #[doc(hidden)]
    #[must_use]
    pub fn with_test_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Runs the script over `items` in one call.
    async fn eval(
        &self,
        mode: Mode,
        items: &[CheckItem<'_>],
    ) -> Result<Vec<Decision>, BackendError> {
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(mode.as_arg());
        match &self.clock {
            Some(clock) => invocation.arg(clock.now_ms()),
            None => invocation.arg(""),
        };
        for item in items {
            let policy = item.policy();
            invocation
                .key(redis_key(item.name(), item.key()))
                .arg(pb::Algorithm::from(policy.algorithm()) as i32)
                .arg(policy.limit())
                .arg(policy.window_ms())
                .arg(policy.burst())
                .arg(item.cost().get());
        }
        let reply: Vec<u64> = match self.connection.clone() {
            Connection::Standalone(mut c) => self.invoke(&invocation, &mut c).await?,
            Connection::Cluster(mut c) => self.invoke(&invocation, &mut c).await?,
        };
        decisions(&reply, items.len())
    }

    async fn invoke<C: ConnectionLike + Send>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        connection: &mut C,
    ) -> Result<Vec<u64>, BackendError> {
        tokio::time::timeout(self.timeout, invocation.invoke_async(connection))
            .await
            .map_err(|_| timed_out(self.timeout))?
            .map_err(classify)
    }

    /// Runs the script over `items` in one call: every item decided, or
    /// every item failed.
    async fn eval_each(&self, mode: Mode, items: &[CheckItem<'_>]) -> Vec<ItemResult> {
        match self.eval(mode, items).await {
            Ok(decisions) => decisions.into_iter().map(Ok).collect(),
            Err(error) => vec![Err(error); items.len()],
        }
    }

    /// On a Cluster, independent items may live in different slots, so each
    /// goes in its own call (all concurrently, over one multiplexed
    /// connection) and a node that is down fails only its own items; a
    /// standalone server takes the batch in one call.
    async fn independent(&self, items: &[CheckItem<'_>]) -> Vec<ItemResult> {
        match self.connection {
            Connection::Standalone(_) => self.eval_each(Mode::Check, items).await,
            Connection::Cluster(_) => {
                let calls = items.iter().map(|item| self.check_one(item));
                futures_util::future::join_all(calls).await
            }
        }
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn check_one(&self, item: &CheckItem<'_>) -> ItemResult {
        let mut d = self.eval(Mode::Check, std::slice::from_ref(item)).await?;
        Ok(d.remove(0))
    }

    async fn check(&self, items: &[CheckItem<'_>], mode: BatchMode) -> Vec<ItemResult> {
        match mode {
            BatchMode::Independent => self.independent(items).await,
            BatchMode::AllOrNothing => self.eval_each(Mode::AllOrNothing, items).await,
        }
    }

    async fn peek(&self, item: &CheckItem<'_>) -> ItemResult {
        let mut d = self.eval(Mode::Peek, std::slice::from_ref(item)).await?;
        Ok(d.remove(0))
    }

    async fn reset(&self, name: &str, key: &str) -> Result<(), BackendError> {
        let mut del = redis::cmd("DEL");
        del.arg(redis_key(name, key));
        let call = async {
            match self.connection.clone() {
                Connection::Standalone(mut c) => del.query_async::<()>(&mut c).await,
                Connection::Cluster(mut c) => del.query_async::<()>(&mut c).await,
            }
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| timed_out(self.timeout))?
            .map_err(unavailable)
    }

    fn stats(&self) -> BackendStats {
        // Redis expires state by TTL; quotad keeps no count of its own.
        BackendStats::default()
    }
}

/// `quotad:<policy>|{<key>}`: policy names hold no `|`, and the key is the
/// Cluster hash tag. A key that starts with `}` would make that tag empty
/// (Redis then hashes the whole name, and the key's policies could land in
/// different slots), so it is written in hex instead: `quotad:<policy>|h{<hex>}`.
fn redis_key(name: &str, key: &str) -> String {
    use std::fmt::Write as _;
    let mut k = String::with_capacity(name.len() + 2 * key.len() + 12);
    k.push_str("quotad:");
    k.push_str(name);
    if key.starts_with('}') {
        k.push_str("|h{");
        for byte in key.bytes() {
            let _ = write!(k, "{byte:02x}");
        }
    } else {
        k.push_str("|{");
        k.push_str(key);
    }
    k.push('}');
    k
}

fn decisions(reply: &[u64], items: usize) -> Result<Vec<Decision>, BackendError> {
    if reply.len() != items * 6 {
        return Err(BackendError::Internal(format!(
            "the script answered {} numbers for {items} items",
            reply.len()
        )));
    }
    reply
        .chunks_exact(6)
        .map(|d| {
            let reason = i32::try_from(d[5])
                .ok()
                .and_then(|code| convert::reason(code).ok())
                .ok_or_else(|| {
                    BackendError::Internal(format!("the script answered reason {}", d[5]))
                })?;
            Ok(Decision {
                allowed: d[0] == 1,
                limit: d[1],
                remaining: d[2],
                retry_after_ms: d[3],
                reset_after_ms: d[4],
                reason,
            })
        })
        .collect()
}

fn unavailable(e: RedisError) -> BackendError {
    BackendError::Unavailable(format!("redis: {e}"))
}

/// An outage (the policy's `on_error` applies) or a fault that retrying
/// and failing open would only hide: a script error, a wrong type, a reply
/// quotad cannot read (INTERNAL).
fn classify(e: RedisError) -> BackendError {
    if e.code() == Some("CROSSSLOT") {
        return BackendError::CrossSlot;
    }
    let outage = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(
            e.code(),
            Some("TRYAGAIN" | "CLUSTERDOWN" | "LOADING" | "MASTERDOWN" | "READONLY" | "BUSY")
        );
    if outage {
        unavailable(e)
    } else {
        BackendError::Internal(format!("redis: {e}"))
    }
}

fn timed_out(after: Duration) -> BackendError {
    BackendError::Unavailable(format!("redis did not answer within {after:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_cluster_hash_tag() {
        assert_eq!(redis_key("per_day", "alice"), "quotad:per_day|{alice}");
        assert_eq!(redis_key("per_day", "}x"), "quotad:per_day|h{7d78}");
        assert_ne!(redis_key("p", "}x"), redis_key("p", "h{7d78"));
        assert_eq!(
            redis_key("inline:fixed_window:1:2:1", "{team}bob"),
            "quotad:inline:fixed_window:1:2:1|{{team}bob}"
        );
    }

    #[test]
    fn a_reply_of_the_wrong_length_is_an_error_not_a_decision() {
        assert!(decisions(&[1, 10, 9, 0, 100], 1).is_err());
        assert!(decisions(&[1, 10, 9, 0, 100, 9], 1).is_err());
        let d = decisions(&[0, 10, 0, 30, 30, 2], 1).expect("well formed");
        assert_eq!(d[0].reason, quotad_core::Reason::LimitExceeded);
        assert!(!d[0].allowed);
    }
}
