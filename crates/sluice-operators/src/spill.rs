//! State beyond a memory budget, kept in files on local disk.
//!
//! A [`SpillSpace`] is one budget per pipeline and worker process: `[pipeline]
//! state_memory_mib` of state bytes held in memory, summed over every operator instance
//! that spills, and the directory (`[pipeline] state_dir`, by default the system's
//! temporary directory) where the rest goes. The rows of a join's sides spill
//! (`crate::join`), and the rows a TopN or the changelog normalization keeps
//! (`crate::row_log`): rows written once and never changed, so a spilled chunk of them is
//! an immutable range of a file. Chunks are written through a [`SpillFile`]: a log's
//! into one file it never rewrites, an expiring join side's into files of a fixed size,
//! each freed with its last chunk.
//!
//! A [`SpillLog`] is one such sequence of chunks. Bytes are appended to its newest
//! chunk, held in memory. When a new chunk starts while the space is over its budget,
//! the log writes its oldest chunks still in memory to its file, oldest first, and drops
//! them from memory (its newest chunk always stays), so the recent rows, the ones a
//! stream probes most, stay in memory. Reading a spilled row is one positioned read,
//! which the kernel's page cache serves from memory while it can. The file is
//! anonymous (created already unlinked): the system frees it when the log is dropped or
//! the process ends, however it ends, so a crash leaves nothing behind.
//!
//! A snapshot shares a log's chunks ([`SpillLog::share`]) rather than copying them; a
//! chunk it shares is never appended to again. A shared chunk that the log then spills
//! is handed to the snapshot as its place in the file, so a checkpoint still being
//! written holds no spilled chunk in memory, beyond the one it is reading. A log keeps
//! the last chunk it spilled, when nothing else holds it, as the next chunk it starts
//! (counted in the budget as if still in use), so that rows go to memory already mapped
//! rather than to fresh pages the kernel must zero.
//!
//! Spill files are no checkpoint: a checkpoint encodes the rows as before (reading the
//! spilled ones back), and a restore appends them again. A log never rewrites its file:
//! a TopN, whose rows leave, copies the rows it keeps into a fresh log once the dead
//! ones outnumber them, and drops the old log and its file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use sluice_runtime::Metrics;
use sluice_types::SluiceError;

use crate::counter::LazyCounter;

/// The run counter of the bytes written to spill files (the exit report lists it, and
/// `/metrics` as `sluice_counter_total{name="…"}`), over every operator and thread.
pub const SPILLED_BYTES: &str = "state bytes written to spill files";

/// The counter [`SPILLED_BYTES`] of `metrics`, registered at the first spill.
pub fn spilled_bytes(metrics: &Arc<Metrics>) -> LazyCounter {
    LazyCounter::new(Arc::clone(metrics), SPILLED_BYTES)
}

/// The bytes of a chunk (a row longer than that gets a chunk of its own).
const CHUNK_BYTES: usize = 256 * 1024;

/// The bytes `start..start + length` of a chunk, as a row's place gives them.
pub(crate) fn byte_range(start: u32, length: u32) -> std::ops::Range<usize> {
    let start = start as usize;
    start..start + length as usize
}

/// The bytes of rows `ids`, in order: those in memory (`resident`) borrowed, the others
/// read (`read`) into `spilled` first, one after the other.
pub(crate) fn gather<'a, I: Copy>(
    ids: impl Iterator<Item = I> + Clone,
    resident: impl Fn(I) -> Option<&'a [u8]>,
    mut read: impl FnMut(I, &mut Vec<u8>) -> Result<(), SluiceError>,
    spilled: &'a mut Vec<u8>,
) -> Result<Vec<&'a [u8]>, SluiceError> {
    spilled.clear();
    let mut ends = Vec::new();
    for id in ids.clone() {
        if resident(id).is_none() {
            read(id, spilled)?;
            ends.push(spilled.len());
        }
    }
    let spilled: &'a [u8] = spilled;
    let (mut start, mut ends) = (0, ends.into_iter());
    Ok(ids
        .map(|id| {
            resident(id).unwrap_or_else(|| {
                let end = ends.next().expect("a spilled row read");
                let row = &spilled[start..end];
                start = end;
                row
            })
        })
        .collect())
}

/// One memory budget for the spillable state of a pipeline's operators on one worker,
/// and where the state beyond it goes.
#[derive(Debug)]
pub struct SpillSpace {
    dir: PathBuf,
    budget: usize,
    /// The bytes of a log's chunk.
    chunk_bytes: usize,
    /// Bytes of chunks held in memory, over every log of this space.
    resident: AtomicUsize,
    /// Bytes written to spill files and still held.
    spilled: AtomicUsize,
}

impl SpillSpace {
    /// A space holding at most about `budget` bytes of spillable state in memory (each
    /// log keeps its newest chunk whatever the budget), spilling the rest into `dir`.
    pub fn new(dir: PathBuf, budget: usize) -> Arc<SpillSpace> {
        SpillSpace::with_chunk_bytes(dir, budget, CHUNK_BYTES)
    }

    /// A space whose logs' chunks hold `chunk_bytes` (tests spill small states).
    pub fn with_chunk_bytes(dir: PathBuf, budget: usize, chunk_bytes: usize) -> Arc<SpillSpace> {
        assert!(chunk_bytes > 0, "chunks hold bytes");
        let (resident, spilled) = (AtomicUsize::new(0), AtomicUsize::new(0));
        Arc::new(SpillSpace { dir, budget, chunk_bytes, resident, spilled })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The bytes of a new chunk of state in this space.
    pub(crate) fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Bytes of spillable state in memory now.
    pub fn resident(&self) -> usize {
        self.resident.load(Ordering::Relaxed)
    }

    /// Bytes of state in spill files now.
    pub fn spilled(&self) -> usize {
        self.spilled.load(Ordering::Relaxed)
    }

    pub(crate) fn over_budget(&self) -> bool {
        self.resident() > self.budget
    }

    /// Counts `bytes` more of state in memory (an operator that keeps its state in its
    /// own structures and evicts it on its own, as the group aggregate does).
    pub fn charge(&self, bytes: usize) {
        self.resident.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts `bytes` fewer of state in memory (as [`SpillSpace::charge`] counted them).
    pub fn release(&self, bytes: usize) {
        self.resident.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Counts `bytes` of state in memory in place of the `counted` bytes counted before
    /// (a structure that stays in memory but counts in the budget: a join's key table),
    /// and remembers them in `counted`.
    pub(crate) fn recount(space: Option<&SpillSpace>, counted: &mut usize, bytes: usize) {
        if let Some(space) = space {
            if bytes > *counted {
                space.charge(bytes - *counted);
            } else {
                space.release(*counted - bytes);
            }
        }
        *counted = bytes;
    }

    /// Counts `bytes` more (`grown`) or fewer of state written to files.
    pub(crate) fn count_spilled(&self, bytes: usize, grown: bool) {
        if grown {
            self.spilled.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.spilled.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// A new anonymous file in the spill directory.
    pub(crate) fn create_file(&self) -> Result<File, SluiceError> {
        tempfile::tempfile_in(&self.dir).map_err(|error| {
            SluiceError::external(
                "state.spill",
                format!("cannot create a spill file in {}: {error}", self.dir.display()),
            )
            .with_fix(
                "set [pipeline] state_dir to a writable local directory with free space, \
                 or raise [pipeline] state_memory_mib to keep more state in memory",
            )
        })
    }
}

/// A chunk written to a spill file: `length` bytes at `offset`, never changed.
#[derive(Debug)]
pub(crate) struct SpilledChunk {
    file: Arc<File>,
    offset: u64,
    length: usize,
}

impl SpilledChunk {
    /// Appends the bytes at `range` of the chunk to `out`.
    pub(crate) fn read_range(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) -> Result<(), SluiceError> {
        let at = out.len();
        out.resize(at + range.len(), 0);
        self.read_at(range.start, &mut out[at..])
    }

    /// Fills `buf` with the chunk's bytes from `at` on.
    pub(crate) fn read_at(&self, at: usize, buf: &mut [u8]) -> Result<(), SluiceError> {
        assert!(at + buf.len() <= self.length, "a range inside the spilled chunk");
        self.file.read_exact_at(buf, self.offset + at as u64).map_err(|error| {
            SluiceError::external("state.spill", format!("cannot read back spilled state: {error}"))
                .with_fix("check the disk of [pipeline] state_dir")
        })
    }

    /// The bytes it holds.
    pub(crate) fn len(&self) -> usize {
        self.length
    }

    /// The whole chunk.
    pub(crate) fn read(&self) -> Result<Vec<u8>, SluiceError> {
        let mut bytes = Vec::with_capacity(self.length);
        self.read_range(0..self.length, &mut bytes)?;
        Ok(bytes)
    }
}

/// Where a state's spilled chunks are written: anonymous files in the space's directory,
/// each written once from its start, a new one begun when the current one holds
/// `segment_bytes`. A file lives as long as a chunk written to it: state freed from its
/// oldest end (an expiring join side's rows) gives its disk back file by file.
#[derive(Debug)]
pub(crate) struct SpillFile {
    file: Option<Arc<File>>,
    length: u64,
    segment_bytes: u64,
}

impl SpillFile {
    pub(crate) fn new(segment_bytes: u64) -> SpillFile {
        SpillFile { file: None, length: 0, segment_bytes }
    }

    /// Writes `bytes` after what this file holds (to a new file if that one is full);
    /// returns where they are.
    pub(crate) fn write(&mut self, space: &SpillSpace, bytes: &[u8]) -> Result<SpilledChunk, SluiceError> {
        if self.length >= self.segment_bytes {
            (self.file, self.length) = (None, 0);
        }
        let file = match &self.file {
            Some(file) => Arc::clone(file),
            None => Arc::clone(self.file.insert(Arc::new(space.create_file()?))),
        };
        file.write_all_at(bytes, self.length).map_err(|error| {
            SluiceError::external(
                "state.spill",
                format!(
                    "cannot write {} bytes of state to a spill file in {}: {error}",
                    bytes.len(),
                    space.dir.display()
                ),
            )
            .with_fix(
                "free space on the disk of [pipeline] state_dir, point state_dir at a larger disk, \
                 or raise [pipeline] state_memory_mib",
            )
        })?;
        let spilled = SpilledChunk { file, offset: self.length, length: bytes.len() };
        self.length += bytes.len() as u64;
        Ok(spilled)
    }
}

/// A chunk of a log: in memory (shared with snapshots), or in the log's file.
#[derive(Debug, Clone)]
pub(crate) enum LogChunk {
    Resident(Arc<Vec<u8>>),
    Spilled(Arc<SpilledChunk>),
}

impl LogChunk {
    /// The bytes the chunk holds.
    pub(crate) fn len(&self) -> usize {
        match self {
            LogChunk::Resident(bytes) => bytes.len(),
            LogChunk::Spilled(spilled) => spilled.length,
        }
    }
}

/// A chunk as a snapshot shares it ([`SpillLog::share`]): the chunk in memory while the
/// log keeps it there, its place in the log's file once the log spilled it.
#[derive(Debug, Clone)]
pub(crate) struct SharedChunk {
    cell: Arc<Mutex<LogChunk>>,
    /// Its bytes (a shared chunk never changes).
    len: usize,
}

impl SharedChunk {
    /// The chunk as it is now: hold it while reading it, then let it go.
    pub(crate) fn get(&self) -> LogChunk {
        self.cell.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The bytes it holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// The chunk a snapshot's job reads rows from, taken from its [`SharedChunk`] when the
/// rows reach it and let go when they move to another, so that a chunk the log spilled
/// meanwhile is freed as soon as its rows are read.
#[derive(Debug, Default)]
pub(crate) struct HeldChunk(Option<(u32, LogChunk)>);

impl HeldChunk {
    /// Chunk `number` of `chunks`, taken again only when it is not the one held.
    pub(crate) fn of(&mut self, chunks: &[SharedChunk], number: u32) -> &LogChunk {
        if self.0.as_ref().is_none_or(|(held, _)| *held != number) {
            self.0 = Some((number, chunks[number as usize].get()));
        }
        &self.0.as_ref().expect("the chunk was just taken").1
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct SpillLog {
    chunks: Vec<LogChunk>,
    /// The chunks in memory that snapshots share, by number: told when they spill.
    shared: Vec<(u32, Weak<Mutex<LogChunk>>)>,
    /// The last chunk spilled, emptied, to be the next one started (its capacity counted
    /// in `resident`).
    spare: Option<Vec<u8>>,
    chunk_bytes: usize,
    /// None: nothing spills (every chunk stays in memory).
    space: Option<Arc<SpillSpace>>,
    file: SpillFile,
    /// Every chunk before this one is spilled.
    first_resident: usize,
    /// The capacity of this log's chunks in memory, as counted in the space.
    resident: usize,
    /// The bytes of this log's spilled chunks, as counted in the space.
    spilled: usize,
    /// Counts the bytes this log writes to its file (None: not counted).
    written: Option<LazyCounter>,
}

impl SpillLog {
    /// A log spilling within `space`, in its chunk size (None: nothing spills).
    pub(crate) fn new(space: Option<Arc<SpillSpace>>) -> SpillLog {
        let chunk_bytes = space.as_ref().map_or(CHUNK_BYTES, |s| s.chunk_bytes);
        SpillLog::with_chunk_bytes(space, chunk_bytes)
    }

    /// A log of chunks of `chunk_bytes` (tests use small ones).
    pub(crate) fn with_chunk_bytes(space: Option<Arc<SpillSpace>>, chunk_bytes: usize) -> SpillLog {
        SpillLog {
            chunks: Vec::new(),
            shared: Vec::new(),
            spare: None,
            chunk_bytes,
            space,
            file: SpillFile::new(u64::MAX),
            first_resident: 0,
            resident: 0,
            spilled: 0,
            written: None,
        }
    }

    /// Counts the bytes this log writes to its file in `written`.
    pub(crate) fn counting(mut self, written: Option<LazyCounter>) -> SpillLog {
        self.written = written;
        self
    }

    /// Stops counting this log's chunks in memory against the space's budget (they are
    /// about to be dropped: a log replacing this one should not spill for them).
    pub(crate) fn uncount_resident(&mut self) {
        if let Some(space) = &self.space {
            space.resident.fetch_sub(self.resident, Ordering::Relaxed);
        }
        self.resident = 0;
        self.spare = None;
    }

    /// The counter of written bytes, for a log that replaces this one.
    pub(crate) fn take_counter(&mut self) -> Option<LazyCounter> {
        self.written.take()
    }

    /// Appends `row`; returns its chunk and where it starts there. Starting a chunk
    /// while the space is over budget first spills this log's older chunks.
    pub(crate) fn append(&mut self, row: &[u8]) -> Result<(u32, u32), SluiceError> {
        fn fits(chunk: &mut LogChunk, length: usize) -> Option<&mut Vec<u8>> {
            match chunk {
                LogChunk::Resident(bytes) => {
                    Arc::get_mut(bytes).filter(|bytes| bytes.capacity() - bytes.len() >= length)
                }
                LogChunk::Spilled(_) => None,
            }
        }
        if self.chunks.last_mut().and_then(|chunk| fits(chunk, row.len())).is_none() {
            match self.spare.take_if(|spare| spare.capacity() >= row.len()) {
                // Counted already.
                Some(spare) => self.chunks.push(LogChunk::Resident(Arc::new(spare))),
                None => {
                    let chunk = Vec::with_capacity(self.chunk_bytes.max(row.len()));
                    // Counted as `spill` uncounts it: by the capacity the vector has.
                    let capacity = chunk.capacity();
                    self.chunks.push(LogChunk::Resident(Arc::new(chunk)));
                    self.resident += capacity;
                    if let Some(space) = &self.space {
                        space.resident.fetch_add(capacity, Ordering::Relaxed);
                    }
                }
            }
            self.spill_over_budget()?;
        }
        let chunk = u32::try_from(self.chunks.len() - 1).expect("fewer than 2^32 chunks");
        let bytes = self.chunks.last_mut().and_then(|c| fits(c, row.len())).expect("a chunk with room, not shared");
        let start = u32::try_from(bytes.len()).expect("a chunk shorter than 4 GiB");
        bytes.extend_from_slice(row);
        Ok((chunk, start))
    }

    /// While the space is over budget, spills this log's oldest chunk in memory but the
    /// newest.
    fn spill_over_budget(&mut self) -> Result<(), SluiceError> {
        let Some(space) = self.space.clone() else { return Ok(()) };
        while space.over_budget() && self.first_resident + 1 < self.chunks.len() {
            self.spill(&space, self.first_resident)?;
            self.first_resident += 1;
        }
        Ok(())
    }

    /// Writes chunk `index` to the file and drops it from memory.
    fn spill(&mut self, space: &SpillSpace, index: usize) -> Result<(), SluiceError> {
        let LogChunk::Resident(bytes) = &self.chunks[index] else { return Ok(()) };
        let (capacity, length) = (bytes.capacity(), bytes.len());
        let spilled = LogChunk::Spilled(Arc::new(self.file.write(space, bytes)?));
        let LogChunk::Resident(bytes) = std::mem::replace(&mut self.chunks[index], spilled.clone()) else {
            unreachable!("the chunk was in memory")
        };
        // Snapshots sharing the chunk read it from the file from now on.
        let number = u32::try_from(index).expect("fewer than 2^32 chunks");
        self.shared.retain(|(chunk, cell)| {
            if *chunk != number {
                return cell.strong_count() > 0;
            }
            if let Some(cell) = cell.upgrade() {
                *cell.lock().unwrap_or_else(PoisonError::into_inner) = spilled.clone();
            }
            false
        });
        self.spilled += length;
        if let Some(written) = self.written.as_mut() {
            written.add(length as u64);
        }
        space.spilled.fetch_add(length, Ordering::Relaxed);
        // Kept as the next chunk when nothing else holds it (a snapshot reading it now
        // does), and it is of the usual size; else freed.
        match Arc::try_unwrap(bytes) {
            Ok(mut bytes) if self.spare.is_none() && capacity == self.chunk_bytes => {
                bytes.clear();
                self.spare = Some(bytes);
            }
            _ => {
                self.resident -= capacity;
                space.resident.fetch_sub(capacity, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Chunks `chunks` shared with a snapshot: none of them is appended to from now on,
    /// and one the log spills later is read from the file by the snapshot.
    pub(crate) fn share(&mut self, chunks: std::ops::Range<u32>) -> Vec<SharedChunk> {
        self.shared.retain(|(_, cell)| cell.strong_count() > 0);
        chunks
            .map(|number| {
                let chunk = self.chunks[number as usize].clone();
                let (resident, len) = (matches!(chunk, LogChunk::Resident(_)), chunk.len());
                let cell = Arc::new(Mutex::new(chunk));
                if resident {
                    self.shared.push((number, Arc::downgrade(&cell)));
                }
                SharedChunk { cell, len }
            })
            .collect()
    }

    /// The number of chunks.
    pub(crate) fn chunk_count(&self) -> u32 {
        u32::try_from(self.chunks.len()).expect("fewer than 2^32 chunks")
    }

    /// The capacity of a new chunk.
    pub(crate) fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Chunk `chunk`, which must be in memory (a log without a space never spills).
    #[cfg(test)]
    pub(crate) fn resident(&self, chunk: u32) -> &Arc<Vec<u8>> {
        match &self.chunks[chunk as usize] {
            LogChunk::Resident(bytes) => bytes,
            LogChunk::Spilled(_) => panic!("chunk {chunk} of a log that never spills is spilled"),
        }
    }

    /// Every chunk, in order.
    #[cfg(test)]
    pub(crate) fn chunks(&self) -> &[LogChunk] {
        &self.chunks
    }

    /// The bytes at `range` of chunk `chunk`, if it is in memory.
    pub(crate) fn get(&self, chunk: u32, range: std::ops::Range<usize>) -> Option<&[u8]> {
        match &self.chunks[chunk as usize] {
            LogChunk::Resident(bytes) => Some(&bytes[range]),
            LogChunk::Spilled(_) => None,
        }
    }

    /// Appends the bytes at `range` of chunk `chunk` to `out`, wherever they are.
    pub(crate) fn read_into(
        &self,
        chunk: u32,
        range: std::ops::Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<(), SluiceError> {
        match &self.chunks[chunk as usize] {
            LogChunk::Resident(bytes) => {
                out.extend_from_slice(&bytes[range]);
                Ok(())
            }
            LogChunk::Spilled(spilled) => spilled.read_range(range, out),
        }
    }

    /// The bytes chunk `chunk` holds (a chunk other than the last is never appended to
    /// again).
    pub(crate) fn chunk_len(&self, chunk: u32) -> usize {
        self.chunks[chunk as usize].len()
    }

    /// Chunk `chunk` as the log holds it (a snapshot takes [`SpillLog::share`]).
    pub(crate) fn chunk(&self, chunk: u32) -> &LogChunk {
        &self.chunks[chunk as usize]
    }

    /// Whether chunk `chunk` is spilled.
    #[cfg(test)]
    fn is_spilled(&self, chunk: u32) -> bool {
        matches!(self.chunks[chunk as usize], LogChunk::Spilled(_))
    }
}

impl Drop for SpillLog {
    fn drop(&mut self) {
        if let Some(space) = &self.space {
            space.resident.fetch_sub(self.resident, Ordering::Relaxed);
            space.spilled.fetch_sub(self.spilled, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(budget: usize) -> (tempfile::TempDir, Arc<SpillSpace>) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::new(dir.path().to_path_buf(), budget);
        (dir, space)
    }

    fn row(i: usize) -> Vec<u8> {
        format!("row {i:06} {}", "x".repeat(i % 37)).into_bytes()
    }

    #[test]
    fn rows_read_back_the_same_from_memory_and_from_the_file() {
        let (_dir, space) = space(0);
        let mut log = SpillLog::with_chunk_bytes(Some(Arc::clone(&space)), 64);
        let mut at = Vec::new();
        for i in 0..500 {
            let r = row(i);
            let (chunk, start) = log.append(&r).expect("append");
            at.push((chunk, start as usize..start as usize + r.len()));
        }
        let last = at.last().expect("rows").0;
        assert!(log.is_spilled(0), "over a budget of 0 every chunk but the newest spills");
        assert!(!log.is_spilled(last), "the newest chunk stays in memory");
        assert_eq!(space.resident(), 2 * 64, "the newest chunk, and the last one spilled kept as the next");
        let mut out = Vec::new();
        for (i, (chunk, range)) in at.into_iter().enumerate() {
            out.clear();
            log.read_into(chunk, range.clone(), &mut out).expect("read");
            assert_eq!(out, row(i));
            assert_eq!(log.get(chunk, range).is_some(), chunk == last);
        }
        let spilled = space.spilled();
        assert!(spilled > 0);
        drop(log);
        assert_eq!((space.resident(), space.spilled()), (0, 0), "a dropped log leaves nothing counted");
    }

    #[test]
    fn a_row_longer_than_a_chunk_gets_one_of_its_own_and_reads_back_spilled() {
        let (_dir, space) = space(0);
        let mut log = SpillLog::with_chunk_bytes(Some(Arc::clone(&space)), 64);
        let huge: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let (first, _) = log.append(b"small").expect("append");
        let (chunk, start) = log.append(&huge).expect("append");
        assert_ne!(chunk, first);
        let (after, _) = log.append(b"next").expect("append");
        assert!(log.is_spilled(chunk) && !log.is_spilled(after), "the huge row's chunk spilled");
        let mut out = Vec::new();
        log.read_into(chunk, start as usize..start as usize + huge.len(), &mut out).expect("read");
        assert_eq!(out, huge);
        assert_eq!(space.resident(), 64, "only the newest chunk is in memory");
    }

    #[test]
    fn the_bytes_written_to_spill_files_are_a_run_counter_registered_at_the_first_spill() {
        let (_dir, space) = space(0);
        let metrics = Arc::new(Metrics::new(Vec::new(), Vec::new(), 1));
        let mut log = SpillLog::with_chunk_bytes(Some(space), 64).counting(Some(spilled_bytes(&metrics)));
        log.append(&[1u8; 40]).expect("append");
        assert!(metrics.counters().is_empty(), "nothing spilled, nothing listed");
        log.append(&[2u8; 40]).expect("append");
        log.append(&[3u8; 40]).expect("append");
        assert_eq!(metrics.counters(), [(SPILLED_BYTES.to_string(), 80)]);
    }

    #[test]
    fn nothing_spills_under_the_budget_or_without_a_space() {
        let (_dir, space) = space(1 << 20);
        let mut within = SpillLog::with_chunk_bytes(Some(Arc::clone(&space)), 64);
        let mut unbounded = SpillLog::with_chunk_bytes(None, 64);
        for i in 0..200 {
            let (chunk, _) = within.append(&row(i)).expect("append");
            assert!(!within.is_spilled(chunk));
            unbounded.append(&row(i)).expect("append");
        }
        assert!((0..within.chunks.len() as u32).all(|c| !within.is_spilled(c)));
        assert!((0..unbounded.chunks.len() as u32).all(|c| !unbounded.is_spilled(c)));
        assert_eq!(space.spilled(), 0);
    }

    #[test]
    fn logs_share_one_budget_and_each_spills_its_own_oldest_chunks() {
        let (_dir, space) = space(256);
        let mut a = SpillLog::with_chunk_bytes(Some(Arc::clone(&space)), 64);
        let mut b = SpillLog::with_chunk_bytes(Some(Arc::clone(&space)), 64);
        for i in 0..100 {
            a.append(&row(i)).expect("append");
            b.append(&row(i)).expect("append");
        }
        assert!(space.resident() <= 256 + 2 * 64, "{} resident", space.resident());
        assert!(a.is_spilled(0) && b.is_spilled(0));
    }

    #[test]
    fn a_chunk_shared_with_a_snapshot_is_not_appended_to_and_survives_its_spill() {
        let (_dir, space) = space(0);
        let mut log = SpillLog::with_chunk_bytes(Some(space), 64);
        let (chunk, start) = log.append(b"first").expect("append");
        let shared = log.share(chunk..chunk + 1).pop().expect("one chunk shared");
        let LogChunk::Resident(held) = shared.get() else { panic!("the newest chunk is in memory") };
        let (next, _) = log.append(b"second").expect("append");
        assert_ne!(next, chunk, "a shared chunk is not appended to");
        assert!(log.is_spilled(chunk), "the shared chunk spilled when the next one started");
        assert_eq!(&held[start as usize..start as usize + 5], b"first");
        // The snapshot now reads the chunk from the file: once its reader lets go of the
        // bytes it held, nothing holds them in memory.
        let LogChunk::Spilled(spilled) = shared.get() else { panic!("the snapshot is told of the spill") };
        assert_eq!(spilled.read().expect("read"), b"first");
        let weak = Arc::downgrade(&held);
        drop(held);
        assert!(weak.upgrade().is_none(), "a spilled chunk that a snapshot shares is freed");
    }

    #[test]
    fn a_spilled_chunk_is_the_next_one_started_unless_a_reader_holds_it() {
        let (_dir, space) = space(0);
        let mut log = SpillLog::with_chunk_bytes(Some(Arc::clone(&space)), 64);
        log.append(&[1u8; 60]).expect("append");
        let LogChunk::Resident(first) = log.chunk(0).clone() else { panic!("in memory") };
        let first_at = first.as_ptr();
        drop(first);
        log.append(&[2u8; 60]).expect("append");
        log.append(&[3u8; 60]).expect("append");
        let LogChunk::Resident(third) = log.chunk(2).clone() else { panic!("the newest chunk is in memory") };
        assert_eq!(third.as_ptr(), first_at, "the first chunk's memory took the third's rows");
        assert_eq!(&third[..], &[3u8; 60][..]);
        // A snapshot reading chunk 2 while it spills keeps its bytes: they are not kept
        // for reuse, and no longer counted.
        drop(third);
        let held = log.share(2..3).pop().expect("shared").get();
        log.append(&[4u8; 60]).expect("append");
        assert!(log.is_spilled(2));
        let LogChunk::Resident(held) = held else { panic!("read before the spill") };
        assert_eq!(&held[..], &[3u8; 60][..], "a reader's bytes are never reused under it");
        assert_eq!(space.resident(), 64, "only the newest chunk counts");
        log.append(&[5u8; 60]).expect("append");
        let LogChunk::Resident(fifth) = log.chunk(4).clone() else { panic!("in memory") };
        assert_ne!(fifth.as_ptr(), held.as_ptr());
        assert_eq!(space.resident(), 2 * 64, "the newest chunk and the one spilled kept, both counted");
        drop((held, fifth, log));
        assert_eq!(space.resident(), 0, "a dropped log leaves nothing counted");
    }

    #[test]
    fn an_unusable_spill_directory_is_a_typed_error_with_its_fix() {
        let space = SpillSpace::new(PathBuf::from("/nonexistent/sluice-spill"), 0);
        let mut log = SpillLog::with_chunk_bytes(Some(space), 8);
        log.append(b"12345678").expect("the first chunk needs no file");
        let error = log.append(b"abcdefgh").expect_err("the spill has nowhere to go");
        let text = error.to_string();
        assert!(text.contains("/nonexistent/sluice-spill") && text.contains("state_dir"), "{text}");
    }
}
