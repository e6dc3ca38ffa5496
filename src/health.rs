//! Whether this server should get traffic: one switch behind `/readyz` on
//! the admin port and gRPC health checking (`grpc.health.v1`) on the gRPC
//! port, so load balancers of either kind see the same answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health as HealthService, HealthServer};
use tonic_health::server::HealthReporter;

/// The readiness of the whole server.
#[derive(Clone, Debug)]
pub(crate) struct Health {
    ready: Arc<AtomicBool>,
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
            ready: Arc::new(AtomicBool::new(false)),
            reporter,
            services,
        };
        (health, service)
    }

    /// Whether `/readyz` answers 200.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Turns the switch.
    pub(crate) async fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
        let status = if ready {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in self.services.iter().chain(&[""]) {
            self.reporter.set_service_status(*service, status).await;
        }
    }
}
