//! The first read of a table's log: from its newest log checkpoint and the commits after
//! it, so that a restart on a table of many commits reads a few objects rather than one
//! per commit, and a table whose early commits a log cleanup removed (Delta's log
//! retention, delta-rs's `cleanup_metadata`) is read at all.
//!
//! The steps, each bounded:
//!
//! 1. `_last_checkpoint` (at most [`LAST_CHECKPOINT_BYTES_MAX`] bytes, else damaged).
//! 2. When it names a version `p`: one listing of `_delta_log/` from `p` on (the names
//!    after `{p:020}`: `p`'s checkpoint and commit, every later one, the pointer; S3's
//!    `start-after`), and step 4 over it. So a start costs what the commits since the
//!    newest log checkpoint cost, however long the log.
//! 3. Otherwise (no pointer, a damaged one, or no checkpoint from `p` on that starts the
//!    read: the pointer names a checkpoint the log does not hold or that cannot be read),
//!    one listing of the whole `_delta_log/`, which is logged, and steps 4 to 6 over it.
//! 4. The listed checkpoints that can start the read, newest first: a single file, or
//!    every part of a multi-part one, of a version after which every commit up to the
//!    newest is listed. At most [`CHECKPOINT_ATTEMPTS_MAX`] are read at one first read,
//!    each at most once; one that cannot be (not Parquet, over `CHECKPOINT_BYTES_MAX`, a
//!    V2 checkpoint: a `checkpointMetadata` or `sidecar` row, gone since the listing) is
//!    logged and the next one tried. A V2 checkpoint named by a UUID, or a multi-part one
//!    with parts missing, is passed over unread. A checkpoint newer than the pointer's
//!    (stale: its writer stopped between the checkpoint and the pointer) is in the listing
//!    and read first.
//! 5. Otherwise version 0, when every commit from version 0 is listed (a table younger
//!    than its first checkpoint, or one without checkpoints).
//! 6. Otherwise the table is refused, naming the table, its versions, why each
//!    checkpoint could not start the read, and the fix: `sink.delta_protocol` when its
//!    newest checkpoint is a V2 one (the table has the `v2Checkpoint` feature, which no
//!    restored commit takes away), else `sink.delta_log_start`. An empty state (no table:
//!    the sink creates version 0) comes only from a log without commits, checkpoints or
//!    `_last_checkpoint`.
//!
//! The listed commits after the start are then read, each of which must still be there
//! (else `sink.delta_log`: a cleanup removed it meanwhile; a restart reads again); the
//! table's later reads ask for the versions after the newest, until one is missing.
//!
//! Why a listing, not the pointer alone: a stale pointer on a log whose commits before
//! the newer checkpoint were removed names a version whose next commit is gone. Read from
//! there, the log would seem to end at that version, and the sink's next commit would
//! take a version that is not the next one. A listing from the pointer's version on shows
//! every later version, so the read starts where every later commit is present and
//! reaches the newest. What it does not show, the versions before the pointer's, matters
//! only when no checkpoint from there on can start the read, and then the whole log is
//! listed. On a local directory the store still reads the whole directory but skips the
//! entries before the name; on S3 (and Azure, GCS) the listing starts there.
//!
//! Never misread: a V2 checkpoint is refused before any of its rows is used, and a table
//! whose protocol names `v2Checkpoint` gets no commit (`Table::check_writable`), so a
//! read that fell back to the commits past a V2 checkpoint ends in that refusal.
//!
//! A failed call (a timeout, a refused request) is returned, not passed over: an
//! unreachable checkpoint is no reason to read every commit, and the error is retryable.
//! A state read from a checkpoint equals the one read from the commits it covers (see
//! `checkpoint_read`).

use std::collections::{BTreeMap, BTreeSet};

use sluice_checkpoint::ObjectDir;
use sluice_types::SluiceError;

use super::checkpoint::{self, CheckpointName, LAST_CHECKPOINT_BYTES_MAX, LastCheckpoint};
use super::checkpoint_read::{self, CHECKPOINT_BYTES_MAX, Unread};
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
    fn complete(&self, version: u64) -> Result<Vec<(String, u64)>, Unread> {
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
            Some((parts, found)) => {
                Err(Unread::Other(format!("a multi-part checkpoint with {} of its {parts} parts", found.len())))
            }
            None => {
                assert!(self.uuid, "a version is listed with a checkpoint file");
                Err(Unread::V2(format!(
                    "a V2 checkpoint (named by a UUID; the {} table feature), which this sink does not read",
                    log::V2_CHECKPOINT
                )))
            }
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
    /// Adds `reason`, unless it was given already (a second listing finds the same gap).
    fn push(&mut self, reason: String) {
        if self.shown.contains(&reason) {
            return;
        }
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

/// The checkpoints one first read passed over, across its listings.
#[derive(Debug, Default)]
struct Tried {
    /// Each version considered (read, or passed over unread).
    versions: BTreeSet<u64>,
    /// Checkpoints read (at most [`CHECKPOINT_ATTEMPTS_MAX`]).
    attempts: usize,
    reasons: Reasons,
    /// The newest version passed over for being a V2 checkpoint.
    v2: Option<u64>,
}

impl Tried {
    fn pass_over(&mut self, version: u64, why: &Unread) {
        if matches!(why, Unread::V2(_)) {
            self.v2 = Some(self.v2.map_or(version, |newest| newest.max(version)));
        }
        self.reasons.push(format!("version {version}: {why}"));
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
        let pointer = self.pointer()?;
        let mut tried = Tried::default();
        if let Some(Ok(named)) = &pointer {
            // The entries from the named version on: its checkpoint, any newer one (the
            // pointer may be stale) and the commits after them.
            let after = format!("{}/{:020}", log::LOG_DIR, named.version);
            let listing = Listing::of(self.dir.list_after(log::LOG_DIR, Some(&after))?);
            if let Some(read) = self.start_at_checkpoint(&listing, pointer.as_ref(), &mut tried)? {
                return Ok(read);
            }
            tracing::info!(
                sink = %self.sink,
                "delta sink: no log checkpoint of {} from version {} on starts the read ({}); listing the whole log",
                self.dir.url(),
                named.version,
                tried.reasons.text()
            );
        }
        let listing = Listing::of(self.dir.list(log::LOG_DIR)?);
        if listing.commits.is_empty() && listing.checkpoints.is_empty() {
            if pointer.is_some() {
                return Err(self.refusal(&listing, &tried, pointer.as_ref()));
            }
            return Ok((LogState::new(self.keep_actions), Start::Empty));
        }
        if let Some(read) = self.start_at_checkpoint(&listing, pointer.as_ref(), &mut tried)? {
            return Ok(read);
        }
        if listing.tail_start == Some(0) {
            if !tried.reasons.is_empty() {
                tracing::warn!(sink = %self.sink, "delta sink: reading every commit of {} from version 0, since no log checkpoint could start the read ({})", self.dir.url(), tried.reasons.text());
            }
            let state = self.commits_after(LogState::new(self.keep_actions), &listing)?;
            self.note_listed(&state, "every commit from version 0");
            return Ok((state, Start::Commits));
        }
        Err(self.refusal(&listing, &tried, pointer.as_ref()))
    }

    /// The read from the newest of `listing`'s checkpoints that starts it (after which
    /// every listed commit follows), skipping those `tried` already passed over and
    /// recording the ones passed over now; `None` when none does.
    fn start_at_checkpoint(
        &self,
        listing: &Listing,
        pointer: Option<&Result<LastCheckpoint, String>>,
        tried: &mut Tried,
    ) -> Result<Option<(LogState, Start)>, SluiceError> {
        for (&version, files) in listing.checkpoints.iter().rev() {
            if tried.attempts == CHECKPOINT_ATTEMPTS_MAX {
                break;
            }
            if !listing.continues_after(version) {
                // Nor does any older one.
                tried.reasons.push(format!("version {version}: commits after it are missing"));
                break;
            }
            if !tried.versions.insert(version) {
                continue;
            }
            let files = match files.complete(version) {
                Ok(files) => files,
                Err(why) => {
                    tried.pass_over(version, &why);
                    continue;
                }
            };
            tried.attempts += 1;
            match self.checkpoint(version, &files)? {
                Ok(state) => {
                    self.note_pointer(pointer, version, &tried.reasons);
                    let state = self.commits_after(state, listing)?;
                    let read = state.version.map_or(0, |newest| newest - version);
                    let how = format!("its checkpoint of version {version} and {read} commits after it");
                    self.note_listed(&state, &how);
                    return Ok(Some((state, Start::Checkpoint(version))));
                }
                Err(why) => {
                    tracing::warn!(sink = %self.sink, "delta sink: the log checkpoint of version {version} of {} is passed over: {why}", self.dir.url());
                    tried.pass_over(version, &why);
                }
            }
        }
        Ok(None)
    }

    /// Logs how the log was read: `how`, and the entries its listings returned.
    fn note_listed(&self, state: &LogState, how: &str) {
        tracing::info!(
            sink = %self.sink,
            version = ?state.version,
            listed_entries = self.dir.listed_entries(),
            "delta sink: read the log of {} from {how}",
            self.dir.url()
        );
    }

    /// `_last_checkpoint`: `None` when there is none, else what it says or why it cannot
    /// be read.
    fn pointer(&self) -> Result<Option<Result<LastCheckpoint, String>>, SluiceError> {
        let read = self.dir.get_at_most(&checkpoint::last_checkpoint_path(), LAST_CHECKPOINT_BYTES_MAX)?;
        Ok(read.map(|read| match read {
            Ok(bytes) => checkpoint::parse_last_checkpoint(&bytes),
            Err(size) => Err(format!("it holds {size} bytes, more than the {LAST_CHECKPOINT_BYTES_MAX} read here")),
        }))
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
    fn checkpoint(&self, version: u64, files: &[(String, u64)]) -> Result<Result<LogState, Unread>, SluiceError> {
        let (listed, most): (u64, u64) = (files.iter().map(|(_, size)| size).sum(), self.checkpoint_bytes_max);
        if listed > most {
            return Ok(Err(Unread::Other(format!("it holds {listed} bytes, more than the {most} read here"))));
        }
        let mut state = LogState::new(self.keep_actions);
        let mut budget = most;
        for (path, _) in files {
            let Some(bytes) = self.dir.get(path, budget)? else {
                return Ok(Err(Unread::Other(format!("{path} is gone"))));
            };
            budget -= bytes.len() as u64;
            match checkpoint_read::apply_file(&mut state, bytes) {
                Ok(_) => {}
                Err(Unread::V2(why)) => return Ok(Err(Unread::V2(format!("{path}: {why}")))),
                Err(Unread::Other(why)) => return Ok(Err(Unread::Other(format!("{path}: {why}")))),
            }
        }
        if state.protocol.is_none() || state.metadata.is_none() {
            return Ok(Err(Unread::Other("it has no protocol or no metaData row".to_string())));
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
        tried: &Tried,
        pointer: Option<&Result<LastCheckpoint, String>>,
    ) -> SluiceError {
        let reasons = &tried.reasons;
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
        let v2_pointer = matches!(pointer, Some(Ok(pointer)) if pointer.v2);
        let pointer = match pointer {
            Some(Ok(pointer)) => format!(", and _last_checkpoint names version {}", pointer.version),
            Some(Err(why)) => format!(", and _last_checkpoint is damaged ({why})"),
            None => String::new(),
        };
        let message = format!(
            "sink `{}`: the log of Delta table {} cannot be read: {commits}, a read from version 0 needs them all, \
             and it has {checkpoints}{pointer}",
            self.sink,
            self.dir.url()
        );
        // The newest checkpoint is a V2 one: the table has the feature (a table that dropped
        // it has a newer classic checkpoint), which no restored commit would take away.
        let v2_newest = tried.v2.is_some_and(|version| tried.versions.last() == Some(&version));
        if v2_newest || v2_pointer {
            return SluiceError::user(
                "sink.delta_protocol",
                format!(
                    "{message}; its log checkpoints are V2 checkpoints: it requires the {} table feature",
                    log::V2_CHECKPOINT
                ),
            )
            .with_fix(log::v2_checkpoint_fix());
        }
        // The oldest checkpoint after which every listed commit is present.
        let needed = listing.tail_start.map_or_else(
            || listing.checkpoints.keys().next_back().copied().unwrap_or(0),
            |start| start.saturating_sub(1),
        );
        SluiceError::user("sink.delta_log_start", message).with_fix(format!(
            "restore the missing commits, or a log checkpoint of version {needed} or later (e.g. {}), from a backup; \
             or write this view to a new Delta table path",
            checkpoint::checkpoint_path(needed)
        ))
    }
}
