//! A snapshot lane after the first (`snapshot_lanes > 1`): it waits for lane 0 to
//! publish the slot's exported snapshot, imports it in a session of its own, reads its
//! part of every table, and ends. Its position then names the snapshot's consistent
//! point, which `checkpoint_committed` gives lane 0: the stream starts once a committed
//! checkpoint holds every part, so the barrier orders the parts' rows before any change.
//! When lane 0 streams from a checkpoint's position instead (no snapshot), it ends at
//! once. Its own position is never read back: lane 0 decides whether a snapshot is read.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use sluice_runtime::metrics::SourceMetrics;
use sluice_runtime::{LaneContext, LanePoll, LaneReader};
use sluice_types::SluiceError;

use super::catalog::CapturedTable;
use super::position::Position;
use super::protocol::Endpoint;
use super::rows::Tables;
use super::snapshot::{self, Part, SnapshotReader};
use super::{Published, Shared};

/// How long a snapshot lane waits between looks at what lane 0 published.
const PUBLISHED_PAUSE: Duration = Duration::from_millis(10);

/// What the snapshot lanes share with lane 0.
pub struct LaneTables {
    pub captured: Arc<Vec<CapturedTable>>,
    pub shared: Arc<Shared>,
}

/// A snapshot lane.
pub struct SnapshotLane {
    source: String,
    endpoint: Endpoint,
    tables: LaneTables,
    schemas: Vec<SchemaRef>,
    part: Part,
    batch_size: usize,
    metrics: Arc<SourceMetrics>,
    reader: Option<(SnapshotReader, u64)>,
    position: Position,
    ended: bool,
}

impl SnapshotLane {
    pub fn new(source: &str, endpoint: Endpoint, tables: LaneTables, part: Part, context: LaneContext) -> SnapshotLane {
        let schemas = tables.captured.iter().map(|t| crate::changelog::with_kinds_schema(&t.schema())).collect();
        SnapshotLane {
            source: source.to_owned(),
            endpoint,
            tables,
            schemas,
            part,
            batch_size: context.batch_size.max(1),
            metrics: context.metrics,
            reader: None,
            position: Position::Snapshot { consistent_point: None },
            ended: false,
        }
    }
}

impl LaneReader for SnapshotLane {
    fn poll(&mut self) -> Result<LanePoll, SluiceError> {
        if self.ended {
            return Ok(LanePoll::Exhausted);
        }
        if self.reader.is_none() {
            match self.tables.shared.published() {
                None => return Ok(LanePoll::Wait(Instant::now() + PUBLISHED_PAUSE)),
                Some(Published::NoSnapshot) => {
                    self.ended = true;
                    return Ok(LanePoll::Exhausted);
                }
                Some(Published::Snapshot { name, consistent_point, blocks }) => {
                    let client = snapshot::import(&self.source, &self.endpoint, &name)?;
                    self.reader = Some((SnapshotReader::new(client, self.part, blocks), consistent_point));
                }
            }
        }
        let (reader, consistent_point) = self.reader.as_mut().expect("the reader was just set");
        let consistent_point = *consistent_point;
        match reader.next(&self.source, &self.endpoint, &self.tables.captured, self.batch_size)? {
            Some((changes, bytes)) => {
                self.metrics.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                let tables = Tables { source: &self.source, captured: &self.tables.captured, schemas: &self.schemas };
                let batches = tables.batches(&changes, consistent_point)?;
                Ok(LanePoll::Data { batches, watermark: None })
            }
            None => {
                tracing::info!(source = %self.source, lane = self.part.index, "snapshot part read");
                self.position = Position::SnapshotDone { consistent_point };
                self.ended = true;
                self.reader = None;
                // The position moved: returned before the end, so a checkpoint takes it.
                Ok(LanePoll::Data { batches: Vec::new(), watermark: None })
            }
        }
    }

    fn position(&self) -> Vec<u8> {
        self.position.encode()
    }
}
