//! A snapshot's records gathered, then written in `(vnode, key)` order, within a bounded
//! amount of memory.
//!
//! A snapshot job produces its records in the state's own order (a join's rows as they
//! arrived, an aggregate's groups in hash order); a run takes them sorted. [`Records`]
//! appends each record's bytes once to a batch in memory. When a batch holds
//! [`BATCH_BYTES`] and another record comes, the batch is sorted and written to a
//! scratch file (anonymous, created already unlinked in the sink's scratch directory,
//! the worker's `state_dir`, so a crash leaves nothing behind), and a new batch starts.
//! [`Records::write`] writes a lone batch straight from memory, or spills the last one
//! too and merges them all. A snapshot job therefore holds at most one batch (and the
//! record that filled it), then one read buffer and one key per spilled batch, whatever
//! the size of its state.
//!
//! **Sorting.** Entries are sorted by vnode first (a stable sort of 4-byte keys); each
//! vnode's entries are sorted by key only when they are not in order already. Records
//! that come in key order within their vnode (a join's appended rows: side, arrival
//! number) cost one comparison each.
//!
//! **Equal keys.** Of records with one key, the last put added wins; a key with only
//! deletes is deleted (a row removed, then stored again, is stored; a delete never
//! hides a put of the same snapshot). A spilled batch keeps one record per key, the
//! winner within the batch, and the merge applies the same rule across batches, older
//! batches first.
//!
//! **The scratch encoding** lives only as long as the job and never leaves the process
//! (so it has no version): per record, its vnode (u32 LE), 0 for a put or 1 for a
//! delete (u8), the key's and the value's lengths (u32 LE each), the key, the value.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use sluice_state::StateSink;
use sluice_types::SluiceError;

/// The bytes a batch holds in memory (record bytes and entries) before it is spilled.
pub(crate) const BATCH_BYTES: usize = 32 << 20;

/// The bytes of a batch past which it reserves its whole room.
const RESERVE_AFTER: usize = 1 << 20;

/// The bytes read from the scratch file at a time, per spilled batch.
const READ_BYTES: usize = 256 << 10;

/// Writes a record's bytes.
pub(crate) type WriteBytes<'a> = dyn Fn(&mut Vec<u8>) + 'a;

/// A range delete: `(vnode, start, end)`.
type RangeDelete = (u32, Vec<u8>, Vec<u8>);

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Records {
    batch: Batch,
    ranges: Vec<RangeDelete>,
    /// The batches spilled so far, oldest first.
    spilled: Vec<Region>,
    scratch: Option<File>,
    /// Where the scratch file goes (None: the system's temporary directory).
    dir: Option<PathBuf>,
    batch_bytes: usize,
    /// The first failure to spill: records added after it are dropped (the snapshot
    /// fails whatever they are, and memory stays bounded), and `write` fails with it.
    failed: Option<SluiceError>,
}

impl Default for Records {
    fn default() -> Records {
        Records::new(None)
    }
}

#[derive(Debug, Default)]
struct Batch {
    bytes: Vec<u8>,
    entries: Vec<RecordEntry>,
}

#[derive(Debug, Clone, Copy)]
struct RecordEntry {
    vnode: u32,
    /// `bytes[start..middle]` is the key, `bytes[middle..end]` the value.
    start: usize,
    middle: usize,
    end: usize,
    delete: bool,
}

/// A spilled batch: `length` bytes of the scratch file from `offset`.
#[derive(Debug, Clone, Copy)]
struct Region {
    offset: u64,
    length: u64,
}

/// One record as the merge sees it.
#[derive(Debug, Clone, Copy)]
struct Point<'a> {
    vnode: u32,
    key: &'a [u8],
    /// None: a delete.
    value: Option<&'a [u8]>,
}

impl Records {
    /// Records spilling into `dir` (the sink's scratch directory; None: the system's
    /// temporary directory).
    pub(crate) fn new(dir: Option<&Path>) -> Records {
        Records::with_batch_bytes(dir, BATCH_BYTES)
    }

    /// Records for a snapshot job writing into `sink`.
    pub(crate) fn for_sink(sink: &dyn StateSink) -> Records {
        Records::new(sink.scratch_dir())
    }

    fn with_batch_bytes(dir: Option<&Path>, batch_bytes: usize) -> Records {
        Records {
            batch: Batch::default(),
            ranges: Vec::new(),
            spilled: Vec::new(),
            scratch: None,
            dir: dir.map(Path::to_path_buf),
            batch_bytes,
            failed: None,
        }
    }

    /// Adds a record: `key` writes its key, then `value` its value (None: a delete).
    pub(crate) fn add(&mut self, vnode: u32, key: impl FnOnce(&mut Vec<u8>), value: Option<&WriteBytes<'_>>) {
        self.spill_if_full();
        if self.failed.is_some() {
            return;
        }
        let bytes = &mut self.batch.bytes;
        let start = bytes.len();
        key(bytes);
        let middle = bytes.len();
        if let Some(value) = value {
            value(bytes);
        }
        let end = bytes.len();
        self.batch.entries.push(RecordEntry { vnode, start, middle, end, delete: value.is_none() });
    }

    /// Adds a put whose value `value` writes, failing as it fails (a spilled row read
    /// back).
    pub(crate) fn try_put(
        &mut self,
        vnode: u32,
        key: &[u8],
        value: impl FnOnce(&mut Vec<u8>) -> Result<(), SluiceError>,
    ) -> Result<(), SluiceError> {
        self.spill_if_full();
        if self.failed.is_some() {
            return Ok(());
        }
        let bytes = &mut self.batch.bytes;
        let start = bytes.len();
        bytes.extend_from_slice(key);
        let middle = bytes.len();
        if let Err(error) = value(bytes) {
            bytes.truncate(start);
            return Err(error);
        }
        let end = bytes.len();
        self.batch.entries.push(RecordEntry { vnode, start, middle, end, delete: false });
        Ok(())
    }

    /// Adds a range delete of `vnode`.
    pub(crate) fn delete_range(&mut self, vnode: u32, start: Vec<u8>, end: Vec<u8>) {
        self.ranges.push((vnode, start, end));
    }

    /// Before a record is added: spills the batch if it is full. (Checked before, not
    /// after, so that the last batch stays in memory and a snapshot that fits one batch,
    /// or holds one large record, such as a group's COUNT(DISTINCT) set, never spills.)
    fn spill_if_full(&mut self) {
        let bytes = &mut self.batch.bytes;
        if bytes.len() >= RESERVE_AFTER && bytes.capacity() < self.batch_bytes {
            // A batch that grows large gets its whole room at once, rather than by
            // doubling past it (and keeps it for the batches after a spill).
            bytes.reserve_exact(self.batch_bytes + RESERVE_AFTER - bytes.len());
        }
        let held = self.batch.bytes.len() + self.batch.entries.len() * size_of::<RecordEntry>();
        if held < self.batch_bytes {
            return;
        }
        if self.failed.is_some() {
            return;
        }
        if let Err(error) = self.spill() {
            self.batch = Batch::default();
            self.failed = Some(error);
        }
    }

    /// Sorts the batch in memory and appends its winners to the scratch file.
    fn spill(&mut self) -> Result<(), SluiceError> {
        let dir = self.dir.clone();
        let failed = |error: std::io::Error| scratch_error(dir.as_deref(), error);
        if self.scratch.is_none() {
            let file = match &self.dir {
                Some(dir) => tempfile::tempfile_in(dir),
                None => tempfile::tempfile(),
            };
            self.scratch = Some(file.map_err(failed)?);
        }
        let file = self.scratch.as_ref().expect("the scratch file was just created");
        let offset = self.spilled.last().map_or(0, |region| region.offset + region.length);
        let mut out = BufWriter::with_capacity(READ_BYTES, FileAt { file, at: offset });
        self.batch.sort();
        let mut length = 0u64;
        for point in self.batch.winners() {
            let header = encode_header(point);
            out.write_all(&header).map_err(failed)?;
            out.write_all(point.key).map_err(failed)?;
            out.write_all(point.value.unwrap_or_default()).map_err(failed)?;
            length += (header.len() + point.key.len() + point.value.map_or(0, <[u8]>::len)) as u64;
        }
        out.flush().map_err(failed)?;
        self.spilled.push(Region { offset, length });
        self.batch.bytes.clear();
        self.batch.entries.clear();
        Ok(())
    }

    /// Writes every record into `sink` in `(vnode, key)` order, each vnode's range
    /// deletes first (see the module documentation for records of equal keys).
    pub(crate) fn write(mut self, sink: &mut dyn StateSink) -> Result<(), SluiceError> {
        if let Some(error) = self.failed.take() {
            return Err(error);
        }
        let mut ranges = std::mem::take(&mut self.ranges);
        ranges.sort();
        let mut ranges = ranges.into_iter().peekable();
        let mut emit = |sink: &mut dyn StateSink, point: Point<'_>| -> Result<(), SluiceError> {
            while let Some((vnode, start, end)) = ranges.next_if(|range| range.0 <= point.vnode) {
                sink.delete_range(vnode, &start, &end)?;
            }
            match point.value {
                Some(value) => sink.put(point.vnode, point.key, value),
                None => sink.delete(point.vnode, point.key),
            }
        };
        if self.spilled.is_empty() {
            self.batch.sort();
            for point in self.batch.winners() {
                emit(sink, point)?;
            }
        } else {
            // The last batch joins the others on disk: the merge then reads every batch
            // the same way, and holds one read buffer of each.
            if !self.batch.entries.is_empty() {
                self.spill()?;
            }
            // The merge needs the batch's room no more.
            self.batch = Batch::default();
            let file = self.scratch.as_ref().expect("batches were spilled into the scratch file");
            let dir = self.dir.as_deref();
            let cursors = self.spilled.iter().map(|region| SpilledCursor::new(file, *region, dir)).collect();
            merge(cursors, |point| emit(sink, point))?;
        }
        for (vnode, start, end) in ranges {
            sink.delete_range(vnode, &start, &end)?;
        }
        Ok(())
    }
}

/// Merges the spilled batches (oldest first), giving `emit` each key's winner in
/// `(vnode, key)` order.
fn merge(
    mut cursors: Vec<SpilledCursor<'_>>,
    mut emit: impl FnMut(Point<'_>) -> Result<(), SluiceError>,
) -> Result<(), SluiceError> {
    // The heap holds each cursor's next key (equal keys pop oldest batch first), led by
    // its first 8 bytes as a number, which orders most keys without comparing their
    // bytes; a key's buffer goes back into the heap with the cursor's following key.
    let mut heap = BinaryHeap::with_capacity(cursors.len());
    for (index, cursor) in cursors.iter_mut().enumerate() {
        if cursor.fill_record()? {
            let point = cursor.current();
            heap.push(Reverse((point.vnode, prefix(point.key), point.key.to_vec(), index)));
        }
    }
    let mut group: Vec<(usize, Vec<u8>)> = Vec::new();
    while let Some(Reverse((vnode, first, key, index))) = heap.pop() {
        group.clear();
        group.push((index, key));
        while let Some(Reverse((next_vnode, next_first, next_key, _))) = heap.peek() {
            if (*next_vnode, *next_first) != (vnode, first) || *next_key != group[0].1 {
                break;
            }
            let Reverse((_, _, key, index)) = heap.pop().expect("the heap's top was just seen");
            group.push((index, key));
        }
        let puts = group.iter().rev().find(|(index, _)| cursors[*index].current().value.is_some());
        let winner = puts.unwrap_or(&group[group.len() - 1]).0;
        emit(cursors[winner].current())?;
        for (index, mut key) in group.drain(..) {
            let cursor = &mut cursors[index];
            cursor.advance();
            if cursor.fill_record()? {
                let point = cursor.current();
                key.clear();
                key.extend_from_slice(point.key);
                heap.push(Reverse((point.vnode, prefix(point.key), key, index)));
            }
        }
    }
    Ok(())
}

impl Batch {
    fn key(&self, entry: &RecordEntry) -> &[u8] {
        &self.bytes[entry.start..entry.middle]
    }

    /// Sorts the entries by `(vnode, key)`, keeping equal keys in the order they came.
    fn sort(&mut self) {
        self.entries.sort_by_key(|entry| entry.vnode);
        let bytes = &self.bytes;
        let key = |entry: &RecordEntry| &bytes[entry.start..entry.middle];
        for vnode in self.entries.chunk_by_mut(|a, b| a.vnode == b.vnode) {
            if !vnode.windows(2).all(|pair| key(&pair[0]) <= key(&pair[1])) {
                vnode.sort_by(|a, b| key(a).cmp(key(b)));
            }
        }
    }

    /// The sorted entries' winners, one per key: the last put, or the last delete when
    /// there is no put.
    fn winners(&self) -> impl Iterator<Item = Point<'_>> + '_ {
        self.entries.chunk_by(|a, b| a.vnode == b.vnode && self.key(a) == self.key(b)).map(|same| {
            let entry = same.iter().rev().find(|entry| !entry.delete).unwrap_or(&same[same.len() - 1]);
            let value = (!entry.delete).then(|| &self.bytes[entry.middle..entry.end]);
            Point { vnode: entry.vnode, key: self.key(entry), value }
        })
    }
}

/// Reads one spilled batch's records back, [`READ_BYTES`] at a time.
struct SpilledCursor<'a> {
    file: &'a File,
    /// The next byte to read from the file, and where the batch ends.
    next: u64,
    end: u64,
    buffer: Vec<u8>,
    /// Where the current record starts in `buffer`, and its length once read whole.
    at: usize,
    length: usize,
    dir: Option<&'a Path>,
}

impl<'a> SpilledCursor<'a> {
    fn new(file: &'a File, region: Region, dir: Option<&'a Path>) -> SpilledCursor<'a> {
        let end = region.offset + region.length;
        SpilledCursor { file, next: region.offset, end, buffer: Vec::new(), at: 0, length: 0, dir }
    }

    /// Makes at least `bytes` bytes readable from `at` (false: the batch ends first).
    fn fill(&mut self, bytes: usize) -> Result<bool, SluiceError> {
        if self.buffer.len() - self.at >= bytes {
            return Ok(true);
        }
        self.buffer.drain(..self.at);
        self.at = 0;
        let wanted = (bytes - self.buffer.len()).max(READ_BYTES) as u64;
        let length = wanted.min(self.end - self.next) as usize;
        if length > 0 {
            let held = self.buffer.len();
            self.buffer.resize(held + length, 0);
            let read = self.file.read_exact_at(&mut self.buffer[held..], self.next);
            read.map_err(|error| scratch_error(self.dir, error))?;
            self.next += length as u64;
        }
        Ok(self.buffer.len() >= bytes)
    }

    /// Reads the next record whole into the buffer (false: the batch has ended).
    fn fill_record(&mut self) -> Result<bool, SluiceError> {
        if !self.fill(HEADER_BYTES)? {
            assert_eq!(self.buffer.len(), self.at, "a spilled batch ends at a record's end");
            return Ok(false);
        }
        let (key_length, value_length) = header_lengths(&self.buffer[self.at..]);
        self.length = HEADER_BYTES + key_length + value_length;
        assert!(self.fill(self.length)?, "a spilled record is written whole");
        Ok(true)
    }

    /// The record [`SpilledCursor::fill_record`] read.
    fn current(&self) -> Point<'_> {
        let record = &self.buffer[self.at..self.at + self.length];
        let vnode = u32::from_le_bytes(record[0..4].try_into().expect("4 bytes"));
        let (key_length, _) = header_lengths(record);
        let (key, value) = record[HEADER_BYTES..].split_at(key_length);
        Point { vnode, key, value: (record[4] == 0).then_some(value) }
    }

    fn advance(&mut self) {
        self.at += self.length;
        self.length = 0;
    }
}

/// A key's first 8 bytes (zeros after a shorter key's end) as a big-endian number: keys
/// in order have prefixes in order, so two keys of different prefixes compare as them.
fn prefix(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let length = key.len().min(8);
    bytes[..length].copy_from_slice(&key[..length]);
    u64::from_be_bytes(bytes)
}

fn header_lengths(header: &[u8]) -> (usize, usize) {
    let key = u32::from_le_bytes(header[5..9].try_into().expect("4 bytes")) as usize;
    let value = u32::from_le_bytes(header[9..13].try_into().expect("4 bytes")) as usize;
    (key, value)
}

const HEADER_BYTES: usize = 13;

fn encode_header(point: Point<'_>) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[0..4].copy_from_slice(&point.vnode.to_le_bytes());
    header[4] = u8::from(point.value.is_none());
    let key_length = u32::try_from(point.key.len()).expect("a record's key is shorter than 4 GiB");
    let value_length =
        u32::try_from(point.value.map_or(0, <[u8]>::len)).expect("a record's value is shorter than 4 GiB");
    header[5..9].copy_from_slice(&key_length.to_le_bytes());
    header[9..13].copy_from_slice(&value_length.to_le_bytes());
    header
}

/// Writes at increasing offsets of a file shared by reference.
struct FileAt<'a> {
    file: &'a File,
    at: u64,
}

impl Write for FileAt<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.file.write_all_at(bytes, self.at)?;
        self.at += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A snapshot's records could not be spilled to, or read back from, the scratch
/// directory.
fn scratch_error(dir: Option<&Path>, error: std::io::Error) -> SluiceError {
    let dir = dir.map_or_else(|| std::env::temp_dir().display().to_string(), |dir| dir.display().to_string());
    SluiceError::external(
        "state.dir_write",
        format!("cannot sort a snapshot's records in {dir} ({BATCH_BYTES} bytes at a time): {error}"),
    )
    .with_fix(
        "free space on that disk, or set [pipeline] state_dir to a writable local directory with room for the state",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sluice_state::CollectedState;
    use std::collections::BTreeMap;

    #[test]
    fn records_come_out_sorted_with_a_put_winning_over_a_delete_of_its_key() {
        let mut records = Records::default();
        records.add(2, |k| k.extend_from_slice(b"b"), Some(&|v: &mut Vec<u8>| v.push(1)));
        records.add(1, |k| k.extend_from_slice(b"z"), None);
        records.add(2, |k| k.extend_from_slice(b"a"), None);
        records.add(2, |k| k.extend_from_slice(b"a"), Some(&|v: &mut Vec<u8>| v.push(2)));
        records.add(2, |k| k.extend_from_slice(b"a"), None);
        records.delete_range(2, b"0".to_vec(), b"1".to_vec());
        let mut collected = sluice_state::CollectedState::default();
        records.write(&mut collected).expect("written");
        assert_eq!(collected.ranges, [(2, b"0".to_vec(), b"1".to_vec())]);
        assert_eq!(
            collected.points,
            [(1, b"z".to_vec(), None), (2, b"a".to_vec(), Some(vec![2])), (2, b"b".to_vec(), Some(vec![1]))]
        );
    }

    /// A record: vnode, key, value (None: a delete).
    type Added = (u32, Vec<u8>, Option<Vec<u8>>);

    /// What the records must write: per `(vnode, key)`, the last put, else a delete.
    fn model(added: &[Added]) -> Vec<Added> {
        let mut winners: BTreeMap<(u32, Vec<u8>), Option<Vec<u8>>> = BTreeMap::new();
        for (vnode, key, value) in added {
            let slot = winners.entry((*vnode, key.clone())).or_insert(None);
            if value.is_some() {
                *slot = value.clone();
            }
        }
        winners.into_iter().map(|((vnode, key), value)| (vnode, key, value)).collect()
    }

    fn written(records: Records) -> CollectedState {
        let mut collected = CollectedState::default();
        records.write(&mut collected).expect("written");
        collected
    }

    proptest! {
        /// Spilled in batches of a few records or kept in memory, the records written are
        /// the model's, in order.
        #[test]
        fn spilled_batches_merge_into_what_one_batch_writes(
            added in proptest::collection::vec(
                (0u32..4, proptest::collection::vec(0u8..4, 0..3), proptest::option::of(proptest::collection::vec(any::<u8>(), 0..4))),
                0..200,
            ),
            batch_bytes in 1usize..400,
            ranges in proptest::collection::vec((0u32..5, 0u8..3), 0..4),
        ) {
            let dir = tempfile::tempdir().expect("a scratch directory");
            let mut small = Records::with_batch_bytes(Some(dir.path()), batch_bytes);
            let mut whole = Records::with_batch_bytes(None, usize::MAX);
            for records in [&mut small, &mut whole] {
                for (vnode, key, value) in &added {
                    let write_value = value.as_ref().map(|value| move |out: &mut Vec<u8>| out.extend_from_slice(value));
                    records.add(*vnode, |out| out.extend_from_slice(key), write_value.as_ref().map(|w| w as &WriteBytes<'_>));
                }
                for (vnode, start) in &ranges {
                    records.delete_range(*vnode, vec![*start], vec![*start + 1]);
                }
            }
            let spilled = !small.spilled.is_empty();
            let (small, whole) = (written(small), written(whole));
            prop_assert_eq!(&small.points, &model(&added));
            prop_assert_eq!(&small.points, &whole.points);
            let mut expected_ranges: Vec<_> = ranges.iter().map(|(vnode, start)| (*vnode, vec![*start], vec![*start + 1])).collect();
            expected_ranges.sort();
            prop_assert_eq!(&small.ranges, &expected_ranges);
            // A full batch spills when the next record comes: the last record never
            // makes one spill.
            let held: usize = added
                .iter()
                .take(added.len().saturating_sub(1))
                .map(|(_, key, value)| key.len() + value.as_ref().map_or(0, Vec::len) + size_of::<RecordEntry>())
                .sum();
            prop_assert_eq!(spilled, held >= batch_bytes, "a batch spills when it is full and another record comes");
        }
    }

    proptest! {
        #[test]
        fn prefixes_order_as_their_keys(a in proptest::collection::vec(any::<u8>(), 0..12), b in proptest::collection::vec(any::<u8>(), 0..12)) {
            if a < b {
                prop_assert!(prefix(&a) <= prefix(&b));
            }
        }
    }

    #[test]
    fn one_large_record_never_spills() {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let mut records = Records::with_batch_bytes(Some(dir.path()), 64);
        records.add(
            3,
            |out| out.extend_from_slice(b"group"),
            Some(&|out: &mut Vec<u8>| out.extend(std::iter::repeat_n(7u8, 1000))),
        );
        assert!(records.spilled.is_empty() && records.scratch.is_none());
        let points = written(records).points;
        assert_eq!(points, [(3, b"group".to_vec(), Some(vec![7; 1000]))]);
    }

    #[test]
    fn records_in_key_order_within_their_vnodes_keep_that_order() {
        let mut records = Records::default();
        for arrival in 0u64..1000 {
            let vnode = (arrival * 7 % 5) as u32;
            records.add(
                vnode,
                |out| out.extend_from_slice(&arrival.to_be_bytes()),
                Some(&|out: &mut Vec<u8>| out.push(1)),
            );
        }
        let points = written(records).points;
        assert_eq!(points.len(), 1000);
        assert!(points.windows(2).all(|pair| (pair[0].0, &pair[0].1) < (pair[1].0, &pair[1].1)));
    }

    #[test]
    fn an_unwritable_scratch_directory_fails_the_write_names_it_and_holds_nothing_more() {
        let missing = std::path::Path::new("/nonexistent/sluice-scratch");
        let mut records = Records::with_batch_bytes(Some(missing), 10);
        for key in 0u8..10 {
            records.add(0, |out| out.push(key), Some(&|out: &mut Vec<u8>| out.push(key)));
        }
        assert!(records.batch.entries.len() <= 1, "records after the failure are not held");
        let error = records.write(&mut CollectedState::default()).expect_err("the scratch file cannot be created");
        assert_eq!(error.code, "state.dir_write");
        assert!(error.to_string().contains("/nonexistent/sluice-scratch"), "{error}");
    }
}
