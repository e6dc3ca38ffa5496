//! Whether this server should get traffic: one answer behind `/readyz` on
//! the admin port and gRPC health checking (`grpc.health.v1`) on the gRPC
//! port, so load balancers of either kind see the same.
//!
//! Ready means serving (from start until a shutdown is requested) and,
//! with `server.readiness_follows_store`, the store answering its probe
//! ([`follow_store`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health as HealthService, HealthServer};
use tonic_health::server::HealthReporter;

use crate::backend::Backend;

/// The readiness of the whole server.
#[derive(Clone, Debug)]
pub(crate) struct Health {
    serving: Arc<AtomicBool>,
    store_ok: Arc<AtomicBool>,
    /// Serializes publishing to the gRPC reporter, so that two changes at
    /// once cannot leave it showing the older one.
    publishing: Arc<Mutex<()>>,
    reporter: HealthReporter,
    /// The gRPC services whose status is reported by name.
    services: &'static [&'static str],
}

impl Health {
    /// A new switch, not serving yet, and the gRPC health service that
    /// reports it for `services` and the server as a whole (`""`).
    pub(crate) fn new(
        services: &'static [&'static str],
    ) -> (Self, HealthServer<impl HealthService>) {
        let (reporter, service) = tonic_health::server::health_reporter();
        let health = Health {
            serving: Arc::new(AtomicBool::new(false)),
            store_ok: Arc::new(AtomicBool::new(true)),
            publishing: Arc::new(Mutex::new(())),
            reporter,
            services,
        };
        (health, service)
    }

    /// Whether `/readyz` answers 200.
    pub(crate) fn is_ready(&self) -> bool {
        self.serving.load(Ordering::Acquire) && self.store_ok.load(Ordering::Acquire)
    }

    /// Starts (`true`) or stops serving.
    pub(crate) async fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Release);
        self.publish().await;
    }

    /// Whether the store answered its latest probe.
    pub(crate) async fn set_store_ok(&self, ok: bool) {
        self.store_ok.store(ok, Ordering::Release);
        self.publish().await;
    }

    async fn publish(&self) {
        let _one_at_a_time = self.publishing.lock().await;
        let status = if self.is_ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in self.services.iter().chain(&[""]) {
            self.reporter.set_service_status(*service, status).await;
        }
    }
}

/// Probes `backend` every `interval` until `stop`, and keeps `health`'s
/// store half in step: a probe that fails or takes longer than `interval`
/// makes the server not ready until one succeeds.
pub(crate) async fn follow_store<B: Backend>(
    backend: Arc<B>,
    health: Health,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_ok = true;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let probe = tokio::time::timeout(interval, backend.probe()).await;
        let ok = matches!(probe, Ok(Ok(())));
        if ok != was_ok {
            match probe {
                Ok(Ok(())) => tracing::info!("state store answers again: ready"),
                Ok(Err(error)) => {
                    tracing::warn!(error = %crate::log::Causes(&error), "state store probe failed: not ready");
                }
                Err(_) => tracing::warn!(?interval, "state store probe timed out: not ready"),
            }
            was_ok = ok;
        }
        health.set_store_ok(ok).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use quotad_core::{BatchMode, CheckItem};
    use tonic_health::pb::HealthCheckRequest;

    use super::*;
    use crate::backend::{BackendError, BackendStats, Deadline, ItemResult};

    /// A backend whose probe fails while `down` is set.
    #[derive(Default)]
    struct Fake {
        down: AtomicBool,
    }

    impl Backend for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        async fn check_one(&self, _item: &CheckItem<'_>, _: Deadline) -> ItemResult {
            Err(BackendError::Internal("not used".into()))
        }
        async fn check(
            &self,
            items: &[CheckItem<'_>],
            _mode: BatchMode,
            _: Deadline,
        ) -> Vec<ItemResult> {
            vec![Err(BackendError::Internal("not used".into())); items.len()]
        }
        async fn peek(&self, _item: &CheckItem<'_>, _: Deadline) -> ItemResult {
            Err(BackendError::Internal("not used".into()))
        }
        async fn lease(
            &self,
            _item: &crate::backend::LeaseItem<'_>,
            _: Deadline,
        ) -> crate::backend::LeaseResult {
            Err(BackendError::Internal("not used".into()))
        }
        async fn acquire(
            &self,
            _item: &CheckItem<'_>,
            _: Deadline,
        ) -> crate::backend::AcquireResult {
            Err(BackendError::Internal("not used".into()))
        }
        async fn renew(
            &self,
            _slot: &crate::backend::SlotItem<'_>,
            _: Deadline,
        ) -> crate::backend::SlotResult {
            Err(BackendError::Internal("not used".into()))
        }
        async fn release(
            &self,
            _slot: &crate::backend::SlotItem<'_>,
            _: Deadline,
        ) -> crate::backend::SlotResult {
            Err(BackendError::Internal("not used".into()))
        }
        async fn reset(
            &self,
            _name: &str,
            _policy: &quotad_core::Policy,
            _key: &str,
            _: Deadline,
        ) -> Result<(), BackendError> {
            Ok(())
        }
        crate::backend::keeps_no_overrides!();

        fn stats(&self) -> BackendStats {
            BackendStats::default()
        }
        async fn probe(&self) -> Result<(), BackendError> {
            if self.down.load(Ordering::SeqCst) {
                Err(BackendError::from(crate::backend::NotRun::NotConnected))
            } else {
                Ok(())
            }
        }
    }

    async fn grpc_status(service: &impl HealthService) -> i32 {
        service
            .check(tonic::Request::new(HealthCheckRequest {
                service: String::new(),
            }))
            .await
            .expect("the server's status")
            .into_inner()
            .status
    }

    /// Lets the probe task run its next ticks (the clock is paused and
    /// advances only when every task waits).
    async fn after_a_probe(interval: Duration) {
        tokio::time::sleep(interval * 2).await;
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_follows_the_store_probe_both_ways() {
        let (health, _server) = Health::new(&["quotad.v1.Quota"]);
        let service =
            tonic_health::server::HealthService::from_health_reporter(health.reporter.clone());
        health.set_serving(true).await;
        let backend = Arc::new(Fake::default());
        let stop = CancellationToken::new();
        let interval = Duration::from_secs(1);
        let task = tokio::spawn(follow_store(
            Arc::clone(&backend),
            health.clone(),
            interval,
            stop.clone(),
        ));
        after_a_probe(interval).await;
        assert!(health.is_ready());
        assert_eq!(grpc_status(&service).await, ServingStatus::Serving as i32);

        backend.down.store(true, Ordering::SeqCst);
        after_a_probe(interval).await;
        assert!(!health.is_ready(), "the store is down");
        assert_eq!(
            grpc_status(&service).await,
            ServingStatus::NotServing as i32
        );

        backend.down.store(false, Ordering::SeqCst);
        after_a_probe(interval).await;
        assert!(health.is_ready(), "the store is back");
        assert_eq!(grpc_status(&service).await, ServingStatus::Serving as i32);

        // Stopping to serve wins over a healthy store.
        health.set_serving(false).await;
        assert!(!health.is_ready());
        stop.cancel();
        task.await.expect("the probe task stops");
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_store_is_always_healthy() {
        let store = Arc::new(quotad_core::MemoryStore::new(
            quotad_core::StoreConfig::try_new(10, 1, quotad_core::OnFull::Deny).expect("valid"),
            Arc::new(quotad_core::FakeClock::new(0)),
        ));
        assert_eq!(Backend::probe(&*store).await, Ok(()));
    }
}
