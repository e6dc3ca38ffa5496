//! The Redis deployments a chaos phase runs on, started as children of
//! the driver on free loopback ports, each node from a config file in its
//! own folder with an append-only file (fsynced every second), so a
//! restart after SIGKILL keeps what was fsynced and a node that Sentinel
//! or the Cluster reconfigured keeps its new role (both rewrite the file).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::proxy::Proxy;
use super::schedule::Role;
use crate::soak::process::{Managed, free_port, signal};

/// The master set's name the sentinels watch.
pub(super) const MASTER: &str = "chaos";

/// One redis-server (or sentinel) from a config file.
#[derive(Debug)]
pub(super) struct Node {
    pub(super) port: u16,
    binary: PathBuf,
    conf: PathBuf,
    sentinel: bool,
    process: Managed,
}

impl Node {
    fn start(
        binary: &Path,
        dir: &Path,
        port: u16,
        conf: &str,
        sentinel: bool,
    ) -> anyhow::Result<Node> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(if sentinel {
            "sentinel.conf"
        } else {
            "redis.conf"
        });
        std::fs::write(&path, conf)?;
        let process = Self::spawn(binary, &path, sentinel)?;
        Ok(Node {
            port,
            binary: binary.to_owned(),
            conf: path,
            sentinel,
            process,
        })
    }

    fn spawn(binary: &Path, conf: &Path, sentinel: bool) -> anyhow::Result<Managed> {
        let dir = conf.parent().context("a config file has a folder")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("log"))?;
        let mut command = Command::new(binary);
        command.arg(conf);
        if sentinel {
            command.arg("--sentinel");
        }
        Managed::spawn(
            command
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
            if sentinel {
                "redis-sentinel"
            } else {
                "redis-server"
            },
        )
    }

    pub(super) fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub(super) fn pause(&self) -> anyhow::Result<()> {
        signal(self.pid(), "-STOP")
    }

    pub(super) fn resume(&self) -> anyhow::Result<()> {
        signal(self.pid(), "-CONT")
    }

    pub(super) fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts it again from its (possibly rewritten) config file.
    pub(super) async fn restart(&mut self) -> anyhow::Result<()> {
        self.process = Self::spawn(&self.binary, &self.conf, self.sentinel)?;
        wait_ping(self.port, Duration::from_secs(30)).await
    }

    /// `redis-cli -p PORT args...`, its output (an error when it takes
    /// over 2 s: a stopped node).
    pub(super) async fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        cli(self.port, args).await
    }
}

/// `redis-cli -p port args...` with a 2 s bound.
pub(super) async fn cli(port: u16, args: &[&str]) -> anyhow::Result<String> {
    cli_within(port, args, Duration::from_secs(2)).await
}

/// `redis-cli -p port args...`, an error after `within`.
pub(super) async fn cli_within(
    port: u16,
    args: &[&str],
    within: Duration,
) -> anyhow::Result<String> {
    let out = tokio::time::timeout(
        within,
        tokio::process::Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("redis-cli -p {port} {args:?} took over {within:?}"))?
    .context("cannot run redis-cli")?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn wait_ping(port: u16, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if cli(port, &["ping"])
            .await
            .is_ok_and(|r| r.starts_with("PONG"))
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("redis on port {port} did not answer PING within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn server_conf(port: u16, extra: &str) -> String {
    format!(
        "port {port}\nbind 127.0.0.1\ndaemonize no\nsave \"\"\nappendonly yes\nappendfsync everysec\ndir .\nrepl-timeout 5\n{extra}"
    )
}

/// A primary and a replica, each behind its own [`Proxy`], and three
/// sentinels that reach both through the proxies: everyone (quotad, the
/// sentinels, the replication link) sees a node through its proxy, so a
/// blackhole is a partition of that node, and the address the sentinels
/// hand out is the proxy's.
#[derive(Debug)]
pub(super) struct SentinelSet {
    /// The two data nodes; `proxies[i]` is in front of `nodes[i]`.
    pub(super) nodes: Vec<Node>,
    pub(super) proxies: Vec<Proxy>,
    pub(super) sentinels: Vec<Node>,
}

impl SentinelSet {
    pub(super) async fn start(binary: &Path, dir: &Path) -> anyhow::Result<SentinelSet> {
        let ports = [free_port()?, free_port()?];
        let mut proxies = Vec::new();
        for port in ports {
            proxies.push(Proxy::start(port).await?);
        }
        let mut nodes = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            // The node announces its proxy as its address, so the
            // sentinels (and through them quotad) reach it there.
            let mut extra = format!(
                "replica-announce-ip 127.0.0.1\nreplica-announce-port {}\n",
                proxies[i].port
            );
            if i == 1 {
                extra.push_str(&format!("replicaof 127.0.0.1 {}\n", proxies[0].port));
            }
            let node_dir = dir.join(format!("redis-{i}"));
            std::fs::create_dir_all(&node_dir)?;
            // `dir .` is relative to where redis-server runs: make it the
            // node's folder by writing it absolute.
            let conf =
                server_conf(*port, &extra).replace("dir .", &format!("dir {}", node_dir.display()));
            nodes.push(Node::start(binary, &node_dir, *port, &conf, false)?);
        }
        for node in &nodes {
            wait_ping(node.port, Duration::from_secs(20)).await?;
        }
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port()?;
            let sdir = dir.join(format!("sentinel-{i}"));
            let conf = format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {}\nsentinel monitor {MASTER} 127.0.0.1 {} 2\nsentinel down-after-milliseconds {MASTER} 1500\nsentinel failover-timeout {MASTER} 6000\nsentinel parallel-syncs {MASTER} 1\n",
                sdir.display(),
                proxies[0].port
            );
            sentinels.push(Node::start(binary, &sdir, port, &conf, true)?);
        }
        let set = SentinelSet {
            nodes,
            proxies,
            sentinels,
        };
        set.wait_settled(Duration::from_secs(40)).await?;
        Ok(set)
    }

    /// Waits until the sentinels agree on a master, see one replica and
    /// each other, and the replica's link is up.
    pub(super) async fn wait_settled(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if self.settled().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the sentinels did not see a master, its replica and each other within {within:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn settled(&self) -> bool {
        let Some(primary) = self.primary().await else {
            return false;
        };
        for s in &self.sentinels {
            let Ok(master) = s.cli(&["sentinel", "master", MASTER]).await else {
                return false;
            };
            let lines: Vec<&str> = master.lines().collect();
            let field = |name: &str| {
                lines
                    .iter()
                    .position(|l| *l == name)
                    .and_then(|i| lines.get(i + 1).copied())
            };
            if field("num-slaves") != Some("1")
                || field("num-other-sentinels") != Some("2")
                || field("flags") != Some("master")
            {
                return false;
            }
        }
        let replica = &self.nodes[1 - primary];
        replica
            .cli(&["info", "replication"])
            .await
            .is_ok_and(|i| i.contains("master_link_status:up"))
    }

    /// The index of the node the sentinels name as master (asked of each
    /// in turn until one answers).
    pub(super) async fn primary(&self) -> Option<usize> {
        for s in &self.sentinels {
            if let Ok(out) = s
                .cli(&["sentinel", "get-master-addr-by-name", MASTER])
                .await
            {
                let port: Option<u16> = out.lines().nth(1).and_then(|p| p.trim().parse().ok());
                if let Some(i) = self.proxies.iter().position(|p| Some(p.port) == port) {
                    return Some(i);
                }
            }
        }
        None
    }

    /// The node a role names now.
    pub(super) async fn resolve(&self, role: Role) -> usize {
        let primary = self.primary().await.unwrap_or(0);
        match role {
            Role::Primary(_) => primary,
            Role::Replica(_) => 1 - primary,
        }
    }

    /// `SENTINEL FAILOVER` through the first sentinel that answers.
    pub(super) async fn failover(&self) -> anyhow::Result<String> {
        let mut last = String::new();
        for s in &self.sentinels {
            match s.cli(&["sentinel", "failover", MASTER]).await {
                Ok(out) if out.starts_with("OK") => return Ok(out),
                Ok(out) => last = out,
                Err(e) => last = e.to_string(),
            }
        }
        Ok(last)
    }

    pub(super) fn watch(&self) -> Watch {
        Watch::Sentinel {
            sentinels: self.sentinels.iter().map(|s| s.port).collect(),
            nodes: self
                .proxies
                .iter()
                .zip(&self.nodes)
                .map(|(p, n)| (p.port, n.port))
                .collect(),
        }
    }

    /// The URLs quotad is given.
    pub(super) fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }
}

/// What to ask to learn which nodes are primaries now, without holding
/// the nodes (the fault player does): a role watcher's view.
#[derive(Clone, Debug)]
pub(super) enum Watch {
    /// Sentinel ports, and (proxy port, node port) of each data node.
    Sentinel {
        sentinels: Vec<u16>,
        nodes: Vec<(u16, u16)>,
    },
    /// Every Cluster node's port.
    Cluster { nodes: Vec<u16> },
}

impl Watch {
    /// How many data nodes say `ROLE` master now (a stopped node, which
    /// takes no writes, does not answer within 300 ms and is not counted),
    /// and how many should.
    pub(super) async fn masters(&self) -> (usize, usize) {
        let (ports, expected): (Vec<u16>, usize) = match self {
            Watch::Sentinel { nodes, .. } => (nodes.iter().map(|(_, n)| *n).collect(), 1),
            Watch::Cluster { nodes } => (nodes.clone(), 3),
        };
        let mut masters = 0;
        for port in ports {
            if cli_within(port, &["role"], Duration::from_millis(300))
                .await
                .is_ok_and(|r| r.starts_with("master"))
            {
                masters += 1;
            }
        }
        (masters, expected)
    }

    /// The ports of the nodes serving writes now, sorted; empty when no
    /// one answers.
    pub(super) async fn primaries(&self) -> Vec<u16> {
        match self {
            Watch::Sentinel { sentinels, nodes } => {
                for s in sentinels {
                    if let Ok(out) = cli(*s, &["sentinel", "get-master-addr-by-name", MASTER]).await
                    {
                        let port: Option<u16> =
                            out.lines().nth(1).and_then(|p| p.trim().parse().ok());
                        if let Some((_, node)) =
                            nodes.iter().find(|(proxy, _)| Some(*proxy) == port)
                        {
                            return vec![*node];
                        }
                    }
                }
                Vec::new()
            }
            Watch::Cluster { nodes } => {
                for n in nodes {
                    if let Ok(text) = cli(*n, &["cluster", "nodes"]).await
                        && !text.is_empty()
                    {
                        let mut ports: Vec<u16> = parse_shards(&text, nodes)
                            .iter()
                            .map(|s| nodes[s.master])
                            .collect();
                        ports.sort_unstable();
                        return ports;
                    }
                }
                Vec::new()
            }
        }
    }
}

/// One master of a Cluster and its replica, by index into
/// [`Cluster::nodes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Shard {
    pub(super) master: usize,
    pub(super) replica: Option<usize>,
    /// The lowest slot the master serves: shards are ordered by it, so
    /// "master 0" means the same slots all run long.
    pub(super) first_slot: u16,
}

/// A Cluster of three masters with one replica each.
#[derive(Debug)]
pub(super) struct Cluster {
    pub(super) nodes: Vec<Node>,
}

impl Cluster {
    pub(super) async fn start(binary: &Path, dir: &Path) -> anyhow::Result<Cluster> {
        let mut nodes = Vec::new();
        for i in 0..6 {
            // A Cluster node also listens on port + 10000 (the bus).
            let port = loop {
                let p = free_port()?;
                if p < 55_000 && std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
                    break p;
                }
            };
            let node_dir = dir.join(format!("cluster-{i}"));
            std::fs::create_dir_all(&node_dir)?;
            let conf = server_conf(
                port,
                "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout 2000\ncluster-require-full-coverage no\n",
            )
            .replace("dir .", &format!("dir {}", node_dir.display()));
            nodes.push(Node::start(binary, &node_dir, port, &conf, false)?);
        }
        for node in &nodes {
            wait_ping(node.port, Duration::from_secs(20)).await?;
        }
        let mut create = vec!["--cluster".to_owned(), "create".to_owned()];
        create.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        create.extend(["--cluster-replicas", "1", "--cluster-yes"].map(str::to_owned));
        let out = tokio::process::Command::new("redis-cli")
            .args(&create)
            .kill_on_drop(true)
            .output()
            .await
            .context("cannot run redis-cli --cluster create")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let cluster = Cluster { nodes };
        cluster.wait_settled(Duration::from_secs(40)).await?;
        Ok(cluster)
    }

    /// Waits until every node says `cluster_state:ok` and three masters
    /// each have a replica whose link is up.
    pub(super) async fn wait_settled(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let mut ok = true;
            for n in &self.nodes {
                if !n
                    .cli(&["cluster", "info"])
                    .await
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
                {
                    ok = false;
                }
            }
            if ok {
                let shards = self.shards().await;
                ok = shards.len() == 3 && shards.iter().all(|s| s.replica.is_some());
                for s in &shards {
                    if let Some(r) = s.replica {
                        ok &= self.nodes[r]
                            .cli(&["info", "replication"])
                            .await
                            .is_ok_and(|i| i.contains("master_link_status:up"));
                    }
                }
            }
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the Cluster did not settle (ok, three masters with a synced replica each) within {within:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The masters that serve slots and their replicas, as the first node
    /// that answers `CLUSTER NODES` sees them, in slot order.
    pub(super) async fn shards(&self) -> Vec<Shard> {
        for n in &self.nodes {
            if let Ok(text) = n.cli(&["cluster", "nodes"]).await
                && !text.is_empty()
            {
                let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
                return parse_shards(&text, &ports);
            }
        }
        Vec::new()
    }

    /// The node a role names now: shard `n` in slot order (of those
    /// serving), its master or its replica.
    pub(super) async fn resolve(&self, role: Role) -> Option<usize> {
        let shards = self.shards().await;
        let (n, primary) = match role {
            Role::Primary(n) => (n, true),
            Role::Replica(n) => (n, false),
        };
        let shard = shards.get(n % shards.len().max(1))?;
        if primary {
            Some(shard.master)
        } else {
            shard.replica
        }
    }

    pub(super) fn watch(&self) -> Watch {
        Watch::Cluster {
            nodes: self.nodes.iter().map(|n| n.port).collect(),
        }
    }

    pub(super) fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }
}

/// The masters that serve slots and their replicas in `CLUSTER NODES`
/// text, by index into `ports`, in slot order.
fn parse_shards(text: &str, ports: &[u16]) -> Vec<Shard> {
    struct Line<'a> {
        id: &'a str,
        port: Option<u16>,
        master: bool,
        failed: bool,
        of: &'a str,
        first_slot: Option<u16>,
    }
    let lines: Vec<Line> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = f
                .get(1)?
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok();
            let flags = f.get(2)?;
            Some(Line {
                id: f.first()?,
                port,
                master: flags.contains("master"),
                failed: flags.contains("fail"),
                of: f.get(3)?,
                first_slot: f
                    .get(8)
                    .and_then(|s| s.split('-').next())
                    .and_then(|s| s.parse().ok()),
            })
        })
        .collect();
    let index = |port: Option<u16>| ports.iter().position(|p| Some(*p) == port);
    let mut shards: Vec<Shard> = lines
        .iter()
        .filter(|l| l.master && !l.failed && l.first_slot.is_some())
        .filter_map(|m| {
            Some(Shard {
                master: index(m.port)?,
                replica: lines
                    .iter()
                    .find(|r| !r.master && !r.failed && r.of == m.id)
                    .and_then(|r| index(r.port)),
                first_slot: m.first_slot?,
            })
        })
        .collect();
    shards.sort_by_key(|s| s.first_slot);
    shards
}

/// Every key under `prefix:` on the node at `port` and its TTL in ms
/// (`PTTL`: -1 for none, -2 when it went meanwhile).
pub(super) async fn ttls(port: u16, prefix: &str) -> anyhow::Result<Vec<(String, i64)>> {
    let pattern = format!("{prefix}:*");
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "--scan", "--pattern", &pattern])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("SCAN took over 20 s")??;
    if !out.status.success() {
        bail!(
            "redis-cli --scan on port {port} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let keys: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    // One redis-cli, one PTTL a line: quotad's key names hold no spaces or
    // quotes (the driver chooses them).
    let mut script = String::new();
    for k in &keys {
        script.push_str("PTTL ");
        script.push_str(k);
        script.push('\n');
    }
    let mut child = tokio::process::Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot run redis-cli")?;
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().context("redis-cli's stdin")?;
        stdin.write_all(script.as_bytes()).await?;
    }
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .context("PTTL took over 20 s")??;
    let replies: Vec<i64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().parse().unwrap_or(i64::MIN))
        .collect();
    if replies.len() != keys.len() {
        bail!("{} keys but {} PTTL replies", keys.len(), replies.len());
    }
    Ok(keys.into_iter().zip(replies).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_read_from_cluster_nodes_in_slot_order_without_failed_nodes() {
        let text = "\
a1 127.0.0.1:7001@17001 master - 0 0 1 connected 5461-10922
b1 127.0.0.1:7002@17002 myself,master - 0 0 2 connected 0-5460
c1 127.0.0.1:7003@17003 master - 0 0 3 connected 10923-16383
a2 127.0.0.1:7004@17004 slave a1 0 0 1 connected
b2 127.0.0.1:7005@17005 slave b1 0 0 2 connected
c2 127.0.0.1:7006@17006 master,fail - 0 0 3 connected
c3 127.0.0.1:7007@17007 slave,fail c1 0 0 3 connected
";
        let ports = [7001, 7002, 7003, 7004, 7005, 7006, 7007];
        let shards = parse_shards(text, &ports);
        assert_eq!(
            shards,
            vec![
                Shard {
                    master: 1,
                    replica: Some(4),
                    first_slot: 0
                },
                Shard {
                    master: 0,
                    replica: Some(3),
                    first_slot: 5461
                },
                Shard {
                    master: 2,
                    replica: None,
                    first_slot: 10923
                },
            ]
        );
    }
}
