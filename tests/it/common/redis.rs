//! Real Redis servers for the tests: each test starts its own
//! `redis-server` processes on free loopback ports and stops them (by PID)
//! when dropped. A missing `redis-server` is a failure that says how to get
//! one, never a silent skip.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HOW_TO_GET_REDIS: &str = "these tests need redis-server (Redis 6.2 or later) on PATH \
     or in QUOTAD_REDIS_SERVER: install it with `apt-get install redis-server`, \
     or run scripts/test.sh, which installs it when missing";

/// One `redis-server` process on 127.0.0.1.
pub(crate) struct RedisServer {
    pub(crate) port: u16,
    child: Option<Child>,
    dir: PathBuf,
    cluster: bool,
    /// Extra `redis-server` arguments, kept for a restart.
    extra: Vec<String>,
    /// `-a PASSWORD` for redis-cli, when the server requires one.
    password: Option<String>,
    paused: bool,
}

fn binary(name: &str, env: &str) -> String {
    std::env::var(env).unwrap_or_else(|_| name.to_owned())
}

/// A port that is free now (and, for a cluster node, whose bus port
/// `port + 10000` is free too).
fn free_port(with_bus: bool) -> u16 {
    for _ in 0..200 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = listener.local_addr().expect("local address").port();
        if !with_bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port pair for a Redis cluster node");
}

impl RedisServer {
    /// Starts a standalone server with no persistence.
    pub(crate) fn start() -> RedisServer {
        Self::spawn(free_port(false), false, &[])
    }

    /// A loopback port free now, for a server started later with
    /// [`RedisServer::start_on`].
    pub(crate) fn free_port() -> u16 {
        free_port(false)
    }

    /// Starts a standalone server with no persistence on `port`.
    pub(crate) fn start_on(port: u16) -> RedisServer {
        Self::spawn(port, false, &[])
    }

    /// Starts a replica of the server on `primary`.
    pub(crate) fn start_replica_of(primary: u16) -> RedisServer {
        let primary = primary.to_string();
        Self::spawn(
            free_port(false),
            false,
            &["--replicaof", "127.0.0.1", &primary],
        )
    }

    /// Starts a standalone server that requires `password`.
    pub(crate) fn start_with_password(password: &str) -> RedisServer {
        let mut server =
            Self::spawn_unchecked(free_port(false), false, &["--requirepass", password]);
        server.password = Some(password.to_owned());
        server.wait_until_up();
        server
    }

    /// Starts a standalone server that also serves TLS on a port of its
    /// own (returned), with the certificate `cert` + `key`; with
    /// `client_ca`, clients must present a certificate that chains to it.
    /// The plain port stays, for `cli`.
    pub(crate) fn start_tls(
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
    ) -> (RedisServer, u16) {
        let tls_port = free_port(false);
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        let ca = client_ca.map(|p| p.display().to_string());
        let tls_port_text = tls_port.to_string();
        let mut extra = vec![
            "--tls-port",
            &tls_port_text,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
        ];
        match &ca {
            Some(ca) => extra.extend(["--tls-ca-cert-file", ca, "--tls-auth-clients", "yes"]),
            // Redis wants a CA file even when it asks for no client
            // certificate: its own certificate serves.
            None => extra.extend(["--tls-ca-cert-file", &cert, "--tls-auth-clients", "no"]),
        }
        (Self::spawn(free_port(false), false, &extra), tls_port)
    }

    fn spawn(port: u16, cluster: bool, extra: &[&str]) -> RedisServer {
        let server = Self::spawn_unchecked(port, cluster, extra);
        server.wait_until_up();
        server
    }

    fn spawn_unchecked(port: u16, cluster: bool, extra: &[&str]) -> RedisServer {
        let dir = std::env::temp_dir().join(format!("quotad-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a Redis work folder");
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        RedisServer {
            port,
            child: Some(spawn_child(port, cluster, &dir, &extra)),
            dir,
            cluster,
            extra,
            password: None,
            paused: false,
        }
    }

    /// The process ID of the running server.
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is running").id()
    }

    /// Freezes the server (SIGSTOP): its sockets stay open and nothing is
    /// answered, as in a long GC-like stall or a hung host.
    pub(crate) fn pause(&mut self) {
        signal(self.pid(), "-STOP");
        self.paused = true;
    }

    /// Lets a paused server run again (SIGCONT): it then serves everything
    /// that queued up meanwhile.
    pub(crate) fn resume(&mut self) {
        signal(self.pid(), "-CONT");
        self.paused = false;
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `CONFIG SET name value`, which must answer OK.
    pub(crate) fn config_set(&self, name: &str, value: &str) {
        assert_eq!(
            self.cli(&["config", "set", name, value]).trim(),
            "OK",
            "CONFIG SET {name} {value}"
        );
    }

    /// Runs `redis-cli -p PORT args...` and returns its output.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        let mut command = Command::new(binary("redis-cli", "QUOTAD_REDIS_CLI"));
        command.arg("-p").arg(self.port.to_string());
        if let Some(password) = &self.password {
            command.env("REDISCLI_AUTH", password);
        }
        let out = command
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): {HOW_TO_GET_REDIS}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn wait_until_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.cli(&["ping"]).trim() == "PONG" {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server on port {} did not answer PING within 10 s",
            self.port
        );
    }

    /// Makes the server unable to persist: its folder goes, and a
    /// background save fails, after which Redis refuses writes (MISCONF).
    pub(crate) fn fail_persistence(&self) {
        std::fs::remove_dir_all(&self.dir).expect("remove the Redis folder");
        // Redis refuses writes after a failed save only when saves are on.
        self.config_set("save", "3600 1");
        let _ = self.cli(&["bgsave"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self
            .cli(&["info", "persistence"])
            .contains("rdb_last_bgsave_status:err")
        {
            assert!(
                Instant::now() < deadline,
                "the background save did not fail within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server (SIGKILL: as abrupt as a crash).
    pub(crate) fn stop(&mut self) {
        if self.paused {
            self.resume();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub(crate) fn restart(&mut self) {
        self.stop();
        self.child = Some(spawn_child(self.port, self.cluster, &self.dir, &self.extra));
        self.wait_until_up();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends a signal to one process this test started, by its PID.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

fn spawn_child(port: u16, cluster: bool, dir: &Path, extra: &[String]) -> Child {
    let mut args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend(["--dir".to_owned(), dir.display().to_string()]);
    if cluster {
        args.extend(
            [
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "2000",
                // One master down leaves the others serving their slots.
                "--cluster-require-full-coverage",
                "no",
            ]
            .iter()
            .map(|s| (*s).to_owned()),
        );
        args.extend([
            "--cluster-config-file".to_owned(),
            format!("nodes-{port}.conf"),
        ]);
    }
    args.extend(extra.iter().cloned());
    Command::new(binary("redis-server", "QUOTAD_REDIS_SERVER"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start redis-server ({e}): {HOW_TO_GET_REDIS}"))
}

/// A three-master Redis Cluster on loopback, no replicas.
pub(crate) struct RedisCluster {
    pub(crate) nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub(crate) fn start() -> RedisCluster {
        Self::start_with(&[])
    }

    /// Three masters and a replica of the last one (`nodes[3]`), with a
    /// cluster node timeout of one second, so that the replica takes over
    /// within a few seconds of its master stopping.
    pub(crate) fn start_with_replica() -> RedisCluster {
        let mut cluster = Self::start_with(&["--cluster-node-timeout", "1000"]);
        let replica =
            RedisServer::spawn(free_port(true), true, &["--cluster-node-timeout", "1000"]);
        let master = &cluster.nodes[2];
        let id = master.cli(&["cluster", "myid"]).trim().to_owned();
        let out = Command::new(binary("redis-cli", "QUOTAD_REDIS_CLI"))
            .args([
                "--cluster",
                "add-node",
                &format!("127.0.0.1:{}", replica.port),
                &format!("127.0.0.1:{}", master.port),
                "--cluster-slave",
                "--cluster-master-id",
                &id,
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): {HOW_TO_GET_REDIS}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster add-node failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info = replica.cli(&["info", "replication"]);
            if info.contains("master_link_status:up") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the replica did not sync with its master within 30 s: {info}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster.nodes.push(replica);
        cluster
    }

    fn start_with(extra: &[&str]) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::spawn(free_port(true), true, extra))
            .collect();
        let mut create = vec!["--cluster".to_owned(), "create".to_owned()];
        create.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        create.extend(
            ["--cluster-replicas", "0", "--cluster-yes"]
                .iter()
                .map(|s| (*s).to_owned()),
        );
        let out = Command::new(binary("redis-cli", "QUOTAD_REDIS_CLI"))
            .args(&create)
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): {HOW_TO_GET_REDIS}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if cluster
                .nodes
                .iter()
                .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"))
            {
                return cluster;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the Redis cluster did not reach cluster_state:ok within 20 s");
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The index of the master that serves `key`'s slot.
    pub(crate) fn node_of(&self, key: &str) -> usize {
        self.nodes
            .iter()
            .take(3)
            .position(|n| !n.cli(&["exists", key]).contains("MOVED"))
            .expect("one master serves every slot")
    }

    /// `count` keys, `prefix-N`, served by node `node`.
    pub(crate) fn keys_on(&self, node: usize, prefix: &str, count: usize) -> Vec<String> {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .filter(|k| self.node_of(k) == node)
            .take(count)
            .collect()
    }
}

/// A TCP proxy on loopback in front of one server, that can blackhole the
/// connections it holds: they stay open, and nothing more passes in either
/// direction (a partition, or a peer gone without a FIN). Connections made
/// after that pass as usual.
pub(crate) struct BlackholeProxy {
    pub(crate) port: u16,
    /// Bumped by [`BlackholeProxy::blackhole`]; a connection accepted in an
    /// earlier generation stops forwarding.
    generation: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Connections accepted in a generation before this one are closed.
    closing: tokio::sync::watch::Sender<u64>,
    /// How long a new connection waits before anything passes (a slow
    /// handshake, a far region), in ms.
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Where new connections go.
    upstream: std::sync::Arc<std::sync::atomic::AtomicU16>,
    task: tokio::task::JoinHandle<()>,
}

impl BlackholeProxy {
    pub(crate) async fn start(upstream: u16) -> BlackholeProxy {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let generation = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let target = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(upstream));
        let delay_ms = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (closing, closed) = tokio::sync::watch::channel(0u64);
        let gen_ = generation.clone();
        let target_ = target.clone();
        let delay_ = delay_ms.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let born = gen_.load(Ordering::SeqCst);
                let live = gen_.clone();
                let upstream = target_.load(Ordering::SeqCst);
                let delay = Duration::from_millis(delay_.load(Ordering::SeqCst));
                let mut closed = closed.clone();
                tokio::spawn(async move {
                    let forward = async move {
                        tokio::time::sleep(delay).await;
                        let Ok(server) =
                            tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                        else {
                            return;
                        };
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        let alive = move || live.load(Ordering::SeqCst) == born;
                        let up = pump(cr, sw, alive.clone());
                        let down = pump(sr, cw, alive);
                        let _ = tokio::join!(up, down);
                    };
                    // Dropping `forward` closes both sockets.
                    tokio::select! {
                        () = forward => {}
                        _ = closed.wait_for(|before| born < *before) => {}
                    }
                });
            }
        });
        BlackholeProxy {
            port,
            generation,
            closing,
            delay_ms,
            upstream: target,
            task,
        }
    }

    /// Sends connections made from now on to `port` (a failover behind one
    /// address); open ones stay where they are.
    pub(crate) fn switch_to(&self, port: u16) {
        self.upstream
            .store(port, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Closes every connection open now; later ones pass as usual.
    pub(crate) fn close_all(&self) {
        self.blackhole();
        self.close_blackholed();
    }

    /// Closes the connections that [`BlackholeProxy::blackhole`] stopped
    /// (a peer that gives up on them at last), keeping the later ones.
    pub(crate) fn close_blackholed(&self) {
        let now = self.generation.load(std::sync::atomic::Ordering::SeqCst);
        self.closing.send_replace(now);
    }

    /// Makes each connection accepted from now on wait `delay` before
    /// anything passes.
    pub(crate) fn delay_new_connections(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).expect("a short delay");
        self.delay_ms.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// Stops forwarding on every connection open now, keeping them open.
    pub(crate) fn blackhole(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for BlackholeProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` while `alive()`; once it is not, reads and drops
/// everything and holds the socket open.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    alive: impl Fn() -> bool,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if alive() && to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
