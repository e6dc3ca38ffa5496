//! Snapshots of the memory store: a versioned, checksummed binary stream
//! written shard by shard ([`MemoryStore::export`]) and loaded into a new
//! store ([`SnapshotReader`]).
//!
//! # Format (version 7)
//!
//! All fixed-width integers are little-endian.
//!
//! ```text
//! magic    8 bytes    "QUOTADSN"
//! version  u32        7
//! frames   each: len u32 (> 0), crc u32 (CRC-32 of the payload), payload
//!          the first: taken_at_ms u64, then the caller's header bytes
//!          then: entries, whole records, each frame's namespaces its own
//! end      u32        0
//! count    u64        entries in the frames
//! crc      u32        CRC-32 of every byte from the magic through count
//! ```
//!
//! An entry record is a sequence of postcard values (varints):
//! the namespace (0 then the policy name when first seen in its frame, or
//! `i + 1` for the frame's `i`-th), then the key, the milliseconds from
//! `taken_at_ms` until the entry is fresh, and the state, whose instants
//! are counted back from that moment (zigzag, so any value round-trips),
//! with the window it was counted over (or none, for a key that only
//! grants keep), then the key's grants: `(id, units, granted_at, ends_at)`,
//! instants counted back the same way, and the algorithm (its index in
//! `Algorithm::ALL`) and window they were charged under (a concurrency
//! key's slots are grants too, up to its limit of them, bound to window 0).
//! A calendar period's count is a state of its own (the last variant),
//! which carries the period's end as well as its start: the end is where
//! the period of the zone that began the count ends, which another zone
//! cannot work out (see `State::FixedWindow`).
//! Version 4 is this format without that variant: its calendar counts were
//! plain fixed windows bound to the calendar's zone (and so were the
//! leases charged under them); they load bound to their period kind, ending
//! where the old calendar's period ends, and one of a zone this build does
//! not know is dropped as expired. Version 2 had no grants and always a
//! state; it is still read. There are no versions 3, 5 and 6: the readable
//! versions (2, 4, 7) are each two flipped bits or more away from the
//! others, so no single damaged bit makes one readable version look
//! like another (the stream's checksum is checked only at its end). Version 1 had no window in fixed windows,
//! sliding windows and sliding logs; it is not read.
//! Frames hold about 64 KiB each, and never span two shards.
//!
//! The writer and the reader of one format
//! (frames, entries, states, version) change together, so they stand
//! together.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::sync::Arc;

use foldhash::HashMap;
use serde::{Deserialize, Serialize, Serializer};
use thiserror::Error;

use super::memory::{MemoryStore, StoreConfig};
use super::shard::{Room, Shard, extra_bytes_with, key_hash};
use crate::algorithm::{Log, State};
use crate::clock::Clock;
use crate::grant::{Grant, Ledger, MAX_GRANTS_PER_KEY};
use crate::policy::{Algorithm, CONCURRENCY_MAX_LIMIT, MAX_EXACT, SLIDING_LOG_MAX_LIMIT};

/// The first bytes of every snapshot.
const MAGIC: [u8; 8] = *b"QUOTADSN";

/// The snapshot format this build writes; it also reads
/// [`READ_VERSIONS`].
pub const SNAPSHOT_VERSION: u32 = 7;

/// The snapshot formats this build reads: version 2 (no grants), 4 (no
/// calendar periods' ends) and this one.
const READ_VERSIONS: [u32; 3] = [2, 4, SNAPSHOT_VERSION];

/// A frame is closed once its payload reaches this size.
const FRAME_BYTES: usize = 64 * 1024;

/// Why a snapshot could not be written or loaded. A load that fails hands
/// back no store.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// Reading or writing failed.
    #[error("snapshot i/o failed")]
    Io(#[from] io::Error),
    /// The input does not start with the snapshot magic bytes.
    #[error("not a quotad snapshot (wrong magic bytes)")]
    WrongMagic,
    /// The input is a snapshot of a format this build does not read.
    #[error(
        "snapshot format version {found} is not supported (this build reads versions 2, 4 and {supported})"
    )]
    UnsupportedVersion {
        /// The version found.
        found: u32,
        /// The version this build writes (it reads 2 and 4 too).
        supported: u32,
    },
    /// The input ends before the snapshot's trailer does.
    #[error("snapshot is truncated (it ends at byte {at}, before its trailer)")]
    Truncated {
        /// Bytes read before the input ended.
        at: u64,
    },
    /// A frame or the whole snapshot does not match its checksum.
    #[error("snapshot checksum mismatch (the {what} at byte {at})")]
    Checksum {
        /// `frame` or `snapshot`.
        what: &'static str,
        /// Where the checked bytes start.
        at: u64,
    },
    /// A frame passed its checksum but holds an entry that breaks a rule.
    #[error("snapshot entry {index} is invalid: {reason}")]
    InvalidEntry {
        /// The entry's position in the snapshot, from 0.
        index: u64,
        /// The rule broken.
        reason: String,
    },
    /// The trailer's entry count differs from the entries read.
    #[error("snapshot trailer counts {expected} entries, but {found} were read")]
    CountMismatch {
        /// The count in the trailer.
        expected: u64,
        /// The entries read.
        found: u64,
    },
    /// Bytes follow the trailer.
    #[error("snapshot has bytes after its trailer")]
    TrailingBytes,
}

/// What an export wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exported {
    /// Entries written: the keys that held live state.
    pub entries: u64,
    /// Bytes written, in all.
    pub bytes: u64,
}

/// What happened to the entries of one namespace (policy name) on load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamespaceCounts {
    /// Entries now held by the new store.
    pub loaded: u64,
    /// Entries already fresh at load time (`fresh_at <= now`): dropped, as a
    /// key without state is fresh.
    pub expired: u64,
    /// Entries the new store had no room for, by its key or byte budget:
    /// dropped, so those keys start fresh.
    pub over_capacity: u64,
    /// Entries under a namespace the caller did not keep: dropped.
    pub skipped: u64,
}

/// What a load did, by namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// When the snapshot was taken, in ms since the Unix epoch.
    pub taken_at_ms: u64,
    /// Counts for each namespace found, by name.
    pub namespaces: BTreeMap<String, NamespaceCounts>,
}

impl LoadReport {
    /// The counts of every namespace added up.
    pub fn total(&self) -> NamespaceCounts {
        self.namespaces
            .values()
            .fold(NamespaceCounts::default(), |t, c| NamespaceCounts {
                loaded: t.loaded + c.loaded,
                expired: t.expired + c.expired,
                over_capacity: t.over_capacity + c.over_capacity,
                skipped: t.skipped + c.skipped,
            })
    }
}

impl MemoryStore {
    /// Writes a snapshot of every key holding live state to `writer`, after
    /// the caller's `header` (opaque here, returned as is by
    /// [`SnapshotReader::header`]).
    ///
    /// Shards are visited one at a time: each is locked only while its
    /// entries are encoded into a buffer, and the buffer is written after
    /// the lock is released, so checks go on meanwhile, memory grows by
    /// about one shard's encoding, and every key is written exactly once
    /// (a key lives in one shard). Each key is written as its shard held it
    /// when visited; state already fresh is left out. The clock is read once.
    /// Wrap a file in a `BufWriter`; nothing is flushed but at the end.
    ///
    /// # Errors
    ///
    /// [`SnapshotError::Io`] when `writer` fails; what was written is then
    /// not a snapshot.
    pub fn export<W: Write>(&self, writer: W, header: &[u8]) -> Result<Exported, SnapshotError> {
        let now = self.now_ms();
        let mut out = Hashed::new(writer);
        out.write(&MAGIC)?;
        out.write(&SNAPSHOT_VERSION.to_le_bytes())?;
        let mut buf = Vec::with_capacity(FRAME_BYTES + 8 + header.len());
        let frame = Frame::open(&mut buf);
        frame.buf.extend_from_slice(&now.to_le_bytes());
        frame.buf.extend_from_slice(header);
        frame.close()?;
        out.write(&buf)?;

        let mut entries = 0;
        for shard in self.shards() {
            buf.clear();
            entries += encode_shard(&shard.lock(), now, &mut buf)?;
            out.write(&buf)?;
        }
        out.write(&0u32.to_le_bytes())?;
        out.write(&entries.to_le_bytes())?;
        let crc = out.crc.clone().finalize();
        out.write(&crc.to_le_bytes())?;
        out.inner.flush()?;
        Ok(Exported {
            entries,
            bytes: out.at,
        })
    }
}

/// Encodes every live entry of `shard` into frames appended to `buf`.
/// Returns how many.
fn encode_shard(shard: &Shard, now: u64, buf: &mut Vec<u8>) -> Result<u64, SnapshotError> {
    let mut entries = 0;
    let mut frame = Frame::open(buf);
    let mut names: HashMap<&str, u32> = HashMap::default();
    for (name, key, fresh_at, state, ledger) in shard.entries() {
        if fresh_at <= now || (state.is_none() && ledger.is_none()) {
            continue;
        }
        match names.get(name) {
            Some(&i) => frame.put(&(i + 1)),
            None => {
                let i = u32::try_from(names.len()).expect("a shard holds fewer than 2^32 keys");
                names.insert(name, i);
                frame.put(&0u32);
                frame.put(name);
            }
        }
        let grants = ledger.map_or(&[][..], Ledger::grants);
        frame.put(&RecordOut {
            key,
            fresh_in: fresh_at - now,
            state: state.map(|state| Stored::new(state, fresh_at)),
            grants: grants
                .iter()
                .map(|g| GrantStored {
                    id: g.id,
                    units: g.units,
                    granted_at: back(fresh_at, g.granted_at),
                    ends_at: back(fresh_at, g.ends_at),
                })
                .collect(),
            grants_under: ledger
                .and_then(Ledger::charged_under)
                .map(|(algorithm, window)| (algorithm as u8, window)),
        });
        entries += 1;
        if frame.len() >= FRAME_BYTES {
            frame.close()?;
            frame = Frame::open(buf);
            names.clear();
        }
    }
    if frame.len() > 0 {
        frame.close()?;
    } else {
        frame.discard();
    }
    Ok(entries)
}

/// A frame being encoded at the end of a buffer: its header is filled in
/// when it is closed.
struct Frame<'a> {
    buf: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Frame<'a> {
    fn open(buf: &'a mut Vec<u8>) -> Self {
        let start = buf.len();
        buf.extend_from_slice(&[0; 8]);
        Frame { buf, start }
    }

    fn len(&self) -> usize {
        self.buf.len() - self.start - 8
    }

    fn put<T: Serialize + ?Sized>(&mut self, value: &T) {
        let buf = std::mem::take(self.buf);
        *self.buf = postcard::to_extend(value, buf).expect("encoding into a Vec cannot fail");
    }

    fn close(self) -> Result<(), SnapshotError> {
        let payload = &self.buf[self.start + 8..];
        let len = u32::try_from(payload.len()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "a snapshot frame passed 4 GiB")
        })?;
        let crc = crc32fast::hash(payload);
        self.buf[self.start..self.start + 4].copy_from_slice(&len.to_le_bytes());
        self.buf[self.start + 4..self.start + 8].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    fn discard(self) {
        self.buf.truncate(self.start);
    }
}

/// A writer that checksums and counts what goes through.
struct Hashed<W> {
    inner: W,
    crc: crc32fast::Hasher,
    at: u64,
}

impl<W: Write> Hashed<W> {
    fn new(inner: W) -> Self {
        Hashed {
            inner,
            crc: crc32fast::Hasher::new(),
            at: 0,
        }
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_all(bytes)?;
        self.crc.update(bytes);
        self.at += bytes.len() as u64;
        Ok(())
    }
}

/// One entry as written.
#[derive(Serialize)]
struct RecordOut<'a> {
    key: &'a str,
    fresh_in: u64,
    state: Option<Stored<LogOut<'a>>>,
    grants: Vec<GrantStored>,
    grants_under: Option<(u8, u64)>,
}

/// One entry as read; the same layout as [`RecordOut`].
#[derive(Deserialize)]
struct RecordIn<'a> {
    key: &'a str,
    fresh_in: u64,
    state: Option<Stored<Vec<(i64, u64)>>>,
    grants: Vec<GrantStored>,
    grants_under: Option<(u8, u64)>,
}

/// One entry as version 2 wrote it: a state, no grants.
#[derive(Deserialize)]
struct RecordInV2<'a> {
    key: &'a str,
    fresh_in: u64,
    state: Stored<Vec<(i64, u64)>>,
}

impl<'a> From<RecordInV2<'a>> for RecordIn<'a> {
    fn from(r: RecordInV2<'a>) -> Self {
        RecordIn {
            key: r.key,
            fresh_in: r.fresh_in,
            state: Some(r.state),
            grants: Vec::new(),
            grants_under: None,
        }
    }
}

/// A grant as stored: instants counted back from the entry's `fresh_at`.
#[derive(Serialize, Deserialize)]
struct GrantStored {
    id: u64,
    units: u64,
    granted_at: i64,
    ends_at: i64,
}

/// The ledger of `grants` charged under `under`, if it keeps the rules a
/// live one keeps; `None` for one to drop: a version 4 calendar's
/// (`from_v4`) whose zone this build does not know.
fn ledger_of(
    grants: Vec<GrantStored>,
    under: Option<(u8, u64)>,
    fresh_at: u64,
    from_v4: bool,
) -> Result<Option<Ledger>, &'static str> {
    let (algorithm, window_ms) = match under {
        None if grants.is_empty() => return Ok(Some(Ledger::new())),
        None => return Err("grants without the algorithm and window they count under"),
        Some((code, window)) => {
            let algorithm = *Algorithm::ALL
                .get(usize::from(code))
                .ok_or("grants under an unknown algorithm")?;
            // Concurrency slots are bound to no window; leases to one.
            if algorithm == Algorithm::Concurrency {
                if window != 0 {
                    return Err("concurrency slots bound to a window");
                }
            } else {
                // A calendar policy's leases are bound to its calendar's
                // binding, as its state is.
                let calendar =
                    algorithm == Algorithm::FixedWindow && crate::calendar::is_binding(window);
                if !calendar && !(1..=MAX_EXACT).contains(&window) {
                    return Err("grants under a window of 0 ms or above 2^53");
                }
                // Version 4 bound them to the calendar's zone too; bound
                // to its period kind now, as its state is, so the units a
                // lease leaves unspent are refunded to that state.
                if calendar && from_v4 {
                    match crate::calendar::calendar_from_v4(window) {
                        Some(c) => return ledger_checked(grants, algorithm, c.binding(), fresh_at),
                        None => return Ok(None),
                    }
                }
            }
            (algorithm, window)
        }
    };
    ledger_checked(grants, algorithm, window_ms, fresh_at)
}

/// The ledger of `grants` under `algorithm` and `window_ms`, if its grants
/// keep the rules live ones keep.
fn ledger_checked(
    grants: Vec<GrantStored>,
    algorithm: Algorithm,
    window_ms: u64,
    fresh_at: u64,
) -> Result<Option<Ledger>, &'static str> {
    let most = if algorithm == Algorithm::Concurrency {
        usize::try_from(CONCURRENCY_MAX_LIMIT).expect("10,000 fits")
    } else {
        MAX_GRANTS_PER_KEY
    };
    if grants.len() > most {
        return Err("more grants than a key may hold");
    }
    let mut out = Vec::with_capacity(grants.len());
    for g in grants {
        let grant = Grant {
            id: g.id,
            units: g.units,
            granted_at: forth(fresh_at, g.granted_at),
            ends_at: forth(fresh_at, g.ends_at),
        };
        if grant.units == 0 || grant.units > MAX_EXACT {
            return Err("a grant of 0 units or above 2^53");
        }
        if grant.ends_at < grant.granted_at || grant.ends_at > fresh_at {
            return Err("a grant that ends before it starts, or after its entry is fresh");
        }
        if out.iter().any(|o: &Grant| o.id == grant.id) {
            return Err("a grant id held twice");
        }
        out.push(grant);
    }
    Ok(Some(Ledger::from_grants(out, algorithm, window_ms)))
}

/// `fresh_at - t` as a signed varint: small for the instants a state holds
/// (never after its `fresh_at`), and exact for any.
fn back(fresh_at: u64, t: u64) -> i64 {
    fresh_at.wrapping_sub(t) as i64
}

fn forth(fresh_at: u64, back: i64) -> u64 {
    fresh_at.wrapping_sub(back as u64)
}

/// A state as stored: instants counted back from the entry's `fresh_at`.
/// A log is written from the live one (`L` = [`LogOut`]) and read as
/// `(step, units)` pairs, the same sequence.
#[derive(Serialize, Deserialize)]
enum Stored<L> {
    FixedWindow {
        start: i64,
        count: u64,
        window_ms: u64,
    },
    SlidingWindow {
        start: i64,
        previous: u64,
        current: u64,
        window_ms: u64,
    },
    TokenBucket {
        tokens: u64,
        at: i64,
        window_ms: u64,
    },
    LeakyBucket {
        level: u64,
        at: i64,
        window_ms: u64,
    },
    SlidingLog {
        entries: L,
        window_ms: u64,
    },
    /// A calendar period's count (version 7): its window is the calendar's
    /// binding, and it carries the period's end. Last, so the variants
    /// before keep the indices versions 2 and 4 wrote.
    CalendarWindow {
        start: i64,
        end: i64,
        count: u64,
        window_ms: u64,
    },
}

/// A log as written: a sequence of `(instant, units)`, the first instant
/// counted back from `fresh_at` and each later one from the one before.
struct LogOut<'a> {
    log: &'a Log,
    fresh_at: u64,
}

impl Serialize for LogOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut previous = None;
        serializer.collect_seq(self.log.admissions().map(|(ms, units)| {
            let step = match previous {
                None => back(self.fresh_at, ms),
                Some(p) => ms.wrapping_sub(p) as i64,
            };
            previous = Some(ms);
            (step, units)
        }))
    }
}

impl<'a> Stored<LogOut<'a>> {
    fn new(state: &'a State, fresh_at: u64) -> Self {
        match *state {
            State::FixedWindow {
                start_ms,
                end_ms,
                count,
                window_ms,
            } if crate::calendar::is_binding(window_ms) => Stored::CalendarWindow {
                start: back(fresh_at, start_ms),
                end: back(fresh_at, end_ms),
                count,
                window_ms,
            },
            State::FixedWindow {
                start_ms,
                count,
                window_ms,
                ..
            } => Stored::FixedWindow {
                start: back(fresh_at, start_ms),
                count,
                window_ms,
            },
            State::SlidingWindow {
                start_ms,
                previous,
                current,
                window_ms,
            } => Stored::SlidingWindow {
                start: back(fresh_at, start_ms),
                previous,
                current,
                window_ms,
            },
            State::TokenBucket {
                tokens,
                at_ms,
                window_ms,
            } => Stored::TokenBucket {
                tokens,
                at: back(fresh_at, at_ms),
                window_ms,
            },
            State::LeakyBucket {
                level,
                at_ms,
                window_ms,
            } => Stored::LeakyBucket {
                level,
                at: back(fresh_at, at_ms),
                window_ms,
            },
            State::SlidingLog { ref log, window_ms } => Stored::SlidingLog {
                entries: LogOut { log, fresh_at },
                window_ms,
            },
        }
    }
}

impl Stored<Vec<(i64, u64)>> {
    /// The state, if it keeps the rules a live state keeps; `None` for a
    /// calendar count to drop (see the two calendar arms).
    fn into_state(self, fresh_at: u64) -> Result<Option<State>, &'static str> {
        let exact = |v: u64, what| if v <= MAX_EXACT { Ok(v) } else { Err(what) };
        let window = |w: u64| {
            if (1..=MAX_EXACT).contains(&w) {
                Ok(w)
            } else {
                Err("a window of 0 ms or above 2^53")
            }
        };
        Ok(Some(match self {
            Stored::FixedWindow {
                start,
                count,
                window_ms,
            } => {
                if count == 0 {
                    return Err("a fixed window counting nothing");
                }
                let start_ms = forth(fresh_at, start);
                // Version 4 wrote a calendar count here, bound to the
                // calendar's zone as well as its period, without the
                // period's end: it is bound to its period kind now, and
                // ends where the old calendar's period begun at its start
                // ends. One of a zone this build does not know, or whose
                // period would not end after its start, is dropped (counted
                // as expired): kept, it would be written as a period that
                // ends before it starts, which no load accepts.
                let (window_ms, end_ms) = if crate::calendar::is_binding(window_ms) {
                    let Some(calendar) = crate::calendar::calendar_from_v4(window_ms) else {
                        return Ok(None);
                    };
                    let end_ms = calendar.bounds(start_ms).1;
                    if end_ms <= start_ms || end_ms - start_ms > crate::calendar::LONGEST_PERIOD_MS
                    {
                        return Ok(None);
                    }
                    (calendar.binding(), end_ms)
                } else {
                    let w = window(window_ms)?;
                    (w, start_ms.saturating_add(w))
                };
                State::FixedWindow {
                    start_ms,
                    end_ms,
                    count: exact(count, "a count above 2^53")?,
                    window_ms,
                }
            }
            Stored::CalendarWindow {
                start,
                end,
                count,
                window_ms,
            } => {
                if count == 0 {
                    return Err("a calendar period counting nothing");
                }
                if !crate::calendar::is_binding(window_ms) {
                    return Err("a calendar period bound to no calendar");
                }
                let (start_ms, end_ms) = (forth(fresh_at, start), forth(fresh_at, end));
                // A period that ends before it starts or lasts over 368
                // days counts nothing this build can honour: that entry is
                // dropped (counted as expired), not the whole snapshot.
                if end_ms <= start_ms || end_ms - start_ms > crate::calendar::LONGEST_PERIOD_MS {
                    return Ok(None);
                }
                State::FixedWindow {
                    start_ms,
                    end_ms,
                    count: exact(count, "a count above 2^53")?,
                    window_ms,
                }
            }
            Stored::SlidingWindow {
                start,
                previous,
                current,
                window_ms,
            } => {
                if previous == 0 && current == 0 {
                    return Err("a sliding window counting nothing");
                }
                State::SlidingWindow {
                    start_ms: forth(fresh_at, start),
                    previous: exact(previous, "a count above 2^53")?,
                    current: exact(current, "a count above 2^53")?,
                    window_ms: window(window_ms)?,
                }
            }
            Stored::TokenBucket {
                tokens,
                at,
                window_ms,
            } => State::TokenBucket {
                tokens: exact(tokens, "tokens above 2^53")?,
                at_ms: forth(fresh_at, at),
                window_ms: window(window_ms)?,
            },
            Stored::LeakyBucket {
                level,
                at,
                window_ms,
            } => {
                if level == 0 {
                    return Err("a leaky bucket with a zero level");
                }
                State::LeakyBucket {
                    level: exact(level, "a level above 2^53")?,
                    at_ms: forth(fresh_at, at),
                    window_ms: window(window_ms)?,
                }
            }
            Stored::SlidingLog {
                entries: steps,
                window_ms,
            } => {
                let max = usize::try_from(SLIDING_LOG_MAX_LIMIT).unwrap_or(usize::MAX);
                if steps.is_empty() || steps.len() > max {
                    return Err("a sliding log of no entries or more than 10,000");
                }
                let (mut ms, mut total) = (0u64, 0u64);
                let mut admissions = Vec::with_capacity(steps.len());
                for (i, &(step, units)) in steps.iter().enumerate() {
                    if i == 0 {
                        ms = forth(fresh_at, step);
                    } else if step <= 0 {
                        return Err("a sliding log whose instants do not increase");
                    } else {
                        ms = ms
                            .checked_add(step as u64)
                            .ok_or("a sliding log past u64 ms")?;
                    }
                    total += units;
                    if units == 0 || total > SLIDING_LOG_MAX_LIMIT {
                        return Err("a sliding log entry of 0 units, or more than 10,000 in all");
                    }
                    admissions.push((ms, units));
                }
                State::SlidingLog {
                    log: Box::new(Log::from_admissions(admissions.into_iter())),
                    window_ms: window(window_ms)?,
                }
            }
        }))
    }
}

/// A reader that checksums and counts what comes through, and reports an
/// early end as [`SnapshotError::Truncated`].
struct Checked<R> {
    inner: R,
    crc: crc32fast::Hasher,
    at: u64,
}

impl<R: Read> Checked<R> {
    fn exact<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut bytes = [0; N];
        match self.inner.read_exact(&mut bytes) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(SnapshotError::Truncated { at: self.at });
            }
            Err(e) => return Err(e.into()),
        }
        self.crc.update(&bytes);
        self.at += N as u64;
        Ok(bytes)
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        self.exact().map(u32::from_le_bytes)
    }

    /// The next frame's payload into `buf`, checked against its checksum;
    /// `None` at the end marker.
    fn frame(&mut self, buf: &mut Vec<u8>) -> Result<Option<()>, SnapshotError> {
        let at = self.at;
        let len = self.u32()?;
        if len == 0 {
            return Ok(None);
        }
        let crc = self.u32()?;
        buf.clear();
        // Read as the bytes arrive: a corrupt length costs no allocation
        // beyond the input itself.
        let read = (&mut self.inner).take(u64::from(len)).read_to_end(buf)?;
        self.crc.update(buf);
        self.at += read as u64;
        if read < len as usize {
            return Err(SnapshotError::Truncated { at: self.at });
        }
        if crc32fast::hash(buf) != crc {
            return Err(SnapshotError::Checksum { what: "frame", at });
        }
        Ok(Some(()))
    }
}

/// A snapshot opened for loading: its magic, version and header are read
/// and checked; [`SnapshotReader::load`] reads the rest.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use quotad_core::{Algorithm, CheckItem, FakeClock, MemoryStore, OnFull, Policy, SnapshotReader, StoreConfig};
///
/// let clock = Arc::new(FakeClock::new(1_700_000_000_000));
/// let config = StoreConfig::try_new(1_000, 1, OnFull::Deny)?;
/// let store = MemoryStore::new(config, clock.clone());
/// let policy = Policy::try_new(Algorithm::FixedWindow, 10, Duration::from_secs(60), None)?;
/// store.check_one(&CheckItem::new("api", policy, "alice", 4)?);
///
/// let mut file = Vec::new();
/// store.export(&mut file, b"policies v1")?;
///
/// let snapshot = SnapshotReader::open(file.as_slice())?;
/// assert_eq!(snapshot.header(), b"policies v1");
/// let (restored, report) = snapshot.load(config, clock, |_| true)?;
/// assert_eq!(report.namespaces["api"].loaded, 1);
/// assert_eq!(restored.peek(&CheckItem::new("api", policy, "alice", 1)?).remaining, 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SnapshotReader<R> {
    input: Checked<R>,
    version: u32,
    taken_at_ms: u64,
    header: Vec<u8>,
}

impl<R> fmt::Debug for SnapshotReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotReader")
            .field("taken_at_ms", &self.taken_at_ms)
            .field("header_bytes", &self.header.len())
            .finish_non_exhaustive()
    }
}

impl<R: Read> SnapshotReader<R> {
    /// Reads and checks the magic bytes, the format version and the header
    /// frame. Wrap a file in a `BufReader`.
    ///
    /// # Errors
    ///
    /// [`SnapshotError::WrongMagic`], [`SnapshotError::UnsupportedVersion`],
    /// [`SnapshotError::Truncated`], [`SnapshotError::Checksum`] (the
    /// header frame), or [`SnapshotError::Io`].
    pub fn open(reader: R) -> Result<Self, SnapshotError> {
        let mut input = Checked {
            inner: reader,
            crc: crc32fast::Hasher::new(),
            at: 0,
        };
        if input.exact::<8>()? != MAGIC {
            return Err(SnapshotError::WrongMagic);
        }
        let version = input.u32()?;
        if !READ_VERSIONS.contains(&version) {
            return Err(SnapshotError::UnsupportedVersion {
                found: version,
                supported: SNAPSHOT_VERSION,
            });
        }
        let mut header = Vec::new();
        let at = input.at;
        // The writer's header frame always holds the 8-byte time; a missing
        // or shorter one (its length damaged) is reported as that damage.
        let Some(&taken_at) = input
            .frame(&mut header)?
            .and_then(|()| header.first_chunk::<8>())
        else {
            return Err(SnapshotError::Checksum { what: "frame", at });
        };
        let taken_at_ms = u64::from_le_bytes(taken_at);
        header.drain(..8);
        Ok(SnapshotReader {
            input,
            version,
            taken_at_ms,
            header,
        })
    }

    /// The header the snapshot was written with.
    pub fn header(&self) -> &[u8] {
        &self.header
    }

    /// When the snapshot was taken, in ms since the Unix epoch.
    pub fn taken_at_ms(&self) -> u64 {
        self.taken_at_ms
    }

    /// Builds a new store with `config` and `clock` from the snapshot's
    /// entries, and counts, by namespace (policy name), what was loaded and
    /// what was dropped.
    ///
    /// `keep` is asked once per namespace whether to load its entries (the
    /// server may drop state under removed policies). An entry that is
    /// fresh by the new clock (`fresh_at <= now`) is dropped as expired:
    /// time-based state is judged at the new instant. An entry that its
    /// shard in the new store has no room for, by keys or bytes, is dropped
    /// as over capacity: entries are loaded in snapshot order, and loading
    /// never evicts, whatever `on_full` says. State under a policy whose
    /// parameters changed is loaded as is; the algorithms judge it under the
    /// new policy as they do after a reload.
    ///
    /// Every frame's checksum, the whole stream's checksum and the entry
    /// count are verified before the store is handed back.
    ///
    /// # Errors
    ///
    /// [`SnapshotError::Truncated`], [`SnapshotError::Checksum`],
    /// [`SnapshotError::InvalidEntry`] (including a key found twice),
    /// [`SnapshotError::CountMismatch`], [`SnapshotError::TrailingBytes`],
    /// or [`SnapshotError::Io`]; no store is returned then.
    pub fn load(
        mut self,
        config: StoreConfig,
        clock: Arc<dyn Clock>,
        mut keep: impl FnMut(&str) -> bool,
    ) -> Result<(MemoryStore, LoadReport), SnapshotError> {
        let now = clock.now_ms();
        let mut store = MemoryStore::new(config, clock);
        let mut namespaces: Vec<(String, bool, NamespaceCounts)> = Vec::new();
        let mut ids: HashMap<String, usize> = HashMap::default();
        let mut buf = Vec::new();
        let mut index = 0u64;
        while self.input.frame(&mut buf)?.is_some() {
            let mut dict: Vec<usize> = Vec::new();
            let mut rest = buf.as_slice();
            while !rest.is_empty() {
                let at = index;
                let invalid =
                    move |reason: String| SnapshotError::InvalidEntry { index: at, reason };
                let decode = |e: postcard::Error| invalid(format!("cannot be decoded ({e})"));
                let (code, r) = postcard::take_from_bytes::<u32>(rest).map_err(decode)?;
                let ns = if code == 0 {
                    let (name, r) = postcard::take_from_bytes::<&str>(r).map_err(decode)?;
                    rest = r;
                    if name.is_empty() || name.contains('\0') {
                        return Err(invalid("a policy name that is empty or holds NUL".into()));
                    }
                    let id = match ids.get(name) {
                        Some(&id) => id,
                        None => {
                            namespaces.push((
                                name.to_owned(),
                                keep(name),
                                NamespaceCounts::default(),
                            ));
                            ids.insert(name.to_owned(), namespaces.len() - 1);
                            namespaces.len() - 1
                        }
                    };
                    dict.push(id);
                    id
                } else {
                    rest = r;
                    let at = usize::try_from(code - 1).unwrap_or(usize::MAX);
                    *dict.get(at).ok_or_else(|| {
                        invalid(format!("names namespace {code} of {}", dict.len()))
                    })?
                };
                let (record, r) = if self.version == 2 {
                    postcard::take_from_bytes::<RecordInV2<'_>>(rest)
                        .map(|(record, r)| (RecordIn::from(record), r))
                } else {
                    postcard::take_from_bytes::<RecordIn<'_>>(rest)
                }
                .map_err(decode)?;
                rest = r;
                if record.key.is_empty() {
                    return Err(invalid("an empty key".into()));
                }
                let fresh_at = self
                    .taken_at_ms
                    .checked_add(record.fresh_in)
                    .ok_or_else(|| invalid("becomes fresh past u64 ms".into()))?;
                // A calendar count (or its leases) this build cannot
                // honour drops its entry, counted as expired.
                let mut dropped = false;
                let state = match record.state {
                    None => None,
                    Some(s) => {
                        let state = s.into_state(fresh_at).map_err(|r| invalid(r.into()))?;
                        dropped |= state.is_none();
                        state
                    }
                };
                let ledger = ledger_of(
                    record.grants,
                    record.grants_under,
                    fresh_at,
                    self.version == 4,
                )
                .map_err(|r| invalid(r.into()))?;
                dropped |= ledger.is_none();
                let ledger = ledger.unwrap_or_default();
                if !dropped && state.is_none() && ledger.is_empty() {
                    return Err(invalid("an entry with neither state nor grants".into()));
                }
                index += 1;
                let (name, kept, counts) = &mut namespaces[ns];
                if !*kept {
                    counts.skipped += 1;
                } else if dropped || fresh_at <= now {
                    counts.expired += 1;
                } else {
                    let hash = key_hash(store.hasher(), name, record.key);
                    let shard = store.shard_mut(hash);
                    if shard.find(hash, name, record.key).is_some() {
                        return Err(invalid(format!(
                            "key {:?} of {name:?} appears twice",
                            record.key
                        )));
                    }
                    let need = Room {
                        keys: 1,
                        bytes: extra_bytes_with(name, record.key, state.as_ref(), &ledger),
                    };
                    if shard.short(need, false).is_empty() {
                        shard.insert_granted(hash, name, record.key, state, ledger, fresh_at);
                        counts.loaded += 1;
                    } else {
                        counts.over_capacity += 1;
                    }
                }
            }
        }
        let expected = u64::from_le_bytes(self.input.exact::<8>()?);
        let crc = self.input.crc.clone().finalize();
        let stored = u32::from_le_bytes(self.input.exact::<4>()?);
        if crc != stored {
            return Err(SnapshotError::Checksum {
                what: "snapshot",
                at: 0,
            });
        }
        if expected != index {
            return Err(SnapshotError::CountMismatch {
                expected,
                found: index,
            });
        }
        let mut probe = [0u8; 1];
        if self.input.inner.read(&mut probe)? != 0 {
            return Err(SnapshotError::TrailingBytes);
        }
        let report = LoadReport {
            taken_at_ms: self.taken_at_ms,
            namespaces: namespaces
                .into_iter()
                .map(|(name, _, counts)| (name, counts))
                .collect(),
        };
        Ok((store, report))
    }
}
