//! What a lane of the source opens with: its part of the plan, shared with the slot's
//! operations (`slot`) and the lane (`lane`).

use std::sync::Arc;

use sluice_runtime::metrics::SourceMetrics;

use super::Shared;
use super::catalog::CapturedTable;
use super::options::CdcOptions;
use super::position::Position;
use super::protocol::Endpoint;

/// What a lane opens with.
pub struct LaneSetup {
    /// The source's lanes: this one and the snapshot lanes after it.
    pub lanes: u32,
    pub source: String,
    pub endpoint: Endpoint,
    pub options: CdcOptions,
    pub captured: Arc<Vec<CapturedTable>>,
    pub shared: Arc<Shared>,
    pub batch_size: usize,
    pub metrics: Arc<SourceMetrics>,
    pub start: Option<Position>,
    /// Bounded: end only once a committed checkpoint covers the last rows returned (see
    /// `lane::CdcLane::may_end`).
    pub end_after_checkpoint: bool,
}
