//! One lane reading the files of a changelog directory one after another, in name order.
//!
//! A key's changes must reach the normalization in the order they were made. Lanes of
//! one source run on different threads, and no order holds between what two threads
//! send, not even when one lane ends before the other starts: so the files of a
//! changelog directory are read by one lane, each file from its start to its end before
//! the next, and a key's changes may span files as long as the names sort in the order
//! the changes were made (as the `file` sink's parts do: `part-{epoch}-{slot}`).
//!
//! Each file is read by a [`FileLane`] of its range (a changelog file is never split),
//! so bad rows, line numbers and CSV headers are per file as with one lane per file. The
//! lane's watermark is the largest its files reached: a new file starts without one.
//!
//! The position is the file's index, the lane's watermark (`i64::MIN` for none) and the
//! file lane's position, 40 bytes; a position of any other length is refused (a
//! checkpoint laid out with one lane per file has as many lanes, which a restore refuses
//! before it reads a position).

use std::sync::Arc;

use sluice_runtime::{LaneContext, LanePoll, LaneReader};
use sluice_types::{SluiceError, TimestampMs};

use super::{FileLane, LaneRange, Shared};

/// The bytes of a chained lane's position: file index, watermark, file lane position.
const POSITION_BYTES: usize = 8 + 8 + 24;

/// A lane reading `ranges` (whole files) in order.
pub struct ChainedLane {
    shared: Arc<Shared>,
    ranges: Vec<LaneRange>,
    /// The file being read: an index into `ranges`.
    index: usize,
    lane: FileLane,
    /// What each file's lane is opened with (its `start` taken by the first).
    context: LaneContext,
    /// The largest watermark of the files read so far.
    watermark: Option<TimestampMs>,
    /// Resumed from a position: the watermark it had there is announced once.
    announce: bool,
}

impl ChainedLane {
    pub(crate) fn open(
        shared: Arc<Shared>,
        ranges: Vec<LaneRange>,
        mut context: LaneContext,
    ) -> Result<ChainedLane, SluiceError> {
        let (index, watermark, start) = match context.start.take() {
            Some(bytes) => {
                let (index, watermark, inner) = decode_position(&bytes)?;
                (index, watermark, Some(inner))
            }
            None => (0, None, None),
        };
        let range = ranges.get(index).cloned().ok_or_else(|| {
            SluiceError::internal(
                "source.position",
                format!("source `{}`: a position in file {index} of {} files", shared.name, ranges.len()),
            )
        })?;
        let announce = start.is_some();
        let lane = FileLane::open(Arc::clone(&shared), range, LaneContext { start, ..clone(&context) })?;
        Ok(ChainedLane { shared, ranges, index, lane, context, watermark, announce })
    }
}

fn clone(context: &LaneContext) -> LaneContext {
    LaneContext {
        lane: context.lane,
        batch_size: context.batch_size,
        tables_needed: context.tables_needed.clone(),
        metrics: Arc::clone(&context.metrics),
        start: None,
    }
}

fn encode_position(index: usize, watermark: Option<TimestampMs>, inner: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(POSITION_BYTES);
    bytes.extend_from_slice(&(index as u64).to_le_bytes());
    bytes.extend_from_slice(&watermark.unwrap_or(i64::MIN).to_le_bytes());
    bytes.extend_from_slice(inner);
    assert_eq!(bytes.len(), POSITION_BYTES, "a file lane's position is 24 bytes");
    bytes
}

fn decode_position(bytes: &[u8]) -> Result<(usize, Option<TimestampMs>, Vec<u8>), SluiceError> {
    if bytes.len() != POSITION_BYTES {
        return Err(SluiceError::internal(
            "source.position",
            format!("a changelog directory's position has {POSITION_BYTES} bytes, not {}", bytes.len()),
        ));
    }
    let word = |i: usize| <[u8; 8]>::try_from(&bytes[i * 8..i * 8 + 8]).expect("8 bytes");
    let index = usize::try_from(u64::from_le_bytes(word(0))).unwrap_or(usize::MAX);
    let watermark = i64::from_le_bytes(word(1));
    Ok((index, (watermark != i64::MIN).then_some(watermark), bytes[16..].to_vec()))
}

impl LaneReader for ChainedLane {
    fn poll(&mut self) -> Result<LanePoll, SluiceError> {
        if let Some(answer) = self.resumed() {
            return Ok(answer);
        }
        loop {
            match self.lane.poll()? {
                LanePoll::Data { batches, watermark } => {
                    self.watermark = self.watermark.max(watermark);
                    return Ok(LanePoll::Data { batches, watermark: self.watermark });
                }
                LanePoll::Exhausted if self.index + 1 < self.ranges.len() => {
                    self.index += 1;
                    let range = self.ranges[self.index].clone();
                    self.lane = FileLane::open(Arc::clone(&self.shared), range, clone(&self.context))?;
                }
                other => return Ok(other),
            }
        }
    }

    fn position(&self) -> Vec<u8> {
        encode_position(self.index, self.watermark, &self.lane.position())
    }

    fn resumed(&mut self) -> Option<LanePoll> {
        let inner = match self.lane.resumed() {
            Some(LanePoll::Data { watermark, .. }) => watermark,
            Some(other) => return Some(other),
            None => None,
        };
        if !std::mem::take(&mut self.announce) && inner.is_none() {
            return None;
        }
        self.watermark = self.watermark.max(inner);
        self.watermark.map(|watermark| LanePoll::Data { batches: Vec::new(), watermark: Some(watermark) })
    }

    fn blocked(&mut self) {
        self.lane.blocked();
    }
}
