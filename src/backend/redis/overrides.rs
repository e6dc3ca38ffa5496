//! Runtime overrides in Redis: one hash per key prefix (`<prefix>:overrides`),
//! a field per override (its policy and scope) holding its JSON, and two
//! fields of its own: `#version`, which every change increments in the
//! same script (`HINCRBY`, never reset), and `#epoch`, fixed when the hash
//! is made (Redis time in microseconds), so a hash lost and made again
//! starts a newer history rather than counting back through versions a
//! replica has seen. Each replica polls the version (`HMGET`) and reads
//! the hash (`HGETALL`) only when it differs from the one it holds
//! (another count, or another epoch: a smaller count in the same epoch is
//! the store gone back, restored from an older copy or failed over with
//! the last writes lost, and is read too), so an idle poll is one small
//! call and no script. A change that changes nothing (removing an
//! override not there, nothing purged) leaves the version as it is.
//!
//! A change is one script ([`SCRIPT`], `overrides.lua`) that checks the
//! call's deadline in Redis's own clock first, as the state scripts do (a
//! change quotad answered as failed never lands later), then, atomically:
//! purges the overrides expired by Redis's clock (`TIME`, not the
//! writer's: a replica with a skewed clock neither purges live overrides
//! nor keeps dead ones), refuses a new override past the policy's
//! room (`limits.max_overrides`, less the file's), writes or removes it,
//! bumps the version and answers the value it replaced. Two replicas
//! setting at once therefore cannot both pass the count.

use redis::Value;

use super::RedisBackend;
use super::deadline;
use crate::backend::{
    BackendError, Deadline, OverrideWrite, OverrideWriteError, OverrideWritten, OverridesVersion,
};

/// The field of the hash that holds its version.
const VERSION: &str = "#version";

/// The field of the hash that holds its epoch.
const EPOCH: &str = "#epoch";

/// The change script; its arguments and answers are described in it.
const SCRIPT: &str = include_str!("overrides.lua");

/// What a `get` found: the version, and the overrides unless unchanged.
pub(super) type Loaded = Option<crate::backend::StoredOverrides>;

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A version field's number: absent is 0.
fn number(v: Option<&Value>) -> Option<u64> {
    match v {
        None | Some(Value::Nil) => Some(0),
        Some(Value::Int(n)) => u64::try_from(*n).ok(),
        Some(v) => text(v)?.parse::<u64>().ok(),
    }
}

impl RedisBackend {
    fn overrides_key(&self) -> String {
        format!("{}:overrides", self.prefix)
    }

    fn overrides_slot(&self, key: &str) -> u16 {
        if self.connections.is_cluster() {
            deadline::slot(key.as_bytes())
        } else {
            0
        }
    }

    /// Runs [`SCRIPT`] for `write`.
    pub(super) async fn write_override_in_redis(
        &self,
        write: &OverrideWrite<'_>,
        deadline: Deadline,
    ) -> Result<OverrideWritten, OverrideWriteError> {
        let key = self.overrides_key();
        let slot = self.overrides_slot(&key);
        let bound = self.connections.bound(deadline);
        // Nothing is sent before the call itself: a failure until then
        // certainly changed nothing.
        let call = self
            .start(slot, &bound)
            .await
            .map_err(OverrideWriteError::NotApplied)?;
        let mut eval = redis::cmd("EVAL");
        eval.arg(SCRIPT)
            .arg(1)
            .arg(&key)
            .arg(call.deadline)
            .arg(if write.value.is_some() { "set" } else { "del" })
            .arg(write.field)
            .arg(write.value.unwrap_or(""))
            .arg(write.policy_fields)
            .arg(write.room);
        let reply = self
            .connections
            .call(&call.link, slot, eval, &bound, None)
            .await
            .map_err(|e| {
                // Sent, and no answer (or a broken connection after
                // sending): Redis may have run it. Anything known to be
                // before the script ran (no connection, an error Redis
                // answered instead of running it) was not applied.
                let e = e.into_backend(&bound);
                if matches!(&e, BackendError::Unavailable(o) if o.may_have_run()) {
                    OverrideWriteError::Unknown(e)
                } else {
                    OverrideWriteError::NotApplied(e)
                }
            })?;
        // The script ran, and its answer cannot be read: it may have
        // written.
        let unreadable = |reply: &Value| {
            OverrideWriteError::Unknown(BackendError::bad_reply(format!(
                "the overrides script answered {reply:?}"
            )))
        };
        let Value::Array(values) = &reply else {
            return Err(unreadable(&reply));
        };
        match values.as_slice() {
            [Value::Int(-1)] => Err(OverrideWriteError::NotApplied(
                crate::backend::NotRun::RefusedLate("overrides script").into(),
            )),
            [Value::Int(-2), Value::Int(count)] => Err(OverrideWriteError::Full(
                u64::try_from(*count).unwrap_or_default(),
            )),
            [Value::Int(version), epoch, previous, Value::Int(purged)] => {
                let version = u64::try_from(*version).map_err(|_| unreadable(&reply))?;
                let epoch = number(Some(epoch)).ok_or_else(|| unreadable(&reply))?;
                if *purged > 0 {
                    tracing::info!(purged, "expired runtime overrides purged from the store");
                }
                Ok(OverrideWritten {
                    version: Some((epoch, version)),
                    previous: text(previous),
                })
            }
            _ => Err(unreadable(&reply)),
        }
    }

    /// One plain command (no script: a read changes nothing, so it needs
    /// no deadline in Redis's clock), within the call's bound.
    async fn overrides_read(
        &self,
        cmd: redis::Cmd,
        deadline: Deadline,
    ) -> Result<Value, BackendError> {
        let key = self.overrides_key();
        let slot = self.overrides_slot(&key);
        let bound = self.connections.bound(deadline);
        let link = self
            .connections
            .link(slot, &bound)
            .await
            .map_err(|e| e.into_backend(&bound))?;
        self.connections
            .call(&link, slot, cmd, &bound, None)
            .await
            .map_err(|e| e.into_backend(&bound))
    }

    /// The overrides unless their version is `known` (the same epoch and
    /// count): an
    /// `HMGET` of the version and epoch, then, when it differs, one `HGETALL`
    /// (whose own version fields are the ones answered, so the set and its
    /// version agree).
    pub(super) async fn load_overrides_from_redis(
        &self,
        known: Option<OverridesVersion>,
        deadline: Deadline,
    ) -> Result<Loaded, BackendError> {
        let key = self.overrides_key();
        let not_a_number =
            || BackendError::bad_reply(format!("{key} {VERSION} or {EPOCH} is not a number"));
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(&key).arg(EPOCH).arg(VERSION);
        let reply = self.overrides_read(hmget, deadline).await?;
        let version = match &reply {
            Value::Array(items) => match items.as_slice() {
                [epoch, version] => (number(Some(epoch)), number(Some(version))),
                _ => (None, None),
            },
            _ => (None, None),
        };
        let (Some(epoch), Some(number_now)) = version else {
            return Err(not_a_number());
        };
        if known.is_some_and(|(e, n)| e == epoch && number_now == n) {
            return Ok(None);
        }
        let mut hgetall = redis::cmd("HGETALL");
        hgetall.arg(&key);
        let reply = self.overrides_read(hgetall, deadline).await?;
        let pairs: Vec<(String, String)> = match &reply {
            Value::Array(items) => items
                .chunks(2)
                .filter_map(|pair| match pair {
                    [f, v] => Some((text(f)?, text(v)?)),
                    _ => None,
                })
                .collect(),
            Value::Map(items) => items
                .iter()
                .filter_map(|(f, v)| Some((text(f)?, text(v)?)))
                .collect(),
            other => {
                return Err(BackendError::bad_reply(format!(
                    "HGETALL {key} answered {other:?}"
                )));
            }
        };
        let field = |name: &str| {
            pairs
                .iter()
                .find(|(f, _)| f == name)
                .map_or(Some(0), |(_, v)| v.parse::<u64>().ok())
        };
        let (Some(epoch), Some(version)) = (field(EPOCH), field(VERSION)) else {
            return Err(not_a_number());
        };
        let pairs = pairs
            .into_iter()
            .filter(|(f, _)| !f.starts_with('#'))
            .collect();
        Ok(Some(((epoch, version), pairs)))
    }
}
