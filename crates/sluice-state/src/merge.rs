//! Runs merged into one ordered sequence of records: what a restore reads and what a
//! compaction writes.
//!
//! The runs are given oldest first. For each key, the newest run that mentions it
//! decides: its put is the value, its delete removes it; and a range delete of a run
//! hides every key it covers in the runs older than it (never in its own run or newer
//! ones: a run applies its range deletes before its puts, `crate::run`).
//!
//! Memory: one block per run being merged, and each run's range deletes of the current
//! vnode (few: a window operator's closed windows since the previous checkpoint). Every
//! block is read when the merge reaches it, checked (checksum, tags, lengths, order), and
//! dropped when the merge leaves it; except a block whose keys a newer run's range
//! delete hides whole (its span, from its first key to the next block's, is covered:
//! `unhidden`), which is never read. So merging the runs of a state whose rows expire
//! (a join's side, deleted by expiry) reads the rows still live, not those expired.
//! A merge that keeps deletes yields the union of its runs' range deletes of each vnode.
//!
//! A live merge may be limited to a range of keys in every vnode ([`Merge::within`]):
//! of each run it reads only the blocks whose span meets the range (a window
//! operator's groups of one window, whose keys start with its end), and yields only the
//! keys in it.

use std::ops::Range;
use std::sync::Arc;

use sluice_types::SluiceError;

use crate::read::{BlockInfo, Entry, RunIndex, RunSource, decode_entry, decode_raw, read_block};
use crate::{Record, StateSink, StateSource, damaged};

/// What a merge yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeMode {
    /// Only live puts: a restore, or a compaction of every run of a range (nothing older
    /// is left for a delete to hide).
    Live,
    /// Puts, deletes and range deletes: a compaction of the newest runs of a range, whose
    /// deletes must still hide keys of the older runs left out of it.
    KeepDeletes,
}

/// A run to merge: where its bytes are, its index, and the vnodes it serves (its records
/// of other vnodes are not read: a run written for vnodes that two threads now own serves
/// each of them its own part).
#[derive(Clone)]
pub struct MergeInput {
    pub source: Arc<dyn RunSource>,
    pub index: Arc<RunIndex>,
    pub vnodes: Range<u32>,
}

impl std::fmt::Debug for MergeInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MergeInput").field("source", &self.source.name()).finish()
    }
}

impl MergeInput {
    /// Opens `source`, reading and checking its index.
    pub fn open(source: Arc<dyn RunSource>) -> Result<MergeInput, SluiceError> {
        let index = Arc::new(RunIndex::read(&*source)?);
        Ok(MergeInput { source, index, vnodes: 0..u32::MAX })
    }

    /// The same run serving only the vnodes `vnodes`.
    pub fn serving(mut self, vnodes: Range<u32>) -> MergeInput {
        self.vnodes = vnodes;
        self
    }
}

/// One run's puts and deletes of the current vnode, one block at a time.
struct Cursor {
    input: usize,
    blocks: Vec<BlockInfo>,
    next_block: usize,
    block: Vec<u8>,
    /// Where the next entry starts in `block`, and the entries left in it.
    at: usize,
    left: u64,
    /// The current entry: its key and, for a put, its value, as ranges of `block`.
    key: Range<usize>,
    value: Option<Range<usize>>,
    /// The key before the current one (the order is checked across blocks), once there is one.
    previous: Option<Vec<u8>>,
    current: bool,
}

impl Cursor {
    fn new(input: usize, blocks: Vec<BlockInfo>) -> Cursor {
        let (key, value, previous) = (0..0, None, None);
        Cursor { input, blocks, next_block: 0, block: Vec::new(), at: 0, left: 0, key, value, previous, current: false }
    }

    fn key(&self) -> &[u8] {
        &self.block[self.key.clone()]
    }

    /// Moves to the next entry, reading the next block when this one is done; `current`
    /// is false at the end.
    fn advance(&mut self, source: &dyn RunSource) -> Result<(), SluiceError> {
        if self.current {
            let previous = self.previous.get_or_insert_with(Vec::new);
            previous.clear();
            previous.extend_from_slice(&self.block[self.key.clone()]);
        }
        let starts_block = self.left == 0;
        if starts_block {
            let Some(info) = self.blocks.get(self.next_block) else {
                self.current = false;
                return Ok(());
            };
            self.block = read_block(source, info)?;
            (self.at, self.left) = (0, info.entries);
            self.next_block += 1;
        }
        let info = &self.blocks[self.next_block - 1];
        let damaged_here = |problem: String| {
            damaged(source.name(), format!("the block of vnode {} at {}: {problem}", info.vnode, info.offset))
        };
        let entry = decode_raw(&self.block, &mut self.at, false).map_err(damaged_here)?;
        self.left -= 1;
        let key = &self.block[entry.key.clone()];
        if starts_block && key != info.first_key.as_slice() {
            return Err(damaged_here("it does not start at its index's key".to_string()));
        }
        if self.previous.as_deref().is_some_and(|previous| previous >= key) {
            return Err(damaged_here("its keys are out of order".to_string()));
        }
        if (self.left == 0) != (self.at == self.block.len()) {
            return Err(damaged_here("its entries do not match its index".to_string()));
        }
        (self.key, self.value, self.current) = (entry.key, entry.tail, true);
        Ok(())
    }
}

/// A range delete's start and end.
type KeyRange = (Vec<u8>, Vec<u8>);

/// A run's range deletes of one vnode, as sorted disjoint intervals (to test a key).
#[derive(Default)]
struct Ranges {
    union: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Ranges {
    fn covers(&self, key: &[u8]) -> bool {
        // The last interval starting at or below `key`.
        let after = self.union.partition_point(|(start, _)| start.as_slice() <= key);
        after > 0 && key < self.union[after - 1].1.as_slice()
    }

    /// Whether every key `k` with `start <= k < end` is covered.
    fn covers_all(&self, start: &[u8], end: &[u8]) -> bool {
        let after = self.union.partition_point(|(first, _)| first.as_slice() <= start);
        after > 0 && end <= self.union[after - 1].1.as_slice()
    }
}

/// The blocks of `blocks` (one run's puts and deletes of a vnode, in order) that may hold
/// a key not hidden by `newer` (the newer runs' range deletes of the vnode). A block's
/// keys lie from its first key to the next block's: one whose span a newer range delete
/// covers whole is left unread (an expired part of a join's side, a closed window's
/// groups), so a merge reads what it keeps, not what was deleted since. The last block
/// is always read: its last key is not in the index.
fn unhidden(blocks: &[BlockInfo], newer: &[Ranges]) -> Vec<BlockInfo> {
    let hidden = |(block, next): (&BlockInfo, &BlockInfo)| {
        newer.iter().any(|ranges| ranges.covers_all(&block.first_key, &next.first_key))
    };
    let mut read = Vec::with_capacity(blocks.len());
    for (position, block) in blocks.iter().enumerate() {
        if !blocks.get(position + 1).is_some_and(|next| hidden((block, next))) {
            read.push(block.clone());
        }
    }
    read
}

/// The blocks of `blocks` (one run's puts and deletes of a vnode, in order) whose span,
/// from its first key to the next block's, meets the keys from `start` up to `end`.
fn spanning<'a>(blocks: &'a [BlockInfo], start: &[u8], end: Option<&[u8]>) -> &'a [BlockInfo] {
    let first = blocks.partition_point(|block| block.first_key.as_slice() <= start).saturating_sub(1);
    let last = end.map_or(blocks.len(), |end| blocks.partition_point(|block| block.first_key.as_slice() < end));
    &blocks[first..last.max(first)]
}

/// The range deletes `blocks` hold (`input`'s range-delete blocks of `vnode`), read and
/// checked: sorted by start, the first starting at the first block's key.
fn read_ranges(input: &MergeInput, vnode: u32, blocks: &[BlockInfo]) -> Result<Vec<KeyRange>, SluiceError> {
    let mut written = Vec::new();
    for info in blocks {
        let block = read_block(&*input.source, info)?;
        let mut at = 0;
        for _ in 0..info.entries {
            match decode_entry(&block, &mut at, true).map_err(|problem| damaged(input.source.name(), problem))? {
                Entry::Range { start, end } => written.push((start.to_vec(), end.to_vec())),
                Entry::Put { .. } | Entry::Delete { .. } => {
                    unreachable!("decode_entry refuses points in a block of ranges")
                }
            }
        }
        if at != block.len() {
            return Err(damaged(
                input.source.name(),
                format!("the range block of vnode {vnode} at {} does not match its index", info.offset),
            ));
        }
    }
    if written.windows(2).any(|pair| pair[0].0 > pair[1].0)
        || written.first().is_some_and(|(start, _)| Some(start) != blocks.first().map(|b| &b.first_key))
    {
        return Err(damaged(input.source.name(), format!("the range deletes of vnode {vnode} are out of order")));
    }
    Ok(written)
}

/// The merge of one vnode.
struct VnodeMerge {
    vnode: u32,
    cursors: Vec<Cursor>,
    /// Per input, its range deletes of this vnode.
    ranges: Vec<Ranges>,
    /// Range deletes still to yield ([`MergeMode::KeepDeletes`]), in order.
    pending_ranges: std::vec::IntoIter<(Vec<u8>, Vec<u8>)>,
    /// The cursors at the key yielded last, to advance before the next.
    consumed: Vec<usize>,
}

/// Runs merged (see the module doc). Implements [`StateSource`] for [`MergeMode::Live`].
pub struct Merge {
    inputs: Vec<MergeInput>,
    vnodes: std::vec::IntoIter<u32>,
    current: Option<VnodeMerge>,
    mode: MergeMode,
    /// The range being yielded ([`MergeMode::KeepDeletes`]).
    range: (Vec<u8>, Vec<u8>),
    blocks_skipped: u64,
    /// Blocks a compaction took whole ([`Merge::write_into`]).
    blocks_copied: u64,
    /// The keys yielded in each vnode: from the first, up to the second (None: every key
    /// from the first on). None: every key.
    keys: Option<(Vec<u8>, Option<Vec<u8>>)>,
    /// Set while [`Merge::write_into`] opens each vnode itself: the merge ends with each
    /// vnode instead of opening the next.
    one_vnode: bool,
}

impl std::fmt::Debug for Merge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merge").field("inputs", &self.inputs).field("mode", &self.mode).finish_non_exhaustive()
    }
}

/// What one step of a merge came to.
enum Step {
    Again,
    End,
    /// `Merge::range` is the next item.
    Range,
    /// The current entry of this cursor is.
    Point(usize),
}

/// One item of a merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merged<'a> {
    Put { vnode: u32, key: &'a [u8], value: &'a [u8] },
    Delete { vnode: u32, key: &'a [u8] },
    Range { vnode: u32, start: &'a [u8], end: &'a [u8] },
}

impl Merge {
    /// The records of the vnodes in `vnodes` of `inputs` (oldest first).
    pub fn new(inputs: Vec<MergeInput>, vnodes: Range<u32>, mode: MergeMode) -> Merge {
        let mut present: Vec<u32> = inputs
            .iter()
            .flat_map(|input| {
                let serves = |vnode: &u32| vnodes.contains(vnode) && input.vnodes.contains(vnode);
                input.index.vnodes().filter(serves).collect::<Vec<_>>()
            })
            .collect();
        present.sort_unstable();
        present.dedup();
        Merge {
            inputs,
            vnodes: present.into_iter(),
            current: None,
            mode,
            range: Default::default(),
            blocks_skipped: 0,
            blocks_copied: 0,
            keys: None,
            one_vnode: false,
        }
    }

    /// The same merge yielding, in each vnode, only the keys from `start` up to `end`
    /// (None: every key from `start` on), and reading only the blocks that may hold them.
    pub fn within(mut self, start: Vec<u8>, end: Option<Vec<u8>>) -> Merge {
        assert_eq!(self.mode, MergeMode::Live, "a merge keeping deletes yields every key of its ranges");
        self.keys = Some((start, end));
        self
    }

    fn open_vnode(&mut self, vnode: u32) -> Result<VnodeMerge, SluiceError> {
        let mut ranges = Vec::with_capacity(self.inputs.len());
        let mut all_ranges = Vec::new();
        let mut points = Vec::with_capacity(self.inputs.len());
        for input in &self.inputs {
            let blocks = if input.vnodes.contains(&vnode) { input.index.vnode_blocks(vnode) } else { &[] };
            let split = blocks.partition_point(|block| block.ranges);
            let written = read_ranges(input, vnode, &blocks[..split])?;
            if self.mode == MergeMode::KeepDeletes {
                all_ranges.extend(written.iter().cloned());
            }
            ranges.push(Ranges { union: union(&written) });
            points.push(&blocks[split..]);
        }
        let mut cursors = Vec::new();
        for (number, blocks) in points.into_iter().enumerate() {
            let blocks = match &self.keys {
                Some((start, end)) => spanning(blocks, start, end.as_deref()),
                None => blocks,
            };
            let read = unhidden(blocks, &ranges[number + 1..]);
            self.blocks_skipped += (blocks.len() - read.len()) as u64;
            if !read.is_empty() {
                let mut cursor = Cursor::new(number, read);
                cursor.advance(&*self.inputs[number].source)?;
                cursors.push(cursor);
            }
        }
        // The merged run's range deletes hide in the runs older than it what any of the
        // merged runs' did: their union, one range where every checkpoint's run wrote one
        // (a join's expiry), so merges of merges do not pile them up.
        all_ranges.sort();
        let pending_ranges = union(&all_ranges).into_iter();
        Ok(VnodeMerge { vnode, cursors, ranges, pending_ranges, consumed: Vec::new() })
    }

    /// Blocks of puts and deletes left unread so far: every key they hold was hidden by a
    /// newer run's range delete.
    pub fn blocks_skipped(&self) -> u64 {
        self.blocks_skipped
    }

    /// The next item, or `None` at the end.
    pub fn next_merged(&mut self) -> Result<Option<Merged<'_>>, SluiceError> {
        let step = loop {
            match self.step()? {
                Step::Again => continue,
                step => break step,
            }
        };
        let current = self.current.as_ref();
        Ok(match step {
            Step::Again | Step::End => None,
            Step::Range => {
                let vnode = current.expect("a vnode is open").vnode;
                Some(Merged::Range { vnode, start: &self.range.0, end: &self.range.1 })
            }
            Step::Point(winner) => {
                let current = current.expect("a vnode is open");
                let cursor = &current.cursors[winner];
                let key = &cursor.block[cursor.key.clone()];
                Some(match &cursor.value {
                    Some(value) => Merged::Put { vnode: current.vnode, key, value: &cursor.block[value.clone()] },
                    None => Merged::Delete { vnode: current.vnode, key },
                })
            }
        })
    }

    /// Moves the merge on by one item, or one step toward it.
    fn step(&mut self) -> Result<Step, SluiceError> {
        let Some(current) = &mut self.current else {
            if self.one_vnode {
                return Ok(Step::End);
            }
            let Some(vnode) = self.vnodes.next() else { return Ok(Step::End) };
            self.current = Some(self.open_vnode(vnode)?);
            return Ok(Step::Again);
        };
        if let Some(range) = current.pending_ranges.next() {
            self.range = range;
            return Ok(Step::Range);
        }
        for &number in &current.consumed {
            let cursor = &mut current.cursors[number];
            cursor.advance(&*self.inputs[cursor.input].source)?;
        }
        current.consumed.clear();
        current.cursors.retain(|cursor| cursor.current);
        if current.cursors.is_empty() {
            self.current = None;
            return Ok(Step::Again);
        }
        // The smallest key; among equal keys the newest input's entry.
        let mut winner = 0;
        for (number, cursor) in current.cursors.iter().enumerate().skip(1) {
            let best = &current.cursors[winner];
            match cursor.key().cmp(best.key()) {
                std::cmp::Ordering::Less => winner = number,
                std::cmp::Ordering::Equal if cursor.input > best.input => winner = number,
                _ => {}
            }
        }
        let key = current.cursors[winner].key();
        current.consumed.extend(current.cursors.iter().enumerate().filter(|(_, c)| c.key() == key).map(|(n, _)| n));
        let cursor = &current.cursors[winner];
        // Hidden by a newer run's range delete: gone (and when deletes are kept, that
        // range delete is yielded too, so nothing needs saying).
        let hidden = current.ranges[cursor.input + 1..].iter().any(|ranges| ranges.covers(key));
        let deleted = cursor.value.is_none() && self.mode == MergeMode::Live;
        let outside = self.keys.as_ref().is_some_and(|(start, end)| {
            key < start.as_slice() || end.as_ref().is_some_and(|end| key >= end.as_slice())
        });
        Ok(if hidden || deleted || outside { Step::Again } else { Step::Point(winner) })
    }

    /// Writes every item into `sink` (a compaction's output run), vnode by vnode. A vnode
    /// whose runs hold no range deletes and whose keys do not overlap from run to run (a
    /// join's appended rows, keyed by arrival: each run's keys above the older runs')
    /// needs no merge: its blocks go to the sink in key order, whole when the sink
    /// [`StateSink::copies_blocks`] and the block is large enough (neither decoded nor
    /// compressed again), else entry by entry. Such a block keeps whatever point deletes
    /// it holds, even in a [`MergeMode::Live`] merge; they hide nothing there, no key
    /// being in two runs.
    pub fn write_into(&mut self, sink: &mut dyn StateSink) -> Result<u64, SluiceError> {
        let mut items = 0;
        self.one_vnode = true;
        while let Some(vnode) = self.vnodes.next() {
            if self.keys.is_none()
                && let Some(order) = self.disjoint(vnode)?
            {
                items += self.concatenate(vnode, &order, sink)?;
                continue;
            }
            self.current = Some(self.open_vnode(vnode)?);
            while let Some(item) = self.next_merged()? {
                items += 1;
                match item {
                    Merged::Put { vnode, key, value } => sink.put(vnode, key, value)?,
                    Merged::Delete { vnode, key } => sink.delete(vnode, key)?,
                    Merged::Range { vnode, start, end } => sink.delete_range(vnode, start, end)?,
                }
            }
        }
        self.one_vnode = false;
        Ok(items)
    }

    /// Blocks a compaction took whole, neither decoded nor compressed again.
    pub fn blocks_copied(&self) -> u64 {
        self.blocks_copied
    }

    /// The inputs holding points of `vnode`, in the order of their keys, when none holds
    /// a range delete of it and their keys do not overlap (each input's first key from
    /// its index, its last from its last block, read here); None otherwise.
    fn disjoint(&self, vnode: u32) -> Result<Option<Vec<usize>>, SluiceError> {
        let mut spans: Vec<(Vec<u8>, Vec<u8>, usize)> = Vec::new();
        for (number, input) in self.inputs.iter().enumerate() {
            let blocks = if input.vnodes.contains(&vnode) { input.index.vnode_blocks(vnode) } else { &[] };
            let (Some(first), Some(last)) = (blocks.first(), blocks.last()) else { continue };
            if first.ranges {
                return Ok(None);
            }
            let bytes = read_block(&*input.source, last)?;
            let entries = crate::read::block_entries(&bytes, last).map_err(|problem| {
                damaged(input.source.name(), format!("the block of vnode {vnode} at {}: {problem}", last.offset))
            })?;
            let last_key = entries.last().map(|entry| entry.key().to_vec()).unwrap_or_default();
            spans.push((first.first_key.clone(), last_key, number));
        }
        spans.sort();
        let overlap = spans.windows(2).any(|pair| pair[0].1 >= pair[1].0);
        Ok((!overlap).then(|| spans.into_iter().map(|(_, _, number)| number).collect()))
    }

    /// Writes the blocks of `vnode` of the inputs `order` (disjoint, in key order) to
    /// `sink`; returns the entries written.
    fn concatenate(&mut self, vnode: u32, order: &[usize], sink: &mut dyn StateSink) -> Result<u64, SluiceError> {
        let whole = sink.copies_blocks();
        let mut items = 0;
        for &number in order {
            let input = &self.inputs[number];
            let source = &*input.source;
            for info in input.index.vnode_blocks(vnode) {
                if whole.is_some_and(|least| info.raw_length.unwrap_or(info.length) >= least) {
                    let length =
                        usize::try_from(info.length).map_err(|_| damaged(source.name(), "a block is too long"))?;
                    let bytes = source.read_at(info.offset, length)?;
                    if crc32fast::hash(&bytes) != info.checksum {
                        let problem = format!("the block of vnode {vnode} at {} fails its checksum", info.offset);
                        return Err(damaged(source.name(), problem));
                    }
                    sink.copy_block(vnode, info, &bytes)?;
                    self.blocks_copied += 1;
                    items += info.entries;
                    continue;
                }
                let bytes = read_block(source, info)?;
                let entries = crate::read::block_entries(&bytes, info).map_err(|problem| {
                    damaged(source.name(), format!("the block of vnode {vnode} at {}: {problem}", info.offset))
                })?;
                for entry in entries {
                    match entry {
                        Entry::Put { key, value } => sink.put(vnode, key, value)?,
                        Entry::Delete { key } if self.mode == MergeMode::KeepDeletes => sink.delete(vnode, key)?,
                        Entry::Delete { .. } => continue,
                        Entry::Range { .. } => unreachable!("block_entries refuses ranges in a block of points"),
                    }
                    items += 1;
                }
            }
        }
        Ok(items)
    }
}

impl StateSource for Merge {
    fn next_record(&mut self) -> Result<Option<Record<'_>>, SluiceError> {
        assert_eq!(self.mode, MergeMode::Live, "a restore reads live records only");
        match self.next_merged()? {
            Some(Merged::Put { vnode, key, value }) => Ok(Some(Record { vnode, key, value })),
            Some(other) => unreachable!("a live merge yields puts only, not {other:?}"),
            None => Ok(None),
        }
    }
}

/// Sorted, possibly overlapping ranges as sorted disjoint intervals.
fn union(ranges: &[(Vec<u8>, Vec<u8>)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut union: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match union.last_mut() {
            Some((_, last_end)) if start <= last_end => {
                if end > last_end {
                    *last_end = end.clone();
                }
            }
            _ => union.push((start.clone(), end.clone())),
        }
    }
    union
}

#[cfg(test)]
mod tests;
