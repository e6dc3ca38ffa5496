//! The gRPC services quotad serves, each built from one
//! [`ServiceContext`] and registering its routes into it.
//!
//! Which services there are is the method table's ([`Service`], in
//! `crate::methods`); this module says how each is built. A new service is
//! a [`Service`], its rows in the table, and its arm in
//! [`ServiceContext::register`], which takes what it needs from the
//! context.

use std::sync::Arc;

use quotad_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use quotad_proto::v1::concurrency_server::ConcurrencyServer;
use quotad_proto::v1::explain_server::ExplainServer;
use quotad_proto::v1::leases_server::LeasesServer;
use quotad_proto::v1::overrides_server::OverridesServer;
use quotad_proto::v1::quota_server::QuotaServer;
use tonic::service::RoutesBuilder;

use crate::api::{
    ConcurrencyService, ExplainService, LeaseService, OverridesService, QuotaService,
    RequestLimits, RlqsService, RlsOptions, RlsService,
};
use crate::backend::Backend;
use crate::config::Config;
use crate::methods::Service;
use crate::metrics::Metrics;
use crate::registry::{self, PolicyRegistry};
use crate::tasks::Tasks;

/// What every gRPC service is built from, and the routes they register:
/// one value, so that a new service takes what it needs from here rather
/// than adding parameters along the way.
pub(crate) struct ServiceContext<'a, B> {
    pub(crate) config: &'a Config,
    pub(crate) backend: Arc<B>,
    pub(crate) registry: Arc<PolicyRegistry>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) tasks: &'a mut Tasks,
    /// What [`ServiceContext::register`] has added so far.
    pub(crate) routes: RoutesBuilder,
}

impl<'a, B: Backend> ServiceContext<'a, B> {
    /// A context with no routes yet.
    pub(crate) fn new(
        config: &'a Config,
        backend: Arc<B>,
        registry: &Arc<PolicyRegistry>,
        metrics: &Arc<Metrics>,
        tasks: &'a mut Tasks,
    ) -> Self {
        ServiceContext {
            config,
            backend,
            registry: Arc::clone(registry),
            metrics: Arc::clone(metrics),
            tasks,
            routes: RoutesBuilder::default(),
        }
    }

    /// Builds `service` and adds its routes. Every [`Service`] of the
    /// method table has its arm here, so a service in the table (and in
    /// gRPC health) is always served.
    pub(crate) fn register(&mut self, service: Service) -> Result<(), RegisterError> {
        let max_message_bytes = self.config.transport().max_message_bytes;
        let limits = RequestLimits {
            max_key_bytes: self.config.store().max_key_bytes,
            on_error: self.config.store().on_error,
            request_timeout: self.config.transport().request_timeout,
        };
        match service {
            Service::Quota => {
                let quota = QuotaService::new(
                    Arc::clone(&self.backend),
                    Arc::clone(&self.registry),
                    Arc::clone(&self.metrics),
                    limits,
                );
                self.routes.add_service(
                    QuotaServer::new(quota).max_decoding_message_size(max_message_bytes),
                );
            }
            Service::Leases => {
                let leases = LeaseService::new(
                    Arc::clone(&self.backend),
                    Arc::clone(&self.registry),
                    Arc::clone(&self.metrics),
                    limits,
                );
                self.routes.add_service(
                    LeasesServer::new(leases).max_decoding_message_size(max_message_bytes),
                );
            }
            Service::Concurrency => {
                let concurrency = ConcurrencyService::new(
                    Arc::clone(&self.backend),
                    Arc::clone(&self.registry),
                    Arc::clone(&self.metrics),
                    limits,
                );
                self.routes.add_service(
                    ConcurrencyServer::new(concurrency)
                        .max_decoding_message_size(max_message_bytes),
                );
            }
            Service::Overrides => {
                let overrides = OverridesService::new(
                    Arc::clone(&self.backend),
                    Arc::clone(&self.registry),
                    Arc::clone(&self.metrics),
                    limits.max_key_bytes,
                    limits.request_timeout,
                );
                self.routes.add_service(
                    OverridesServer::new(overrides).max_decoding_message_size(max_message_bytes),
                );
            }
            Service::Explain => {
                let explain = ExplainService::new(
                    Arc::clone(&self.backend),
                    Arc::clone(&self.registry),
                    Arc::clone(&self.metrics),
                    limits.max_key_bytes,
                    limits.request_timeout,
                );
                self.routes.add_service(
                    ExplainServer::new(explain).max_decoding_message_size(max_message_bytes),
                );
            }
            Service::Rls => {
                let rls = RlsService::new(
                    Arc::clone(&self.backend),
                    registry::start_rls(self.config, &self.metrics, self.tasks)?,
                    Arc::clone(&self.registry),
                    Arc::clone(&self.metrics),
                    RlsOptions::new(self.config),
                );
                self.routes.add_service(
                    RateLimitServiceServer::new(rls).max_decoding_message_size(max_message_bytes),
                );
            }
            Service::Rlqs => {
                let rules = registry::start_rlqs(self.config, &self.registry, self.tasks)?;
                let rlqs = RlqsService::new(
                    Arc::clone(&self.backend),
                    Arc::clone(&self.metrics),
                    Arc::clone(&self.registry),
                    rules,
                    limits,
                );
                self.routes.add_service(
                    RateLimitQuotaServiceServer::new(rlqs)
                        .max_decoding_message_size(max_message_bytes),
                );
            }
        }
        Ok(())
    }
}

/// Why a service could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The RLS rules could not be loaded at start.
    #[error("RLS rules")]
    Rls(#[from] crate::policy::rls::RlsConfigError),
    /// The RLQS bucket rules (`rlqs.rules`) could not be loaded at start.
    #[error(transparent)]
    Rlqs(#[from] crate::policy::rlqs::RlqsConfigError),
}
