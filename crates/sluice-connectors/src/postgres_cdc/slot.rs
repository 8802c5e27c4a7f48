//! The slot, over the replication session: its state (exists? confirmed where?), its
//! creation with an exported snapshot imported at once in a second session (before the
//! replication session runs another command, which would end the export), a new snapshot
//! on the slot kept by a restart during the snapshot (the slot checked to be the one the
//! first snapshot was taken at), and the server's WAL position (a bounded lane's stop).

use sluice_types::SluiceError;

use super::position::{format_lsn, parse_lsn};
use super::protocol::{ProtocolError, ReplicationConnection};
use super::setup::LaneSetup;
use crate::postgres::options::quote_identifier;

/// A snapshot to read before streaming from the slot's `consistent_point`: a session
/// holding it, its name (for the other snapshot lanes) and, when the replication
/// session does not export it, the session that does.
pub struct OpenedSnapshot {
    /// In a REPEATABLE READ transaction on the snapshot.
    pub client: postgres::Client,
    pub snapshot_name: String,
    pub consistent_point: u64,
    /// A restart's new snapshot: the session exporting it (`pg_export_snapshot()`), in
    /// its transaction, which must outlive every import (until the stream starts).
    pub exporter: Option<postgres::Client>,
}

pub fn missing_slot(setup: &LaneSetup, why: &str) -> SluiceError {
    SluiceError::user(
        "source.postgres_cdc.slot_missing",
        format!(
            "source `{}`: PostgreSQL at {} has no replication slot `{}` ({why})",
            setup.source,
            setup.endpoint.describe(),
            setup.options.slot
        ),
    )
    .with_fix(format!(
        "create it (SELECT pg_create_logical_replication_slot('{}', 'pgoutput')) or set create_slot = true \
         and start the pipeline afresh (a new state directory) to read a snapshot",
        setup.options.slot
    ))
}

/// The slot's confirmed position, or None when it does not exist.
pub fn slot_state(setup: &LaneSetup, connection: &mut ReplicationConnection) -> Result<Option<u64>, SluiceError> {
    let slot = setup.options.slot.replace('\'', "''");
    let rows = connection
        .query(&format!(
            "SELECT plugin::text, confirmed_flush_lsn::text, database::text FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
        .map_err(|e| session_error(setup, "reading pg_replication_slots", &e))?;
    let Some(row) = rows.first() else { return Ok(None) };
    if row.first().cloned().flatten().as_deref() != Some("pgoutput") {
        return Err(SluiceError::user(
            "source.postgres_cdc.slot_plugin",
            format!(
                "source `{}`: slot `{}` is not a logical slot of the pgoutput plugin",
                setup.source, setup.options.slot
            ),
        )
        .with_fix("name another slot with `slot`, or drop this one"));
    }
    Ok(Some(row.get(1).cloned().flatten().as_deref().and_then(parse_lsn).unwrap_or(0)))
}

fn session_error(setup: &LaneSetup, doing: &str, error: &ProtocolError) -> SluiceError {
    SluiceError::external(
        "source.postgres_cdc.session",
        format!("source `{}`: PostgreSQL at {}: {doing} failed: {error}", setup.source, setup.endpoint.describe()),
    )
}

/// Creates the slot with an exported snapshot and imports it in a second session.
pub fn create_slot(setup: &LaneSetup, connection: &mut ReplicationConnection) -> Result<OpenedSnapshot, SluiceError> {
    let command =
        format!("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT", quote_identifier(&setup.options.slot));
    let rows = connection.query(&command).map_err(|e| match &e {
        ProtocolError::Server(server) if server.code == "53400" => SluiceError::user(
            "source.postgres_cdc.max_replication_slots",
            format!("source `{}`: PostgreSQL at {}: {server}", setup.source, setup.endpoint.describe()),
        )
        .with_fix("raise max_replication_slots on the server (and restart it), or drop an unused slot"),
        _ => session_error(setup, &format!("creating slot `{}`", setup.options.slot), &e),
    })?;
    let row = rows
        .first()
        .ok_or_else(|| session_error(setup, "creating the slot", &ProtocolError::Unexpected("no row".into())))?;
    let consistent_point = row.get(1).cloned().flatten().as_deref().and_then(parse_lsn);
    let snapshot_name = row.get(2).cloned().flatten();
    let (Some(consistent_point), Some(snapshot_name)) = (consistent_point, snapshot_name) else {
        return Err(session_error(setup, "creating the slot", &ProtocolError::Unexpected(format!("the row {row:?}"))));
    };
    let client = super::snapshot::import(&setup.source, &setup.endpoint, &snapshot_name)?;
    tracing::info!(source = %setup.source, slot = %setup.options.slot, lsn = %format_lsn(consistent_point), "slot created; reading the snapshot");
    Ok(OpenedSnapshot { client, snapshot_name, consistent_point, exporter: None })
}

/// The consistent point a restart during the snapshot streams from: that of the slot
/// the first snapshot was taken at (`recorded`, None in a version 1 position), which
/// `confirmed` (the slot's confirmed position, None: no slot) must still be, since a
/// checkpoint during the snapshot never advances it. A slot dropped, created again or
/// advanced lost the changes that say which rows returned were since deleted: refused.
pub fn kept_point(setup: &LaneSetup, recorded: Option<u64>, confirmed: Option<u64>) -> Result<u64, SluiceError> {
    let slot = &setup.options.slot;
    let found = match (recorded, confirmed) {
        (Some(recorded), Some(confirmed)) if recorded == confirmed => return Ok(recorded),
        (None, Some(confirmed)) => {
            tracing::info!(source = %setup.source, slot, lsn = %format_lsn(confirmed), "a version 1 checkpoint names no consistent point: the slot's confirmed position is taken");
            return Ok(confirmed);
        }
        (_, None) => format!("has no slot `{slot}`"),
        (_, Some(confirmed)) => {
            format!("has a slot `{slot}` confirmed at {}: created again or advanced since", format_lsn(confirmed))
        }
    };
    let point = recorded.map_or_else(String::new, |lsn| format!(" at {}", format_lsn(lsn)));
    Err(SluiceError::user(
        "source.postgres_cdc.snapshot_slot_lost",
        format!(
            "source `{}`: the run stopped during its snapshot, taken{point} on slot `{slot}`, and PostgreSQL at {} \
             {found}: the slot's changes since that snapshot, which say which rows read before were deleted or \
             changed, are gone",
            setup.source,
            setup.endpoint.describe()
        ),
    )
    .with_fix(format!(
        "start the pipeline afresh (a new state directory and an emptied sink), with the slot dropped \
         (SELECT pg_drop_replication_slot('{slot}')) if it exists: it then reads a whole new snapshot"
    )))
}

/// A new snapshot for a restart during the snapshot, on the slot kept at
/// `consistent_point`: a session exports it from a REPEATABLE READ transaction and stays
/// open (so the other snapshot lanes can import it), and a second session imports it.
/// Every change committed after the point is streamed after it, those the snapshot
/// already holds too (the module's note says why that converges).
pub fn snapshot_again(setup: &LaneSetup, consistent_point: u64) -> Result<OpenedSnapshot, SluiceError> {
    let fail =
        |e: &postgres::Error| super::catalog::query_error(&setup.source, &setup.endpoint, "exporting a snapshot", e);
    let mut exporter = super::catalog::connect(&setup.source, &setup.endpoint)?;
    exporter.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").map_err(|e| fail(&e))?;
    let row =
        exporter.query_one("SELECT pg_export_snapshot(), pg_current_wal_lsn()::text", &[]).map_err(|e| fail(&e))?;
    let snapshot_name: String = row.try_get(0).map_err(|e| fail(&e))?;
    let now: String = row.try_get(1).map_err(|e| fail(&e))?;
    let client = super::snapshot::import(&setup.source, &setup.endpoint, &snapshot_name)?;
    tracing::warn!(
        source = %setup.source,
        slot = %setup.options.slot,
        from = %format_lsn(consistent_point),
        snapshot_at = %now,
        "the run stopped during its snapshot: the slot is kept, a new snapshot is read, and the changes from the \
         first snapshot's point on are applied again on top of it; those the new snapshot already holds may be \
         counted as duplicate inserts, deletes of unknown keys or out-of-order changes"
    );
    Ok(OpenedSnapshot { client, snapshot_name, consistent_point, exporter: Some(exporter) })
}

/// The server's WAL position now.
pub fn current_lsn(setup: &LaneSetup, connection: &mut ReplicationConnection) -> Result<u64, SluiceError> {
    let rows = connection
        .query("SELECT pg_current_wal_lsn()::text")
        .map_err(|e| session_error(setup, "reading pg_current_wal_lsn()", &e))?;
    rows.first().and_then(|row| row.first().cloned().flatten()).as_deref().and_then(parse_lsn).ok_or_else(|| {
        session_error(setup, "reading pg_current_wal_lsn()", &ProtocolError::Unexpected("no LSN".into()))
    })
}
