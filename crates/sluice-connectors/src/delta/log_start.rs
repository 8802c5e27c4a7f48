//! The first read of a table's log: from its newest log checkpoint and the commits after
//! it, so that a restart on a table of many commits reads a few objects rather than one
//! per commit, and a table whose early commits a log cleanup removed (Delta's log
//! retention, delta-rs's `cleanup_metadata`) is read at all.
//!
//! The steps, each bounded:
//!
//! 1. One listing of `_delta_log/` (the first read listed it before too): the commits,
//!    each version's checkpoint files and their sizes, and whether `_last_checkpoint` is
//!    there.
//! 2. `_last_checkpoint` (at most [`LAST_CHECKPOINT_BYTES_MAX`] bytes), checked against the
//!    listing: missing, damaged, naming a checkpoint the log does not hold, or older than
//!    a listed one (stale: its writer stopped between the checkpoint and the pointer) is
//!    logged, and the listing decides.
//! 3. The checkpoints that can start the read, newest first: a single file, or every part
//!    of a multi-part one, of a version after which every commit up to the newest is
//!    listed. At most [`CHECKPOINT_ATTEMPTS_MAX`] are read; one that cannot be (not
//!    Parquet, over `CHECKPOINT_BYTES_MAX`, a V2 checkpoint with sidecars, gone since the
//!    listing) is logged and the next one tried. A V2 checkpoint named by a UUID, or a
//!    multi-part one with parts missing, is passed over unread.
//! 4. Otherwise version 0, when every commit from version 0 is listed (a table younger
//!    than its first checkpoint, or one without checkpoints).
//! 5. Otherwise the table is refused (`sink.delta_log_start`), naming the table, its
//!    versions, why each checkpoint could not start the read, and the fix. An empty state
//!    (no table: the sink creates version 0) comes only from a log without commits,
//!    checkpoints or `_last_checkpoint`.
//!
//! The listed commits after the start are then read, each of which must still be there
//! (else `sink.delta_log`: a cleanup removed it meanwhile; a restart reads again); the
//! table's later reads ask for the versions after the newest, until one is missing.
//!
//! Why the listing, not the pointer alone: a stale pointer on a log whose commits before
//! the newer checkpoint were removed names a version whose next commit is gone. Read from
//! there, the log would seem to end at that version, and the sink's next commit would
//! take a version that is not the next one. The listing shows every version, so the read
//! starts where every later commit is present and reaches the newest. It costs one
//! LIST per 1,000 entries on S3, as before this read used checkpoints; a listing that
//! starts after a name (S3's `start-after`, which `ObjectDir` does not offer) would make
//! it cost only the entries after the pointer.
//!
//! A failed call (a timeout, a refused request) is returned, not passed over: an
//! unreachable checkpoint is no reason to read every commit, and the error is retryable.
//! A state read from a checkpoint equals the one read from the commits it covers (see
//! `checkpoint_read`).

use std::collections::{BTreeMap, BTreeSet};

use sluice_checkpoint::ObjectDir;
use sluice_types::SluiceError;

use super::checkpoint::{self, CheckpointName, LAST_CHECKPOINT_BYTES_MAX, LastCheckpoint};
use super::checkpoint_read::{self, CHECKPOINT_BYTES_MAX};
use super::log::{self, COMMIT_BYTES_MAX, LogState};

/// The most checkpoints read at one first read before falling back to the commits.
pub const CHECKPOINT_ATTEMPTS_MAX: usize = 3;

/// The most reasons (a checkpoint passed over) named in a message.
const REASONS_SHOWN_MAX: usize = 4;

/// Where a first read started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// An empty log: no table yet.
    Empty,
    /// Every commit from version 0.
    Commits,
    /// The log checkpoint of this version, then the commits after it.
    Checkpoint(u64),
}

/// Reads `dir`'s log from its start (see the module doc); `keep_actions`: keep the live
/// actions (`LogState::actions`). `sink` names the sink in messages.
pub fn first_read(sink: &str, dir: &ObjectDir, keep_actions: bool) -> Result<(LogState, Start), SluiceError> {
    first_read_within(sink, dir, keep_actions, CHECKPOINT_BYTES_MAX)
}

/// [`first_read`] reading at most `checkpoint_bytes_max` bytes of one checkpoint's files
/// (tests lower it).
pub fn first_read_within(
    sink: &str,
    dir: &ObjectDir,
    keep_actions: bool,
    checkpoint_bytes_max: u64,
) -> Result<(LogState, Start), SluiceError> {
    Reader { sink, dir, keep_actions, checkpoint_bytes_max }.read()
}

/// Reads commit `version` into `state`, which must be at the version before: `false`
/// when the commit does not exist.
pub fn read_commit(sink: &str, dir: &ObjectDir, state: &mut LogState, version: u64) -> Result<bool, SluiceError> {
    let path = log::commit_path(version);
    let Some(bytes) = dir.get(&path, COMMIT_BYTES_MAX)? else { return Ok(false) };
    state.apply(version, &bytes).map_err(|why| {
        SluiceError::external(
            "sink.delta_log",
            format!("sink `{sink}`: {}/{path} is not a Delta commit: {why}", dir.url()),
        )
        .with_fix("write this view to a new Delta table path; the log of this one is damaged")
    })?;
    Ok(true)
}

/// A table's log as one listing shows it.
#[derive(Debug, Default)]
struct Listing {
    commits: BTreeSet<u64>,
    checkpoints: BTreeMap<u64, Files>,
    /// The size of `_last_checkpoint`, when listed.
    pointer_bytes: Option<u64>,
    /// The oldest version from which every commit up to the newest is listed.
    tail_start: Option<u64>,
}

/// The checkpoint files listed for one version.
#[derive(Debug, Default)]
struct Files {
    /// The single file's size.
    single: Option<u64>,
    /// Per number of parts named, each part listed and its size.
    parts: BTreeMap<u64, BTreeMap<u64, u64>>,
    /// A V2 checkpoint named by a UUID.
    uuid: bool,
}

impl Listing {
    fn of(entries: Vec<(String, u64)>) -> Listing {
        let mut listing = Listing::default();
        for (path, size) in entries {
            if let Some(version) = log::commit_version(&path) {
                listing.commits.insert(version);
            } else if let Some(name) = checkpoint::checkpoint_name(&path) {
                let files = listing.checkpoints.entry(name.version()).or_default();
                match name {
                    CheckpointName::Single { .. } => files.single = Some(size),
                    CheckpointName::Part { part, parts, .. } => {
                        files.parts.entry(parts).or_default().insert(part, size);
                    }
                    CheckpointName::Uuid { .. } => files.uuid = true,
                }
            } else if path == checkpoint::last_checkpoint_path() {
                listing.pointer_bytes = Some(size);
            }
        }
        let newest = listing.commits.last().copied();
        listing.tail_start = newest.map(|newest| {
            let mut start = newest;
            for &version in listing.commits.iter().rev().skip(1) {
                if version + 1 != start {
                    break;
                }
                start = version;
            }
            start
        });
        listing
    }

    /// Whether every listed commit after `version` follows it without a gap.
    fn continues_after(&self, version: u64) -> bool {
        match (self.commits.last(), self.tail_start) {
            (Some(&newest), Some(start)) => version >= newest || version + 1 >= start,
            _ => true,
        }
    }
}

impl Files {
    /// The files (name, size) of a complete checkpoint of `version`: its single file,
    /// else a complete set of parts; the reason when there is none.
    fn complete(&self, version: u64) -> Result<Vec<(String, u64)>, String> {
        if let Some(size) = self.single {
            return Ok(vec![(checkpoint::checkpoint_path(version), size)]);
        }
        for (&parts, found) in self.parts.iter().rev() {
            if found.len() as u64 == parts {
                let files = found.iter().map(|(&part, &size)| (checkpoint::part_path(version, part, parts), size));
                return Ok(files.collect());
            }
        }
        match self.parts.iter().next_back() {
            Some((parts, found)) => Err(format!("a multi-part checkpoint with {} of its {parts} parts", found.len())),
            None => Err("a V2 checkpoint (named by a UUID), which this sink does not read".to_string()),
        }
    }
}

/// Why checkpoints were passed over, for messages: the first few and a count of the rest.
#[derive(Debug, Default)]
struct Reasons {
    shown: Vec<String>,
    more: usize,
}

impl Reasons {
    fn push(&mut self, reason: String) {
        if self.shown.len() < REASONS_SHOWN_MAX {
            self.shown.push(reason);
        } else {
            self.more += 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.shown.is_empty()
    }

    fn text(&self) -> String {
        let mut text = self.shown.join("; ");
        if self.more > 0 {
            text.push_str(&format!("; and {} more", self.more));
        }
        text
    }
}

struct Reader<'a> {
    sink: &'a str,
    dir: &'a ObjectDir,
    keep_actions: bool,
    checkpoint_bytes_max: u64,
}

impl Reader<'_> {
    fn read(&self) -> Result<(LogState, Start), SluiceError> {
        let listing = Listing::of(self.dir.list(log::LOG_DIR)?);
        let pointer = self.pointer(&listing)?;
        if listing.commits.is_empty() && listing.checkpoints.is_empty() {
            if listing.pointer_bytes.is_some() {
                return Err(self.refusal(&listing, &Reasons::default(), pointer.as_ref()));
            }
            return Ok((LogState::new(self.keep_actions), Start::Empty));
        }
        let mut reasons = Reasons::default();
        let mut attempts = 0;
        for (&version, files) in listing.checkpoints.iter().rev() {
            if attempts == CHECKPOINT_ATTEMPTS_MAX {
                break;
            }
            if !listing.continues_after(version) {
                // Nor does any older one.
                reasons.push(format!("version {version}: commits after it are missing"));
                break;
            }
            let files = match files.complete(version) {
                Ok(files) => files,
                Err(why) => {
                    reasons.push(format!("version {version}: {why}"));
                    continue;
                }
            };
            attempts += 1;
            match self.checkpoint(version, &files)? {
                Ok(state) => {
                    self.note_pointer(pointer.as_ref(), version, &reasons);
                    let state = self.commits_after(state, &listing)?;
                    let read = state.version.map_or(0, |newest| newest - version);
                    tracing::info!(
                        sink = %self.sink,
                        "delta sink: read the log of {} from its checkpoint of version {version} and {read} commits after it",
                        self.dir.url()
                    );
                    return Ok((state, Start::Checkpoint(version)));
                }
                Err(why) => {
                    tracing::warn!(sink = %self.sink, "delta sink: the log checkpoint of version {version} of {} is passed over: {why}", self.dir.url());
                    reasons.push(format!("version {version}: {why}"));
                }
            }
        }
        if listing.tail_start == Some(0) {
            if !reasons.is_empty() {
                tracing::warn!(sink = %self.sink, "delta sink: reading every commit of {} from version 0, since no log checkpoint could start the read ({})", self.dir.url(), reasons.text());
            }
            let state = self.commits_after(LogState::new(self.keep_actions), &listing)?;
            return Ok((state, Start::Commits));
        }
        Err(self.refusal(&listing, &reasons, pointer.as_ref()))
    }

    /// `_last_checkpoint`: `None` when there is none, else what it says or why it cannot
    /// be read.
    fn pointer(&self, listing: &Listing) -> Result<Option<Result<LastCheckpoint, String>>, SluiceError> {
        match listing.pointer_bytes {
            None => Ok(None),
            Some(size) if size > LAST_CHECKPOINT_BYTES_MAX => {
                Ok(Some(Err(format!("it holds {size} bytes, more than the {LAST_CHECKPOINT_BYTES_MAX} read here"))))
            }
            Some(_) => {
                let bytes = self.dir.get(&checkpoint::last_checkpoint_path(), LAST_CHECKPOINT_BYTES_MAX)?;
                Ok(bytes.map(|bytes| checkpoint::parse_last_checkpoint(&bytes)))
            }
        }
    }

    /// Logs what `_last_checkpoint` says against the checkpoint read, `version`.
    fn note_pointer(&self, pointer: Option<&Result<LastCheckpoint, String>>, version: u64, reasons: &Reasons) {
        let url = self.dir.url();
        match pointer {
            None => {
                tracing::info!(sink = %self.sink, "delta sink: {url} has no _last_checkpoint; the listing names its newest log checkpoint")
            }
            Some(Err(why)) => {
                tracing::warn!(sink = %self.sink, "delta sink: the _last_checkpoint of {url} is damaged ({why}); the listing names its newest log checkpoint")
            }
            Some(Ok(pointer)) if pointer.version < version => {
                tracing::warn!(sink = %self.sink, "delta sink: the _last_checkpoint of {url} is stale: it names version {}, and the log holds a checkpoint of version {version}", pointer.version)
            }
            Some(Ok(pointer)) if pointer.version > version => {
                tracing::warn!(sink = %self.sink, "delta sink: the _last_checkpoint of {url} names version {}, whose checkpoint cannot start the read ({}); read from version {version}", pointer.version, reasons.text())
            }
            Some(Ok(_)) => {}
        }
    }

    /// The state of the checkpoint of `version` made of `files`; the reason when they are
    /// not a checkpoint this sink reads.
    fn checkpoint(&self, version: u64, files: &[(String, u64)]) -> Result<Result<LogState, String>, SluiceError> {
        let (listed, most): (u64, u64) = (files.iter().map(|(_, size)| size).sum(), self.checkpoint_bytes_max);
        if listed > most {
            return Ok(Err(format!("it holds {listed} bytes, more than the {most} read here")));
        }
        let mut state = LogState::new(self.keep_actions);
        let mut budget = most;
        for (path, _) in files {
            let Some(bytes) = self.dir.get(path, budget)? else {
                return Ok(Err(format!("{path} is gone")));
            };
            budget -= bytes.len() as u64;
            if let Err(why) = checkpoint_read::apply_file(&mut state, bytes) {
                return Ok(Err(format!("{path}: {why}")));
            }
        }
        if state.protocol.is_none() || state.metadata.is_none() {
            return Ok(Err("it has no protocol or no metaData row".to_string()));
        }
        state.version = Some(version);
        Ok(Ok(state))
    }

    /// `state` read on through every listed commit after its version.
    fn commits_after(&self, mut state: LogState, listing: &Listing) -> Result<LogState, SluiceError> {
        let from = state.version.map_or(0, |version| version + 1);
        for &version in listing.commits.range(from..) {
            if !read_commit(self.sink, self.dir, &mut state, version)? {
                return Err(SluiceError::external(
                    "sink.delta_log",
                    format!(
                        "sink `{}`: {}/{} was listed and is gone before it was read (a log cleanup removed it \
                         meanwhile?)",
                        self.sink,
                        self.dir.url(),
                        log::commit_path(version)
                    ),
                )
                .with_fix("start the pipeline again: the next read of the log starts at its newest checkpoint"));
            }
        }
        Ok(state)
    }

    fn refusal(
        &self,
        listing: &Listing,
        reasons: &Reasons,
        pointer: Option<&Result<LastCheckpoint, String>>,
    ) -> SluiceError {
        let commits = match (listing.commits.first(), listing.commits.last(), listing.tail_start) {
            (Some(oldest), Some(newest), Some(start)) if start > *oldest => {
                format!("its commits run from version {oldest} to {newest}, with versions missing before {start}")
            }
            (Some(oldest), Some(newest), _) => format!("its commits run from version {oldest} to {newest}"),
            _ => "it has no commits".to_string(),
        };
        let checkpoints = match (listing.checkpoints.is_empty(), reasons.is_empty()) {
            (true, _) => "no log checkpoint".to_string(),
            (false, true) => "no log checkpoint it can start from".to_string(),
            (false, false) => format!("no log checkpoint it can start from ({})", reasons.text()),
        };
        let pointer = match pointer {
            Some(Ok(pointer)) => format!(", and _last_checkpoint names version {}", pointer.version),
            Some(Err(why)) => format!(", and _last_checkpoint is damaged ({why})"),
            None => String::new(),
        };
        // The oldest checkpoint after which every listed commit is present.
        let needed = listing.tail_start.map_or_else(
            || listing.checkpoints.keys().next_back().copied().unwrap_or(0),
            |start| start.saturating_sub(1),
        );
        SluiceError::user(
            "sink.delta_log_start",
            format!(
                "sink `{}`: the log of Delta table {} cannot be read: {commits}, a read from version 0 needs them all, \
                 and it has {checkpoints}{pointer}",
                self.sink,
                self.dir.url()
            ),
        )
        .with_fix(format!(
            "restore the missing commits, or a log checkpoint of version {needed} or later (e.g. {}), from a backup; \
             or write this view to a new Delta table path",
            checkpoint::checkpoint_path(needed)
        ))
    }
}
