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
        Self::spawn(free_port(false), false)
    }

    fn spawn(port: u16, cluster: bool) -> RedisServer {
        let dir = std::env::temp_dir().join(format!("quotad-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a Redis work folder");
        let server = RedisServer {
            port,
            child: Some(spawn_child(port, cluster, &dir)),
            dir,
            cluster,
        };
        server.wait_until_up();
        server
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Runs `redis-cli -p PORT args...` and returns its output.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(binary("redis-cli", "QUOTAD_REDIS_CLI"))
            .arg("-p")
            .arg(self.port.to_string())
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

    /// Stops the server (SIGKILL: as abrupt as a crash).
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub(crate) fn restart(&mut self) {
        self.stop();
        self.child = Some(spawn_child(self.port, self.cluster, &self.dir));
        self.wait_until_up();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spawn_child(port: u16, cluster: bool, dir: &Path) -> Child {
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
            ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]
                .iter()
                .map(|s| (*s).to_owned()),
        );
        args.extend([
            "--cluster-config-file".to_owned(),
            format!("nodes-{port}.conf"),
        ]);
    }
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
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::spawn(free_port(true), true))
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
}
