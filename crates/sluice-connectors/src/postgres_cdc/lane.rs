//! The source's one lane: opening the slot (created with a snapshot, reused, resumed
//! from a checkpoint's position, or kept with a new snapshot by a restart during the
//! snapshot), the snapshot's rows, then the stream's transactions (see the module's
//! correctness argument in `postgres_cdc/mod.rs`).
//!
//! A poll reads at most [`MESSAGES_PER_POLL`] stream messages and returns the rows of
//! whole transactions only (or a piece of one beyond `transaction_rows_max`), as batches
//! in commit order (consecutive rows of one table in one batch), each with its row kinds.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use sluice_runtime::{LanePoll, LaneReader};
use sluice_types::{RowKind, SluiceError};

use super::Published;
use super::catalog;
use super::pgoutput::{self, Message, Relation, StreamMessage, Value};
use super::position::{Position, format_lsn};
use super::protocol::{ProtocolError, ReplicationConnection};
use super::rows::{Change, Tables};
use super::setup::LaneSetup;
use super::slot;
use super::snapshot::{self, Part, SnapshotReader};
use crate::postgres::options::quote_identifier;

/// Stream messages handled by one poll at most (the driver's other work goes on).
pub const MESSAGES_PER_POLL: usize = 4096;
/// The longest between two status updates (the server's `wal_sender_timeout` is 60 s by
/// default).
const STATUS_INTERVAL: Duration = Duration::from_secs(10);
/// How often an idle bounded lane asks the server where its stream is.
const REPLY_INTERVAL: Duration = Duration::from_millis(50);
/// The pause an idle lane asks for.
const IDLE_PAUSE: Duration = Duration::from_millis(5);

/// The snapshot being read (this lane's part), or read and waiting for the other
/// snapshot lanes' parts.
struct Snapshot {
    reader: Option<SnapshotReader>,
    consistent_point: u64,
    /// The session exporting a restart's new snapshot: closed once the stream starts,
    /// after every snapshot lane imported it.
    _exporter: Option<postgres::Client>,
}

enum Phase {
    Snapshot(Box<Snapshot>),
    Stream,
    Ended,
}

/// The lane.
pub struct CdcLane {
    setup: LaneSetup,
    connection: ReplicationConnection,
    phase: Phase,
    schemas: Vec<SchemaRef>,
    /// Relation oid → captured table (None: a table of the publication not captured).
    relations: HashMap<u32, Option<usize>>,
    /// Changes not yet returned; `pending[..committed]` are of whole transactions.
    pending: Vec<Change>,
    committed: usize,
    /// The end LSN of the last transaction in `pending[..committed]` (or returned).
    commit_lsn: u64,
    /// Inside a transaction: its changes so far, and whether it was returned before the
    /// position resumed from (dropped whole).
    transaction: Option<Transaction>,
    /// Changes of the first transaction after the resumed position already returned.
    resumed_changes: u64,
    /// The position after the rows returned.
    position: Position,
    /// The resumed position's LSN: transactions committing before it are dropped.
    resume_lsn: u64,
    received_lsn: u64,
    /// The server's decoded position from its last keepalive.
    server_lsn: u64,
    stop_lsn: Option<u64>,
    confirmed_sent: u64,
    last_status: Instant,
    last_reply_request: Option<Instant>,
    /// Some rows were returned by this lane.
    returned_rows: bool,
}

struct Transaction {
    changes: u64,
    dropped: bool,
    /// Changes already returned in pieces.
    returned: u64,
}

impl CdcLane {
    /// Connects, opens the slot and, for a fresh slot, the snapshot.
    pub fn open(setup: LaneSetup) -> Result<CdcLane, SluiceError> {
        let mut connection = ReplicationConnection::connect(&setup.endpoint)?;
        let slot = setup.options.slot.clone();
        let existing = slot::slot_state(&setup, &mut connection)?;
        // Read before the slot may be created: a command on the replication session
        // after the creation would end the snapshot's export, which the snapshot lanes
        // import later.
        let stop_lsn = if setup.options.bounded { Some(slot::current_lsn(&setup, &mut connection)?) } else { None };
        let schemas = setup.captured.iter().map(|t| crate::changelog::with_kinds_schema(&t.schema())).collect();
        let (phase, position) = match (setup.start, existing) {
            (Some(Position::Stream { lsn, changes }), Some(confirmed)) => {
                if confirmed > lsn {
                    return Err(SluiceError::user(
                        "source.postgres_cdc.slot_ahead",
                        format!(
                            "source `{}`: slot `{slot}` confirmed {} but the checkpoint resumes from {}: the changes \
                             between were released by the server",
                            setup.source,
                            format_lsn(confirmed),
                            format_lsn(lsn)
                        ),
                    )
                    .with_fix("restore the newest checkpoint, or start the pipeline afresh (a new state and slot)"));
                }
                (Phase::Stream, Position::Stream { lsn, changes })
            }
            (Some(Position::Stream { lsn, .. }), None) => {
                return Err(slot::missing_slot(
                    &setup,
                    &format!("the checkpoint resumes from {} in it", format_lsn(lsn)),
                ));
            }
            (Some(Position::Snapshot { consistent_point }), existing) => {
                let point = slot::kept_point(&setup, consistent_point, existing)?;
                snapshot_phase(&setup, slot::snapshot_again(&setup, point)?)?
            }
            (None, Some(confirmed)) if !setup.options.create_slot => {
                (Phase::Stream, Position::Stream { lsn: confirmed, changes: 0 })
            }
            (None, Some(_)) => {
                return Err(SluiceError::user(
                    "source.postgres_cdc.slot_exists",
                    format!(
                        "source `{}`: slot `{slot}` exists, and the run starts without a checkpoint, so it would \
                         read a snapshot the slot cannot give",
                        setup.source
                    ),
                )
                .with_fix(format!(
                    "drop the slot (SELECT pg_drop_replication_slot('{slot}')) to start with a snapshot, or set \
                     create_slot = false to read the changes after its confirmed position"
                )));
            }
            (None, None) if !setup.options.create_slot => {
                return Err(slot::missing_slot(&setup, "create_slot = false"));
            }
            (None, None) => snapshot_phase(&setup, slot::create_slot(&setup, &mut connection)?)?,
            (Some(Position::SnapshotDone { .. }), _) => {
                return Err(SluiceError::user(
                    "source.postgres_cdc.position",
                    format!("source `{}`: the checkpoint gives lane 0 a snapshot lane's position", setup.source),
                )
                .with_fix("restore a checkpoint written by this source, or start the pipeline afresh"));
            }
        };
        let (resume_lsn, resumed_changes) = match position {
            Position::Stream { lsn, changes } => (lsn, changes),
            Position::Snapshot { .. } | Position::SnapshotDone { .. } => (0, 0),
        };
        let consistent_point = match &phase {
            Phase::Snapshot(snapshot) => snapshot.consistent_point,
            _ => resume_lsn,
        };
        let mut lane = CdcLane {
            connection,
            phase,
            schemas,
            relations: HashMap::new(),
            pending: Vec::new(),
            committed: 0,
            commit_lsn: consistent_point,
            transaction: None,
            resumed_changes,
            position,
            resume_lsn: consistent_point,
            received_lsn: consistent_point,
            server_lsn: 0,
            stop_lsn,
            confirmed_sent: 0,
            last_status: Instant::now(),
            last_reply_request: None,
            returned_rows: false,
            setup,
        };
        if matches!(lane.phase, Phase::Stream) {
            lane.setup.shared.publish(Published::NoSnapshot);
            lane.start_stream(resume_lsn)?;
        }
        Ok(lane)
    }

    fn start_stream(&mut self, lsn: u64) -> Result<(), SluiceError> {
        let options = &self.setup.options;
        let publication = quote_identifier(&options.publication).replace('\'', "''");
        let command = format!(
            "START_REPLICATION SLOT {} LOGICAL {} (proto_version '1', publication_names '{publication}')",
            quote_identifier(&options.slot),
            format_lsn(lsn)
        );
        self.connection.start_replication(&command).map_err(|e| self.stream_error("starting replication", e))?;
        self.setup.shared.streaming.store(true, Ordering::Release);
        self.resume_lsn = lsn;
        self.commit_lsn = lsn;
        self.received_lsn = self.received_lsn.max(lsn);
        tracing::info!(source = %self.setup.source, slot = %options.slot, lsn = %format_lsn(lsn), "streaming changes");
        Ok(())
    }

    fn stream_error(&self, doing: &str, error: ProtocolError) -> SluiceError {
        let source = &self.setup.source;
        let server = self.setup.endpoint.describe();
        let slot = &self.setup.options.slot;
        let at = format_lsn(self.commit_lsn);
        match error {
            ProtocolError::Server(e) if e.message.contains("publication") && e.code == "42704" => {
                catalog::missing_publication(source, &self.setup.endpoint, &self.setup.options.publication, &self.setup.options.tables)
                    .context(format!("{doing} at LSN {at}: {e}"))
            }
            ProtocolError::Io(e) => SluiceError::external(
                "source.postgres_cdc.connection",
                format!("source `{source}`: the replication session to {server} (slot `{slot}`) failed {doing} at LSN {at}: {e}"),
            )
            .with_fix("check that the server is running; the run restarts from its last checkpoint"),
            other => SluiceError::external(
                "source.postgres_cdc.stream",
                format!("source `{source}`: PostgreSQL at {server} (slot `{slot}`), {doing} at LSN {at}: {other}"),
            )
            .with_fix("see the server's log; the run restarts from its last checkpoint"),
        }
    }

    fn poll_snapshot(&mut self) -> Result<LanePoll, SluiceError> {
        let Phase::Snapshot(snapshot) = &mut self.phase else { unreachable!("polled as a snapshot") };
        let consistent_point = snapshot.consistent_point;
        if let Some(reader) = snapshot.reader.as_mut() {
            let setup = &self.setup;
            match reader.next(&setup.source, &setup.endpoint, &setup.captured, setup.batch_size)? {
                Some((changes, bytes)) => {
                    self.setup.metrics.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                    let batches = self.batches(&changes)?;
                    return Ok(LanePoll::Data { batches, watermark: None });
                }
                None => {
                    snapshot.reader = None;
                    tracing::info!(source = %self.setup.source, "snapshot read");
                }
            }
        }
        // The other snapshot lanes' parts must be in a committed checkpoint before a
        // change is returned: its barrier orders their rows before the stream's.
        if !self.setup.shared.snapshot_lanes_done(consistent_point, self.setup.lanes) {
            return Ok(LanePoll::Wait(Instant::now() + IDLE_PAUSE));
        }
        self.phase = Phase::Stream;
        self.position = Position::Stream { lsn: consistent_point, changes: 0 };
        self.start_stream(consistent_point)?;
        Ok(LanePoll::Data { batches: Vec::new(), watermark: None })
    }

    fn poll_stream(&mut self) -> Result<LanePoll, SluiceError> {
        self.send_status(false)?;
        let mut idle = false;
        for _ in 0..MESSAGES_PER_POLL {
            let payload = self.connection.read_copy().map_err(|e| self.stream_error("reading the stream", e))?;
            let Some(payload) = payload else {
                idle = true;
                break;
            };
            self.setup.metrics.bytes.fetch_add(payload.len() as u64, Ordering::Relaxed);
            match pgoutput::decode_stream(&payload).map_err(|e| self.decode_error(&e.0))? {
                StreamMessage::Keepalive { end, reply } => {
                    self.server_lsn = self.server_lsn.max(end);
                    if reply {
                        self.send_status(true)?;
                    }
                }
                StreamMessage::XLogData { start, data, .. } => {
                    self.received_lsn = self.received_lsn.max(start);
                    let message = pgoutput::decode(&data).map_err(|e| self.decode_error(&e.0))?;
                    self.handle(message)?;
                }
            }
            if self.committed >= self.setup.batch_size && self.transaction.is_none() {
                break;
            }
            if self.pending.len() >= self.setup.options.transaction_rows_max + self.committed {
                return self.emit_piece();
            }
        }
        if self.committed > 0 {
            return self.emit_committed();
        }
        if self.transaction.is_none()
            && let Some(stop) = self.stop_lsn
        {
            if self.commit_lsn.max(self.server_lsn) >= stop {
                if !self.may_end() {
                    return Ok(LanePoll::Wait(Instant::now() + IDLE_PAUSE));
                }
                // The committed checkpoint's LSN, confirmed before the session ends.
                self.send_status(false)?;
                tracing::info!(source = %self.setup.source, lsn = %format_lsn(stop), "bounded: read up to the WAL position at start");
                self.end();
                return Ok(LanePoll::Exhausted);
            }
            if idle && self.last_reply_request.is_none_or(|at| at.elapsed() >= REPLY_INTERVAL) {
                self.last_reply_request = Some(Instant::now());
                self.send_status_now(true)?;
            }
        }
        Ok(if idle {
            LanePoll::Wait(Instant::now() + IDLE_PAUSE)
        } else {
            LanePoll::Data { batches: Vec::new(), watermark: None }
        })
    }

    /// Whether a bounded lane that read to its stop may end: the state operators keep
    /// is checkpointed at barriers, and the checkpoint a run takes at the end of its input
    /// carries the state of its last barrier, so rows returned after that barrier would
    /// be missing from the state a later run restores. With exactly-once checkpoints the
    /// lane therefore waits, reading nothing more, until a checkpoint whose position
    /// covers its last rows is committed (one checkpoint interval at most).
    fn may_end(&self) -> bool {
        if !self.setup.end_after_checkpoint || !self.returned_rows {
            return true;
        }
        let committed = self.setup.shared.committed_lsn.load(Ordering::Acquire);
        self.position.lsn().is_some_and(|lsn| committed >= lsn)
    }

    fn end(&mut self) {
        self.phase = Phase::Ended;
        self.setup.shared.streaming.store(false, Ordering::Release);
    }

    fn decode_error(&self, what: &str) -> SluiceError {
        SluiceError::external(
            "source.postgres_cdc.decode",
            format!(
                "source `{}`: a malformed replication message after LSN {} (slot `{}`): {what}",
                self.setup.source,
                format_lsn(self.received_lsn),
                self.setup.options.slot
            ),
        )
        .with_fix("check that the slot uses the pgoutput plugin; report the server's version with this message")
    }

    fn handle(&mut self, message: Message) -> Result<(), SluiceError> {
        match message {
            Message::Begin { final_lsn, .. } => {
                let dropped = final_lsn < self.resume_lsn;
                self.transaction = Some(Transaction { changes: 0, dropped, returned: 0 });
            }
            Message::Commit { end_lsn, .. } => {
                let transaction = self.transaction.take();
                if transaction.is_some_and(|t| !t.dropped) {
                    self.commit_lsn = end_lsn;
                    self.committed = self.pending.len();
                    self.resumed_changes = 0;
                }
            }
            Message::Relation(relation) => self.relation(relation)?,
            Message::Insert { relation, new } => {
                if let Some(table) = self.change(relation)? {
                    let values = self.values(table, &new, None)?;
                    self.pending.push(Change { table, kind: RowKind::Insert, values });
                }
            }
            Message::Update { relation, old, new } => {
                if let Some(table) = self.change(relation)? {
                    let values = self.values(table, &new, old.as_ref().map(|(_, old)| old.as_slice()))?;
                    if let Some((_, old)) = &old {
                        let before = self.values(table, old, None)?;
                        self.pending.push(Change { table, kind: RowKind::UpdateBefore, values: before });
                    }
                    self.pending.push(Change { table, kind: RowKind::UpdateAfter, values });
                }
            }
            Message::Delete { relation, old: (_, old) } => {
                if let Some(table) = self.change(relation)? {
                    let values = self.values(table, &old, None)?;
                    self.pending.push(Change { table, kind: RowKind::Delete, values });
                }
            }
            Message::Truncate { relations } => {
                if let Some(table) = relations.iter().find_map(|oid| self.relations.get(oid).copied().flatten()) {
                    let captured = &self.setup.captured[table];
                    return Err(SluiceError::user(
                        "source.postgres_cdc.truncate",
                        format!(
                            "source `{}`: table {} was truncated (at LSN {}), which a changelog of rows cannot carry",
                            self.setup.source,
                            captured.qualified(),
                            format_lsn(self.received_lsn)
                        ),
                    )
                    .with_fix(format!(
                        "delete rows with DELETE instead of TRUNCATE, or leave TRUNCATE out of the publication \
                         (ALTER PUBLICATION {} SET (publish = 'insert, update, delete')); to go on, start the \
                         pipeline afresh (new state, the slot dropped)",
                        quote_identifier(&self.setup.options.publication)
                    )));
                }
            }
            Message::Origin { .. } | Message::Type { .. } | Message::Logical { .. } => {}
        }
        Ok(())
    }

    /// A change of `relation` in the open transaction: its captured table, or None when
    /// it is not captured or already returned.
    fn change(&mut self, relation: u32) -> Result<Option<usize>, SluiceError> {
        let Some(transaction) = self.transaction.as_mut() else {
            return Err(self.decode_error("a change outside a transaction"));
        };
        transaction.changes += 1;
        if transaction.dropped || transaction.changes <= self.resumed_changes.max(transaction.returned) {
            return Ok(None);
        }
        match self.relations.get(&relation) {
            Some(table) => Ok(*table),
            None => Err(self.decode_error(&format!("a change of relation {relation} before its Relation message"))),
        }
    }

    /// Checks a Relation message against the catalog read at planning.
    fn relation(&mut self, relation: Relation) -> Result<(), SluiceError> {
        let table =
            self.setup.captured.iter().position(|t| t.namespace == relation.namespace && t.name == relation.name);
        self.relations.insert(relation.oid, table);
        let Some(index) = table else { return Ok(()) };
        let captured = &self.setup.captured[index];
        let kinds: Vec<(String, String)> =
            relation.columns.iter().map(|c| (c.name.clone(), format!("{}:{}", c.type_oid, c.type_modifier))).collect();
        let known: Vec<(String, String)> =
            captured.columns.iter().map(|c| (c.name.clone(), format!("{}:{}", c.type_oid, c.type_modifier))).collect();
        let mut changes = catalog::column_changes(
            known.iter().map(|(n, k)| (n.as_str(), k.as_str())),
            kinds.iter().map(|(n, k)| (n.as_str(), k.as_str())),
        );
        if (relation.replica_identity == b'f') != captured.full_identity {
            changes.push(format!("REPLICA IDENTITY became '{}'", relation.replica_identity as char));
        }
        if changes.is_empty() {
            return Ok(());
        }
        let when = format!("while captured (at LSN {})", format_lsn(self.received_lsn));
        Err(catalog::schema_change(&self.setup.source, &captured.qualified(), &when, &changes))
    }

    /// A tuple's values: an unchanged TOAST value filled from `old` (FULL's old image).
    fn values(&self, table: usize, tuple: &[Value], old: Option<&[Value]>) -> Result<Vec<Option<Bytes>>, SluiceError> {
        let captured = &self.setup.captured[table];
        if tuple.len() != captured.columns.len() {
            return Err(self.decode_error(&format!(
                "a row of {} with {} values for {} columns",
                captured.qualified(),
                tuple.len(),
                captured.columns.len()
            )));
        }
        tuple
            .iter()
            .enumerate()
            .map(|(i, value)| match value {
                Value::Null => Ok(None),
                Value::Text(text) => Ok(Some(text.clone())),
                Value::Unchanged => match old.and_then(|old| old.get(i)) {
                    Some(Value::Text(text)) => Ok(Some(text.clone())),
                    Some(Value::Null) => Ok(None),
                    // A key-only old image, an unchanged value in an old image, or none.
                    _ => Err(SluiceError::user(
                        "source.postgres_cdc.toast",
                        format!(
                            "source `{}`: an update of {} at LSN {} left column `{}` unchanged and out of line, and \
                             the change carries no old value for it",
                            self.setup.source,
                            captured.qualified(),
                            format_lsn(self.received_lsn),
                            captured.columns[i].name
                        ),
                    )
                    .with_fix(format!(
                        "ALTER TABLE {}.{} REPLICA IDENTITY FULL, then start the pipeline afresh",
                        quote_identifier(&captured.namespace),
                        quote_identifier(&captured.name)
                    ))),
                },
            })
            .collect()
    }

    fn emit_committed(&mut self) -> Result<LanePoll, SluiceError> {
        let changes: Vec<Change> = self.pending.drain(..self.committed).collect();
        self.committed = 0;
        self.position = Position::Stream { lsn: self.commit_lsn, changes: 0 };
        let batches = self.batches(&changes)?;
        Ok(LanePoll::Data { batches, watermark: None })
    }

    /// Every pending change, the open transaction's included (it outgrew
    /// `transaction_rows_max`): the position counts its changes returned.
    fn emit_piece(&mut self) -> Result<LanePoll, SluiceError> {
        let changes: Vec<Change> = std::mem::take(&mut self.pending);
        self.committed = 0;
        let transaction = self.transaction.as_mut().expect("a piece is cut inside a transaction");
        if transaction.returned == 0 {
            tracing::info!(
                source = %self.setup.source,
                rows_max = self.setup.options.transaction_rows_max,
                "a transaction larger than transaction_rows_max is returned in pieces"
            );
        }
        transaction.returned = transaction.changes;
        self.position = Position::Stream { lsn: self.commit_lsn, changes: transaction.changes };
        let batches = self.batches(&changes)?;
        Ok(LanePoll::Data { batches, watermark: None })
    }

    /// `changes` as batches: consecutive rows of one table together, in order.
    fn batches(&mut self, changes: &[Change]) -> Result<Vec<(usize, RecordBatch)>, SluiceError> {
        self.returned_rows |= !changes.is_empty();
        let tables = Tables { source: &self.setup.source, captured: &self.setup.captured, schemas: &self.schemas };
        tables.batches(changes, self.received_lsn)
    }

    /// A status update when one is due: the committed checkpoint's LSN advanced, the
    /// server asked (`reply_requested`), or [`STATUS_INTERVAL`] passed.
    fn send_status(&mut self, reply_requested: bool) -> Result<(), SluiceError> {
        let committed = self.setup.shared.committed_lsn.load(Ordering::Acquire);
        if reply_requested || committed > self.confirmed_sent || self.last_status.elapsed() >= STATUS_INTERVAL {
            self.send_status_now(false)?;
        }
        Ok(())
    }

    fn send_status_now(&mut self, reply: bool) -> Result<(), SluiceError> {
        let committed = self.setup.shared.committed_lsn.load(Ordering::Acquire);
        // Never below where the stream resumed (the server keeps the greater).
        let flushed = committed.max(self.resume_lsn);
        self.connection
            .send_status(self.received_lsn.max(flushed), flushed, reply)
            .map_err(|e| self.stream_error("confirming a position", e))?;
        self.confirmed_sent = committed;
        self.last_status = Instant::now();
        Ok(())
    }
}

/// The phase and position of a lane that opened a snapshot (its slot just created, or
/// kept by a restart): its part of the snapshot to read, the snapshot published for the
/// other snapshot lanes. The position names the slot's consistent point, which a restart
/// during the snapshot streams from.
fn snapshot_phase(setup: &LaneSetup, mut opened: slot::OpenedSnapshot) -> Result<(Phase, Position), SluiceError> {
    let blocks = if setup.lanes > 1 {
        snapshot::table_blocks(&setup.source, &setup.endpoint, &mut opened.client, &setup.captured)?
    } else {
        Vec::new()
    };
    setup.shared.publish(Published::Snapshot {
        name: opened.snapshot_name,
        consistent_point: opened.consistent_point,
        blocks: blocks.clone(),
    });
    let reader = SnapshotReader::new(opened.client, Part { index: 0, count: setup.lanes }, blocks);
    let consistent_point = opened.consistent_point;
    let snapshot = Snapshot { reader: Some(reader), consistent_point, _exporter: opened.exporter };
    Ok((Phase::Snapshot(Box::new(snapshot)), Position::Snapshot { consistent_point: Some(consistent_point) }))
}

impl LaneReader for CdcLane {
    fn poll(&mut self) -> Result<LanePoll, SluiceError> {
        match self.phase {
            Phase::Snapshot(_) => self.poll_snapshot(),
            Phase::Stream => self.poll_stream(),
            Phase::Ended => Ok(LanePoll::Exhausted),
        }
    }

    fn position(&self) -> Vec<u8> {
        self.position.encode()
    }

    /// Not polled (its downstream is full): the session still sends a status update
    /// when one is due, so that the server's `wal_sender_timeout` does not end it. A
    /// failure here shows again at the next poll, which reads the session.
    fn blocked(&mut self) {
        if matches!(self.phase, Phase::Stream) && self.last_status.elapsed() >= STATUS_INTERVAL {
            let _ = self.send_status_now(false);
        }
    }
}

impl Drop for CdcLane {
    fn drop(&mut self) {
        self.setup.shared.streaming.store(false, Ordering::Release);
    }
}
