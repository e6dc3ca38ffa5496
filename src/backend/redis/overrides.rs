//! Runtime overrides in Redis: one hash per key prefix (`<prefix>:overrides`),
//! a field per override (its policy and scope) holding its JSON, and a
//! version field (`#version`) that every change increments in the same
//! script. Each replica polls the version (`HGET`) and reads the hash
//! (`HGETALL`) only when it changed, so an idle poll is one small call and
//! no script.
//!
//! A change is a script that checks the call's deadline in Redis's own
//! clock first, as the state scripts do: a change quotad answered as
//! failed never lands later.

use redis::Value;

use super::RedisBackend;
use super::deadline;
use crate::backend::{BackendError, Deadline};

/// The field of the hash that holds its version.
const VERSION: &str = "#version";

/// `ARGV[1]`: the deadline (ms, Redis clock); `ARGV[2]`: `set` or `del`;
/// then the field and value (`set`) or the field (`del`). Answers
/// `{version}` (the new one), or `{-1}` past the deadline, nothing done.
const SCRIPT: &str = "local t = redis.call('TIME') \
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[1]) then return {-1} end \
if ARGV[2] == 'set' then redis.call('HSET', KEYS[1], ARGV[3], ARGV[4]) \
return {redis.call('HINCRBY', KEYS[1], '#version', 1)} end \
if ARGV[2] == 'del' then redis.call('HDEL', KEYS[1], ARGV[3]) \
return {redis.call('HINCRBY', KEYS[1], '#version', 1)} end \
return {0}";

/// What a `get` found: the version, and the overrides unless unchanged.
pub(super) type Loaded = Option<crate::backend::StoredOverrides>;

impl RedisBackend {
    fn overrides_key(&self) -> String {
        format!("{}:overrides", self.prefix)
    }

    /// Runs [`SCRIPT`] with `args` after the operation.
    async fn overrides_call(
        &self,
        op: &str,
        args: &[&str],
        deadline: Deadline,
    ) -> Result<Vec<Value>, BackendError> {
        let key = self.overrides_key();
        let slot = if self.connections.is_cluster() {
            deadline::slot(key.as_bytes())
        } else {
            0
        };
        let bound = self.connections.bound(deadline);
        let call = self.start(slot, &bound).await?;
        let mut eval = redis::cmd("EVAL");
        eval.arg(SCRIPT).arg(1).arg(&key).arg(call.deadline).arg(op);
        for a in args {
            eval.arg(*a);
        }
        let reply = self
            .connections
            .call(&call.link, slot, eval, &bound, None)
            .await
            .map_err(|e| e.into_backend(&bound))?;
        let Value::Array(values) = reply else {
            return Err(BackendError::bad_reply(format!(
                "the overrides script answered {reply:?}"
            )));
        };
        if matches!(values.first(), Some(Value::Int(-1))) {
            return Err(crate::backend::NotRun::RefusedLate("overrides script").into());
        }
        Ok(values)
    }

    pub(super) async fn put_override_in_redis(
        &self,
        field: &str,
        value: &str,
        deadline: Deadline,
    ) -> Result<(), BackendError> {
        self.overrides_call("set", &[field, value], deadline)
            .await
            .map(drop)
    }

    pub(super) async fn remove_override_in_redis(
        &self,
        field: &str,
        deadline: Deadline,
    ) -> Result<(), BackendError> {
        self.overrides_call("del", &[field], deadline)
            .await
            .map(drop)
    }

    /// One plain command (no script: a read changes nothing, so it needs
    /// no deadline in Redis's clock), within the call's bound.
    async fn overrides_read(
        &self,
        cmd: redis::Cmd,
        deadline: Deadline,
    ) -> Result<Value, BackendError> {
        let key = self.overrides_key();
        let slot = if self.connections.is_cluster() {
            deadline::slot(key.as_bytes())
        } else {
            0
        };
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

    /// The overrides unless their version is `known`: an `HGET` of the
    /// version, then, when it changed, one `HGETALL` (whose own version
    /// field is the one answered, so the set and its version agree).
    pub(super) async fn load_overrides_from_redis(
        &self,
        known: Option<u64>,
        deadline: Deadline,
    ) -> Result<Loaded, BackendError> {
        let text = |v: &Value| match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let number = |v: Option<&Value>| match v {
            None | Some(Value::Nil) => Some(0),
            Some(v) => text(v)?.parse::<u64>().ok(),
        };
        let key = self.overrides_key();
        let mut hget = redis::cmd("HGET");
        hget.arg(&key).arg(VERSION);
        let reply = self.overrides_read(hget, deadline).await?;
        let version = number(Some(&reply)).ok_or_else(|| {
            BackendError::bad_reply(format!("{key} {VERSION} holds {reply:?}, not a number"))
        })?;
        if known == Some(version) {
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
        let version = pairs
            .iter()
            .find(|(f, _)| f == VERSION)
            .map_or(Some(0), |(_, v)| v.parse().ok())
            .ok_or_else(|| BackendError::bad_reply(format!("{key} {VERSION} is not a number")))?;
        let pairs = pairs.into_iter().filter(|(f, _)| f != VERSION).collect();
        Ok(Some((version, pairs)))
    }
}
