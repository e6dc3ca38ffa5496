//! Redis Sentinel (`store.redis.sentinel_nodes`): quotad finds the master
//! through three real sentinels (`redis-server --sentinel`), and follows a
//! failover after the primary is SIGKILLed under load. Nothing is counted
//! twice; what asynchronous replication loses is measured, not assumed.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use quotad::Config;
use quotad_client::{Check, Client, Reason};

use crate::common::TestServer;
use crate::common::redis::RedisServer;

pub(super) const MASTER: &str = "quotad-main";

/// One sentinel process, killed when dropped.
pub(super) struct Sentinel {
    pub(super) port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    pub(super) fn start(primary: u16) -> Sentinel {
        let port = RedisServer::free_port();
        let dir = tempfile::tempdir().expect("sentinel folder");
        let conf: PathBuf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {MASTER} 127.0.0.1 {primary} 2\nsentinel down-after-milliseconds {MASTER} 1000\nsentinel failover-timeout {MASTER} 5000\nsentinel parallel-syncs {MASTER} 1\n",
                dir.path().display()
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new(
            std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned()),
        )
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect(
            "start redis-server --sentinel (install redis-server: apt-get install redis-server)",
        );
        Sentinel {
            port,
            child,
            _dir: dir,
        }
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether this sentinel sees the master with one replica and both
    /// other sentinels.
    pub(super) fn ready(&self) -> bool {
        let master = self.cli(&["sentinel", "master", MASTER]);
        let field = |name: &str| {
            let lines: Vec<&str> = master.lines().collect();
            lines
                .iter()
                .position(|l| l.trim() == name)
                .and_then(|i| lines.get(i + 1))
                .map(|v| v.trim().to_owned())
        };
        field("num-slaves").as_deref() == Some("1")
            && field("num-other-sentinels").as_deref() == Some("2")
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotad_follows_a_sentinel_failover_after_the_primary_is_killed_and_counts_nothing_twice() {
    let mut primary = RedisServer::start();
    // The first full sync at once, not after diskless sync's 5 s delay.
    primary.config_set("repl-diskless-sync-delay", "0");
    let replica = RedisServer::start_replica_of(primary.port);
    let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(primary.port)).collect();
    let started = Instant::now();
    while !sentinels.iter().all(Sentinel::ready)
        || !replica
            .cli(&["info", "replication"])
            .contains("master_link_status:up")
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the replica did not sync, or the sentinels did not see the master, its replica and each other, within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let nodes: Vec<String> = sentinels
        .iter()
        .map(|s| format!("redis://127.0.0.1:{}", s.port))
        .collect();
    let config = Config::from_toml(&format!(
        "[store]\nbackend = \"redis\"\n\n[store.redis]\nurl = \"redis://{MASTER}/0\"\nsentinel_nodes = {nodes:?}\ntimeout = \"200ms\"\n\n[policies.api]\nalgorithm = \"fixed_window\"\nlimit = 1000000\nwindow = \"1h\"\n"
    ))
    .expect("valid config");
    let server = TestServer::start(config).await;
    let client = Client::builder(format!("http://{}", server.grpc_addr))
        .deadline(Duration::from_millis(500))
        .deny_cache(0)
        .build()
        .expect("client");
    let check = Check::named("api", "k");

    let mut admitted = 0_u64;
    for _ in 0..200 {
        let decision = client
            .check(&check)
            .await
            .expect("decided through the sentinels");
        assert!(decision.allowed);
        admitted += 1;
    }
    // SIGKILL the primary under load; count until checks are decided again.
    primary.stop();
    let killed = Instant::now();
    let mut failed = 0_u64;
    let back = loop {
        match client.check(&check).await {
            Ok(decision) if decision.reason == Reason::WithinLimit => {
                admitted += 1;
                break killed.elapsed();
            }
            Ok(decision) => panic!("unexpected answer {decision:?}"),
            Err(_) => failed += 1,
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "no failover within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    for _ in 0..200 {
        let decision = client
            .check(&check)
            .await
            .expect("decided on the new primary");
        assert!(decision.allowed);
        admitted += 1;
    }
    let peeked = client.peek(&check).await.expect("peek");
    let counted = 1_000_000 - peeked.remaining;
    eprintln!(
        "sentinel failover: decided again {back:?} after SIGKILL ({failed} checks failed meanwhile); admitted {admitted}, counted {counted}"
    );
    assert!(
        counted <= admitted,
        "nothing counted twice: {counted} counted for {admitted} admitted"
    );
    // Only what the killed primary acknowledged and had not yet replicated
    // can be lost: at most the checks just before the kill.
    assert!(
        admitted - counted <= 200,
        "lost {} of {admitted}",
        admitted - counted
    );
    // The replica is the primary now.
    assert!(
        replica.cli(&["role"]).starts_with("master"),
        "{}",
        replica.cli(&["role"])
    );
}
