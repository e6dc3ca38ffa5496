//! `quotad demo`: the window-boundary attack, live, on the real clock.
//!
//! A fixed window forgets everything at each boundary, so `limit` requests
//! just before it and `limit` right after it all pass: 2 x the limit in a
//! few milliseconds. A sliding window counter still weighs the previous
//! window's requests right after the boundary, so the second burst is
//! denied. The demo shows both side by side: every request is one
//! `CheckBatch` of two items (the same key under each policy), decided at
//! the same instant.
//!
//! Timing is checked against quotad's own answers, not assumed: a fixed
//! window's `reset_after_ms` says how far before the window's end each
//! request landed. An attempt whose first burst ran past the boundary, or
//! whose second burst landed more than [`LATE_MS`] after it (a busy
//! machine), is reported and repeated at the next boundary with fresh
//! keys, within [`ATTACK_BUDGET`].

use std::io::Write;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quotad::{Config, Listeners};
use quotad_client::{BatchMode, Check, Client, Decision, PolicyRef};
use quotad_core::{Algorithm, Policy};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::args::endpoint;
use super::{Failure, client, failure, human};

/// Requests admitted per window, under both policies.
const LIMIT: u64 = 10;
/// The window of both policies.
const WINDOW_MS: u64 = 2_000;
/// The first burst starts this long before a boundary...
const LEAD_MS: u64 = 50;
/// ...and only if at least this much time is left when it would start;
/// otherwise the demo waits for the next boundary.
const MIN_LEAD_MS: u64 = 30;
/// The second burst starts this long after the boundary.
const AFTER_MS: u64 = 5;
/// "Right after the boundary": the latest a request of the second burst
/// may land. Up to 100 ms in, a 2 s window still weighs the previous
/// window's 10 requests as round(10 x 1,900 / 2,000) = 10.
const LATE_MS: u64 = WINDOW_MS / 20;
/// The time the boundary attack may take, attempts included.
const ATTACK_BUDGET: Duration = Duration::from_secs(10);
/// Bursts 1 and 2 run only with at least this much left in the window, so
/// no boundary falls inside them.
const ROOM_MS: u64 = 500;

const FIXED: Algorithm = Algorithm::FixedWindow;
const SLIDING: Algorithm = Algorithm::SlidingWindow;

/// The names of the in-process server's policies: the same limit and
/// window, the two algorithms.
const NAMED: [(&str, Algorithm); 2] = [("demo_fixed", FIXED), ("demo_sliding", SLIDING)];

/// The in-process server's configuration, written from the constants.
fn demo_config() -> String {
    NAMED
        .iter()
        .map(|(name, algorithm)| {
            format!(
                "[policies.{name}]\nalgorithm = \"{algorithm}\"\nlimit = {LIMIT}\nwindow = \"{WINDOW_MS}ms\"\n"
            )
        })
        .collect()
}

/// `quotad demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// A running quotad to use, with inline policies; without it, the demo
    /// starts its own on 127.0.0.1
    #[arg(long, value_name = "ADDR", conflicts_with = "grpc_addr")]
    addr: Option<String>,
    /// Where the demo's own quotad listens (its admin port takes any free
    /// loopback port)
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:0")]
    grpc_addr: std::net::SocketAddr,
    /// Longest wait for each answer, connecting included
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// Runs the demo against `--addr`, or against a quotad of its own.
///
/// # Errors
///
/// [`Failure`] when quotad cannot be reached or refuses the requests, or
/// when no boundary could be hit on time within [`ATTACK_BUDGET`].
pub(crate) async fn demo(args: DemoArgs, mut out: impl Write) -> Result<(), Failure> {
    writeln!(
        out,
        "quotad demo: {FIXED} vs {SLIDING}, each {LIMIT} requests per {}, on the real clock",
        human(WINDOW_MS)
    )?;
    match args.addr {
        Some(addr) => {
            let uri = endpoint(&addr, false)?;
            let client = client(&uri, args.timeout, None, None)?;
            writeln!(out, "server: quotad at {uri}, with inline policies")?;
            play(&client, &uri, &Policies::inline(), &mut out).await
        }
        None => {
            let server = InProcess::start(args.grpc_addr).await?;
            let uri = format!("http://{}", server.addr);
            writeln!(
                out,
                "server: quotad started in this process on {uri} (policies {} and {})",
                NAMED[0].0, NAMED[1].0
            )?;
            let played = match client(&uri, args.timeout, None, None) {
                Ok(client) => play(&client, &uri, &Policies::named(), &mut out).await,
                Err(failure) => Err(failure),
            };
            let stopped = server.stop().await;
            played.and(stopped)
        }
    }
}

/// The two policies compared.
#[derive(Debug)]
struct Policies {
    fixed: PolicyRef,
    sliding: PolicyRef,
}

impl Policies {
    fn named() -> Self {
        Self {
            fixed: PolicyRef::Named(NAMED[0].0.to_owned()),
            sliding: PolicyRef::Named(NAMED[1].0.to_owned()),
        }
    }

    fn inline() -> Self {
        let policy = |algorithm| {
            Policy::try_new(algorithm, LIMIT, Duration::from_millis(WINDOW_MS), None)
                .expect("the demo's constant policies are valid")
        };
        Self {
            fixed: PolicyRef::Inline(policy(FIXED)),
            sliding: PolicyRef::Inline(policy(SLIDING)),
        }
    }

    /// One request: the same key under both policies, in one batch.
    fn pair(&self, key: &str) -> [Check; 2] {
        let check = |policy: &PolicyRef| match policy {
            PolicyRef::Named(name) => Check::named(name.clone(), key),
            PolicyRef::Inline(policy) => Check::inline(*policy, key),
        };
        [check(&self.fixed), check(&self.sliding)]
    }
}

/// The three bursts.
async fn play(
    client: &Client,
    uri: &str,
    policies: &Policies,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let run = format!("demo-{}-{}", now_ms(), std::process::id());
    writeln!(out, "keys: {run}-* (new for every run)")?;
    let burst = Burst {
        client,
        uri,
        policies,
    };

    make_room().await;
    let normal = LIMIT / 2;
    writeln!(
        out,
        "\n1. a normal burst: {normal} requests, under the limit"
    )?;
    let tally = burst
        .fire(&format!("{run}-normal"), 1..=normal, None, out)
        .await?;
    writeln!(out, "   => {}", tally.summary())?;

    let over = LIMIT + LIMIT / 2;
    writeln!(out, "\n2. an over-limit burst: {over} requests")?;
    let tally = burst
        .fire(&format!("{run}-over"), 1..=over, None, out)
        .await?;
    writeln!(out, "   => {}", tally.summary())?;

    writeln!(
        out,
        "\n3. the boundary attack: {LIMIT} requests just before a window boundary, {LIMIT} right after it"
    )?;
    let (before, after) = attack(&burst, &run, out).await?;
    let fixed = before.fixed + after.fixed;
    let sliding = before.sliding + after.sliding;
    let sent = before.sent + after.sent;
    writeln!(out)?;
    writeln!(
        out,
        "result: {FIXED} admitted {fixed} of {sent} across the boundary: {} x the limit of {LIMIT}",
        times(fixed)
    )?;
    writeln!(
        out,
        "result: {SLIDING} admitted {sliding} of {sent} across the boundary: {} x the limit of {LIMIT}",
        times(sliding)
    )?;
    writeln!(
        out,
        "The fixed window counts from zero again at the boundary. The sliding window estimates\n\
         previous count x (share of the previous window still inside the last {window}) + current count,\n\
         so right after the boundary it still counts all {LIMIT} and admits more only as they slide out.",
        window = human(WINDOW_MS)
    )?;
    Ok(())
}

/// Sends requests and prints each pair of decisions as it arrives.
struct Burst<'a> {
    client: &'a Client,
    uri: &'a str,
    policies: &'a Policies,
}

/// What one burst admitted, with every decision for the timing checks.
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    fixed: u64,
    sliding: u64,
    decisions: Vec<(Decision, Decision)>,
}

impl Tally {
    fn summary(&self) -> String {
        format!(
            "{FIXED} admitted {} of {}, {SLIDING} admitted {} of {}",
            self.fixed, self.sent, self.sliding, self.sent
        )
    }
}

impl Burst<'_> {
    /// Requests numbered `numbers` for `key`, one after another; with a
    /// `boundary`, each line shows the local time relative to it.
    async fn fire(
        &self,
        key: &str,
        numbers: RangeInclusive<u64>,
        boundary: Option<u64>,
        out: &mut impl Write,
    ) -> Result<Tally, Failure> {
        let mut tally = Tally::default();
        let checks = self.policies.pair(key);
        for n in numbers {
            let sent_at = now_ms();
            let decisions = self
                .client
                .check_batch(&checks, BatchMode::Independent)
                .await
                .map_err(|error| failure(self.uri, error))?;
            let [fixed, sliding] = decisions[..] else {
                return Err(Failure::Failed(format!(
                    "quotad at {} answered {} decisions for a batch of 2",
                    self.uri,
                    decisions.len()
                )));
            };
            let when = boundary.map_or_else(String::new, |b| {
                let offset = i128::from(sent_at) - i128::from(b);
                format!("{:>7}  ", format!("t{offset:+}ms"))
            });
            writeln!(
                out,
                "   {when}#{n:<3} {FIXED}: {:<28} {SLIDING}: {}",
                outcome(&fixed),
                outcome(&sliding)
            )?;
            tally.sent += 1;
            tally.fixed += u64::from(fixed.allowed);
            tally.sliding += u64::from(sliding.allowed);
            tally.decisions.push((fixed, sliding));
        }
        Ok(tally)
    }
}

fn outcome(d: &Decision) -> String {
    if d.allowed {
        format!("allowed, {} left", d.remaining)
    } else if d.retry_after_ms > 0 {
        format!("DENIED, retry in {}", human(d.retry_after_ms))
    } else {
        format!("DENIED ({})", d.reason)
    }
}

/// Fires the two bursts around a boundary until both land where they
/// should (see the module docs), within [`ATTACK_BUDGET`].
async fn attack(
    burst: &Burst<'_>,
    run: &str,
    out: &mut impl Write,
) -> Result<(Tally, Tally), Failure> {
    let give_up = Instant::now() + ATTACK_BUDGET;
    for attempt in 1.. {
        let boundary = next_boundary(now_ms() + LEAD_MS);
        let wait = Duration::from_millis(boundary.saturating_sub(now_ms()) + LATE_MS);
        if Instant::now() + wait > give_up {
            break;
        }
        sleep_until(boundary - LEAD_MS).await;
        let left = boundary.saturating_sub(now_ms());
        if left < MIN_LEAD_MS {
            writeln!(
                out,
                "   (woke up only {left} ms before the boundary; waiting for the next one)"
            )?;
            continue;
        }
        writeln!(
            out,
            "   waiting for the boundary at {} ...",
            humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(boundary))
        )?;
        let key = format!("{run}-boundary-{attempt}");
        let before = burst.fire(&key, 1..=LIMIT, Some(boundary), out).await?;
        sleep_until(boundary + AFTER_MS).await;
        writeln!(out, "   -- window boundary --")?;
        let after = burst
            .fire(&key, LIMIT + 1..=2 * LIMIT, Some(boundary), out)
            .await?;
        let finished = now_ms().saturating_sub(boundary);
        match mistimed(&before, &after, finished) {
            None => return Ok((before, after)),
            Some(problem) => writeln!(
                out,
                "   ({problem}; trying again at the next boundary with a fresh key)"
            )?,
        }
    }
    Err(Failure::Failed(format!(
        "could not fire the bursts around a window boundary on time within {} (is the machine very busy?)",
        human(u64::try_from(ATTACK_BUDGET.as_millis()).unwrap_or(u64::MAX))
    )))
}

/// Why an attempt does not show the boundary attack, judged by quotad's
/// clock: a fixed window's `reset_after_ms` is the time left in the window
/// the request landed in. `finished` (local ms after the boundary when the
/// second burst was done) rules out a second burst in a later window.
fn mistimed(before: &Tally, after: &Tally, finished: u64) -> Option<String> {
    if finished > WINDOW_MS / 2 {
        return Some(format!(
            "the second burst took until {finished} ms after the boundary"
        ));
    }
    if let Some((fixed, _)) = before
        .decisions
        .iter()
        .find(|(fixed, _)| fixed.reset_after_ms > WINDOW_MS / 2)
    {
        return Some(format!(
            "the first burst ran past the boundary ({} ms into the next window)",
            WINDOW_MS - fixed.reset_after_ms
        ));
    }
    after
        .decisions
        .iter()
        .map(|(fixed, _)| WINDOW_MS.saturating_sub(fixed.reset_after_ms))
        .find(|&elapsed| elapsed > LATE_MS)
        .map(|elapsed| {
            format!(
                "the second burst landed {elapsed} ms into its window, not right after the boundary"
            )
        })
}

/// `count / LIMIT` with one decimal.
fn times(count: u64) -> String {
    let tenths = (count * 10 + LIMIT / 2) / LIMIT;
    format!("{}.{}", tenths / 10, tenths % 10)
}

/// Waits for the next window when the current one is nearly over, so that
/// a short burst stays inside one window.
async fn make_room() {
    let now = now_ms();
    let boundary = next_boundary(now);
    if boundary - now < ROOM_MS {
        sleep_until(boundary + AFTER_MS).await;
    }
}

/// The first epoch-aligned window boundary after `ms`.
fn next_boundary(ms: u64) -> u64 {
    (ms / WINDOW_MS + 1) * WINDOW_MS
}

/// Milliseconds since the Unix epoch, the clock quotad's windows align to.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

async fn sleep_until(ms: u64) {
    let now = now_ms();
    if ms > now {
        tokio::time::sleep(Duration::from_millis(ms - now)).await;
    }
}

/// A quotad serving the demo's policies on loopback, in this process.
struct InProcess {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    join: JoinHandle<Result<(), quotad::Error>>,
}

impl InProcess {
    async fn start(grpc_addr: std::net::SocketAddr) -> Result<Self, Failure> {
        let config = Config::from_toml(&demo_config())
            .map_err(|e| Failure::Failed(format!("the demo's config is invalid: {e}")))?;
        let bind = |addr: std::net::SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|e| Failure::Failed(format!("cannot bind {addr}: {e}")))
        };
        let grpc = bind(grpc_addr).await?;
        let addr = grpc
            .local_addr()
            .map_err(|e| Failure::Failed(format!("cannot read the bound address: {e}")))?;
        let listeners = Listeners {
            grpc: grpc.into(),
            admin: bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0))).await?,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let join = tokio::spawn(quotad::run(config, listeners, async {
            let _ = stopped.await;
        }));
        Ok(Self { addr, stop, join })
    }

    async fn stop(self) -> Result<(), Failure> {
        let _ = self.stop.send(());
        match tokio::time::timeout(Duration::from_secs(5), self.join).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(error))) => Err(Failure::Failed(format!(
                "the demo's quotad failed: {error}"
            ))),
            Ok(Err(error)) => Err(Failure::Failed(format!(
                "the demo's quotad failed: {error}"
            ))),
            Err(_) => Err(Failure::Failed(
                "the demo's quotad did not stop within 5s".to_owned(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(reset_after_ms: u64) -> (Decision, Decision) {
        let d = Decision {
            allowed: true,
            limit: LIMIT,
            remaining: 0,
            retry_after_ms: 0,
            reset_after_ms,
            reason: quotad_client::Reason::WithinLimit,
        };
        (d, d)
    }

    fn tally(resets: &[u64]) -> Tally {
        Tally {
            decisions: resets.iter().map(|&r| fixed(r)).collect(),
            ..Tally::default()
        }
    }

    #[test]
    fn boundaries_are_aligned_to_the_epoch() {
        assert_eq!(next_boundary(0), WINDOW_MS);
        assert_eq!(next_boundary(1_767_268_830_001), 1_767_268_832_000);
        assert_eq!(next_boundary(1_767_268_832_000), 1_767_268_834_000);
    }

    #[test]
    fn an_attempt_on_time_is_accepted() {
        assert_eq!(
            mistimed(&tally(&[45, 41]), &tally(&[1_994, 1_990]), 12),
            None
        );
    }

    #[test]
    fn a_first_burst_running_past_the_boundary_is_rejected() {
        let problem = mistimed(&tally(&[3, 1_998]), &tally(&[1_990]), 12).expect("mistimed");
        assert!(problem.contains("ran past the boundary (2 ms"), "{problem}");
    }

    #[test]
    fn a_second_burst_landing_late_is_rejected() {
        let problem = mistimed(&tally(&[40]), &tally(&[1_990, 1_850]), 160).expect("mistimed");
        assert!(
            problem.contains("landed 150 ms into its window"),
            "{problem}"
        );
    }

    #[test]
    fn a_second_burst_that_may_have_reached_a_later_window_is_rejected() {
        // On time within its window, but finished too late to be sure that
        // window is the one right after the boundary.
        let problem = mistimed(&tally(&[40]), &tally(&[1_990]), 2_050).expect("mistimed");
        assert!(problem.contains("took until 2050 ms"), "{problem}");
    }

    #[test]
    fn ratios_have_one_decimal() {
        assert_eq!(times(20), "2.0");
        assert_eq!(times(10), "1.0");
        assert_eq!(times(11), "1.1");
    }
}
