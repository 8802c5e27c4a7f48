//! Reading the slot's snapshot: a session importing it (`SET TRANSACTION SNAPSHOT` in a
//! REPEATABLE READ, READ ONLY transaction), then each table through a cursor,
//! `batch_size` rows per fetch, so memory holds one fetch. With several snapshot lanes
//! each reads one part of every table: a range of its blocks (`ctid`), the ranges cut
//! from the table's size in blocks when the snapshot was taken (rows visible in the
//! snapshot lie below it; the last part is open-ended), which PostgreSQL 14 and later
//! read as TID range scans.

use bytes::Bytes;
use postgres::{Client, SimpleQueryMessage};
use sluice_types::{RowKind, SluiceError};

use super::catalog::{self, CapturedTable};
use super::protocol::Endpoint;
use super::rows::Change;
use crate::postgres::options::quote_identifier;

/// Which part of every table a lane reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub index: u32,
    pub count: u32,
}

/// A session on the snapshot `name` (exported by the slot's creation).
pub fn import(source: &str, endpoint: &Endpoint, name: &str) -> Result<Client, SluiceError> {
    let mut client = catalog::connect(source, endpoint)?;
    let statement = format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{}'",
        name.replace('\'', "''")
    );
    client
        .batch_execute(&statement)
        .map_err(|e| catalog::query_error(source, endpoint, "importing the slot's snapshot", &e))?;
    Ok(client)
}

/// Each table's size in blocks, read in the snapshot's session.
pub fn table_blocks(
    source: &str,
    endpoint: &Endpoint,
    client: &mut Client,
    captured: &[CapturedTable],
) -> Result<Vec<u64>, SluiceError> {
    captured
        .iter()
        .map(|table| {
            let name = format!("{}.{}", quote_identifier(&table.namespace), quote_identifier(&table.name));
            let row = client
                .query_one(
                    "SELECT (pg_relation_size($1::text::regclass) / current_setting('block_size')::bigint)",
                    &[&name],
                )
                .map_err(|e| catalog::query_error(source, endpoint, "reading a table's size", &e))?;
            Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
        })
        .collect()
}

/// The snapshot's reader of one part.
pub struct SnapshotReader {
    client: Client,
    part: Part,
    /// Each table's size in blocks at the snapshot (only read with several parts).
    blocks: Vec<u64>,
    /// The table whose cursor is open (or next to open).
    table: usize,
    cursor_open: bool,
}

impl SnapshotReader {
    pub fn new(client: Client, part: Part, blocks: Vec<u64>) -> SnapshotReader {
        assert!(part.index < part.count, "part {part:?}");
        SnapshotReader { client, part, blocks, table: 0, cursor_open: false }
    }

    /// The next rows (none when a table just ended), or None once every table is read
    /// (the transaction then ended).
    pub fn next(
        &mut self,
        source: &str,
        endpoint: &Endpoint,
        captured: &[CapturedTable],
        batch_size: usize,
    ) -> Result<Option<(Vec<Change>, usize)>, SluiceError> {
        let fail = |doing: &str, e: &postgres::Error| catalog::query_error(source, endpoint, doing, e);
        if self.table == captured.len() {
            self.client.batch_execute("COMMIT").map_err(|e| fail("ending the snapshot", &e))?;
            return Ok(None);
        }
        let table = &captured[self.table];
        let reading = format!("reading {}", table.qualified());
        if !self.cursor_open {
            let statement = format!("DECLARE sluice_snapshot NO SCROLL CURSOR FOR {}", self.select(table));
            self.client.batch_execute(&statement).map_err(|e| fail(&reading, &e))?;
            self.cursor_open = true;
        }
        let fetch = format!("FETCH {batch_size} FROM sluice_snapshot");
        let messages = self.client.simple_query(&fetch).map_err(|e| fail(&reading, &e))?;
        let mut changes = Vec::new();
        let mut bytes = 0;
        for message in &messages {
            if let SimpleQueryMessage::Row(row) = message {
                let values: Vec<Option<Bytes>> =
                    (0..row.len()).map(|i| row.get(i).map(|v| Bytes::copy_from_slice(v.as_bytes()))).collect();
                bytes += values.iter().flatten().map(Bytes::len).sum::<usize>();
                changes.push(Change { table: self.table, kind: RowKind::Insert, values });
            }
        }
        if changes.is_empty() {
            self.client.batch_execute("CLOSE sluice_snapshot").map_err(|e| fail("closing a cursor", &e))?;
            self.cursor_open = false;
            self.table += 1;
        }
        Ok(Some((changes, bytes)))
    }

    /// The query of this part of `table`.
    fn select(&self, table: &CapturedTable) -> String {
        let columns: Vec<String> = table.columns.iter().map(|c| quote_identifier(&c.name)).collect();
        let mut query = format!(
            "SELECT {} FROM {}.{}",
            columns.join(", "),
            quote_identifier(&table.namespace),
            quote_identifier(&table.name)
        );
        if self.part.count > 1 {
            let blocks = self.blocks.get(self.table).copied().unwrap_or(0);
            let per_part = blocks.div_ceil(u64::from(self.part.count)).max(1);
            let start = per_part * u64::from(self.part.index);
            query.push_str(&format!(" WHERE ctid >= '({start},0)'::tid"));
            if self.part.index + 1 < self.part.count {
                query.push_str(&format!(" AND ctid < '({},0)'::tid", start + per_part));
            }
        }
        query
    }
}
