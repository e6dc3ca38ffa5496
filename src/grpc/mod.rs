//! The gRPC server: quotad's services, gRPC health checking and server
//! reflection on one port, with the transport settings that the no-op
//! bench server shares (so the floor it measures stays a floor).
//!
//! What bounds a connection ([`TransportSettings`]): HTTP/2 streams per
//! connection (advertised in the SETTINGS frame), streams reset before
//! they are accepted and locally reset streams (both close the connection
//! past their limit: HTTP/2 reset floods), open connections per port, a
//! timeout per call, and the size of a request message (past it:
//! RESOURCE_EXHAUSTED, [`status`]).

pub mod arrival;
pub mod shed;
pub mod status;
pub mod trace;

use std::time::Duration;

use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::health_server::{Health as HealthService, HealthServer};
use tower_layer::{Identity, Stack};

use crate::auth::AuthLayer;
use crate::config::{TlsFileError, TlsSettings, TransportSettings};
use crate::listen::{ConnectionLimit, GrpcListener, Incoming, UnixIncoming};
use crate::tasks::ServerTask;

use self::arrival::ArrivalLayer;
use self::shed::ShedLayer;
use self::status::SizeStatusLayer;
use self::trace::RpcTraceLayer;

/// Why the gRPC server could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A TLS file could not be used.
    #[error("TLS: server.tls.{0}")]
    Tls(#[from] TlsFileError),
    /// tonic refused the transport settings (its TLS configuration).
    #[error("gRPC server")]
    Transport(#[from] tonic::transport::Error),
    /// The reflection service could not be built.
    #[error("gRPC reflection")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// The gRPC server builder [`server`] makes: tonic's, with quotad's layers.
pub type GrpcServer = Server<Stack<SizeStatusLayer, Stack<ArrivalLayer, Identity>>>;

/// Locally reset streams (the server refusing a client's broken frames)
/// allowed on one connection before it is closed: hyper's own default,
/// which tonic otherwise turns off (RUSTSEC-2024-0003).
const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1_024;

/// The tonic server builder with quotad's transport settings.
///
/// HTTP/2 keepalive pings find dead connections; TLS is applied when given.
///
/// # Errors
///
/// [`BuildError::Tls`] when the TLS files cannot be read, and
/// [`BuildError::Transport`] when tonic rejects them.
pub fn server(
    transport: &TransportSettings,
    tls: Option<&TlsSettings>,
) -> Result<GrpcServer, BuildError> {
    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(transport.max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(transport.max_pending_reset_streams))
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESET_STREAMS))
        .timeout(transport.request_timeout);
    if let Some(age) = transport.max_connection_age {
        builder = builder
            .max_connection_age(age)
            .max_connection_age_grace(transport.drain_timeout);
    }
    if let Some(tls) = tls {
        let config = tls.server_config()?;
        builder = builder.tls_config(config)?;
    }
    // Arrival first: the outermost of quotad's layers.
    Ok(builder.layer(ArrivalLayer).layer(SizeStatusLayer))
}

/// The accepted connections of `listener`, at most
/// `transport.max_connections` open at once, each with TCP_NODELAY and TCP
/// keepalive (tonic ignores the builder's `tcp_nodelay` for a pre-bound
/// listener; `TcpIncoming` sets it on each accepted socket).
pub fn incoming(listener: TcpListener, transport: &TransportSettings) -> Incoming<TcpIncoming> {
    incoming_within(
        listener,
        ConnectionLimit::new(transport.max_connections, "grpc")
            .silent_for(transport.handshake_timeout),
    )
}

pub(crate) fn incoming_within(
    listener: TcpListener,
    limit: ConnectionLimit,
) -> Incoming<TcpIncoming> {
    let tcp = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(Duration::from_secs(60)));
    Incoming::new(tcp, limit)
}

/// The largest request message health checking and reflection accept: a
/// service or symbol name, never more than a few hundred bytes. Their
/// streams are read outside `transport.request_timeout`, so tonic's 4 MiB
/// default would let one connection hold hundreds of MiB.
pub(crate) const CONTROL_MESSAGE_BYTES: usize = 64 * 1024;

/// Reflection for quotad's API and gRPC health, v1 and v1alpha (older
/// grpcurl and other tools still ask for v1alpha).
pub(crate) fn reflection(routes: Routes) -> Result<Routes, BuildError> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(quotad_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok(routes
        .add_service(
            builder()
                .build_v1()?
                .max_decoding_message_size(CONTROL_MESSAGE_BYTES),
        )
        .add_service(
            builder()
                .build_v1alpha()?
                .max_decoding_message_size(CONTROL_MESSAGE_BYTES),
        ))
}

/// Serves `routes` (quotad's services), health and reflection on
/// `listener` until stopped, then lets calls in flight finish; `guards`
/// are the [`ShedLayer`] that bounds the calls in progress (outside) and
/// the auth layer that decides who may call what (inside).
pub(crate) fn spawn(
    listener: GrpcListener,
    transport: &TransportSettings,
    limit: ConnectionLimit,
    tls: Option<&TlsSettings>,
    guards: Stack<AuthLayer, ShedLayer>,
    health: HealthServer<impl HealthService>,
    routes: Routes,
) -> Result<ServerTask<tonic::transport::Error>, BuildError> {
    // A span per call (disabled when traces are not exported), around the
    // guards (auth, then the in-flight bound).
    let mut builder = server(transport, tls)?.layer(RpcTraceLayer).layer(guards);
    let health = health.max_decoding_message_size(CONTROL_MESSAGE_BYTES);
    let routes = reflection(routes.add_service(health))?;
    let router = builder.add_routes(routes);
    Ok(match listener {
        GrpcListener::Tcp(listener) => {
            let incoming = incoming_within(listener, limit);
            ServerTask::spawn(move |stop| async move {
                router
                    .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                    .await
            })
        }
        GrpcListener::Unix(socket) => {
            // Dropped when the server stops accepting, which removes the
            // socket file.
            let incoming = Incoming::new(UnixIncoming::new(socket), limit);
            ServerTask::spawn(move |stop| async move {
                router
                    .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                    .await
            })
        }
    })
}
