//! An axum app rate-limited through quotad: `/api/demo` is unlimited,
//! `/api/limited` sits behind quotad-client's tower layer (its `http`
//! feature) under the policy `api`, keyed by the peer's IP: by address for
//! IPv4, by /64 network for IPv6.
//!
//! ```sh
//! cargo run --release -- serve --config config/quotad.example.toml
//! cargo run --example axum_app -- http://127.0.0.1:50051 127.0.0.1:3000
//! for i in $(seq 12); do curl -si 127.0.0.1:3000/api/limited | head -1; done
//! ```
//!
//! Denied requests get `429 Too Many Requests` with `Retry-After`,
//! `RateLimit`, `RateLimit-Policy` and `X-RateLimit-*`. If quotad is down,
//! the layer fails open (the request passes; the client counts it in
//! `quotad_client_unavailable_total` and logs one line per 10 s).

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use quotad_client::{Client, FailurePolicy, IpPrefixes, KeyExtractor, RateLimitLayer};

/// The app, with `/api/limited` behind `layer`.
fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/api/demo", get(|| async { "unlimited\n" }))
        .route("/api/limited", get(|| async { "ok\n" }).layer(layer))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let quotad = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:50051".to_owned());
    let listen: SocketAddr = args.next().as_deref().unwrap_or("127.0.0.1:3000").parse()?;

    let client = Client::builder(quotad)
        .deadline(Duration::from_millis(100))
        .on_unavailable(FailurePolicy::FailOpen)
        .build()?;
    let layer = RateLimitLayer::new(client, "api", KeyExtractor::PeerIp)
        .ip_prefixes(IpPrefixes::default())
        .window_secs(60);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    axum::serve(
        listener,
        app(layer).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
