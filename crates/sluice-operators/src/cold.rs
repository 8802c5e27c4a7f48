//! Keyed state beyond the memory budget, evicted from memory into sorted runs on local
//! disk and read back when its key comes again: the group aggregate's groups
//! (`crate::aggregate::group`), TopN's partitions (`crate::topn`), the changelog
//! normalization's keys (`crate::normalize`), the session aggregate's keys
//! (`crate::aggregate::session`), the OVER aggregate's idle partitions (`crate::over`)
//! and the window aggregate's windows (`crate::aggregate`, evicted whole, read back by
//! group).
//!
//! An operator given a [`SpillSpace`] counts the bytes of its entries in the space's
//! budget (`[pipeline] state_memory_mib`, shared with every other operator that spills
//! on the worker). When it ends a batch while the space is over its budget, it evicts
//! entries no row touched since the clock's hand last passed them (a bit per entry, set
//! when a row touches it: the second-chance policy), enough to bring the space an eighth
//! of the budget under it, and writes them as one run ([`ColdStore::add`]): each
//! entry's records in the operator's checkpoint encoding, so a cold entry is written and
//! read by the same code as a checkpointed one. The run is an anonymous file in the
//! space's directory (unlinked at once: a crash leaves nothing behind), in the run
//! format of `sluice_state::run`, in blocks of [`COLD_BLOCK_BYTES`].
//!
//! **Lookups** ([`ColdRuns::find`]). A key not in memory is looked for in the runs,
//! newest first: a run's bloom filter (14 bits per entry, over the hash the operator
//! gives) skips the runs that do not hold it; otherwise the run's block index (in
//! memory, read back from the run once it is written) names the one block that may hold
//! its record, read with one positioned read (the kernel's page cache is the block
//! cache). The first run that names the key decides: a put is the entry, with the
//! records that follow it and belong to it (a group's COUNT(DISTINCT) values, maybe into
//! the next blocks); a delete means the entry was dropped. An entry read back stays in
//! its run: its copy in memory is newer, and the operator keeps, for the entries dropped
//! from memory whose older copy may still be in a run, their keys, written as deletes
//! with the next run.
//!
//! **Compaction.** After a run is added, the runs are merged by `sluice_state::compact`'s
//! policy (tiers of similar sizes; everything once the newer runs hold as many bytes as
//! the oldest), through `sluice_state::Merge` (deletes dropped when the oldest run takes
//! part), on a `sluice-merge` thread of their own: a merge may rewrite most of the
//! operator's cold state, and on the operator's thread every row and barrier would wait
//! for it. One merge at a time per store; lookups read the runs it merges until it is
//! put in place, at the next run added after it is written ([`ColdStore::add`]). Only
//! when the merges fall behind (`sluice_state::compact::overdue`: twice the runs the
//! policy keeps, judged on the runs as they will be once the merge under way is in
//! place) does the operator wait for the one under way. Meanwhile a lookup may ask up to
//! twice that many runs (the merge's inputs are still there). Memory per run: its
//! index (an entry per block) and its bloom filter, counted in the space.
//!
//! **Checkpoints** read the runs too (each operator's `state` module): a full snapshot
//! merges them into its records, and a delta writes again the entries evicted while
//! changed since the previous snapshot (their keys are kept until then).

use std::collections::HashSet;
use std::io::BufWriter;
use std::sync::Arc;

use sluice_state::compact::{self, RunInfo};
use sluice_state::merge::MergeInput;
use sluice_state::read::{BlockInfo, Entry, FileSource, block_entries, read_block};
use sluice_state::{Merge, MergeMode, RunSource, RunWriter, StateSink, StateSource};
use sluice_types::SluiceError;

use crate::counter::LazyCounter;
use crate::records::Records;
use crate::spill::SpillSpace;

/// Bits of an entry's marks: a row touched it since the clock's hand last passed it.
pub(crate) const RECENT: u8 = 1;
/// An older copy of the entry may be in a cold run.
pub(crate) const FROM_COLD: u8 = 2;
/// The other six bits count the hand's passes since the entry was last touched.
const AGE_UNIT: u8 = 4;
const AGE_MAX: u8 = 63;
/// The passes an entry read back from a run stays untouched before it goes again.
const RETURNED_PASSES: usize = 4;

/// The clock's hand passes an entry of about `bytes` with marks `marks`, in a space of
/// `budget` bytes: whether it is evicted now. A touched entry gets a second chance (its
/// age starts again); an untouched one ages, and goes once it was passed untouched
/// more times than it holds eighths of the budget, so that a large entry, whose every
/// eviction writes it whole and whose every return reads it whole, leaves only when it
/// stays cold (a COUNT(DISTINCT) group of millions of values, touched every few
/// batches, would otherwise be written and read back over and over).
///
/// An entry read back from a run proved itself warmer than the hand's last revolution:
/// it goes only once passed untouched [`RETURNED_PASSES`] times at least. Entries that
/// come back at about the pace the hand goes round (NEXMark q16's thousands of small
/// groups, each touched once in 100,000 rows, while its few hot groups alone exceed the
/// budget) would otherwise be written and read whole at every revolution.
pub(crate) fn passes(marks: &mut u8, bytes: usize, budget: usize) -> bool {
    if *marks & RECENT != 0 {
        *marks &= FROM_COLD;
        return false;
    }
    let age = *marks / AGE_UNIT;
    let mut needed = (bytes / (budget / 8).max(64 << 10)).min(usize::from(AGE_MAX));
    if *marks & FROM_COLD != 0 {
        needed = needed.max(RETURNED_PASSES);
    }
    if usize::from(age) >= needed {
        return true;
    }
    *marks += AGE_UNIT;
    false
}

/// The bytes of a block of a cold run: a lookup reads one (and an entry's following
/// records may continue into the next ones).
pub(crate) const COLD_BLOCK_BYTES: usize = 16 * 1024;

/// Bits of a run's bloom filter per group it names: a false positive about 0.2% of the
/// time, with [`BLOOM_PROBES`] probes in one cache line (1% with 10 bits). Each false
/// positive reads a block of a run, and a lookup of a key no run holds asks every run:
/// NEXMark q18 at 100 M events and 256 MiB ran at 0.70-0.78 M events/s with 10 bits,
/// 0.92-0.95 M with 14, the filters' extra memory counted in the budget.
const BLOOM_BITS_PER_KEY: usize = 14;
const BLOOM_PROBES: u32 = 7;

/// A cache line of a bloom filter: 512 bits.
#[derive(Debug, Clone, Copy, Default)]
#[repr(align(64))]
struct BloomLine([u64; 8]);

/// A blocked bloom filter over placement hashes: a key's probes all fall in one cache
/// line, chosen by the hash. A lookup of a key no run holds (most keys of a state that
/// keeps growing, NEXMark q18's) asks every run's filter; with probes spread over the
/// whole filter each one was a cache miss, and the lookups took 11% of q18's time at
/// 256 MiB. One line per run costs one miss, for a few tenths of a percent more false
/// positives.
#[derive(Debug)]
struct Bloom {
    lines: Vec<BloomLine>,
}

impl Bloom {
    /// A filter for up to `keys` keys.
    fn with_capacity(keys: usize) -> Bloom {
        let lines = (keys.max(1) * BLOOM_BITS_PER_KEY).div_ceil(512);
        Bloom { lines: vec![BloomLine::default(); lines] }
    }

    /// The line of `hash`, and its bits there (seven of nine bits each, from a second
    /// mix of the hash).
    fn probes(&self, hash: u64) -> (usize, impl Iterator<Item = usize> + use<>) {
        let mixed = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let line = ((u128::from(mixed) * self.lines.len() as u128) >> 64) as usize;
        let bits = hash.rotate_left(29).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        (line, (0..BLOOM_PROBES).map(move |i| ((bits >> (9 * i)) & 511) as usize))
    }

    fn insert(&mut self, hash: u64) {
        let (line, bits) = self.probes(hash);
        let line = &mut self.lines[line].0;
        for bit in bits {
            line[bit / 64] |= 1 << (bit % 64);
        }
    }

    fn may_hold(&self, hash: u64) -> bool {
        let (line, mut bits) = self.probes(hash);
        let line = &self.lines[line].0;
        bits.all(|bit| line[bit / 64] & (1 << (bit % 64)) != 0)
    }

    fn bytes(&self) -> usize {
        self.lines.len() * 64
    }
}

/// A run's file: counted in the space's spilled bytes while it lives (jobs of snapshots
/// that read it hold it too).
struct ColdFile {
    source: FileSource,
    space: Arc<SpillSpace>,
}

impl RunSource for ColdFile {
    fn name(&self) -> &str {
        self.source.name()
    }

    fn size(&self) -> u64 {
        self.source.size()
    }

    fn read_at(&self, offset: u64, length: usize) -> Result<Vec<u8>, SluiceError> {
        self.source.read_at(offset, length)
    }
}

impl Drop for ColdFile {
    fn drop(&mut self) {
        self.space.count_spilled(self.source.size() as usize, false);
    }
}

/// One run of evicted entries.
#[derive(Clone)]
pub(crate) struct ColdRun {
    input: MergeInput,
    bloom: Arc<Bloom>,
    /// The entries' records (puts and deletes) it holds.
    groups: usize,
    bytes: u64,
}

/// An entry found in a run: its record's value, and the records that follow it and
/// belong to it (their keys, their values).
#[derive(Debug, Default)]
pub(crate) struct ColdEntry {
    pub(crate) value: Vec<u8>,
    pub(crate) following: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The runs, oldest first, and how to find a group in them. Cheap to clone (a snapshot's
/// job reads the runs of its barrier).
#[derive(Clone, Default)]
pub(crate) struct ColdRuns {
    runs: Vec<ColdRun>,
}

impl ColdRuns {
    pub(crate) fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Every run, as inputs of a merge (oldest first).
    pub(crate) fn inputs(&self) -> Vec<MergeInput> {
        self.runs.iter().map(|run| run.input.clone()).collect()
    }

    /// The newest copy of the entry of record `key` (of vnode `vnode`, bloom hash
    /// `hash`) with the records after it whose keys `follows` accepts, or None when no
    /// run holds it or the newest that names it deleted it.
    pub(crate) fn find(
        &self,
        vnode: u32,
        key: &[u8],
        hash: u64,
        follows: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Option<ColdEntry>, SluiceError> {
        self.find_in_runs(vnode, key, follows, |run| run.bloom.may_hold(hash))
    }

    /// The value of record `key` (of vnode `vnode`) in the newest run that names it,
    /// asking every run, newest first, without a filter (runs whose records no filter
    /// names: a group aggregate's spilled COUNT(DISTINCT) values, which their set's range
    /// filters instead); None when no run names it, or the newest deletes it.
    pub(crate) fn find_unfiltered(&self, vnode: u32, key: &[u8]) -> Result<Option<Vec<u8>>, SluiceError> {
        Ok(self.find_in_runs(vnode, key, &|_| false, |_| true)?.map(|entry| entry.value))
    }

    /// [`ColdRuns::find`] among the runs `may_hold` does not rule out.
    fn find_in_runs(
        &self,
        vnode: u32,
        key: &[u8],
        follows: &dyn Fn(&[u8]) -> bool,
        may_hold: impl Fn(&ColdRun) -> bool,
    ) -> Result<Option<ColdEntry>, SluiceError> {
        for run in self.runs.iter().rev().filter(|run| may_hold(run)) {
            match find_in(&run.input, vnode, key, follows)? {
                Found::Absent => continue,
                Found::Deleted => return Ok(None),
                Found::Put(entry) => return Ok(Some(entry)),
            }
        }
        Ok(None)
    }

    /// Adds every live record of the runs to a full snapshot's `records`, but those
    /// whose entry `shadowed` says has a newer copy in memory (or was deleted there).
    pub(crate) fn add_live(
        &self,
        records: &mut Records,
        shadowed: impl Fn(&[u8]) -> Result<bool, SluiceError>,
    ) -> Result<(), SluiceError> {
        let mut merge = Merge::new(self.inputs(), 0..u32::MAX, MergeMode::Live);
        while let Some(record) = merge.next_record()? {
            if !shadowed(record.key)? {
                let value = |v: &mut Vec<u8>| v.extend_from_slice(record.value);
                records.add(record.vnode, |k| k.extend_from_slice(record.key), Some(&value));
            }
        }
        Ok(())
    }

    /// A snapshot's share of the runs of an operator whose entry is one record under its
    /// key (the session and OVER aggregates'), placed by `hash(key)` among `vnodes`: a
    /// full snapshot every live record but those `keys` shadows (a newer copy in memory,
    /// or dropped); a delta the current record of each key in `keys` (evicted while
    /// changed since the previous snapshot).
    pub(crate) fn add_to_snapshot(
        &self,
        records: &mut Records,
        full: bool,
        keys: &Keys,
        hash: &dyn Fn(&[u8]) -> u64,
        vnodes: u32,
    ) -> Result<(), SluiceError> {
        if full {
            return self.add_live(records, |key| Ok(keys.contains(key)));
        }
        for key in keys {
            let hash = hash(key);
            let vnode = sluice_types::vnode::of_hash(hash, vnodes);
            let Some(found) = self.find(vnode, key, hash, &|_| false)? else { continue };
            let value = |bytes: &mut Vec<u8>| bytes.extend_from_slice(&found.value);
            records.add(vnode, |k| k.extend_from_slice(key), Some(&value));
        }
        Ok(())
    }

    /// The bytes of memory the runs' indexes and filters take.
    fn memory(&self) -> usize {
        let index = |run: &ColdRun| run.input.index.blocks.iter().map(|b| 64 + b.first_key.len()).sum::<usize>();
        self.runs.iter().map(|run| run.bloom.bytes() + index(run)).sum()
    }
}

enum Found {
    Absent,
    Deleted,
    Put(ColdEntry),
}

/// Record `key` in one run: the block that may hold it, then the records after it that
/// `follows` accepts (into the following blocks of its vnode while they continue).
fn find_in(input: &MergeInput, vnode: u32, key: &[u8], follows: &dyn Fn(&[u8]) -> bool) -> Result<Found, SluiceError> {
    let blocks = input.index.vnode_blocks(vnode);
    let points = &blocks[blocks.partition_point(|block| block.ranges)..];
    let at = points.partition_point(|block| block.first_key.as_slice() <= key);
    let Some(first) = at.checked_sub(1) else { return Ok(Found::Absent) };
    let mut found: Option<ColdEntry> = None;
    for info in &points[first..] {
        let block = read_block(&*input.source, info)?;
        let entries = block_entries(&block, info).map_err(|problem| damaged(input, info, problem))?;
        for entry in entries {
            match (&mut found, entry) {
                (None, Entry::Put { key: k, value }) if k == key => {
                    found = Some(ColdEntry { value: value.to_vec(), following: Vec::new() });
                }
                (None, Entry::Delete { key: k }) if k == key => return Ok(Found::Deleted),
                (None, entry) if entry.key() > key => return Ok(Found::Absent),
                (None, _) => {}
                (Some(found), Entry::Put { key: k, value }) if follows(k) => {
                    found.following.push((k.to_vec(), value.to_vec()));
                }
                (Some(found), _) => return Ok(Found::Put(std::mem::take(found))),
            }
        }
        if found.is_none() {
            // The record would be in this block: it is not.
            return Ok(Found::Absent);
        }
    }
    Ok(found.map_or(Found::Absent, Found::Put))
}

fn damaged(input: &MergeInput, info: &BlockInfo, problem: String) -> SluiceError {
    SluiceError::internal(
        "state.spill",
        format!(
            "a block of vnode {} at {} of spilled state in {} is damaged: {problem}",
            info.vnode,
            info.offset,
            input.source.name()
        ),
    )
}

/// A sink writing a run and a bloom filter of the entries it names.
struct ColdSink<'a> {
    writer: RunWriter<BufWriter<std::fs::File>>,
    bloom: Bloom,
    groups: usize,
    /// The bloom hash of a key, when the key is an entry's record.
    group_hash: &'a dyn Fn(&[u8]) -> Option<u64>,
}

impl ColdSink<'_> {
    fn named(&mut self, key: &[u8]) {
        if let Some(hash) = (self.group_hash)(key) {
            self.bloom.insert(hash);
            self.groups += 1;
        }
    }
}

impl StateSink for ColdSink<'_> {
    fn interleave(&mut self) {
        self.writer.interleave();
    }

    fn delete_range(&mut self, vnode: u32, start: &[u8], end: &[u8]) -> Result<(), SluiceError> {
        self.writer.delete_range(vnode, start, end)
    }

    fn put(&mut self, vnode: u32, key: &[u8], value: &[u8]) -> Result<(), SluiceError> {
        self.named(key);
        self.writer.put(vnode, key, value)
    }

    fn delete(&mut self, vnode: u32, key: &[u8]) -> Result<(), SluiceError> {
        self.named(key);
        self.writer.delete(vnode, key)
    }
}

/// The bloom hash of a record's key, when the record is an entry's (not one that follows
/// an entry's). Shared with the thread that merges the runs.
type GroupHash = Arc<dyn Fn(&[u8]) -> Option<u64> + Send + Sync>;

/// The thread writing a merge of a store's runs.
struct Merging {
    thread: std::thread::JoinHandle<Result<MergedRun, SluiceError>>,
    /// The runs it merges.
    range: std::ops::Range<usize>,
}

/// The evicted entries of one operator instance: its runs, and where they go.
pub(crate) struct ColdStore {
    space: Arc<SpillSpace>,
    runs: ColdRuns,
    /// Counts the bytes written to runs (the spill counter).
    written: LazyCounter,
    /// The memory of the runs' indexes and filters, as counted in the space.
    charged: usize,
    /// The bytes of the operator's entries in memory, as counted in the space (the
    /// operator says what they are: [`ColdStore::charge`], [`ColdStore::release`]).
    entries: usize,
    /// After an eviction that could not bring the space to its goal: the least the
    /// space held since (see [`ColdStore::eviction_goal`]).
    futile_low: Option<usize>,
    /// The entries the clock's hand looked at since the last eviction that reached its
    /// goal (see [`ColdStore::evicted`]).
    looked: usize,
    /// The merge under way, if any ([`ColdStore::add`]).
    merging: Option<Merging>,
    /// Whether its runs' blocks are compressed ([`ColdStore::compressed`]).
    compress: bool,
}

impl ColdStore {
    pub(crate) fn new(space: Arc<SpillSpace>, written: LazyCounter) -> ColdStore {
        ColdStore {
            space,
            runs: ColdRuns::default(),
            written,
            charged: 0,
            entries: 0,
            futile_low: None,
            looked: 0,
            merging: None,
            compress: false,
        }
    }

    /// The same store writing its runs' blocks compressed (LZ4, where that saves an
    /// eighth of a block; `sluice_state::run`): for records whose keys repeat a long
    /// prefix, a group aggregate's spilled COUNT(DISTINCT) values (each record holds its
    /// group's key; q16's shrink to about a third). A lookup then decompresses the block
    /// it reads.
    pub(crate) fn compressed(mut self) -> ColdStore {
        self.compress = true;
        self
    }

    /// Whether the operator should evict now, and how many bytes: enough to bring the
    /// space an eighth of its budget under it. None under the budget, and, after
    /// evictions that fell short of their goal over a whole turn of the clock's hand (the
    /// entries touched since the hand last passed them hold more than the budget: hot
    /// state alone exceeds it; [`ColdStore::evicted`]), until
    /// the space has grown by an eighth of the budget past the least it held since.
    /// Evicting at every batch then would write the same few cold entries over and over,
    /// each run of a handful, while every one that comes back is read again: pacing the
    /// evictions by growth writes them in runs worth their cost, and the memory over the
    /// budget stays what the hot entries take.
    pub(crate) fn eviction_goal(&mut self) -> Option<usize> {
        let (resident, budget) = (self.space.resident(), self.space.budget());
        if resident <= budget {
            self.futile_low = None;
            return None;
        }
        if let Some(low) = self.futile_low.as_mut() {
            *low = (*low).min(resident);
            if resident < low.saturating_add(budget / 8) {
                return None;
            }
        }
        Some(resident - budget + budget / 8)
    }

    /// Notes an eviction that freed `freed` bytes towards `goal` (`freed` already
    /// released from the space), its clock's hand having looked at `looked` of the
    /// operator's `entries` entries. Short of its goal, it is futile (the next waits for
    /// the space to grow, [`ColdStore::eviction_goal`]) only once the hand went all the
    /// way round since the last eviction that reached its goal: a hand that stopped at its
    /// operator's cap on entries looked at per call has not yet seen the entries it may
    /// evict. Pacing those evictions by growth let the space grow without end while each
    /// freed less than the growth it waited for (NEXMark q18 at 100 M events and 256 MiB
    /// grew to 2.1 GB: 2^17 partitions looked at per call, 23 MB freed per 32 MB grown).
    pub(crate) fn evicted(&mut self, freed: usize, goal: usize, looked: usize, entries: usize) {
        if freed >= goal {
            (self.futile_low, self.looked) = (None, 0);
            return;
        }
        self.looked = self.looked.saturating_add(looked);
        if self.looked >= entries {
            (self.futile_low, self.looked) = (Some(self.space.resident()), 0);
        }
    }

    /// Counts `bytes` more of the operator's entries in the space.
    pub(crate) fn charge(&mut self, bytes: usize) {
        self.entries += bytes;
        self.space.charge(bytes);
    }

    /// Counts `bytes` fewer of the operator's entries in the space.
    pub(crate) fn release(&mut self, bytes: usize) {
        self.entries -= bytes;
        self.space.release(bytes);
    }

    /// Counts the operator's entries as `bytes` in all.
    pub(crate) fn set_entry_bytes(&mut self, bytes: usize) {
        self.space.charge(bytes);
        self.space.release(self.entries);
        self.entries = bytes;
    }

    /// The bytes of the operator's entries counted in the space.
    pub(crate) fn entry_bytes(&self) -> usize {
        self.entries
    }

    pub(crate) fn space(&self) -> &Arc<SpillSpace> {
        &self.space
    }

    pub(crate) fn runs(&self) -> &ColdRuns {
        &self.runs
    }

    /// Writes `records` (of about `groups` entries) as a new run, then puts in place the
    /// merge under way if it is written, and starts the next merge the policy asks for
    /// on a thread of its own (see the module's documentation). `group_hash` gives the
    /// bloom hash of a record's key when it is an entry's record (not one that follows
    /// an entry's). A merge that could not be written fails here, at the next run: the
    /// runs are then those before it, all readable.
    pub(crate) fn add(
        &mut self,
        records: Records,
        groups: usize,
        about_bytes: usize,
        group_hash: impl Fn(&[u8]) -> Option<u64> + Send + Sync + 'static,
    ) -> Result<(), SluiceError> {
        self.add_in_order(groups, about_bytes, group_hash, |sink| records.write(sink))
    }

    /// [`ColdStore::add`] of the records `fill` writes, in `(vnode, key)` order (an
    /// operator that has them in order writes them without gathering and sorting them).
    pub(crate) fn add_in_order(
        &mut self,
        groups: usize,
        about_bytes: usize,
        group_hash: impl Fn(&[u8]) -> Option<u64> + Send + Sync + 'static,
        fill: impl FnOnce(&mut dyn StateSink) -> Result<(), SluiceError>,
    ) -> Result<(), SluiceError> {
        let group_hash: GroupHash = Arc::new(group_hash);
        let run = self.write(groups, about_bytes, &*group_hash, |sink| fill(sink))?;
        let run_bytes = run.bytes;
        self.runs.runs.push(run);
        self.recharge();
        let behind = self.catch_up(&group_hash)?;
        let merged = self.finish_merge(behind)?;
        if self.merging.is_none() {
            self.start_merge(group_hash)?;
        }
        tracing::debug!(
            entries = groups,
            about_bytes,
            run_bytes,
            merged_bytes = merged,
            waited = behind,
            runs = self.runs.runs.len(),
            runs_memory = self.charged,
            entries_memory = self.entries,
            resident = self.space.resident(),
            budget = self.space.budget(),
            "state evicted beyond the memory budget"
        );
        Ok(())
    }

    fn run_infos(&self) -> Vec<RunInfo> {
        self.runs.runs.iter().map(|run| RunInfo::of(run.bytes)).collect()
    }

    /// The runs as they will be once the merge under way is in place (its inputs one run
    /// of their bytes): whether the merges fell behind is judged on those. On the runs as
    /// they are, a merge of every run, rewriting gigabytes, counted its own inputs as
    /// newer runs piling up, and the operator waited for all of it (NEXMark q9's steps
    /// of 5 to 7.6 s at 100 M events and 256 MiB).
    fn runs_to_be(&self) -> Vec<RunInfo> {
        let mut infos = self.run_infos();
        if let Some(range) = self.merging.as_ref().map(|merging| merging.range.clone()) {
            let bytes = infos[range.clone()].iter().map(|run| run.bytes).sum();
            infos.splice(range, [RunInfo::of(bytes)]);
        }
        infos
    }

    /// The merge that `sluice_state::compact`'s policy asks of the runs now (None when
    /// none is due); its run's filter holds `group_hash` of its entries' keys.
    fn plan_merge(&self, group_hash: GroupHash) -> Option<RunMerge> {
        let plan = compact::plan(&self.run_infos())?;
        let mode = if plan.includes_base() { MergeMode::Live } else { MergeMode::KeepDeletes };
        Some(self.merge_of(plan.runs, mode, group_hash))
    }

    /// The merge of runs `range` in `mode`.
    fn merge_of(&self, range: std::ops::Range<usize>, mode: MergeMode, group_hash: GroupHash) -> RunMerge {
        let merged = &self.runs.runs[range.clone()];
        RunMerge {
            space: Arc::clone(&self.space),
            inputs: merged.iter().map(|run| run.input.clone()).collect(),
            blooms: merged.iter().map(|run| Arc::clone(&run.bloom)).collect(),
            mode,
            groups: merged.iter().map(|run| run.groups).sum(),
            bytes: merged.iter().map(|run| run.bytes as usize).sum(),
            range,
            group_hash,
            compress: self.compress,
        }
    }

    /// When the merges fell behind while one is under way: some of the runs added since
    /// it started, small ones as a rule, merged here into one (deletes kept: older runs
    /// may hold what they delete), rather than the operator waiting for a merge that may
    /// be rewriting gigabytes (NEXMark q9 at 100 M events and 256 MiB waited up to 6.7 s
    /// so, its TopN adding a run of a few hundred KB a dozen times a second). Returns
    /// whether the merges are still behind.
    fn catch_up(&mut self, group_hash: &GroupHash) -> Result<bool, SluiceError> {
        if !compact::overdue(&self.runs_to_be()) {
            return Ok(false);
        }
        let Some(range) = self.merging.as_ref().map(|merging| merging.range.clone()) else { return Ok(true) };
        let since = self.catch_up_range(range.end..self.runs.runs.len());
        if since.len() >= 2 {
            let merge = self.merge_of(since, MergeMode::KeepDeletes, Arc::clone(group_hash));
            self.put_in_place(merge.write_here()?);
        }
        Ok(compact::overdue(&self.runs_to_be()))
    }

    /// Of the runs `since` (added since the merge under way started), the fewest
    /// adjacent ones, and of those the fewest bytes, whose merge brings the runs to be
    /// back within the policy; all of them when none does (their bytes, not their
    /// number, are behind). Merging them all wrote hundreds of MB on the operator's
    /// thread where a few of them would do (NEXMark q18 at 100 M events and 256 MiB:
    /// runs of about 30 MB, a step of 3.6 s).
    fn catch_up_range(&self, since: std::ops::Range<usize>) -> std::ops::Range<usize> {
        let infos = self.runs_to_be();
        // `since` in the runs to be: the merge under way is one run there.
        let collapsed = self.merging.as_ref().map_or(0, |merging| merging.range.len().saturating_sub(1));
        let at = |run: usize| run - collapsed;
        for length in 2..since.len() {
            let windows = (since.start..=since.end - length).map(|start| start..start + length);
            let bytes = |window: &std::ops::Range<usize>| -> u64 {
                infos[at(window.start)..at(window.end)].iter().map(|run| run.bytes).sum()
            };
            let Some(cheapest) = windows.min_by_key(|window| bytes(window)) else { continue };
            let mut merged = infos.clone();
            merged.splice(at(cheapest.start)..at(cheapest.end), [RunInfo::of(bytes(&cheapest))]);
            if !compact::overdue(&merged) {
                return cheapest;
            }
        }
        since
    }

    /// Starts the merge the policy asks for, if any, on a thread of its own; without a
    /// thread to be had, writes it here.
    fn start_merge(&mut self, group_hash: GroupHash) -> Result<(), SluiceError> {
        assert!(self.merging.is_none(), "one merge at a time");
        let Some(merge) = self.plan_merge(group_hash) else { return Ok(()) };
        let range = merge.range.clone();
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new().name("sluice-merge".into()).spawn(move || {
            let merge: RunMerge = receiver.recv().expect("the merge, sent at once");
            merge.write()
        });
        match spawned {
            Ok(thread) => {
                sender.send(merge).expect("the merge's thread waits for it");
                self.merging = Some(Merging { thread, range });
            }
            Err(error) => {
                tracing::debug!(%error, "no thread for a merge of evicted state: merged on the operator's");
                self.put_in_place(merge.write_here()?);
            }
        }
        Ok(())
    }

    /// Puts the merge under way in place of the runs it merged once it is written (when
    /// `wait`, once it is, joining its thread); returns the bytes it wrote.
    fn finish_merge(&mut self, wait: bool) -> Result<u64, SluiceError> {
        if !self.merging.as_ref().is_some_and(|merging| wait || merging.thread.is_finished()) {
            return Ok(0);
        }
        let merging = self.merging.take().expect("a merge under way");
        let merged = merging
            .thread
            .join()
            .map_err(|_| SluiceError::internal("state.spill", "the merge of evicted state's runs panicked"))??;
        let bytes = merged.run.bytes;
        self.put_in_place(merged);
        Ok(bytes)
    }

    /// Puts a merge's run in place of the runs it merged, and counts its bytes as
    /// written.
    fn put_in_place(&mut self, merged: MergedRun) {
        let runs = &mut self.runs.runs;
        let replaced = runs.get(merged.range.clone()).unwrap_or_default();
        assert!(
            replaced.len() == merged.blooms.len()
                && replaced.iter().zip(&merged.blooms).all(|(run, bloom)| Arc::ptr_eq(&run.bloom, bloom)),
            "a merge replaces the runs it merged, still in their places"
        );
        self.written.add(merged.run.bytes);
        runs.splice(merged.range, [merged.run]);
        self.recharge();
    }

    /// Counts the runs' indexes and filters in the space.
    fn recharge(&mut self) {
        let memory = self.runs.memory();
        self.space.charge(memory);
        self.space.release(self.charged);
        self.charged = memory;
    }

    /// A new run holding what `fill` writes.
    fn write(
        &mut self,
        groups: usize,
        about_bytes: usize,
        group_hash: &dyn Fn(&[u8]) -> Option<u64>,
        fill: impl FnOnce(&mut ColdSink<'_>) -> Result<(), SluiceError>,
    ) -> Result<ColdRun, SluiceError> {
        let run = write_run(&self.space, groups, about_bytes, self.compress, group_hash, fill)?;
        self.written.add(run.bytes);
        Ok(run)
    }
}

/// A new run in `space` holding what `fill` writes (of about `groups` entries and
/// `about_bytes` bytes; its blocks compressed when `compress`), counted there as spilled;
/// its bytes are the caller's to count as written. Free of any store, so that a merge
/// may run on another thread.
fn write_run(
    space: &Arc<SpillSpace>,
    groups: usize,
    about_bytes: usize,
    compress: bool,
    group_hash: &dyn Fn(&[u8]) -> Option<u64>,
    fill: impl FnOnce(&mut ColdSink<'_>) -> Result<(), SluiceError>,
) -> Result<ColdRun, SluiceError> {
    let failed = |error: SluiceError| {
        SluiceError::external(
            "state.spill",
            format!(
                "cannot write about {about_bytes} bytes of evicted state to a spill file in {}: {error}",
                space.dir().display()
            ),
        )
        .with_fix(
            "free space on the disk of [pipeline] state_dir, point state_dir at a larger disk, \
             or raise [pipeline] state_memory_mib",
        )
    };
    let file = space.create_file()?;
    let mut writer =
        RunWriter::with_block_bytes(BufWriter::with_capacity(256 << 10, file), COLD_BLOCK_BYTES).map_err(failed)?;
    if compress {
        writer = writer.compressed();
    }
    let mut sink = ColdSink { writer, bloom: Bloom::with_capacity(groups), groups: 0, group_hash };
    fill(&mut sink).map_err(failed)?;
    let ColdSink { writer, bloom, groups, .. } = sink;
    let (written, out) = writer.finish().map_err(failed)?;
    let file = out.into_inner().map_err(|error| failed(SluiceError::external("state.spill", error.to_string())))?;
    let name = format!("a spill file of evicted state in {}", space.dir().display());
    let source = FileSource::from_file(name, file)?;
    space.count_spilled(written.bytes as usize, true);
    let source: Arc<dyn RunSource> = Arc::new(ColdFile { source, space: Arc::clone(space) });
    let input = MergeInput::open(source)?;
    Ok(ColdRun { input, bloom: Arc::new(bloom), groups, bytes: written.bytes })
}

impl Drop for ColdStore {
    fn drop(&mut self) {
        // Its files are the space's: gone with the store, not after it.
        if let Some(merging) = self.merging.take() {
            let _ = merging.thread.join();
        }
        self.space.release(self.charged + self.entries);
    }
}

/// Keys of entries, for [`HashSet`] lookups by slice.
pub(crate) type Keys = HashSet<Vec<u8>>;

/// Records beyond the memory budget for state that lives outside an operator's own
/// structures (a materialized table's slices, in `sluice-engine`): sorted runs of
/// `(vnode, key) → value` in the space's directory, written as [`ColdStore`] writes its
/// runs (bloom filters over `sluice_types::key::hash` of each key, compacted by the same
/// policy, deletes dropped once the oldest run takes part), but merged where the caller
/// likes, on another thread ([`SpilledRecords::plan_merge`]). The caller counts its own
/// entries in memory here too ([`SpilledRecords::set_entry_bytes`]), so that the space
/// sees them and their runs' indexes and filters in its budget.
pub struct SpilledRecords {
    store: ColdStore,
}

impl std::fmt::Debug for SpilledRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpilledRecords").field("runs", &self.store.runs.runs.len()).finish_non_exhaustive()
    }
}

fn record_hash(key: &[u8]) -> Option<u64> {
    Some(sluice_types::key::hash(key))
}

impl SpilledRecords {
    /// Runs in `space`; `written` counts the bytes written to them.
    pub fn new(space: Arc<SpillSpace>, written: LazyCounter) -> SpilledRecords {
        SpilledRecords { store: ColdStore::new(space, written) }
    }

    /// Writes what `fill` puts and deletes, in `(vnode, key)` order (about `keys` keys
    /// and `about_bytes` bytes), as a new run. A file that cannot be written fails with
    /// the directory, the bytes and the fix; the runs are then those before the call.
    /// The caller merges the runs where it likes ([`SpilledRecords::plan_merge`]), off
    /// its own thread.
    pub fn add_unmerged(
        &mut self,
        keys: usize,
        about_bytes: usize,
        fill: impl FnOnce(&mut dyn StateSink) -> Result<(), SluiceError>,
    ) -> Result<(), SluiceError> {
        let run = self.store.write(keys, about_bytes, &record_hash, |sink| fill(sink))?;
        self.store.runs.runs.push(run);
        self.store.recharge();
        Ok(())
    }

    /// The merge that `sluice_state::compact`'s policy asks of the runs now (None when
    /// none is due), to be written on any thread ([`RunMerge::write`]) and put in place
    /// of the runs it merges by [`SpilledRecords::finish_merge`]. Runs added meanwhile
    /// come after them; the caller starts no other merge until this one is finished.
    pub fn plan_merge(&self) -> Option<RunMerge> {
        self.store.plan_merge(Arc::new(record_hash))
    }

    /// Puts a merge's run in place of the runs it merged, and counts its bytes as
    /// written.
    pub fn finish_merge(&mut self, merged: MergedRun) {
        self.store.put_in_place(merged);
    }

    /// The runs as they are now: a reader keeps them (and their files) while newer runs
    /// are added and merged.
    pub fn runs(&self) -> SpilledRuns {
        SpilledRuns(self.store.runs.clone())
    }

    /// Counts the caller's entries in memory as `bytes` in the space.
    pub fn set_entry_bytes(&mut self, bytes: usize) {
        self.store.set_entry_bytes(bytes);
    }

    pub fn space(&self) -> &Arc<SpillSpace> {
        self.store.space()
    }
}

/// A merge of some of the runs of a [`ColdStore`] or of [`SpilledRecords`] (planned by
/// [`SpilledRecords::plan_merge`]): it holds its inputs (their files live while it does)
/// and writes on any thread.
pub struct RunMerge {
    space: Arc<SpillSpace>,
    inputs: Vec<MergeInput>,
    /// The merged runs' filters, which name them when the merge is put in place.
    blooms: Vec<Arc<Bloom>>,
    mode: MergeMode,
    groups: usize,
    bytes: usize,
    range: std::ops::Range<usize>,
    group_hash: GroupHash,
    compress: bool,
}

/// A merge's run, written, for [`SpilledRecords::finish_merge`].
pub struct MergedRun {
    run: ColdRun,
    blooms: Vec<Arc<Bloom>>,
    range: std::ops::Range<usize>,
}

impl RunMerge {
    /// Writes the merged run, on a merge's thread (the `state.merge` failpoint holds or
    /// fails it there). A file that cannot be written fails with the directory, the bytes
    /// and the fix; the runs then stay as they are.
    pub fn write(self) -> Result<MergedRun, SluiceError> {
        sluice_types::failpoint!("state.merge");
        self.write_here()
    }

    /// [`RunMerge::write`] on the caller's thread.
    fn write_here(self) -> Result<MergedRun, SluiceError> {
        let RunMerge { space, inputs, blooms, mode, groups, bytes, range, group_hash, compress } = self;
        let mut merge = Merge::new(inputs, 0..u32::MAX, mode);
        let fill = |sink: &mut ColdSink<'_>| merge.write_into(sink).map(|_| ());
        let run = write_run(&space, groups, bytes, compress, &*group_hash, fill)?;
        Ok(MergedRun { run, blooms, range })
    }
}

/// The runs of [`SpilledRecords`] at one moment, oldest first. Cheap to clone.
#[derive(Clone, Default)]
pub struct SpilledRuns(ColdRuns);

impl std::fmt::Debug for SpilledRuns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpilledRuns").field("runs", &self.0.runs.len()).finish()
    }
}

impl SpilledRuns {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of `key` (of vnode `vnode`) in the newest run that names it; None when
    /// no run does, or that run deletes it.
    pub fn get(&self, vnode: u32, key: &[u8]) -> Result<Option<Vec<u8>>, SluiceError> {
        let hash = sluice_types::key::hash(key);
        Ok(self.0.find(vnode, key, hash, &|_| false)?.map(|found| found.value))
    }

    /// Every live record, in `(vnode, key)` order, read block by block.
    pub fn scan(&self) -> Merge {
        Merge::new(self.0.inputs(), 0..u32::MAX, MergeMode::Live)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use sluice_runtime::Metrics;

    use super::*;

    const VNODES: u32 = 4;

    fn vnode_of(key: &[u8]) -> u32 {
        sluice_types::vnode::of_hash(sluice_types::key::hash(key), VNODES)
    }

    fn hash(key: &[u8]) -> Option<u64> {
        Some(sluice_types::key::hash(key))
    }

    fn store(space: &Arc<SpillSpace>) -> ColdStore {
        let written = LazyCounter::new(Arc::new(Metrics::new(Vec::new(), Vec::new(), 1)), "spilled");
        ColdStore::new(Arc::clone(space), written)
    }

    fn find(store: &ColdStore, key: &[u8]) -> Option<Vec<u8>> {
        let found = store.runs().find(vnode_of(key), key, sluice_types::key::hash(key), &|_| false);
        found.expect("a lookup").map(|entry| entry.value)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Runs of puts and deletes over a few keys, added one after another (and merged
        /// as the policy says): a lookup always finds the newest put of a key unless a
        /// newer delete names it, the runs stay few, and once the store is dropped the
        /// space counts none of its memory or files.
        #[test]
        fn a_lookup_finds_the_newest_copy_through_compactions(
            runs in prop::collection::vec(
                prop::collection::btree_map(0u16..300, prop::option::weighted(0.8, any::<u16>()), 1..60),
                1..40,
            ),
        ) {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let space = SpillSpace::new(dir.path().to_path_buf(), 1 << 30);
            let mut cold = store(&space);
            let mut model: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
            let key_of = |k: u16| format!("key-{k}").into_bytes();
            for run in &runs {
                let mut records = Records::new(None);
                for (&k, value) in run {
                    let key = key_of(k);
                    let value = value.map(|v| v.to_le_bytes().to_vec());
                    match &value {
                        Some(bytes) => {
                            records.add(vnode_of(&key), |out| out.extend_from_slice(&key), Some(&|out: &mut Vec<u8>| out.extend_from_slice(bytes)))
                        }
                        None => records.add(vnode_of(&key), |out| out.extend_from_slice(&key), None),
                    }
                    model.insert(key, value);
                }
                cold.add(records, run.len(), 0, hash).expect("a run");
                // Within twice the policy's runs once the merge under way is in place;
                // meanwhile its inputs too.
                let (to_be, now) = (cold.runs_to_be().len(), cold.runs().runs.len());
                prop_assert!(to_be < 2 * compact::RUNS_MAX, "{} runs to be", to_be);
                prop_assert!(now < 4 * compact::RUNS_MAX, "{} runs", now);
            }
            for k in 0..300 {
                let key = key_of(k);
                prop_assert_eq!(find(&cold, &key), model.get(&key).cloned().flatten(), "key {}", k);
            }
            prop_assert!(space.spilled() > 0 && space.resident() > 0);
            drop(cold);
            prop_assert_eq!((space.resident(), space.spilled()), (0, 0));
        }
    }

    #[test]
    fn an_entry_goes_when_passed_untouched_often_enough_for_its_size_and_its_return() {
        let budget = 8 << 20;
        // A small entry goes at the first pass it was not touched before.
        let mut marks = RECENT;
        assert!(!passes(&mut marks, 100, budget), "touched since the last pass");
        assert!(passes(&mut marks, 100, budget));
        // One of three eighths of the budget waits three passes untouched.
        let mut marks = 0;
        assert_eq!(
            (0..4).map(|_| passes(&mut marks, 3 << 20, budget)).collect::<Vec<_>>(),
            [false, false, false, true]
        );
        // One read back from a run waits four, and a touch starts it over.
        let mut marks = FROM_COLD;
        assert_eq!((0..3).map(|_| passes(&mut marks, 100, budget)).collect::<Vec<_>>(), [false, false, false]);
        marks |= RECENT;
        assert!(!passes(&mut marks, 100, budget));
        assert_eq!(marks, FROM_COLD, "the touch cleared its age, not where it came from");
        assert_eq!(
            (0..5).map(|_| passes(&mut marks, 100, budget)).collect::<Vec<_>>(),
            [false, false, false, false, true]
        );
    }

    /// Runs added without merging, then the merge the policy plans written on another
    /// thread while a newer run is added: put in place, the runs are fewer, each key's
    /// newest value stands (the newer run's over the merged ones'), deletes are gone
    /// from a merge that includes the oldest run, and the space counts no file once the
    /// records are dropped.
    #[test]
    fn a_merge_written_on_another_thread_replaces_the_runs_it_merged() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::new(dir.path().to_path_buf(), 1 << 30);
        let written = LazyCounter::new(Arc::new(Metrics::new(Vec::new(), Vec::new(), 1)), "spilled");
        let mut records = SpilledRecords::new(Arc::clone(&space), written);
        let mut want: BTreeMap<(u32, Vec<u8>), Vec<u8>> = BTreeMap::new();
        let mut add = |records: &mut SpilledRecords, round: u32, keys: std::ops::Range<u32>| {
            let mut run: BTreeMap<(u32, Vec<u8>), Option<Vec<u8>>> = BTreeMap::new();
            for key in keys {
                let key = key.to_be_bytes().to_vec();
                // Every third key of a later round deleted, the others given the round.
                let value = (round == 0 || key[3] % 3 != 0).then(|| round.to_le_bytes().to_vec());
                run.insert((vnode_of(&key), key), value);
            }
            records
                .add_unmerged(run.len(), 0, |sink| {
                    for ((vnode, key), value) in &run {
                        match value {
                            Some(value) => sink.put(*vnode, key, value)?,
                            None => sink.delete(*vnode, key)?,
                        }
                    }
                    Ok(())
                })
                .expect("a run");
            for (key, value) in run {
                match value {
                    Some(value) => want.insert(key, value),
                    None => want.remove(&key),
                };
            }
        };
        let mut round = 0;
        let merge = loop {
            add(&mut records, round, round * 50..round * 50 + 100);
            round += 1;
            if let Some(merge) = records.plan_merge() {
                break merge;
            }
            assert!(round < 64, "the policy never asked for a merge");
        };
        let before = records.runs().0.runs.len();
        let merged = std::thread::spawn(move || merge.write()).join().expect("the merge's thread").expect("merged");
        add(&mut records, round, 0..30);
        records.finish_merge(merged);
        let after = records.runs().0.runs.len();
        assert!(after < before + 1, "{before} runs and one added, {after} after the merge");
        let mut scanned = BTreeMap::new();
        let mut scan = records.runs().scan();
        while let Some(record) = scan.next_record().expect("a record") {
            scanned.insert((record.vnode, record.key.to_vec()), record.value.to_vec());
        }
        assert_eq!(scanned, want);
        for ((vnode, key), value) in &want {
            assert_eq!(records.runs().get(*vnode, key).expect("a lookup").as_ref(), Some(value));
        }
        drop((records, scan));
        assert_eq!(space.spilled(), 0, "the merged runs' files and the merge's are gone");
    }

    /// A store's merge is written on a thread of its own: held there (the `state.merge`
    /// failpoint paused), runs go on being added and every lookup finds the newest copy;
    /// let go, its run takes the place of those it merged. Past twice the runs the policy
    /// keeps, the runs added meanwhile are merged here instead of waiting. A merge that
    /// fails loses nothing: its error comes back from a later run added, every record is
    /// still found, and the store goes on.
    #[test]
    fn a_store_adds_runs_while_its_merge_is_written_elsewhere_and_a_failed_merge_fails_the_next_add() {
        use sluice_types::failpoint::fail;
        let scenario = fail::FailScenario::setup();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::new(dir.path().to_path_buf(), 1 << 30);
        let mut cold = store(&space);
        let mut want: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
        // A base of 1,000 keys, then runs of 40 of them: a merge of eight small runs
        // falls due long before the merges could fall behind (and the store wait).
        let add = |cold: &mut ColdStore, want: &mut BTreeMap<Vec<u8>, u32>, round: u32| {
            let mut records = Records::new(None);
            let keys = if round == 0 { 0..1000 } else { 0..40 };
            let keys: BTreeMap<(u32, Vec<u8>), ()> = keys
                .map(|k| format!("key-{}", (round * 7 + k) % 1000).into_bytes())
                .map(|k| ((vnode_of(&k), k), ()))
                .collect();
            for (_, key) in keys.keys() {
                records.add(
                    vnode_of(key),
                    |out| out.extend_from_slice(key),
                    Some(&|out: &mut Vec<u8>| out.extend_from_slice(&round.to_le_bytes())),
                );
                want.insert(key.clone(), round);
            }
            cold.add(records, keys.len(), 0, hash)
        };
        let check = |cold: &ColdStore, want: &BTreeMap<Vec<u8>, u32>| {
            for (key, round) in want {
                assert_eq!(find(cold, key), Some(round.to_le_bytes().to_vec()), "{}", String::from_utf8_lossy(key));
            }
        };
        fail::cfg("state.merge", "pause").expect("cfg");
        let mut round = 0;
        while cold.merging.is_none() {
            add(&mut cold, &mut want, round).expect("a run");
            round += 1;
            assert!(round < 64, "the policy never asked for a merge");
        }
        let before = cold.runs.runs.len();
        for _ in 0..3 {
            add(&mut cold, &mut want, round).expect("a run while the merge is held");
            round += 1;
            check(&cold, &want);
        }
        assert_eq!(cold.runs.runs.len(), before + 3, "no run merged while the merge is held");
        // Past twice the runs the policy keeps, runs added since the merge started are
        // merged here rather than the store waiting for the held merge: the fewest that
        // bring it back within the policy (two at a time), so the runs to be stay one
        // under the limit.
        let mut reached = false;
        for _ in 0..2 * compact::RUNS_MAX {
            add(&mut cold, &mut want, round).expect("a run while the merge is held");
            round += 1;
            let runs = cold.runs_to_be().len();
            assert!(runs < 2 * compact::RUNS_MAX, "{runs} runs to be");
            reached |= runs == 2 * compact::RUNS_MAX - 1;
            if reached {
                assert_eq!(runs, 2 * compact::RUNS_MAX - 1, "no more runs merged here than needed");
            }
            check(&cold, &want);
        }
        assert!(reached, "the runs reached the limit while the merge was held");
        let before = cold.runs.runs.len();
        fail::remove("state.merge");
        let merged = cold.finish_merge(true).expect("the merge");
        assert!(merged > 0 && cold.runs.runs.len() < before, "{} runs", cold.runs.runs.len());
        check(&cold, &want);

        fail::cfg("state.merge", "return(disk full)").expect("cfg");
        let mut failed = None;
        for _ in 0..64 {
            let added = add(&mut cold, &mut want, round);
            round += 1;
            if let Err(error) = added {
                failed = Some(error);
                break;
            }
        }
        let error = failed.expect("a failed merge fails a later add");
        assert!(error.message.contains("disk full"), "{error}");
        // Nothing merged is lost, and the store goes on.
        check(&cold, &want);
        fail::remove("state.merge");
        add(&mut cold, &mut want, round).expect("a run after the failed merge");
        check(&cold, &want);
        drop(cold);
        assert_eq!(space.spilled(), 0, "no file is left");
        scenario.teardown();
    }

    /// The filter never forgets a key it was given, and names about 0.2% of the keys it
    /// was not (under 0.5%, over 100,000 of each).
    #[test]
    fn a_bloom_filter_holds_its_keys_and_few_others() {
        let mut bloom = Bloom::with_capacity(100_000);
        let key = |k: u64| sluice_types::key::hash(&k.to_le_bytes());
        for k in 0..100_000 {
            bloom.insert(key(k));
        }
        assert!((0..100_000).all(|k| bloom.may_hold(key(k))), "a key given is held");
        let false_positives = (100_000..200_000).filter(|&k| bloom.may_hold(key(k))).count();
        assert!(false_positives < 500, "{false_positives} false positives in 100,000");
        assert_eq!(bloom.bytes(), (100_000 * BLOOM_BITS_PER_KEY).div_ceil(512) * 64, "14 bits a key, in whole lines");
    }

    #[test]
    fn after_a_whole_turn_of_evictions_short_of_their_goal_the_next_waits_for_an_eighth_of_the_budget() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::new(dir.path().to_path_buf(), 800);
        let mut cold = store(&space);
        cold.charge(700);
        assert_eq!(cold.eviction_goal(), None, "under the budget");
        cold.charge(300);
        assert_eq!(cold.eviction_goal(), Some(200 + 100), "to an eighth under the budget");
        // A full eviction: the next one comes at the next batch over the budget.
        cold.release(300);
        cold.evicted(300, 300, 10, 1000);
        cold.charge(150);
        assert_eq!(cold.eviction_goal(), Some(50 + 100));
        // Short of the goal, its hand stopped at the operator's cap: the next comes at
        // once, from where the hand stopped.
        cold.evicted(0, 150, 400, 1000);
        assert_eq!(cold.eviction_goal(), Some(50 + 100), "400 of 1,000 entries looked at");
        cold.evicted(0, 150, 400, 1000);
        assert_eq!(cold.eviction_goal(), Some(50 + 100), "800 of 1,000 entries looked at");
        // Short of it once the hand went all the way round: none until the space grew
        // by 100 past its least since.
        cold.release(20);
        cold.evicted(20, 150, 200, 1000);
        assert_eq!(space.resident(), 830);
        assert_eq!(cold.eviction_goal(), None);
        cold.release(10);
        assert_eq!(cold.eviction_goal(), None, "820 is the least now");
        cold.charge(99);
        assert_eq!(cold.eviction_goal(), None, "919: 99 past the least");
        cold.charge(1);
        assert_eq!(cold.eviction_goal(), Some(120 + 100), "920: an eighth past the least");
        // Under the budget again, the pacing is forgotten.
        cold.evicted(0, 220, 1000, 1000);
        cold.release(200);
        assert_eq!(cold.eviction_goal(), None, "720: under the budget");
        cold.charge(100);
        assert_eq!(cold.eviction_goal(), Some(20 + 100), "over the budget again: at once");
        drop(cold);
        assert_eq!(space.resident(), 0);
    }

    #[test]
    fn an_entry_comes_back_with_the_records_that_follow_it_across_blocks() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let space = SpillSpace::new(dir.path().to_path_buf(), 1 << 30);
        let mut cold = store(&space);
        let mut records = Records::new(None);
        // One entry whose following records fill several blocks, between two others.
        let vnode = 0;
        let put = |records: &mut Records, key: Vec<u8>, value: Vec<u8>| {
            records.add(
                vnode,
                |out| out.extend_from_slice(&key),
                Some(&|out: &mut Vec<u8>| out.extend_from_slice(&value)),
            )
        };
        put(&mut records, b"a".to_vec(), b"first".to_vec());
        put(&mut records, b"b".to_vec(), b"entry".to_vec());
        for i in 0..2000u32 {
            let mut key = b"b+".to_vec();
            key.extend_from_slice(&i.to_be_bytes());
            put(&mut records, key, vec![7; 40]);
        }
        put(&mut records, b"c".to_vec(), b"last".to_vec());
        cold.add(records, 3, 0, |key: &[u8]| (!key.contains(&b'+')).then_some(1)).expect("a run");
        let blocks = cold.runs().runs[0].input.index.blocks.len();
        assert!(blocks > 3, "the values span {blocks} blocks");
        let follows = |key: &[u8]| key.starts_with(b"b+");
        let found = cold.runs().find(vnode, b"b", 1, &follows).expect("a lookup").expect("the entry");
        assert_eq!(found.value, b"entry");
        assert_eq!(found.following.len(), 2000);
        let last = cold.runs().find(vnode, b"c", 1, &|_| false).expect("a lookup").expect("the last entry");
        assert_eq!(last.value, b"last");
        assert!(cold.runs().find(vnode, b"bb", 1, &|_| false).expect("a lookup").is_none(), "absent");
    }
}
