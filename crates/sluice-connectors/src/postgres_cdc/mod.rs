//! `connector = "postgres-cdc"`: the tables of one PostgreSQL database as changelog
//! tables, a snapshot of them followed by their changes from a logical replication
//! slot (the `pgoutput` plugin), exactly once.
//!
//! - [`options`]: `[source.options]`, validated without I/O.
//! - [`catalog`]: at planning, the server's `wal_level`, the publication, and each
//!   table's columns, primary key and `REPLICA IDENTITY` (the tables' schemas and keys
//!   come from here, never from the pipeline file).
//! - [`protocol`]: the replication session (startup, authentication, queries,
//!   `START_REPLICATION`, CopyBoth, status updates); [`transport`]: its bytes, plain or
//!   TLS (SSLRequest, then the handshake).
//! - [`pgoutput`]: the stream's messages, decoded.
//! - [`values`]: text values into Arrow columns; [`rows`]: changes into batches.
//! - [`position`]: a lane's checkpointed position.
//! - [`slot`]: the slot's state, creation with a snapshot, a restart's new snapshot on
//!   the slot kept.
//! - [`snapshot`]: reading the snapshot, one part of every table per snapshot lane;
//!   [`snapshot_lane`]: the lanes after the first, which read a part and end.
//! - [`lane`]: lane 0: its part of the snapshot, then the stream, transaction by
//!   transaction.
//!
//! # The correctness argument
//!
//! **No gap, no duplicate between snapshot and stream.** A fresh run creates the slot
//! with `EXPORT_SNAPSHOT`: the server returns the slot's consistent point and a
//! snapshot showing exactly the transactions committed before it. The lane imports the
//! snapshot (`SET TRANSACTION SNAPSHOT`, REPEATABLE READ) in a second session before the
//! replication session runs another command (which would end the export), reads the
//! tables through cursors, and then streams from the consistent point: the stream holds
//! exactly the transactions committing after it.
//!
//! **Exactly once.** The lane's position is the end LSN of the last transaction whose
//! rows it returned (and, inside a transaction cut in pieces, how many of its changes
//! went out). A poll returns only whole transactions, so a barrier falls between
//! transactions. On restart the lane asks for the stream from that LSN and drops every
//! transaction whose commit record starts before it (the server skips them too). The
//! slot's confirmed position, which lets the server recycle WAL, is advanced only by
//! [`SourceFactory::checkpoint_committed`]: to the position of a checkpoint that is
//! published and whose sinks committed, so the server always keeps what a restart from
//! the newest checkpoint needs. While the lane streams it sends that LSN in its status
//! updates; otherwise (the lane ended) the factory advances the slot over SQL.
//!
//! **Transactions.** pgoutput protocol 1 sends a transaction at its commit, so a long
//! transaction costs nothing until then and checkpoints pass while it runs. Its rows are
//! held until its Commit; beyond `transaction_rows_max` rows the held rows are returned
//! (the position then counts the transaction's changes already out, and a restart skips
//! those), so memory stays bounded and output stays exactly once, at the price of a
//! checkpoint possibly falling inside that transaction. Spilling was not chosen: the
//! stream is already durable in the server's WAL, which the position replays from.
//!
//! **Snapshot lanes.** With `snapshot_lanes = N`, lane 0 opens the snapshot (the slot's
//! export, or a restart's, below) and publishes its name, its consistent point and each
//! table's size in blocks (read in the snapshot); lanes 1..N import it (the exporting
//! session stays idle until lane 0 streams, so the export lives) and each reads its
//! range of every table's blocks, lane 0 the first. A change of a key must reach the
//! normalization after the key's snapshot row, which another lane, on another thread,
//! may have sent: lane 0 starts the stream only once a committed checkpoint holds every
//! other lane's position "part read" of this snapshot (its barrier, aligned across every
//! exchange, orders all of their rows first). A part names its snapshot by the
//! consistent point, which a restart's snapshot shares with the first one, so publishing
//! a snapshot forgets the parts recorded before (and a snapshot lane's position before
//! its part names none). Hence exactly-once checkpoints are required. Lane 0 alone
//! decides whether a snapshot is read; the other lanes follow what it publishes.
//!
//! **Restart during the snapshot.** The exported snapshot lives only as long as the
//! session that created the slot, so a run stopped before its snapshot ended cannot
//! finish it, and no later snapshot shows which rows the first one returned were deleted
//! since. The slot's changes do: a checkpoint taken during the snapshot carries no LSN,
//! so the slot's confirmed position is still the consistent point L0 (which lane 0's
//! position records) and the server keeps every change committed after it. The restart
//! therefore keeps the slot, reads a new snapshot S1 in an ordinary REPEATABLE READ
//! transaction (exported with `pg_export_snapshot()` by a session held open until the
//! stream starts, for the other snapshot lanes), and streams from L0 under the rules of
//! a fresh run (the parts committed first). It converges to PostgreSQL's tables because
//! the normalization sets a key's row (an insert, an update's new row) or removes it (a
//! delete, an update's old row) whatever it held, and every change of a key reaches it
//! after the key's S1 row, in commit order: a key no transaction after L0 changed ends
//! as S1 shows it, which is as the first snapshot returned it (if it did: a duplicate
//! insert that emits nothing); any other key ends as its last change, as in
//! PostgreSQL. A row returned by the first snapshot and deleted since thus gets its
//! delete, and one updated, or deleted and inserted again, its last row. The changes S1
//! already holds count in the normalization's counters: an insert as a duplicate
//! insert, a delete of a key the first snapshot never returned as a delete of an unknown
//! key (dropped), an old row older than the key's as an out-of-order change (the key's
//! row retracted, the new one applied); the restart logs why, with L0 and S1's WAL
//! position. Until the stream passes S1, the output may show a key's older row again
//! (as the snapshot itself shows states PostgreSQL never had); the end is PostgreSQL's.
//! Exactly once holds from L0 on as in any stream: positions are transactions', and
//! only the snapshot's rows (as before) come twice.
//!
//! Other designs, and why not: dropping the slot and reading a new snapshot (the first
//! version) kept the deleted rows forever; deleting the keys the first snapshot returned
//! that S1 lacks needs those keys, which only the normalization holds, on every thread;
//! skipping the changes S1 holds by their commit LSN is not sound, as visibility in a
//! snapshot does not follow commit LSN order (a transaction whose commit record precedes
//! S1's WAL position may still be invisible to S1), while applying every change from L0
//! again needs no such cut. A restart that finds the slot gone, or at another confirmed
//! position (dropped and created again, or advanced), is refused
//! (`source.postgres_cdc.snapshot_slot_lost`, the fix: start afresh): a new snapshot
//! without the changes from L0 gives a wrong answer that nothing would show, the
//! deleted rows counted for ever. A version 1 position names no L0: the slot's confirmed
//! position is taken for it. A restart after the snapshot resumes the stream from its
//! position and reads no snapshot.
//!
//! **Schema changes** are not followed: a Relation message whose columns differ from
//! the catalog's at planning stops the run with the table, the change and the fix, and
//! so does a restart whose catalog differs from the columns its checkpoint recorded
//! (the source's layout); a TRUNCATE of a captured table stops it too.

pub mod catalog;
pub mod lane;
pub mod options;
pub mod pgoutput;
pub mod position;
pub mod protocol;
pub mod rows;
pub mod setup;
pub mod slot;
pub mod snapshot;
pub mod snapshot_lane;
pub mod transport;
pub mod values;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sluice_config::{ConfigError, SourceConfig};
use sluice_runtime::{LaneContext, LaneReader, SourceChangelog, SourceFactory, TableDef};
use sluice_types::{Epoch, SluiceError};

use self::catalog::CapturedTable;
use self::options::CdcOptions;
use self::position::Position;
use crate::connector::{ConfiguredSource, OptionDoc, SourceConnector, SourceContext};

/// The changelog format's name in `explain`.
pub const FORMAT: &str = "pgoutput";

/// The `postgres-cdc` source connector.
#[derive(Debug, Clone, Copy, Default)]
pub struct PostgresCdcConnector;

impl SourceConnector for PostgresCdcConnector {
    fn name(&self) -> &'static str {
        "postgres-cdc"
    }

    fn options(&self) -> &'static [OptionDoc] {
        options::OPTIONS
    }

    fn configure(&self, config: &SourceConfig) -> Result<Box<dyn ConfiguredSource>, Vec<ConfigError>> {
        let options = options::options_of(config)?;
        Ok(Box::new(ConfiguredCdc { name: config.name.clone(), options }))
    }
}

/// A validated `postgres-cdc` source.
#[derive(Debug, Clone)]
pub struct ConfiguredCdc {
    pub name: String,
    pub options: CdcOptions,
}

impl ConfiguredSource for ConfiguredCdc {
    fn tables(&self) -> Vec<String> {
        self.options.tables.iter().map(|t| t.name.clone()).collect()
    }

    fn reads_declared_schema(&self) -> bool {
        false
    }

    fn build(&self, context: &SourceContext<'_>) -> Result<Arc<dyn SourceFactory>, SluiceError> {
        // Planning names the source before the message already; the lane's errors, which
        // nothing else names, keep the prefix.
        let prefix = format!("source `{}`: ", self.name);
        self.build_factory(context).map_err(|mut error| {
            if let Some(rest) = error.message.strip_prefix(&prefix) {
                error.message = rest.to_owned();
            }
            error
        })
    }
}

impl ConfiguredCdc {
    fn build_factory(&self, context: &SourceContext<'_>) -> Result<Arc<dyn SourceFactory>, SluiceError> {
        if self.options.snapshot_lanes > 1 && !context.exactly_once {
            return Err(SluiceError::user(
                "source.postgres_cdc.snapshot_lanes",
                format!(
                    "source `{}`: snapshot_lanes = {} needs exactly-once checkpoints: the stream starts once a \
                     checkpoint holds every lane's part of the snapshot",
                    self.name, self.options.snapshot_lanes
                ),
            )
            .with_fix("add [checkpoint] with guarantee = \"exactly-once\", or remove snapshot_lanes"));
        }
        if context.workers > 1 {
            return Err(SluiceError::user(
                "source.postgres_cdc.cluster",
                format!("source `{}`: a replication slot is read by one session, so one worker", self.name),
            )
            .with_fix("run the pipeline solo (without --workers), or read the changes through Kafka"));
        }
        let endpoint = self.options.endpoint(&self.name)?;
        let captured = catalog::read_catalog(&self.name, &endpoint, &self.options.publication, &self.options.tables)?;
        if let Some(recorded) = &context.layout {
            catalog::check_layout(&self.name, recorded, &captured)?;
        }
        let tables = captured
            .iter()
            .map(|table| TableDef {
                name: table.name.clone(),
                schema: table.schema(),
                event_time: None,
                changelog: Some(SourceChangelog {
                    primary_key: table.key.clone(),
                    upsert: false,
                    format: FORMAT.to_owned(),
                }),
            })
            .collect();
        Ok(Arc::new(PostgresCdcSource {
            name: self.name.clone(),
            options: self.options.clone(),
            captured: Arc::new(captured),
            tables,
            shared: Arc::new(Shared::default()),
            end_after_checkpoint: context.exactly_once,
        }))
    }
}

/// What the factory (on the controller's thread) and the lanes share.
#[derive(Debug, Default)]
pub struct Shared {
    /// The end LSN of the newest committed checkpoint's position: the slot's confirmed
    /// position may advance to it.
    pub committed_lsn: AtomicU64,
    /// The lane holds the slot (its session streams): it sends `committed_lsn` itself.
    pub streaming: AtomicBool,
    /// What lane 0 tells the snapshot lanes (set once it opened the slot).
    published: Mutex<Option<Published>>,
    /// Per lane, the consistent point of the snapshot whose part it returned, as the
    /// newest committed checkpoint holds it (0: none).
    parts_committed: Mutex<Vec<u64>>,
}

/// What lane 0 tells the other snapshot lanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// The run streams from a checkpoint's position: no snapshot to read.
    NoSnapshot,
    /// The snapshot's name (exported by the slot's creation, or by a restart's session),
    /// the slot's consistent point the stream starts from, and each table's size in
    /// blocks (which the parts are cut from).
    Snapshot { name: String, consistent_point: u64, blocks: Vec<u64> },
}

impl Shared {
    /// Publishes what lane 0 opened; a snapshot's parts count from here on (a restart's
    /// snapshot has the consistent point of the first one).
    pub fn publish(&self, published: Published) {
        let mut slot = self.published.lock().expect("the published snapshot");
        if matches!(published, Published::Snapshot { .. }) {
            self.parts_committed.lock().expect("the committed parts").clear();
        }
        *slot = Some(published);
    }

    pub fn published(&self) -> Option<Published> {
        self.published.lock().expect("the published snapshot").clone()
    }

    /// Whether a committed checkpoint holds every other snapshot lane's part of the
    /// snapshot at `consistent_point` (of `lanes` lanes).
    pub fn snapshot_lanes_done(&self, consistent_point: u64, lanes: u32) -> bool {
        let parts = self.parts_committed.lock().expect("the committed parts");
        (1..lanes as usize).all(|lane| parts.get(lane) == Some(&consistent_point))
    }
}

/// The planned source.
pub struct PostgresCdcSource {
    name: String,
    options: CdcOptions,
    captured: Arc<Vec<CapturedTable>>,
    tables: Vec<TableDef>,
    shared: Arc<Shared>,
    end_after_checkpoint: bool,
}

impl SourceFactory for PostgresCdcSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn tables(&self) -> &[TableDef] {
        &self.tables
    }

    fn lanes(&self) -> u32 {
        self.options.snapshot_lanes
    }

    /// The captured tables' columns, so that a restart after a schema change is refused.
    fn layout(&self) -> Vec<u8> {
        catalog::layout(&self.captured)
    }

    fn open_lane(&self, context: LaneContext) -> Result<Box<dyn LaneReader>, SluiceError> {
        let endpoint = self.options.endpoint(&self.name)?;
        let start = context.start.as_deref().map(|bytes| Position::decode(&self.name, bytes)).transpose()?;
        if context.lane > 0 {
            let part = snapshot::Part { index: context.lane, count: self.options.snapshot_lanes };
            let tables =
                snapshot_lane::LaneTables { captured: Arc::clone(&self.captured), shared: Arc::clone(&self.shared) };
            return Ok(Box::new(snapshot_lane::SnapshotLane::new(&self.name, endpoint, tables, part, context)));
        }
        let lane = lane::CdcLane::open(setup::LaneSetup {
            lanes: self.options.snapshot_lanes,
            source: self.name.clone(),
            endpoint,
            options: self.options.clone(),
            captured: Arc::clone(&self.captured),
            shared: Arc::clone(&self.shared),
            batch_size: context.batch_size.max(1),
            metrics: context.metrics,
            start,
            end_after_checkpoint: self.end_after_checkpoint && self.options.bounded,
        })?;
        Ok(Box::new(lane))
    }

    fn describe(&self) -> String {
        let tables: Vec<String> = self
            .captured
            .iter()
            .zip(&self.tables)
            .map(|(table, def)| {
                let changelog = def.changelog.as_ref().expect("every table is a changelog");
                format!("{} ({})", table.qualified(), crate::changelog::describe(changelog, &def.schema))
            })
            .collect();
        format!(
            "postgres-cdc(slot={}, publication={}, tables=[{}]{})",
            self.options.slot,
            self.options.publication,
            tables.join("; "),
            if self.options.bounded { ", bounded" } else { "" }
        )
    }

    fn checkpoint_committed(&self, epoch: Epoch, positions: &[(u32, &[u8])]) {
        {
            let mut parts = self.shared.parts_committed.lock().expect("the committed parts");
            for (lane, bytes) in positions {
                if let Ok(Position::SnapshotDone { consistent_point }) = Position::decode(&self.name, bytes) {
                    if parts.len() <= *lane as usize {
                        parts.resize(*lane as usize + 1, 0);
                    }
                    parts[*lane as usize] = consistent_point;
                }
            }
        }
        let Some(lsn) = positions.iter().find_map(|(_, bytes)| Position::decode(&self.name, bytes).ok()?.lsn()) else {
            return;
        };
        let before = self.shared.committed_lsn.fetch_max(lsn, Ordering::AcqRel);
        if before >= lsn || self.shared.streaming.load(Ordering::Acquire) {
            return;
        }
        // The lane does not hold the slot (it ended): advance it over SQL.
        if let Err(error) = self.advance_slot(lsn) {
            tracing::warn!(source = %self.name, ?epoch, "the slot's confirmed position was not advanced: {error}");
        }
    }
}

impl PostgresCdcSource {
    fn advance_slot(&self, lsn: u64) -> Result<(), SluiceError> {
        let endpoint = self.options.endpoint(&self.name)?;
        let mut client = catalog::connect(&self.name, &endpoint)?;
        let target = position::format_lsn(lsn);
        client
            .execute(
                "SELECT pg_replication_slot_advance($1, $2::text::pg_lsn) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND confirmed_flush_lsn < $2::text::pg_lsn",
                &[&self.options.slot, &target],
            )
            .map_err(|e| catalog::query_error(&self.name, &endpoint, "advancing the slot", &e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
