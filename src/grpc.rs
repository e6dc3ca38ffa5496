//! The gRPC server: quotad's services, gRPC health checking and server
//! reflection on one port, with the transport settings that the no-op
//! bench server shares (so the floor it measures stays a floor).

use std::time::Duration;

use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::health_server::{Health as HealthService, HealthServer};

use crate::Error;
use crate::config::TlsSettings;
use crate::tasks::ServerTask;

/// The tonic server builder with quotad's transport settings.
///
/// HTTP/2 keepalive pings find dead connections; TLS is applied when given.
///
/// # Errors
///
/// [`Error::Tls`] when the TLS files cannot be read, and the transport
/// error when tonic rejects them.
pub fn server(tls: Option<&TlsSettings>) -> Result<Server, Error> {
    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let Some(tls) = tls {
        let config = tls
            .server_config()
            .map_err(|e| Error::Tls(format!("server.tls.{}: {}", e.field, e.message)))?;
        builder = builder.tls_config(config)?;
    }
    Ok(builder)
}

/// The accepted connections of `listener`, each with TCP_NODELAY and TCP
/// keepalive (tonic ignores the builder's `tcp_nodelay` for a pre-bound
/// listener; `TcpIncoming` sets it on each accepted socket).
pub fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(Duration::from_secs(60)))
}

/// Reflection for quotad's API and gRPC health, v1 and v1alpha (older
/// grpcurl and other tools still ask for v1alpha).
pub(crate) fn reflection(routes: Routes) -> Result<Routes, Error> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(quotad_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok(routes
        .add_service(builder().build_v1()?)
        .add_service(builder().build_v1alpha()?))
}

/// Serves `routes` (quotad's services), health and reflection on
/// `listener` until stopped, then lets calls in flight finish.
pub(crate) fn spawn(
    listener: TcpListener,
    tls: Option<&TlsSettings>,
    health: HealthServer<impl HealthService>,
    routes: Routes,
) -> Result<ServerTask, Error> {
    let mut builder = server(tls)?;
    let routes = reflection(routes.add_service(health))?;
    let incoming = incoming(listener);
    Ok(ServerTask::spawn(move |stop| async move {
        builder
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await
            .map_err(Error::Grpc)
    }))
}
