//! The gRPC port on a unix socket: served and checked over the socket, the
//! socket file created with the configured mode, a stale file replaced, a
//! live one or a file that is not a socket left alone, and the file
//! removed on shutdown.

use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::Path;
use std::time::Duration;

use quotad::listen::UnixSocket;
use quotad::{Config, Listeners};
use quotad_client::{Check, Client};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::common::process::run_within;

const CONFIG: &str = "[policies.api]\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n";

/// Runs quotad on the socket at `path`; returns the stop switch and the task.
async fn serve(
    path: &Path,
    mode: u32,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), quotad::Error>>,
) {
    let listeners = Listeners {
        grpc: UnixSocket::bind(path, mode)
            .expect("bind the socket")
            .into(),
        admin: TcpListener::bind("127.0.0.1:0").await.expect("bind admin"),
    };
    let config = Config::from_toml(CONFIG).expect("valid config");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(quotad::run(config, listeners, async {
        let _ = stopped.await;
    }));
    (stop, task)
}

#[tokio::test]
async fn checks_are_served_over_a_unix_socket_whose_file_has_the_configured_mode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("quotad.sock");
    let (stop, task) = serve(&path, 0o600).await;

    let meta = std::fs::symlink_metadata(&path).expect("the socket file");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    let client = Client::builder(format!("unix://{}", path.display()))
        .deadline(Duration::from_secs(5))
        .build()
        .expect("a client");
    let decision = client
        .check(&Check::named("api", "alice").cost(3))
        .await
        .expect("decided over the socket");
    assert_eq!(decision.remaining, 7);

    // The command line client too.
    let bin = env!("CARGO_BIN_EXE_quotad");
    let addr = format!("unix://{}", path.display());
    let mut command = std::process::Command::new(bin);
    command.args(["peek", "--addr", &addr, "--policy", "api", "--key", "alice"]);
    let peeked = tokio::task::spawn_blocking(move || run_within(command, Duration::from_secs(30)))
        .await
        .expect("the command runs");
    assert!(peeked.status.success(), "{}", peeked.transcript());
    assert!(peeked.stdout.contains("7"), "{}", peeked.transcript());

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("stops")
        .expect("no panic")
        .expect("run returns Ok");
    assert!(!path.exists(), "the socket file is removed on shutdown");
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced_and_a_live_one_or_another_file_is_left_alone() {
    let dir = tempfile::tempdir().expect("temp dir");

    // A socket file nobody listens on: what a killed process leaves.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
    assert!(stale.exists());
    let socket = UnixSocket::bind(&stale, 0o660).expect("the stale file is replaced");
    assert_eq!(
        std::fs::metadata(&stale)
            .expect("meta")
            .permissions()
            .mode()
            & 0o777,
        0o660
    );

    // While it listens, a second server cannot take its place.
    let error = UnixSocket::bind(&stale, 0o660).expect_err("in use");
    assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse, "{error}");
    assert!(stale.exists(), "the live socket is untouched");
    drop(socket);
    assert!(!stale.exists(), "removed when dropped");

    // A file that is not a socket is never deleted.
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "keep me").expect("write");
    let error = UnixSocket::bind(&file, 0o660).expect_err("not a socket");
    assert_eq!(error.kind(), std::io::ErrorKind::AlreadyExists, "{error}");
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "keep me");
}

#[tokio::test]
async fn a_socket_is_placed_only_once_it_has_its_mode_and_paths_too_long_are_a_config_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("grpc.sock");
    let socket = UnixSocket::bind(&path, 0o600).expect("bound");
    // Bound in a private folder that is gone once the socket is in place:
    // nothing but the socket and its lock file beside it.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["grpc.sock", "grpc.sock.lock"]);
    // Two quotads cannot both take the path, even when the socket file is
    // removed behind the first one's back.
    std::fs::remove_file(&path).expect("remove");
    let error = UnixSocket::bind(&path, 0o600).expect_err("the first still holds it");
    assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse, "{error}");
    drop(socket);

    let long = format!("unix://{}/{}.sock", dir.path().display(), "s".repeat(100));
    let text = format!("[server]\ngrpc_addr = {long:?}\n");
    let message = quotad::Config::from_toml(&text)
        .expect_err("too long for a unix socket")
        .to_string();
    assert!(
        message.starts_with("server.grpc_addr: ") && message.contains("at most 107 bytes"),
        "{message}"
    );
}
