//! Snapshots of the join's state, split by vnode.
//!
//! At a barrier the driver copies the stored rows of both sides (each row's bytes are
//! shared, not copied: the chunks of bytes holding them are reference-counted) with
//! their weights, match counts and key hashes, and returns a job; the checkpoint writer
//! thread encodes the copy into one blob per vnode holding rows, the vnode of each row's
//! join key hash (the hash the exchange routes both inputs by), so a restore onto any
//! number of threads gives each row to the thread its key's future rows go to. It first
//! gathers each row's bytes into its vnode's buffer, reading the spilled rows back
//! ([`super::append`]) one chunk at a time, each chunk dropped once its rows are
//! gathered; then it sorts each vnode's rows into that vnode's blob, dropping the
//! buffer: the encoding holds about the rows' bytes once, never every spilled chunk as
//! well. Rows after the barrier change the live state, never the copy (a chunk a copy
//! shares is not appended to, and a compaction of the store leaves it to the copy). A
//! side whose rows expire holds equal rows apart as they arrived and leaves expired rows
//! out; the encoding merges equal rows into one (weights and match counts summed), so
//! the blob is the same as a side kept by row would write.
//!
//! Layout, version [`JOIN_STATE_VERSION`] (little-endian): `u32 version`, `u32 rows`,
//! then per distinct row, ordered by side and then by the row's bytes:
//! - `u8 side`: 0 left, 1 right;
//! - the row: `u32 length` + the side's columns, in order, in the key encoding of
//!   [`sluice_types::key`];
//! - `i64 weight`: its multiplicity, never 0;
//! - `i64 matches`: the summed weights of the other side's rows it joins with (0 from a
//!   side kept appended, [`super::append`], whose match counts are never read).
//!
//! The join key and its hash are recomputed from the row when restored, and so is a
//! row's expiry (an interval or window join's time index: the expiry's column is one
//! of the row's), so expiry needed no change of the layout. Decoding checks
//! every length against the remaining bytes, every row must decode as a row of its
//! side's schema and encode back to the same bytes, and no row may appear twice: a
//! blob from another plan or a damaged one is refused, never misread, and never panics.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use sluice_runtime::BlobJob;
use sluice_types::key::KeyRows;
use sluice_types::{SluiceError, vnode};

use super::store::{NEVER, RowRef};
use super::{JoinOperator, SharedRow, expiry_times};
use crate::blob::{BlobWriter, Reader};
use crate::partition::encode_keys;

/// The blob layout this build writes and reads.
pub const JOIN_STATE_VERSION: u32 = 1;
const VERSION: u32 = JOIN_STATE_VERSION;

/// The fewest bytes one row takes: side, length, weight, matches.
const MIN_ROW_BYTES: usize = 1 + 4 + 8 + 8;

/// One stored row, as copied at a barrier.
struct Copied {
    side: u8,
    key_hash: u64,
    row: SharedRow,
    weight: i64,
    matches: i64,
}

/// Copies the stored rows and returns the job that encodes them; None without state.
pub(super) fn snapshot(join: &JoinOperator) -> Option<BlobJob> {
    let mut copy = Vec::with_capacity(join.state_rows());
    for (side, state) in join.sides.iter().enumerate() {
        copy.extend(state.store.rows().map(|stored| Copied {
            side: side as u8,
            key_hash: stored.key_hash,
            row: stored.row,
            weight: stored.weight,
            matches: stored.matches,
        }));
    }
    if copy.is_empty() {
        return None;
    }
    let vnodes = join.vnodes;
    Some(Box::new(move || encode(copy, vnodes)))
}

/// One row gathered in its vnode's buffer: side, place in the buffer, weight, matches.
struct Gathered {
    side: u8,
    range: std::ops::Range<usize>,
    weight: i64,
    matches: i64,
}

/// The rows of one vnode, gathered: their bytes one after another.
struct VnodeRows {
    bytes: Vec<u8>,
    rows: Vec<Gathered>,
}

/// One blob per vnode holding rows, in vnode order, each ordered by side and then by
/// row. Equal rows of a side (an expiring side keeps each arrival apart) become one,
/// their weights and match counts summed: equal rows have equal keys, so one vnode.
fn encode(mut copy: Vec<Copied>, vnodes: u32) -> Result<Vec<(u32, Vec<u8>)>, SluiceError> {
    // Each vnode's buffers sized exactly: grown by doubling, they would take up to
    // twice the rows' bytes.
    let mut sizes: std::collections::BTreeMap<u32, (usize, usize)> = std::collections::BTreeMap::new();
    for row in &copy {
        let (bytes, rows) = sizes.entry(vnode::of_hash(row.key_hash, vnodes)).or_default();
        *bytes += row.row.range().len();
        *rows += 1;
    }
    let mut gathered: std::collections::BTreeMap<u32, VnodeRows> = (sizes.into_iter())
        .map(|(vnode, (bytes, rows))| {
            (vnode, VnodeRows { bytes: Vec::with_capacity(bytes), rows: Vec::with_capacity(rows) })
        })
        .collect();
    // Rows of one spilled chunk together, so that each chunk is read back once.
    copy.sort_unstable_by_key(|row| row.row.spilled().map_or(std::ptr::null(), Arc::as_ptr));
    let mut chunk: Option<(*const crate::spill::SpilledChunk, Vec<u8>)> = None;
    for row in copy {
        let bytes = match row.row.spilled() {
            None => row.row.bytes(),
            Some(spilled) => {
                if chunk.as_ref().is_none_or(|(held, _)| *held != Arc::as_ptr(spilled)) {
                    // The chunk before is dropped here: none of its rows is left.
                    chunk = Some((Arc::as_ptr(spilled), spilled.read()?));
                }
                &chunk.as_ref().expect("the row's chunk was just read").1[row.row.range()]
            }
        };
        let vnode = gathered.get_mut(&vnode::of_hash(row.key_hash, vnodes)).expect("every row's vnode was sized");
        let start = vnode.bytes.len();
        vnode.bytes.extend_from_slice(bytes);
        let range = start..vnode.bytes.len();
        vnode.rows.push(Gathered { side: row.side, range, weight: row.weight, matches: row.matches });
    }
    drop(chunk);
    let mut blobs = Vec::with_capacity(gathered.len());
    for (vnode, VnodeRows { bytes, mut rows }) in gathered {
        let row = |gathered: &Gathered| &bytes[gathered.range.clone()];
        rows.sort_by(|a, b| (a.side, row(a)).cmp(&(b.side, row(b))));
        rows.dedup_by(|later, kept| {
            let equal = later.side == kept.side && row(later) == row(kept);
            if equal {
                kept.weight += later.weight;
                kept.matches += later.matches;
            }
            equal
        });
        let mut blob = BlobWriter::new(VERSION);
        blob.reserve(vnode, rows.iter().map(|gathered| MIN_ROW_BYTES + gathered.range.len()).sum());
        for gathered in &rows {
            let out = blob.entry(vnode);
            out.push(gathered.side);
            let length = u32::try_from(gathered.range.len()).expect("a row shorter than 4 GiB");
            out.extend_from_slice(&length.to_le_bytes());
            out.extend_from_slice(row(gathered));
            out.extend_from_slice(&gathered.weight.to_le_bytes());
            out.extend_from_slice(&gathered.matches.to_le_bytes());
        }
        blobs.extend(blob.finish());
    }
    Ok(blobs)
}

fn corrupt(what: &str) -> SluiceError {
    crate::blob::corrupt(STATE, what)
}

/// The state's name in errors.
const STATE: &str = "join";

/// A row read from a blob: bytes, weight, matches.
type ReadRow<'a> = (&'a [u8], i64, i64);

/// Loads the rows of `blobs` (of the vnodes this instance owns) into `join`.
pub(super) fn restore(join: &mut JoinOperator, blobs: Vec<Vec<u8>>) -> Result<(), SluiceError> {
    // Every row read so far, per side: none may appear twice, in one blob or across them.
    let mut seen: [HashSet<&[u8]>; 2] = [HashSet::new(), HashSet::new()];
    for blob in &blobs {
        let mut reader = Reader::new(blob, STATE);
        if reader.u32()? != VERSION {
            return Err(corrupt("unknown version"));
        }
        let count = reader.u32()? as usize;
        if count > reader.remaining() / MIN_ROW_BYTES {
            return Err(corrupt("more rows than bytes"));
        }
        let mut sides: [Vec<ReadRow<'_>>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..count {
            let side = reader.u8()?;
            let row = reader.bytes()?;
            let weight = reader.i64()?;
            let matches = reader.i64()?;
            if weight == 0 {
                return Err(corrupt("a row of weight 0"));
            }
            let side = side as usize;
            let rows = sides.get_mut(side).ok_or_else(|| corrupt("a side other than left or right"))?;
            if !seen[side].insert(row) {
                return Err(corrupt("a row appears twice"));
            }
            rows.push((row, weight, matches));
        }
        reader.finish()?;
        for (side, rows) in sides.iter().enumerate() {
            load(join, side, rows)?;
        }
    }
    for side in &mut join.sides {
        side.store.restored();
    }
    Ok(())
}

/// Adds `rows` of one blob to side `side`'s store, after checking they are rows of its
/// schema in their canonical encoding.
fn load(join: &mut JoinOperator, side: usize, rows: &[ReadRow<'_>]) -> Result<(), SluiceError> {
    if rows.is_empty() {
        return Ok(());
    }
    let state = &mut join.sides[side];
    let another_plan = |_| corrupt("a row of another plan");
    let columns = state.row_encoder.decode(rows.iter().map(|r| r.0)).map_err(another_plan)?;
    let batch =
        RecordBatch::try_new(Arc::clone(&state.schema), columns).map_err(|_| corrupt("a row of another plan"))?;
    let mut encoded = KeyRows::default();
    state.row_encoder.encode(batch.columns(), &mut encoded).map_err(another_plan)?;
    let mut keys = KeyRows::default();
    encode_keys(&batch, &state.keys, &mut state.key_encoder, &mut keys).map_err(another_plan)?;
    // The time index is rebuilt from the rows (a row without a time, never stored by a
    // join with an expiry, goes at the first watermark).
    let expires = expiry_times(&batch, state.expiry);
    for (index, &(row, weight, matches)) in rows.iter().enumerate() {
        if encoded.row(index) != row {
            return Err(corrupt("a row not in its canonical encoding"));
        }
        if weight < 0 && state.expiry.is_some() {
            return Err(corrupt("a retracted row on a side whose rows expire"));
        }
        let expires = expires.as_ref().map_or(NEVER, |e| e[index].unwrap_or(i64::MIN));
        let row = RowRef { row, row_hash: encoded.hash(index), key: keys.row(index), key_hash: keys.hash(index) };
        state.store.apply(&row, weight, matches, expires)?;
    }
    Ok(())
}
