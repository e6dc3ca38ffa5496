//! Snapshots of the memory store on disk: written on shutdown (after the
//! listeners have drained) and every `store.snapshot.interval`, loaded on
//! start before the server reports ready.
//!
//! quotad-core owns the format (versioned, checksummed, written shard by
//! shard without stopping the world); this module owns the file: written
//! to a temporary file in the same folder, synced, renamed over the old
//! one and the folder synced, so a crash leaves the old snapshot or the
//! new one, never half of one. The header names the policies in force, so
//! a load can tell which entries belong to a policy that was removed or
//! whose parameters changed; those entries are loaded as they are and
//! reconciled on their key's next request, exactly as after a hot reload
//! (see the `policy` module docs), and counted.
//!
//! The header also keeps the runtime overrides (`quotad override set`),
//! one a line as `@override <json>`, so that they survive a restart as the
//! counts do. A quotad from before overrides reads such a line as a policy
//! line it cannot parse and skips it; a snapshot from before overrides has
//! none: both load.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quotad_core::{
    Algorithm, Calendar, Clock, Exported, MemoryStore, Policy, SnapshotError, SnapshotReader,
    StoreConfig,
};
use tokio_util::sync::CancellationToken;

use crate::config::{OnBadSnapshot, PolicySettings, SnapshotSettings};
use crate::log::Causes;
use crate::metrics::Metrics;
use crate::registry::PolicyRegistry;
use crate::registry::overrides::{self, Override};

/// What starts a header line holding a runtime override.
const OVERRIDE_LINE: &str = "@override ";

/// A snapshot that could not be loaded, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("snapshot {}", path.display())]
pub struct LoadError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    #[source]
    pub source: SnapshotError,
}

/// A snapshot that could not be written, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("snapshot {} not written", path.display())]
pub struct WriteError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// Temporary snapshot files start with this and the snapshot's own file
/// name, so the ones a crash leaves behind can be found and removed, and
/// only those: another quotad writing a snapshot of another name into the
/// same folder keeps its file in progress.
const TEMPORARY_PREFIX: &str = ".quotad-snapshot-";

/// The start of the names of `path`'s temporary files.
fn temporary_prefix(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    format!("{TEMPORARY_PREFIX}{name}.")
}

/// The random characters that end a temporary file's name.
const TEMPORARY_RANDOM: usize = 8;

/// Whether `file_name` is one of `path`'s temporary files: its prefix, then
/// exactly [`TEMPORARY_RANDOM`] random characters (so not a file of a
/// snapshot whose name starts with this one's, `state` and `state.2`).
fn is_temporary_of(path: &Path, file_name: &str) -> bool {
    file_name
        .strip_prefix(&temporary_prefix(path))
        .is_some_and(|rest| {
            rest.len() == TEMPORARY_RANDOM && rest.bytes().all(|b| b.is_ascii_alphanumeric())
        })
}

/// The folder of the snapshot at `path`.
fn folder_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Removes the temporary files a crash during a write left next to `path`.
pub(crate) fn remove_leftovers(path: &Path) {
    let Ok(entries) = std::fs::read_dir(folder_of(path)) else {
        return;
    };
    for entry in entries.flatten() {
        if is_temporary_of(path, &entry.file_name().to_string_lossy()) {
            let leftover = entry.path();
            match std::fs::remove_file(&leftover) {
                Ok(()) => {
                    tracing::info!(path = %leftover.display(), "removed a snapshot a crash left half-written");
                }
                Err(error) => {
                    tracing::warn!(path = %leftover.display(), %error, "cannot remove a half-written snapshot");
                }
            }
        }
    }
}

/// The snapshot header: the named policies in force, one a line, as
/// `name algorithm limit window_ms burst`, and a calendar quota's
/// calendar (`day@America/New_York`). Namespaces that are not named
/// policies (inline, Envoy rules) carry their parameters in their name.
pub(crate) fn header(policies: &BTreeMap<String, PolicySettings>) -> Vec<u8> {
    let mut text = String::new();
    for (name, settings) in policies {
        let p = settings.policy;
        text.push_str(&format!(
            "{name} {} {} {} {}",
            p.algorithm(),
            p.limit(),
            p.window_ms(),
            p.burst()
        ));
        if let Some(calendar) = p.calendar_period() {
            text.push(' ');
            text.push_str(&calendar.spec());
        }
        text.push('\n');
    }
    text.into_bytes()
}

/// [`header`], and the runtime overrides after the policies.
pub(crate) fn header_with(
    policies: &BTreeMap<String, PolicySettings>,
    runtime: &[Arc<Override>],
) -> Vec<u8> {
    let mut bytes = header(policies);
    for entry in runtime {
        bytes.extend_from_slice(OVERRIDE_LINE.as_bytes());
        bytes.extend_from_slice(overrides::store_value(entry).as_bytes());
        bytes.push(b'\n');
    }
    bytes
}

/// The runtime overrides a header keeps; a line this version cannot read
/// is logged and skipped.
fn read_overrides(bytes: &[u8]) -> Vec<Arc<Override>> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|line| line.strip_prefix(OVERRIDE_LINE))
        .filter_map(|json| overrides::from_store("snapshot", json))
        .map(Arc::new)
        .collect()
}

/// The policies a header names; lines it cannot read are left out (they
/// can only make entries count as under a removed policy).
fn read_header(bytes: &[u8]) -> BTreeMap<String, Policy> {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split(' ');
            let name = parts.next()?;
            let algorithm: Algorithm = parts.next()?.parse().ok()?;
            let mut number = || parts.next()?.parse::<u64>().ok();
            let (limit, window_ms, burst) = (number()?, number()?, number()?);
            let burst = algorithm.is_bucket().then_some(burst);
            let policy = match parts.next() {
                Some(spec) => {
                    Policy::calendar(algorithm, limit, Calendar::from_spec(spec).ok()?).ok()?
                }
                None => Policy::try_new(algorithm, limit, Duration::from_millis(window_ms), burst)
                    .ok()?,
            };
            Some((name.to_owned(), policy))
        })
        .collect()
}

/// Loads the store from `settings.path`, or makes an empty one when there
/// is no file yet or, with `on_bad_file = "start_empty"`, when the file
/// cannot be read (logged and counted).
///
/// # Errors
///
/// [`LoadError`] for a bad file with `on_bad_file = "refuse"`.
pub(crate) fn load(
    settings: &SnapshotSettings,
    config: StoreConfig,
    clock: Arc<dyn Clock>,
    registry: &PolicyRegistry,
    metrics: &Metrics,
) -> Result<MemoryStore, LoadError> {
    let policies = &registry.snapshot().policies();
    let path = &settings.path;
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(path = %path.display(), "no snapshot yet: starting empty");
            return Ok(MemoryStore::new(config, clock));
        }
        Err(e) => return bad_file(settings, config, clock, metrics, SnapshotError::Io(e)),
    };
    let started = Instant::now();
    let loaded = SnapshotReader::open(BufReader::with_capacity(1 << 20, file)).and_then(|reader| {
        let written = read_header(reader.header());
        let kept = read_overrides(reader.header());
        reader
            .load(config, Arc::clone(&clock), |_| true)
            .map(|(store, report)| (store, report, written, kept))
    });
    let (store, report, written, kept) = match loaded {
        Ok(loaded) => loaded,
        Err(error) => return bad_file(settings, config, clock, metrics, error),
    };
    if !kept.is_empty() {
        tracing::info!(
            overrides = kept.len(),
            "runtime overrides loaded from the snapshot"
        );
    }
    registry.set_runtime_overrides(kept);
    let now = clock.now_ms();
    if report.taken_at_ms > now {
        tracing::warn!(
            path = %path.display(),
            ahead_ms = report.taken_at_ms - now,
            "the snapshot was taken later than this clock says it is now (clock skew \
             between hosts, or a clock stepped back): its keys wait for the clock to \
             catch up before they refill"
        );
    }
    let mut removed = 0;
    let mut changed = 0;
    for (namespace, counts) in &report.namespaces {
        let (Some(then), now) = (written.get(namespace), policies.get(namespace)) else {
            continue;
        };
        match now {
            None => removed += counts.loaded,
            Some(now) if now.policy != *then => changed += counts.loaded,
            Some(_) => {}
        }
    }
    let total = report.total();
    metrics.snapshot_loaded(&[
        ("loaded", total.loaded),
        ("expired", total.expired),
        ("over_capacity", total.over_capacity),
        ("policy_removed", removed),
        ("policy_changed", changed),
    ]);
    tracing::info!(
        path = %path.display(),
        taken_at_ms = report.taken_at_ms,
        loaded = total.loaded,
        expired = total.expired,
        over_capacity = total.over_capacity,
        policy_removed = removed,
        policy_changed = changed,
        elapsed_ms = started.elapsed().as_millis(),
        "snapshot loaded"
    );
    Ok(store)
}

fn bad_file(
    settings: &SnapshotSettings,
    config: StoreConfig,
    clock: Arc<dyn Clock>,
    metrics: &Metrics,
    source: SnapshotError,
) -> Result<MemoryStore, LoadError> {
    let error = LoadError {
        path: settings.path.clone(),
        source,
    };
    match settings.on_bad_file {
        OnBadSnapshot::Refuse => Err(error),
        OnBadSnapshot::StartEmpty => {
            metrics.snapshot_load_failed();
            // Kept aside, not overwritten by the next snapshot: the error
            // may have been passing (a read error), or the file of a newer
            // version that a downgrade cannot read.
            let kept = keep_aside(&settings.path);
            tracing::error!(
                error = %Causes(&error),
                kept_as = %kept.as_ref().map_or_else(|e| format!("(not kept: {e})"), |p| p.display().to_string()),
                "SNAPSHOT NOT LOADED: starting with an empty store, every key starts fresh \
                 (store.snapshot.on_bad_file = \"start_empty\")"
            );
            Ok(MemoryStore::new(config, clock))
        }
    }
}

/// Bad snapshots kept beside the snapshot at most; past them, a bad file
/// is left in place, for the next snapshot to replace.
const MAX_KEPT_BAD: u32 = 16;

/// Moves the bad snapshot at `path` aside, to the first free name of
/// `<path>.bad`, `<path>.bad.2`, ... (a hard link, which never replaces a
/// file, then the removal of `path`): an earlier bad file, perhaps the
/// only copy of counts a downgrade could not read, is never overwritten.
fn keep_aside(path: &Path) -> std::io::Result<PathBuf> {
    for n in 1..=MAX_KEPT_BAD {
        let mut aside = path.as_os_str().to_owned();
        aside.push(if n == 1 {
            ".bad".to_owned()
        } else {
            format!(".bad.{n}")
        });
        let aside = PathBuf::from(aside);
        match std::fs::hard_link(path, &aside) {
            Ok(()) => {
                std::fs::remove_file(path)?;
                return Ok(aside);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!(
        "{MAX_KEPT_BAD} bad snapshots are kept beside it already"
    )))
}

/// Writes the store to `path` atomically: a temporary file in the same
/// folder, synced, renamed over `path`, and the folder synced.
///
/// # Errors
///
/// The I/O error of the step that failed; `path` is then untouched.
pub(crate) fn write(store: &MemoryStore, path: &Path, header: &[u8]) -> std::io::Result<Exported> {
    let folder = folder_of(path);
    let mut temp = tempfile::Builder::new()
        .prefix(&temporary_prefix(path))
        .rand_bytes(TEMPORARY_RANDOM)
        .tempfile_in(folder)?;
    let exported = {
        let mut out = BufWriter::with_capacity(1 << 20, temp.as_file_mut());
        let exported = store.export(&mut out, header).map_err(|e| match e {
            SnapshotError::Io(io) => io,
            other => std::io::Error::other(other),
        })?;
        out.flush()?;
        exported
    };
    temp.as_file().sync_all()?;
    temp.persist(path).map_err(|e| e.error)?;
    File::open(folder)?.sync_all()?;
    Ok(exported)
}

/// When a snapshot is written: the writes at start and shutdown are
/// logged at `info`, the periodic ones at `debug`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum When {
    Start,
    Periodic,
    Shutdown,
}

/// Writes a snapshot now, off the async threads, with the policies in
/// force in its header, recording it in the metrics and the log.
///
/// # Errors
///
/// [`WriteError`] when it could not be written; the old snapshot stays.
pub(crate) async fn write_now(
    store: &Arc<MemoryStore>,
    path: &Path,
    registry: &PolicyRegistry,
    metrics: &Metrics,
    when: When,
) -> Result<(), WriteError> {
    let bytes = header_with(
        &registry.snapshot().policies(),
        &registry.runtime_overrides(),
    );
    let (store, target) = (Arc::clone(store), path.to_owned());
    let started = Instant::now();
    let written = tokio::task::spawn_blocking(move || write(&store, &target, &bytes)).await;
    let elapsed = started.elapsed();
    match written {
        Ok(Ok(exported)) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            metrics.snapshot_written(elapsed, exported.bytes, now);
            let (entries, bytes, elapsed_ms) =
                (exported.entries, exported.bytes, elapsed.as_millis());
            let path = path.display();
            if when == When::Periodic {
                tracing::debug!(%path, entries, bytes, elapsed_ms, "snapshot written");
            } else {
                tracing::info!(%path, entries, bytes, elapsed_ms, ?when, "snapshot written");
            }
            Ok(())
        }
        Ok(Err(source)) => {
            metrics.snapshot_failed();
            tracing::error!(path = %path.display(), error = %Causes(&source), "snapshot not written; the previous one stays");
            Err(WriteError {
                path: path.to_owned(),
                source,
            })
        }
        Err(error) => {
            metrics.snapshot_failed();
            tracing::error!(path = %path.display(), %error, "snapshot task failed");
            Err(WriteError {
                path: path.to_owned(),
                source: std::io::Error::other(error.to_string()),
            })
        }
    }
}

/// Writes a snapshot every `interval` until `stop`.
pub(crate) async fn periodic(
    store: Arc<MemoryStore>,
    path: PathBuf,
    interval: Duration,
    registry: Arc<PolicyRegistry>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {
                // A failure is logged and counted; the next tick tries again.
                let _ = write_now(&store, &path, &registry, &metrics, When::Periodic).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use quotad_core::OnFull;

    use super::*;
    use crate::config::Config;

    #[test]
    fn the_header_names_each_policy_with_its_counting_parameters() {
        let config = Config::from_toml(
            "[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n\
             [policies.api]\nalgorithm = \"token_bucket\"\nlimit = 10\nwindow = \"1s\"\nburst = 20\n",
        )
        .expect("valid");
        let header = header(config.policies());
        let read = read_header(&header);
        assert_eq!(read.len(), 2);
        assert_eq!(read["login"], config.policies()["login"].policy);
        assert_eq!(read["api"], config.policies()["api"].policy);
        assert!(read_header(b"x nonsense 1 2 3\n\xff\n").is_empty());
    }

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("quotad.snapshot");
        let clock = Arc::new(quotad_core::FakeClock::new(1_767_268_800_000));
        let config = StoreConfig::try_new(1_000, 4, OnFull::Deny).expect("valid");
        let store = MemoryStore::new(config, clock.clone());
        let policy = Policy::try_new(Algorithm::FixedWindow, 5, Duration::from_secs(60), None)
            .expect("valid");
        let item = quotad_core::CheckItem::new("login", policy, "alice", 2).expect("valid");
        assert!(store.check_one(&item).allowed);
        std::fs::write(&path, b"an older snapshot").expect("write");
        let exported = write(&store, &path, b"").expect("written");
        assert_eq!(exported.entries, 1);
        let files: Vec<_> = std::fs::read_dir(dir.path()).expect("list").collect();
        assert_eq!(files.len(), 1, "only the snapshot itself");
        let reader =
            SnapshotReader::open(File::open(&path).expect("open")).expect("a valid snapshot");
        let (loaded, _) = reader.load(config, clock, |_| true).expect("loads");
        assert_eq!(loaded.peek(&item).remaining, 3);
    }
}
