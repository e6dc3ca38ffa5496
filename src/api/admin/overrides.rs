//! The `quotad.v1.Overrides` gRPC service: set, remove and list runtime
//! overrides.
//!
//! A change is validated against the policies in force and the bounds of
//! `[limits]` (an override's numbers are chosen by a caller, as an inline
//! policy's are), kept in the store (so that every replica on it applies
//! it; the memory store keeps it in its snapshot), then swapped into this
//! replica's registry, and logged with the caller's identity and the
//! previous value the store answered (target `quotad::audit`). A change
//! the store certainly did not keep is UNAVAILABLE and changes nothing; a
//! change sent whose answer never came is UNAVAILABLE saying it may have
//! been applied, is logged as unknown (never as applied), and the poller
//! shows which it was.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::Algorithm;
use quotad_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::entry_to_pb;
use crate::api::error::ServiceError;
use crate::api::request::check_key_bytes;
use crate::auth::{self, Origin};
use crate::backend::{Backend, Deadline, OverrideWrite, OverrideWriteError, OverrideWritten};
use crate::config::LimitSettings;
use crate::metrics::{Method, Metrics};
use crate::registry::PolicyRegistry;
use crate::registry::PutError;
use crate::registry::overrides::{
    Override, Scope, Source, from_store, store_field, store_fields_of, store_value,
};

/// The Overrides service over a backend `S`.
#[derive(Debug)]
pub(crate) struct OverridesService<S> {
    backend: Arc<S>,
    policies: Arc<PolicyRegistry>,
    metrics: Arc<Metrics>,
    max_key_bytes: usize,
    request_timeout: Duration,
}

/// `scope` as written: a key or a non-empty prefix, within the key bound.
fn scope_of(scope: Option<pb::OverrideScope>, max_key_bytes: usize) -> Result<Scope, ServiceError> {
    match scope.and_then(|s| s.scope) {
        None => Err(ServiceError::invalid(
            "scope",
            "must be set: a key or a prefix",
        )),
        Some(pb::override_scope::Scope::Key(k)) => {
            check_key_bytes(&k, max_key_bytes).map_err(|e| rename(e, "scope.key"))?;
            Ok(Scope::Key(k))
        }
        Some(pb::override_scope::Scope::Prefix(p)) => {
            if p.is_empty() {
                return Err(ServiceError::invalid(
                    "scope.prefix",
                    "must not be empty (an override for every key is the policy itself)",
                ));
            }
            check_key_bytes(&p, max_key_bytes).map_err(|e| rename(e, "scope.prefix"))?;
            Ok(Scope::Prefix(p))
        }
    }
}

/// `error` about a key, as about `field`.
fn rename(error: ServiceError, field: &str) -> ServiceError {
    match error {
        ServiceError::Invalid { message, .. } => ServiceError::invalid(field, message),
        other => other,
    }
}

fn policy_of(policy: &str) -> Result<(), ServiceError> {
    // A policy name is a config table's name: short and printable. What
    // is not cannot name one, and must not reach the audit log.
    if policy.is_empty() || policy.len() > MAX_POLICY_NAME || policy.chars().any(char::is_control) {
        Err(ServiceError::invalid(
            "policy",
            "must name a configured policy",
        ))
    } else {
        Ok(())
    }
}

/// The longest policy name an override call may give.
const MAX_POLICY_NAME: usize = 256;

/// The latest expiry an override may have: 10 years from now (past it, say
/// none; dates past year 9999 cannot even be written in RFC 3339).
const MAX_EXPIRY_MS: u64 = 10 * 366 * 86_400_000;

impl<S: Backend> OverridesService<S> {
    pub(crate) fn new(
        backend: Arc<S>,
        policies: Arc<PolicyRegistry>,
        metrics: Arc<Metrics>,
        max_key_bytes: usize,
        request_timeout: Duration,
    ) -> Self {
        OverridesService {
            backend,
            policies,
            metrics,
            max_key_bytes,
            request_timeout,
        }
    }

    fn admit(&self, origin: Origin, method: &str) -> Result<(), ServiceError> {
        let access = self.policies.snapshot().limits().allow_overrides;
        origin
            .admitted_by(access, method, "limits.allow_overrides")
            .map_err(ServiceError::Refused)
    }

    async fn set_one(
        &self,
        request: pb::SetOverrideRequest,
        origin: Origin,
        caller: String,
        deadline: Deadline,
    ) -> Result<pb::SetOverrideResponse, ServiceError> {
        self.admit(origin, "SetOverride")?;
        policy_of(&request.policy)?;
        let scope = scope_of(request.scope, self.max_key_bytes)?;
        let now = self.policies.now_ms();
        if let Some(at) = request.expires_at_ms
            && at <= now
        {
            return Err(ServiceError::invalid(
                "expires_at_ms",
                format!("must be in the future (it is {at}, now is {now})"),
            ));
        }
        if let Some(at) = request.expires_at_ms
            && at - now > MAX_EXPIRY_MS
        {
            return Err(ServiceError::invalid(
                "expires_at_ms",
                format!("must be within 10 years (it is {at}, now is {now}); omit it for none"),
            ));
        }
        let entry = Override {
            policy: request.policy,
            scope,
            limit: request.limit,
            window_ms: request.window_ms,
            burst: request.burst,
            expires_at_ms: request.expires_at_ms,
            source: Source::Runtime,
            set_by: caller.clone(),
            set_at_ms: now,
        };
        self.policies
            .check_override(&entry)
            .map_err(|e| put_error(&entry, e))?;
        let set = self.policies.snapshot();
        let algorithm = set
            .get(&entry.policy)
            .map(|(_, named)| named.settings.policy.algorithm());
        within_limits(&entry, algorithm, set.limits())?;
        let max = set.limits().max_overrides;
        let field = store_field(&entry.policy, &entry.scope);
        let value = store_value(&entry);
        let fields = store_fields_of(&entry.policy);
        let write = OverrideWrite {
            field: &field,
            value: Some(&value),
            policy_fields: &fields,
            room: max.saturating_sub(self.policies.file_overrides_of(&entry.policy)),
        };
        let written = self
            .written(
                &write,
                deadline,
                &caller,
                &entry.policy,
                &entry.scope,
                &entry.numbers(),
            )
            .await
            .map_err(|e| match e {
                OverrideWriteError::Full(_) => put_error(&entry, PutError::TooMany(max)),
                other => not_kept(other),
            })?;
        let slot = (entry.policy.clone(), entry.scope.clone());
        let old = match written.version {
            Some(version) => {
                self.policies
                    .apply_stored_change(slot, Some(entry.clone()), version);
                written
                    .previous
                    .as_deref()
                    .and_then(|v| from_store(&field, v))
                    .map(Arc::new)
            }
            None => self
                .policies
                .put_override(entry.clone())
                .map_err(|e| put_error(&entry, e))?,
        };
        tracing::info!(
            target: "quotad::audit",
            %caller,
            policy = %entry.policy,
            scope = %entry.scope.describe(),
            old = %old.as_deref().map_or_else(|| "none".to_owned(), Override::numbers),
            new = %entry.numbers(),
            "override set"
        );
        crate::registry::overrides::export(&self.policies, &self.metrics);
        Ok(pb::SetOverrideResponse {
            previous: old.as_deref().map(entry_to_pb),
        })
    }

    /// Runs `write` in the store; a write whose outcome is unknown is
    /// logged as such (never as applied).
    async fn written(
        &self,
        write: &OverrideWrite<'_>,
        deadline: Deadline,
        caller: &str,
        policy: &str,
        scope: &Scope,
        new: &str,
    ) -> Result<OverrideWritten, OverrideWriteError> {
        let result = self.backend.write_override(write, deadline).await;
        if let Err(OverrideWriteError::Unknown(error)) = &result {
            tracing::warn!(
                target: "quotad::audit",
                %caller,
                %policy,
                scope = %scope.describe(),
                error = %crate::log::Causes(error),
                change = if write.value.is_some() { "set" } else { "remove" },
                new = %new,
                "override change sent, outcome unknown (it may have been applied; the store's set shows which)"
            );
        }
        result
    }

    async fn remove_one(
        &self,
        request: pb::RemoveOverrideRequest,
        origin: Origin,
        caller: String,
        deadline: Deadline,
    ) -> Result<pb::RemoveOverrideResponse, ServiceError> {
        self.admit(origin, "RemoveOverride")?;
        policy_of(&request.policy)?;
        let scope = scope_of(request.scope, self.max_key_bytes)?;
        let field = store_field(&request.policy, &scope);
        let fields = store_fields_of(&request.policy);
        let write = OverrideWrite {
            field: &field,
            value: None,
            policy_fields: &fields,
            room: 0,
        };
        let written = self
            .written(&write, deadline, &caller, &request.policy, &scope, "none")
            .await
            .map_err(not_kept)?;
        let old = match written.version {
            Some(version) => {
                self.policies.apply_stored_change(
                    (request.policy.clone(), scope.clone()),
                    None,
                    version,
                );
                written
                    .previous
                    .as_deref()
                    .and_then(|v| from_store(&field, v))
                    .map(Arc::new)
            }
            None => self.policies.remove_override(&request.policy, &scope),
        };
        tracing::info!(
            target: "quotad::audit",
            %caller,
            policy = %request.policy,
            scope = %scope.describe(),
            old = %old.as_deref().map_or_else(|| "none".to_owned(), Override::numbers),
            new = "none",
            "override removed"
        );
        crate::registry::overrides::export(&self.policies, &self.metrics);
        Ok(pb::RemoveOverrideResponse {
            removed: old.is_some(),
            previous: old.as_deref().map(entry_to_pb),
        })
    }

    fn list(
        &self,
        request: &pb::ListOverridesRequest,
        origin: Origin,
    ) -> Result<pb::ListOverridesResponse, ServiceError> {
        self.admit(origin, "ListOverrides")?;
        let set = self.policies.snapshot();
        let now = self.policies.now_ms();
        let overrides = set
            .overrides()
            .iter()
            .filter(|a| a.entry.live_at(now))
            .filter(|a| request.policy.is_empty() || a.entry.policy == request.policy)
            .map(|a| entry_to_pb(&a.entry))
            .collect();
        Ok(pb::ListOverridesResponse {
            overrides,
            in_sync: self.policies.in_sync(),
        })
    }
}

/// The UNAVAILABLE of a change the store did not certainly keep: one that
/// certainly changed nothing says so; one sent whose answer never came
/// says it may have been applied.
fn not_kept(error: OverrideWriteError) -> ServiceError {
    match error {
        OverrideWriteError::Unknown(_) => {
            ServiceError::MaybeKept(crate::log::Causes(&error).to_string())
        }
        other => ServiceError::NotKept(crate::log::Causes(&other).to_string()),
    }
}

/// Refuses an override whose numbers `[limits]` does not allow an inline
/// policy: its limit (and burst) above `limits.max_inline_limit` (a
/// sliding log's above `limits.max_inline_log_limit` when smaller), a
/// window it sets above `limits.max_inline_window`. A window (or calendar
/// period) left out is the policy's, written in the config file, and is
/// not the caller's to answer for.
fn within_limits(
    entry: &Override,
    algorithm: Option<Algorithm>,
    limits: &LimitSettings,
) -> Result<(), ServiceError> {
    let max_window_ms = u64::try_from(limits.max_inline_window.as_millis()).unwrap_or(u64::MAX);
    if let Some(window_ms) = entry.window_ms
        && window_ms > max_window_ms
    {
        return Err(ServiceError::invalid(
            "window_ms",
            format!(
                "must be at most {max_window_ms} for an override (limits.max_inline_window); got {window_ms}"
            ),
        ));
    }
    let max_limit = limits.max_inline_limit;
    let (max_of_limit, setting) =
        if algorithm == Some(Algorithm::SlidingLog) && limits.max_inline_log_limit < max_limit {
            (limits.max_inline_log_limit, "limits.max_inline_log_limit")
        } else {
            (max_limit, "limits.max_inline_limit")
        };
    if entry.limit > max_of_limit {
        return Err(ServiceError::invalid(
            "limit",
            format!(
                "must be at most {max_of_limit} for an override ({setting}); got {}",
                entry.limit
            ),
        ));
    }
    if let Some(burst) = entry.burst
        && burst > max_limit
    {
        return Err(ServiceError::invalid(
            "burst",
            format!(
                "must be at most {max_limit} for an override (limits.max_inline_limit); got {burst}"
            ),
        ));
    }
    Ok(())
}

/// The INVALID_ARGUMENT for an override the registry refuses.
fn put_error(entry: &Override, error: PutError) -> ServiceError {
    match error {
        PutError::UnknownPolicy => {
            ServiceError::invalid("policy", format!("no policy named {:?}", entry.policy))
        }
        PutError::Invalid(e) => {
            let field = match e.field {
                "key" => "scope.key",
                "prefix" => "scope.prefix",
                other => other,
            };
            ServiceError::invalid(field, e.message)
        }
        PutError::TooMany(max) => ServiceError::invalid(
            "scope",
            format!(
                "policy {:?} has {max} overrides already (limits.max_overrides)",
                entry.policy
            ),
        ),
    }
}

#[tonic::async_trait]
impl<S: Backend> pb::overrides_server::Overrides for OverridesService<S> {
    async fn set_override(
        &self,
        request: Request<pb::SetOverrideRequest>,
    ) -> Result<Response<pb::SetOverrideResponse>, Status> {
        let origin = Origin::of(&request);
        let caller = auth::caller(&request);
        crate::api::serve(
            &self.metrics,
            Method::SetOverride,
            request,
            self.request_timeout,
            |r, d| self.set_one(r, origin, caller, d),
        )
        .await
    }

    async fn remove_override(
        &self,
        request: Request<pb::RemoveOverrideRequest>,
    ) -> Result<Response<pb::RemoveOverrideResponse>, Status> {
        let origin = Origin::of(&request);
        let caller = auth::caller(&request);
        crate::api::serve(
            &self.metrics,
            Method::RemoveOverride,
            request,
            self.request_timeout,
            |r, d| self.remove_one(r, origin, caller, d),
        )
        .await
    }

    async fn list_overrides(
        &self,
        request: Request<pb::ListOverridesRequest>,
    ) -> Result<Response<pb::ListOverridesResponse>, Status> {
        let origin = Origin::of(&request);
        crate::api::serve(
            &self.metrics,
            Method::ListOverrides,
            request,
            self.request_timeout,
            |r, _| std::future::ready(self.list(&r, origin)),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use quotad_core::{FakeClock, MemoryStore, OnFull, StoreConfig};
    use tonic::transport::server::TcpConnectInfo;

    use super::*;
    use crate::config::Config;
    use crate::registry::PolicySet;

    fn service(toml: &str) -> OverridesService<MemoryStore> {
        let config = Config::from_toml(toml).expect("valid config");
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let set = PolicySet::new(config.policies(), config.limits(), &metrics);
        let store = StoreConfig::try_new(1_000, 4, OnFull::Deny).expect("valid store");
        OverridesService::new(
            Arc::new(MemoryStore::new(store, Arc::new(FakeClock::new(0)))),
            Arc::new(PolicyRegistry::new(set)),
            metrics,
            64,
            Duration::from_secs(1),
        )
    }

    const API: &str = "[policies.api]\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1m\"\n";

    async fn set_from(service: &OverridesService<MemoryStore>, from: &str) -> Result<(), Status> {
        use pb::overrides_server::Overrides as _;
        let mut request = Request::new(pb::SetOverrideRequest {
            policy: "api".to_owned(),
            scope: Some(pb::OverrideScope {
                scope: Some(pb::override_scope::Scope::Key("k".to_owned())),
            }),
            limit: 30,
            ..pb::SetOverrideRequest::default()
        });
        request.extensions_mut().insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some(from.parse().expect("an address")),
        });
        service.set_override(request).await.map(|_| ())
    }

    #[tokio::test]
    async fn an_anonymous_caller_from_another_host_is_refused_by_default_and_changes_nothing() {
        let local = service(API);
        for remote in ["10.1.2.3:4000", "[2001:db8::1]:4000"] {
            let refused = set_from(&local, remote).await.expect_err("refused");
            assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{remote}");
            assert!(
                refused
                    .message()
                    .contains("limits.allow_overrides = \"local\""),
                "{}",
                refused.message()
            );
        }
        assert!(local.policies.runtime_overrides().is_empty());
        set_from(&local, "127.0.0.1:4000")
            .await
            .expect("a local caller may");
        assert_eq!(local.policies.runtime_overrides().len(), 1);
        let open = service(&format!("[limits]\nallow_overrides = \"anyone\"\n{API}"));
        set_from(&open, "10.1.2.3:4000").await.expect("anyone");
    }

    fn runtime(limit: u64) -> Override {
        Override {
            policy: "api".to_owned(),
            scope: Scope::Key("k".to_owned()),
            limit,
            window_ms: None,
            burst: None,
            expires_at_ms: None,
            source: Source::Runtime,
            set_by: "test".to_owned(),
            set_at_ms: 0,
        }
    }

    fn limit_held(service: &OverridesService<MemoryStore>) -> Option<u64> {
        service
            .policies
            .runtime_overrides()
            .first()
            .map(|e| e.limit)
    }

    fn limit_of_slot(service: &OverridesService<MemoryStore>, key: &str) -> Option<u64> {
        service
            .policies
            .runtime_overrides()
            .iter()
            .find(|e| e.scope == Scope::Key(key.to_owned()))
            .map(|e| e.limit)
    }

    #[test]
    fn a_set_read_while_this_replica_changed_its_own_is_not_applied_and_the_next_is() {
        let s = service(API);
        let slot = ("api".to_owned(), Scope::Key("k".to_owned()));
        let start = s.policies.poll_start();
        assert!(s.policies.set_stored_overrides((7, 1), Vec::new(), start));
        // A poll begins; meanwhile this replica's change lands at (7, 2).
        let start = s.policies.poll_start();
        s.policies
            .apply_stored_change(slot.clone(), Some(runtime(30)), (7, 2));
        assert_eq!(limit_held(&s), Some(30));
        // The read answers the hash from before the change: refused.
        assert!(!s.policies.set_stored_overrides((7, 1), Vec::new(), start));
        assert_eq!(limit_held(&s), Some(30));
        // The next poll reads again, and the store's set is applied.
        let start = s.policies.poll_start();
        assert_eq!(start.known, Some((7, 1)));
        assert!(
            s.policies
                .set_stored_overrides((7, 3), vec![Arc::new(runtime(40))], start)
        );
        assert_eq!(limit_held(&s), Some(40));
        // The same version again is nothing new.
        let start = s.policies.poll_start();
        assert!(!s.policies.set_stored_overrides((7, 3), Vec::new(), start));
        assert_eq!(limit_held(&s), Some(40));
    }

    #[test]
    fn a_store_gone_back_within_its_epoch_is_followed() {
        let s = service(API);
        let start = s.policies.poll_start();
        assert!(
            s.policies
                .set_stored_overrides((7, 5), vec![Arc::new(runtime(40))], start)
        );
        // Restored from an older copy: a smaller count, the same epoch.
        let start = s.policies.poll_start();
        assert!(s.policies.set_stored_overrides((7, 3), Vec::new(), start));
        assert_eq!(limit_held(&s), None);
        assert_eq!(s.policies.poll_start().known, Some((7, 3)));
    }

    #[test]
    fn a_change_answered_at_a_count_already_held_makes_the_next_poll_read_the_whole_set() {
        let s = service(API);
        let slot = ("api".to_owned(), Scope::Key("k".to_owned()));
        let start = s.policies.poll_start();
        assert!(s.policies.set_stored_overrides((7, 5), Vec::new(), start));
        // The store went back to 3 and this change made it 4: the set held
        // (at 5) is not overwritten, and the next poll reads the store
        // whatever its version.
        s.policies
            .apply_stored_change(slot.clone(), Some(runtime(30)), (7, 4));
        assert_eq!(limit_held(&s), None);
        let start = s.policies.poll_start();
        assert_eq!(start.known, None);
        // Even one whose count came back to the one held.
        assert!(
            s.policies
                .set_stored_overrides((7, 5), vec![Arc::new(runtime(30))], start)
        );
        assert_eq!(limit_held(&s), Some(30));
        assert_eq!(s.policies.poll_start().known, Some((7, 5)));
        // A removal that changed nothing (the store's version unchanged,
        // nothing held for it) asks for no read.
        s.policies.apply_stored_change(
            ("api".to_owned(), Scope::Key("absent".to_owned())),
            None,
            (7, 5),
        );
        assert_eq!(s.policies.poll_start().known, Some((7, 5)));
        assert_eq!(limit_of_slot(&s, "k"), Some(30));
    }

    #[test]
    fn a_change_answered_in_another_epoch_is_left_to_the_poller() {
        let s = service(API);
        let slot = ("api".to_owned(), Scope::Key("k".to_owned()));
        let start = s.policies.poll_start();
        assert!(s.policies.set_stored_overrides((9, 4), Vec::new(), start));
        // An answer from the old history (a larger count of an older
        // epoch) is never applied over the new one.
        s.policies
            .apply_stored_change(slot.clone(), Some(runtime(30)), (7, 50));
        assert_eq!(limit_held(&s), None);
        // In the epoch held it is.
        s.policies
            .apply_stored_change(slot, Some(runtime(31)), (9, 5));
        assert_eq!(limit_held(&s), Some(31));
        // The store's word in another epoch is followed.
        let start = s.policies.poll_start();
        assert!(s.policies.set_stored_overrides((11, 1), Vec::new(), start));
        assert_eq!(limit_held(&s), None);
    }
}
