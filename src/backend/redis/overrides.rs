//! Runtime overrides in Redis: one hash per key prefix (`<prefix>:overrides`),
//! a field per override (its policy and scope) holding its JSON, and a
//! version field (`#version`) that every change increments in the same
//! script. Each replica polls the version and reads the hash only when it
//! changed, so an idle poll is one small call.
//!
//! Every script checks the call's deadline in Redis's own clock first, as
//! the state scripts do: a change quotad answered as failed never lands
//! later.

use redis::Value;

use super::RedisBackend;
use super::deadline;
use crate::backend::{BackendError, Deadline};

/// The field of the hash that holds its version.
const VERSION: &str = "#version";

/// `ARGV[1]`: the deadline (ms, Redis clock); `ARGV[2]`: `set`, `del` or
/// `get`; then the field and value (`set`), the field (`del`), or the
/// version known (`get`). `set` and `del` answer the new version (0: past
/// the deadline, nothing done); `get` answers `{version}` when it is the
/// one known, else `{version, field, value, ...}` without the version
/// field.
const SCRIPT: &str = "local t = redis.call('TIME') \
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[1]) then return {-1} end \
if ARGV[2] == 'set' then redis.call('HSET', KEYS[1], ARGV[3], ARGV[4]) \
return {redis.call('HINCRBY', KEYS[1], '#version', 1)} end \
if ARGV[2] == 'del' then redis.call('HDEL', KEYS[1], ARGV[3]) \
return {redis.call('HINCRBY', KEYS[1], '#version', 1)} end \
local v = tonumber(redis.call('HGET', KEYS[1], '#version') or '0') \
if tostring(v) == ARGV[3] then return {v} end \
local all = redis.call('HGETALL', KEYS[1]) local out = {v} \
for i = 1, #all, 2 do if all[i] ~= '#version' then out[#out + 1] = all[i] out[#out + 1] = all[i + 1] end end \
return out";

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
            return Err(BackendError::Internal(format!(
                "the overrides script answered {reply:?}"
            )));
        };
        if matches!(values.first(), Some(Value::Int(-1))) {
            return Err(BackendError::Unavailable(
                "redis ran the overrides script past its deadline and refused it".to_owned(),
            ));
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

    pub(super) async fn load_overrides_from_redis(
        &self,
        known: Option<u64>,
        deadline: Deadline,
    ) -> Result<Loaded, BackendError> {
        // No version is ever -1: with none known, the hash is read.
        let known = known.map_or_else(|| "-1".to_owned(), |v| v.to_string());
        let values = self.overrides_call("get", &[&known], deadline).await?;
        let text = |v: &Value| match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let Some(Value::Int(version)) = values.first() else {
            return Err(BackendError::Internal(format!(
                "the overrides script answered {values:?}"
            )));
        };
        let version = u64::try_from(*version).unwrap_or(0);
        if values.len() == 1 && known == version.to_string() {
            return Ok(None);
        }
        let pairs = values[1..]
            .chunks(2)
            .filter_map(|pair| match pair {
                [f, v] => Some((text(f)?, text(v)?)),
                _ => None,
            })
            .filter(|(f, _)| f != VERSION)
            .collect();
        Ok(Some((version, pairs)))
    }
}
