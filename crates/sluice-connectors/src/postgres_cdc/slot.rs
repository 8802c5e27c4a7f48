//! The slot, over the replication session: its state (exists? confirmed where?), its
//! creation with an exported snapshot imported at once in a second session (before the
//! replication session runs another command, which would end the export), dropping it,
//! and the server's WAL position (a bounded lane's stop).

use sluice_types::SluiceError;

use super::position::{format_lsn, parse_lsn};
use super::protocol::{ProtocolError, ReplicationConnection};
use super::setup::LaneSetup;
use crate::postgres::options::quote_identifier;

/// A slot just created: a session holding its snapshot, the snapshot's name (for the
/// other snapshot lanes) and the slot's consistent point.
pub struct CreatedSlot {
    /// In a REPEATABLE READ transaction on the slot's snapshot.
    pub client: postgres::Client,
    pub snapshot_name: String,
    pub consistent_point: u64,
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

pub fn drop_slot(setup: &LaneSetup, connection: &mut ReplicationConnection) -> Result<(), SluiceError> {
    let command = format!("DROP_REPLICATION_SLOT {}", quote_identifier(&setup.options.slot));
    connection.query(&command).map_err(|e| session_error(setup, "dropping the slot", &e))?;
    Ok(())
}

/// Creates the slot with an exported snapshot and imports it in a second session.
pub fn create_slot(setup: &LaneSetup, connection: &mut ReplicationConnection) -> Result<CreatedSlot, SluiceError> {
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
    Ok(CreatedSlot { client, snapshot_name, consistent_point })
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
