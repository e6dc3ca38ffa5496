//! Leases under real faults, with real processes: three `quotad serve`
//! replicas on one `redis-server`, six `quotad check --leases` clients on
//! one hot key (two per replica), one client SIGKILLed part-way and one
//! replica SIGSTOPped for 1.5 s. Every admission any client printed (the
//! killed one's up to its death: the CLI flushes each line) is attributed
//! to its policy window, and each window must hold the global bound
//! (admitted <= limit) and lose no more than the faults can strand.
//!
//! Every process is started here and ended here by its own handle (its
//! PID), on success and on failure alike (the guards kill on drop).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::binary::Server;
use crate::common::redis::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_quotad");

/// The policy: a fixed window of [`LIMIT`] per [`WINDOW_MS`], leases of
/// 2 to [`MAX_UNITS`] units for at most 1 s. Stores that fail are
/// answered as denials (`fail_closed`), so a client keeps running through
/// a fault rather than exiting on an error.
const LIMIT: u64 = 300;
const WINDOW_MS: u64 = 2_000;
const MAX_UNITS: u64 = 20;

/// Six clients at one check per 10 ms each (some 70 a second each, with
/// the calls' own time): about three times the limit's 150 a second, so
/// the budget of every window runs out in its first half, faults or not.
/// 380 checks last some 4.5 s (6 s for a client of the stopped replica):
/// two whole windows from a start just after a boundary.
const CLIENTS_PER_REPLICA: usize = 2;
const CHECKS: &str = "380";
const INTERVAL: &str = "10ms";

/// When the faults happen, counted from the clients' start (20 ms after a
/// window boundary): each early in its own window, while the budget is
/// not spent yet and the clients hold leases, so the faults have units to
/// strand. The kill is 0.27 s into the first window; the stall from 0.17 s
/// to 1.67 s into the second.
const KILL_AT: Duration = Duration::from_millis(250);
const STOP_AT: Duration = Duration::from_millis(2_150);
const STOP_FOR: Duration = Duration::from_millis(1_500);

/// The client whose process is killed (on replica 0) and the replica that
/// is stopped (serving clients 2 and 3).
const KILLED: usize = 0;
const STOPPED: usize = 1;

/// How late a lease's local decision may be stamped after its window's
/// end: the stamp is read just after the decision, and a busy host may
/// deschedule the process in between. The lease itself stops spending a
/// margin (5 ms) and 0.1% before quotad's end.
const STAMP_LAG_MS: u64 = 50;

const RUNS: usize = 3;

fn config(redis: &RedisServer) -> String {
    format!(
        r#"
[store]
backend = "redis"

[store.redis]
url = "{url}"

[policies.hot]
algorithm = "fixed_window"
limit = {LIMIT}
window = "{WINDOW_MS}ms"
on_error = "fail_closed"
lease = {{ max_units = {MAX_UNITS}, min_units = 2, max_ttl = "1s" }}
"#,
        url = redis.url()
    )
}

/// A running `quotad check`, killed (by its own handle) if still running
/// when dropped; its stdout is read to the end on a thread of its own.
struct CheckProcess {
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

impl CheckProcess {
    fn spawn(addr: &str, key: &str) -> CheckProcess {
        let mut command = Command::new(BIN);
        command
            .args([
                "check",
                "--addr",
                addr,
                "--policy",
                "hot",
                "--key",
                key,
                "--count",
                CHECKS,
                "--interval",
                INTERVAL,
                "--leases",
                &MAX_UNITS.to_string(),
                "--timestamps",
                // Longer than the stall: a client of the stopped replica
                // waits for it rather than exiting on an error.
                "--timeout",
                "5s",
            ])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("QUOTAD_") {
                command.env_remove(name);
            }
        }
        let mut child = command.spawn().expect("spawn quotad check");
        let stdout = drain(child.stdout.take().expect("piped stdout"));
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        CheckProcess {
            child,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    /// SIGKILL, as abrupt as a crash.
    fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Waits (polling, until `deadline`) for the process to end; returns
    /// its exit code (`None` when killed by a signal), stdout and stderr.
    fn finish(mut self, deadline: Instant) -> (Option<i32>, String, String) {
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "a quotad check did not finish in time"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = self
            .stdout
            .take()
            .expect("read once")
            .join()
            .expect("reader");
        let err = self
            .stderr
            .take()
            .expect("read once")
            .join()
            .expect("reader");
        (status.code(), out, err)
    }
}

impl Drop for CheckProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn drain(mut pipe: impl std::io::Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// A stopped replica is let run again when dropped, so a failing test
/// does not leave it stopped until its own guard kills it.
struct Stopped<'a>(&'a Server);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.signal("CONT");
    }
}

fn wall_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_millis()).expect("ms fit in u64")
}

/// One decision a client printed.
#[derive(Clone, Copy, Debug)]
struct Decided {
    client: usize,
    at_ms: u64,
    allowed: bool,
    /// Denied because the budget was spent (not a store failure).
    exhausted: bool,
    from_lease: bool,
    /// The end of the window the decision was charged to.
    window_end: u64,
}

/// Parses `#N  at MS  allowed  remaining R/L  reset in D  (reason)[  from a lease]`.
fn parse(client: usize, line: &str) -> Option<Decided> {
    let rest = line.strip_prefix('#')?;
    let (_, rest) = rest.split_once("  at ")?;
    let (at, rest) = rest.split_once("  ")?;
    let at_ms: u64 = at.parse().ok()?;
    let allowed = rest.starts_with("allowed ");
    let reset_ms = match rest.split_once("reset in ") {
        Some((_, tail)) => {
            let text = tail.split("  (").next()?;
            u64::try_from(humantime::parse_duration(text).ok()?.as_millis()).ok()?
        }
        None => 0,
    };
    Some(Decided {
        client,
        at_ms,
        allowed,
        exhausted: rest.contains("(limit_exceeded)"),
        from_lease: rest.ends_with("from a lease"),
        window_end: window_end(at_ms, reset_ms),
    })
}

/// The end of the window a decision was charged to, from its stamp and
/// the reset it reported. Windows are aligned to the Unix epoch on
/// Redis's clock, which on this host is the stamps' clock too.
///
/// Attributing by the stamp alone would misplace a decision stamped after
/// a boundary that was decided before it (a call's answer arrives after
/// quotad decided; across the stall, 1.5 s after). The reset says which
/// window: a call's `reset_after_ms` is that window's end less quotad's
/// decision time, which is at most the stamp; a lease's is the end quotad
/// reported at the grant, counted by the client from when the grant
/// arrived, so no earlier than the real end either. Either way
/// `stamp + reset` is at or after the window's end (give or take 5 ms of
/// whole-millisecond rounding on two clocks) and less than a window past
/// it (the answer's delay is far below the 2 s window), so the window's end
/// is the last boundary at or before `stamp + reset + 5 ms`. A lease spent
/// after the client's own record of the window's end reports no reset, and
/// is placed by its stamp: it would show up in the next window.
fn window_end(at_ms: u64, reset_ms: u64) -> u64 {
    let late = at_ms + reset_ms + 5;
    late - late % WINDOW_MS
}

/// What one run measured, per window end.
#[derive(Debug, Default)]
struct Window {
    admitted: u64,
    from_leases: u64,
    exhausted: u64,
}

#[test]
fn three_replicas_six_clients_a_killed_client_and_a_stopped_replica_never_over_admit() {
    let started = Instant::now();
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("quotad.toml");
    std::fs::write(&path, config(&redis)).expect("write the config");
    let replicas: Vec<Server> = (0..3).map(|_| serve(&path)).collect();
    let (grpc, admin): (Vec<_>, Vec<_>) = replicas.iter().map(Server::addresses).unzip();
    let addrs: Vec<String> = grpc.iter().map(ToString::to_string).collect();

    for run in 0..RUNS {
        scenario(run, &replicas, &addrs);
    }
    report(&admin);
    // The replicas and Redis are killed by their guards.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

/// Prints what each replica counted of leases and of Redis replies that
/// came after quotad gave up on them (a stopped quotad's timeouts fire
/// before it reads the reply waiting in its socket): what to look at when
/// a window is off.
fn report(admin: &[std::net::SocketAddr]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    for (i, &admin) in admin.iter().enumerate() {
        let (status, text) = runtime.block_on(crate::common::http_get(admin, "/metrics"));
        assert_eq!(status, 200, "{text}");
        let metrics = crate::common::Metrics::parse(&text);
        let leases: Vec<String> = ["granted", "direct", "returned", "ended", "refused"]
            .iter()
            .map(|outcome| {
                let n = metrics.value(
                    "quotad_leases_total",
                    &[("policy", "hot"), ("outcome", outcome)],
                );
                format!("{outcome} {n}")
            })
            .collect();
        let late = |outcome: &str| {
            metrics.value("quotad_redis_late_scripts_total", &[("outcome", outcome)])
        };
        eprintln!(
            "replica {i}: leases {}; late Redis replies: {} counted, {} refused",
            leases.join(", "),
            late("counted"),
            late("refused")
        );
    }
}

fn serve(config: &Path) -> Server {
    let config = config.to_string_lossy();
    Server::spawn(&[
        "serve",
        "--config",
        &config,
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ])
}

fn scenario(run: usize, replicas: &[Server], addrs: &[String]) {
    let key = format!("hot-{}-{run}", std::process::id());
    // Start just after a window boundary, so that the run covers two whole
    // windows while every client is still checking.
    let into = wall_ms() % WINDOW_MS;
    std::thread::sleep(Duration::from_millis(WINDOW_MS - into + 20));

    let t0 = Instant::now();
    let mut clients: Vec<CheckProcess> = (0..addrs.len() * CLIENTS_PER_REPLICA)
        .map(|i| CheckProcess::spawn(&addrs[i / CLIENTS_PER_REPLICA], &key))
        .collect();

    std::thread::sleep(KILL_AT.saturating_sub(t0.elapsed()));
    clients[KILLED].kill();
    let killed_ms = wall_ms();

    std::thread::sleep(STOP_AT.saturating_sub(t0.elapsed()));
    replicas[STOPPED].signal("STOP");
    let stopped = Stopped(&replicas[STOPPED]);
    let stop_ms = wall_ms();
    std::thread::sleep(STOP_FOR);
    drop(stopped);
    let cont_ms = wall_ms();

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut decided = Vec::new();
    // The last stamp of each client that ran to its end.
    let mut last_of_finished = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let (code, out, err) = client.finish(deadline);
        let mut last = 0;
        for line in out.lines().filter(|l| l.starts_with('#')) {
            let d = parse(i, line).unwrap_or_else(|| panic!("client {i}: {line:?}"));
            last = last.max(d.at_ms);
            decided.push(d);
        }
        if i == KILLED {
            assert_eq!(code, None, "killed by a signal: {err}");
        } else {
            assert_eq!(code, Some(0), "client {i} exits 0:\n{out}\n{err}");
            last_of_finished.push(last);
        }
    }
    let demand_until = last_of_finished.iter().copied().min().unwrap_or(0);

    let mut windows: BTreeMap<u64, Window> = BTreeMap::new();
    for d in &decided {
        let w = windows.entry(d.window_end).or_default();
        if d.allowed {
            w.admitted += 1;
            w.from_leases += u64::from(d.from_lease);
        }
        w.exhausted += u64::from(d.exhausted);
        if d.from_lease {
            // A lease is spent only before the end of the window it was
            // charged to (by the client's margin, before quotad's own end).
            assert!(
                d.at_ms < d.window_end + STAMP_LAG_MS,
                "run {run}: client {} spent a lease at {} after its window's end {}",
                d.client,
                d.at_ms,
                d.window_end
            );
        }
    }

    eprintln!(
        "run {run}: key {key}, killed client {KILLED} at {killed_ms}, replica {STOPPED} stopped {stop_ms}..{cont_ms}, demand until {demand_until}"
    );
    let mut checked = 0;
    for (&end, w) in &windows {
        let start = end - WINDOW_MS;
        // The global bound, whatever happened.
        assert!(
            w.admitted <= LIMIT,
            "run {run}: window [{start}, {end}) admitted {} > {LIMIT} ({} from leases): over-admission",
            w.admitted,
            w.from_leases
        );
        // The lower bound, where it means something: the budget ran out
        // (some check was denied for it) and every client that was not
        // killed was still checking when the window ended, so units given
        // back late in the window still met demand. What may then be
        // missing is only what the faults stranded:
        // - the killed client's leases: it spends one at a time, but holds
        //   two for a while, since the one it stopped when its successor
        //   came is settled with its next call: at most 2 x max_units,
        //   until they end, which is by the window's end; plus the cost of
        //   the check it may have had in flight, which quotad admitted and
        //   the client died before printing;
        // - per client of the stopped replica, the same two leases it held
        //   or was granted when its calls stalled (they ended meanwhile,
        //   or a grant came back too late to spend or as a failed call),
        //   plus the cost of one check that Redis counted while quotad,
        //   stopped, timed out on its reply and answered it fail_closed.
        let saturated = w.exhausted > 0 && demand_until >= end;
        let kill = if (start..end).contains(&killed_ms) {
            2 * MAX_UNITS + 1
        } else {
            0
        };
        let stall = if stop_ms < end && cont_ms >= start {
            CLIENTS_PER_REPLICA as u64 * (2 * MAX_UNITS + 1)
        } else {
            0
        };
        let floor = LIMIT.saturating_sub(kill + stall);
        eprintln!(
            "run {run}: window [{start}, {end}): admitted {} ({} from leases), denied as exhausted {}, {}",
            w.admitted,
            w.from_leases,
            w.exhausted,
            if saturated {
                format!(
                    "short of the limit by {} (may strand {kill} killed + {stall} stalled)",
                    LIMIT - w.admitted
                )
            } else {
                "not saturated: no lower bound".to_owned()
            }
        );
        if saturated {
            checked += 1;
            assert!(
                w.admitted >= floor,
                "run {run}: window [{start}, {end}) admitted {} < {floor} = {LIMIT} - {kill} (killed client) - {stall} (stalled replica's clients)",
                w.admitted
            );
        }
    }
    assert!(
        checked >= 1,
        "run {run}: no window was saturated to check the lower bound: {windows:?}"
    );
}
