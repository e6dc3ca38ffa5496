//! The transport's bounds: a finite HTTP/2 stream limit advertised to every
//! client, a header-read timeout on the admin port, and a cap on the open
//! connections of each port.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::{TestServer, eventually};
use quotad::Config;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The HTTP/2 connection preface, then an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
const SETTINGS_FRAME: u8 = 0x4;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;

/// Long enough for anything these tests wait for on loopback; only a
/// server that never answers reaches it.
const PATIENCE: Duration = Duration::from_secs(10);

async fn start(toml: &str) -> TestServer {
    TestServer::start(Config::from_toml(toml).expect("valid config")).await
}

/// Opens an HTTP/2 connection and returns it with the settings of the
/// server's first frame, which must be SETTINGS.
async fn http2_settings(addr: SocketAddr) -> (TcpStream, Vec<(u16, u32)>) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(PREFACE).await.expect("send the preface");
    let mut header = [0_u8; 9];
    tokio::time::timeout(PATIENCE, stream.read_exact(&mut header))
        .await
        .expect("the server answers the preface")
        .expect("a frame header");
    let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    assert_eq!(header[3], SETTINGS_FRAME, "the first frame is SETTINGS");
    let mut payload = vec![0_u8; len];
    stream.read_exact(&mut payload).await.expect("the settings");
    let settings = payload
        .chunks_exact(6)
        .map(|s| {
            (
                u16::from_be_bytes([s[0], s[1]]),
                u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
            )
        })
        .collect();
    (stream, settings)
}

/// Whether the server closes `stream` (EOF or reset) before `PATIENCE`.
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0_u8; 1024];
    loop {
        match tokio::time::timeout(PATIENCE, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // A response (408 or 400) may come first; the close follows.
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn every_grpc_connection_is_told_a_finite_stream_limit() {
    let server = start("").await;
    let (_stream, settings) = http2_settings(server.grpc_addr).await;
    let limit = settings
        .iter()
        .find(|(id, _)| *id == SETTINGS_MAX_CONCURRENT_STREAMS)
        .map(|(_, value)| *value);
    assert_eq!(limit, Some(200), "the default, advertised: {settings:?}");

    let server = start("[transport]\nmax_concurrent_streams = 8\n").await;
    let (_stream, settings) = http2_settings(server.grpc_addr).await;
    assert!(
        settings.contains(&(SETTINGS_MAX_CONCURRENT_STREAMS, 8)),
        "{settings:?}"
    );
}

/// A connection to `addr` that has sent a request's line and one header,
/// and not the blank line that ends the headers.
async fn half_a_request(addr: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: quotad\r\n")
        .await
        .expect("half a request");
    stream
}

#[tokio::test]
async fn an_admin_client_that_sends_half_a_request_is_disconnected() {
    let server = start("[transport]\nadmin_header_timeout = \"200ms\"\n").await;
    let mut stream = half_a_request(server.admin_addr).await;
    assert!(
        closed_by_server(&mut stream).await,
        "the connection is closed after the header timeout"
    );
    // The port still serves whole requests.
    assert_eq!(server.get("/healthz").await.0, 200);

    // The setting is what closed it: with an hour, the same half request
    // is still open five times 200 ms later.
    let patient = start("[transport]\nadmin_header_timeout = \"1h\"\n").await;
    let mut stream = half_a_request(patient.admin_addr).await;
    let mut buf = [0_u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf))
            .await
            .is_err(),
        "open, and nothing answered, within the hour's timeout"
    );
}

#[tokio::test]
async fn each_port_closes_connections_past_its_cap_and_counts_them() {
    let server = start("[transport]\nmax_connections = 2\nadmin_header_timeout = \"1m\"\n").await;

    // gRPC: two connections are served, the third is closed at once.
    let (first, _) = http2_settings(server.grpc_addr).await;
    let (_second, _) = http2_settings(server.grpc_addr).await;
    let mut third = TcpStream::connect(server.grpc_addr)
        .await
        .expect("the kernel accepts");
    assert!(closed_by_server(&mut third).await, "past the cap: closed");
    // A closed connection gives its place back.
    drop(first);
    eventually(PATIENCE, "a place frees up on the gRPC port", || async {
        let mut stream = TcpStream::connect(server.grpc_addr).await.expect("connect");
        stream.write_all(PREFACE).await.is_ok() && {
            let mut byte = [0_u8; 1];
            matches!(
                tokio::time::timeout(PATIENCE, stream.read(&mut byte)).await,
                Ok(Ok(1))
            )
        }
    })
    .await;

    // Admin: two idle connections fill the port, the third is closed.
    let held = [
        TcpStream::connect(server.admin_addr)
            .await
            .expect("connect"),
        TcpStream::connect(server.admin_addr)
            .await
            .expect("connect"),
    ];
    let mut past = TcpStream::connect(server.admin_addr)
        .await
        .expect("the kernel accepts");
    assert!(closed_by_server(&mut past).await, "past the cap: closed");
    drop(held);

    let deadline = tokio::time::Instant::now() + PATIENCE;
    let metrics = loop {
        if let Some(metrics) = scrape(server.admin_addr).await {
            break metrics;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the admin port serves again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let rejected = |port| metrics.value("quotad_connections_rejected_total", &[("port", port)]);
    // At least the one closed above on each port (waiting for a place may
    // have been refused too).
    assert!(rejected("grpc") >= 1.0, "{}", metrics.text);
    assert!(rejected("admin") >= 1.0, "{}", metrics.text);
}

/// `/metrics`, or `None` when the port closes the connection unanswered.
async fn scrape(addr: SocketAddr) -> Option<crate::common::Metrics> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let request = "GET /metrics HTTP/1.1\r\nHost: quotad\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut raw))
        .await
        .ok()?
        .ok()?;
    let raw = String::from_utf8(raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    // The exposition is short enough to come in one chunk or unchunked.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body.split_once("\r\n")?.1.rsplit_once("\r\n0\r\n")?.0
    } else {
        body
    };
    head.starts_with("HTTP/1.1 200")
        .then(|| crate::common::Metrics::parse(body))
}

#[tokio::test]
async fn a_connection_that_never_speaks_is_closed_and_gives_its_place_back() {
    let server = start(
        "[transport]\nmax_connections = 1\nhandshake_timeout = \"300ms\"\nadmin_header_timeout = \"1m\"\n",
    )
    .await;
    // A socket that says nothing holds the one place...
    let mut silent = TcpStream::connect(server.grpc_addr).await.expect("connect");
    // ...until the handshake timeout closes it.
    assert!(
        closed_by_server(&mut silent).await,
        "closed for its silence"
    );
    let (_served, settings) = http2_settings(server.grpc_addr).await;
    assert!(!settings.is_empty(), "the place came back");
}

#[tokio::test]
async fn a_connection_that_stalls_in_its_preface_is_closed_and_gives_its_place_back() {
    use tokio::io::AsyncWriteExt as _;
    let server = start(
        "[transport]\nmax_connections = 1\nhandshake_timeout = \"300ms\"\nadmin_header_timeout = \"1m\"\n",
    )
    .await;
    // Three bytes of the 24-byte HTTP/2 preface, then nothing: the one
    // place is held...
    let mut stalled = TcpStream::connect(server.grpc_addr).await.expect("connect");
    stalled.write_all(b"PRI").await.expect("write");
    // ...until the handshake timeout closes it (HTTP/2 alone would wait
    // for the rest until the connection's maximum age).
    assert!(
        closed_by_server(&mut stalled).await,
        "closed for its unfinished preface"
    );
    let (_served, settings) = http2_settings(server.grpc_addr).await;
    assert!(!settings.is_empty(), "the place came back");
}

#[tokio::test]
async fn health_and_reflection_refuse_large_messages() {
    use tokio_stream::StreamExt as _;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;

    let server = start("").await;
    // What the server makes of a reflection request for a symbol name of
    // `len` bytes: `Some(answered)`, or `None` when the call failed.
    let ask = |len: usize| {
        let channel = server.channel();
        async move {
            let mut client = ServerReflectionClient::new(channel.await);
            let request = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::FileContainingSymbol("x".repeat(len))),
            };
            match client
                .server_reflection_info(tokio_stream::iter([request]))
                .await
            {
                Err(status) => Err(status.code()),
                Ok(response) => match response.into_inner().next().await {
                    Some(Ok(_)) => Ok(true),
                    Some(Err(status)) => Err(status.code()),
                    // The server read no request: the stream just ends.
                    None => Ok(false),
                },
            }
        }
    };
    // A name of a few KiB is read and answered: no such symbol...
    assert_eq!(ask(4 * 1024).await, Err(tonic::Code::NotFound));
    // ...one of 1 MiB is refused before it is read: never answered.
    let refused = ask(1 << 20).await;
    assert!(
        matches!(refused, Ok(false) | Err(tonic::Code::ResourceExhausted)),
        "{refused:?}"
    );
}
