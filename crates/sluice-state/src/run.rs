//! The run file: one snapshot's records (or a compaction's), sorted by `(vnode, key)`,
//! in blocks of one vnode each, with an index at the end.
//!
//! # Encoding, format version 3
//!
//! This section is the complete specification; the golden vectors in `run/tests.rs` pin
//! it, and a change of these bytes needs a new version.
//!
//! Integers marked `u32`/`u64` are little-endian; a varint is unsigned LEB128 as in the
//! manifest (7 bits a byte, least significant group first, high bit set on every byte
//! but the last, always the shortest form).
//!
//! ```text
//! header   magic: ASCII "SLUICERN" (53 4c 55 49 43 45 52 4e), version: u32 (03 00 00 00)
//! blocks   from offset 12 to the index, tiling those bytes exactly
//! index    count: varint, then per block, in index order (below):
//!            vnode: varint, offset: varint, length: varint, entries: varint,
//!            kind: u8 (0: puts and deletes, 1: range deletes),
//!            codec: u8 (0: stored as is, 1: LZ4), codec 1 only: raw length: varint,
//!            checksum: u32 (CRC-32 of the block's bytes in the file),
//!            first key: varint length + bytes
//! footer   index offset: u64, index length: u64, index checksum: u32 (CRC-32 of the
//!          index), version: u32 (03 00 00 00), magic: "SLUICERN"   (32 bytes)
//! ```
//!
//! A block's `length` bytes in the file are its entries as they are (codec 0) or their
//! LZ4 block encoding (codec 1: the LZ4 block format, without a frame, that gives back
//! `raw length` bytes, at most 255 times `length`). A writer compresses a block only when
//! asked ([`RunWriter::compressed`]: a checkpoint's runs) and only when LZ4 saves an
//! eighth of its bytes. The checksum covers the bytes in the file, so a run is verified
//! without decompressing it. What follows is of a block's entries, decompressed.
//!
//! A block holds the entries of one vnode and one kind, each entry:
//!
//! ```text
//! tag: u8        0 put, 1 delete, 2 range delete
//! key: varint length + bytes      (a range delete's start)
//! tag 0: value: varint length + bytes
//! tag 2: end: varint length + bytes  (exclusive; above the start)
//! ```
//!
//! A block of kind 0 holds tags 0 and 1 only, of kind 1 tag 2 only. The index lists the
//! blocks ordered by vnode; a vnode's range-delete blocks come before its other blocks;
//! range deletes are ordered by start (non-decreasing), puts and deletes by key (strictly
//! increasing, across the vnode's blocks). The blocks' bytes need not be in the file in
//! that order: sorted by offset, each block starts where the previous one ends, the first
//! at offset 12 and the last ending at the index. A block ends once it holds at least
//! [`BLOCK_BYTES`] (so one entry larger than that is a block of its own), or earlier. The
//! CRC-32 is zlib's (reflected polynomial `0xEDB88320`), as the manifest's.
//!
//! A writer given its records vnode by vnode writes the blocks in index order. One given
//! records whose vnodes interleave ([`StateSink::interleave`]: a join's rows in arrival
//! order, each vnode's in key order) keeps an open block per vnode and writes each when it
//! fills (or, past [`OPEN_BYTES_MAX`] held open, the largest first), so the records reach
//! the file once, in the order they come, without a sort.
//!
//! Meaning: a run applies to the state of the runs before it its range deletes first,
//! then its puts and deletes. So a range delete never hides a put of its own run.
//!
//! A reader checks everything before trusting it (`crate::read`): the footer and the
//! index's checksum, the index's order, that the blocks tile the bytes between header and
//! index exactly, each block's checksum when it is read, and the order of its entries.
//!
//! Version 2 is version 3 without the codec (every block stored as is); version 1 is
//! version 2 with the blocks in index order in the file. A reader reads all three.

use std::io::Write;

use sluice_types::SluiceError;

use crate::{StateSink, varint};

/// The run encoding this build writes (it reads [`RUN_FORMAT_VERSION_2`] and
/// [`RUN_FORMAT_VERSION_1`] too).
pub const RUN_FORMAT_VERSION: u32 = 3;
/// Version 3 without the codec: every block stored as is.
pub const RUN_FORMAT_VERSION_2: u32 = 2;
/// The first run encoding: version 2 with the blocks in index order.
pub const RUN_FORMAT_VERSION_1: u32 = 1;
/// A block's codec (format version 3): stored as is.
pub(crate) const CODEC_STORED: u8 = 0;
/// A block's codec (format version 3): an LZ4 block.
pub(crate) const CODEC_LZ4: u8 = 1;
/// The most bytes an LZ4 block gives back per byte of its own.
pub(crate) const LZ4_RATIO_MAX: u64 = 255;
/// The first and last 8 bytes of a run.
pub const MAGIC: &[u8; 8] = b"SLUICERN";
/// The bytes before the first block.
pub const HEADER_BYTES: u64 = 12;
/// The bytes of the footer.
pub const FOOTER_BYTES: u64 = 32;
/// A block ends once it holds this many bytes.
pub const BLOCK_BYTES: usize = 64 * 1024;
/// The bytes of open blocks an interleaving writer holds before it writes the largest.
pub const OPEN_BYTES_MAX: usize = 16 << 20;

pub(crate) const TAG_PUT: u8 = 0;
pub(crate) const TAG_DELETE: u8 = 1;
pub(crate) const TAG_RANGE: u8 = 2;
pub(crate) const KIND_POINTS: u8 = 0;
pub(crate) const KIND_RANGES: u8 = 1;

/// What a finished run is: its size and checksum as a store names it, and its extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrittenRun {
    pub bytes: u64,
    /// CRC-32 of the whole file.
    pub checksum: u32,
    pub entries: u64,
    pub blocks: u64,
}

/// A map keyed by vnode, hashed by one multiplication (looked up once per record of an
/// interleaving writer; the keys are small integers, not input).
type VnodeMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<VnodeHasher>>;

/// Fibonacci hashing of the integers a key writes: its high bits, which the table's
/// probes use first, depend on every bit of the key.
#[derive(Debug, Default, Clone, Copy)]
struct VnodeHasher(u64);

impl std::hash::Hasher for VnodeHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.write_u64(u64::from(value));
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(29) ^ value).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The [`crate::StateSink`] order, asserted: a snapshot that breaks it is a bug.
#[derive(Debug, Default, Clone)]
pub(crate) struct OrderCheck {
    /// The vnode written last, whether its points began, and its last key or range start.
    last: Option<(u32, bool, Vec<u8>)>,
    /// Once vnodes may interleave ([`OrderCheck::interleave`]): the same per vnode.
    vnodes: Option<VnodeMap<u32, (bool, Vec<u8>)>>,
}

impl OrderCheck {
    /// From now on, vnodes may interleave; each vnode's own order still holds. Only
    /// before the first record.
    pub(crate) fn interleave(&mut self) {
        assert!(self.last.is_none() && self.vnodes.is_none(), "a sink interleaves vnodes from its first record on");
        self.vnodes = Some(VnodeMap::default());
    }

    pub(crate) fn range(&mut self, vnode: u32, start: &[u8], end: &[u8]) {
        assert!(start < end, "a range delete of vnode {vnode} ends above its start");
        let (points, previous) = match self.vnode(vnode, false, start) {
            Some(last) => last,
            None => return,
        };
        assert!(!*points, "vnode {vnode}'s range deletes come before its puts and deletes");
        assert!(previous.as_slice() <= start, "vnode {vnode}'s range deletes come in order of their starts");
        previous.clear();
        previous.extend_from_slice(start);
    }

    pub(crate) fn point(&mut self, vnode: u32, key: &[u8]) {
        let (points, previous) = match self.vnode(vnode, true, key) {
            Some(last) => last,
            None => return,
        };
        assert!(!*points || previous.as_slice() < key, "vnode {vnode}'s keys come strictly ascending");
        *points = true;
        previous.clear();
        previous.extend_from_slice(key);
    }

    /// What was written last of `vnode`, to check `key` against; None when `vnode` is
    /// new (then `points` and `key` are noted as its first record).
    fn vnode(&mut self, vnode: u32, points: bool, key: &[u8]) -> Option<(&mut bool, &mut Vec<u8>)> {
        if let Some(vnodes) = &mut self.vnodes {
            return match vnodes.entry(vnode) {
                std::collections::hash_map::Entry::Occupied(seen) => {
                    let (points, previous) = seen.into_mut();
                    Some((points, previous))
                }
                std::collections::hash_map::Entry::Vacant(new) => {
                    new.insert((points, key.to_vec()));
                    None
                }
            };
        }
        if self.last.as_ref().is_some_and(|(last, _, _)| *last == vnode) {
            let (_, points, previous) = self.last.as_mut().expect("vnode's last record");
            return Some((points, previous));
        }
        assert!(self.last.as_ref().is_none_or(|(done, _, _)| *done < vnode), "vnodes come in ascending order");
        self.last = Some((vnode, points, key.to_vec()));
        None
    }
}

/// Where a block went in the file, as its index entry gives it.
#[derive(Debug, Clone, Copy)]
struct Written {
    offset: u64,
    length: u64,
    raw_length: Option<u64>,
    checksum: u32,
    entries: u64,
}

/// The block being filled.
#[derive(Debug, Default)]
struct OpenBlock {
    bytes: Vec<u8>,
    vnode: u32,
    kind: u8,
    entries: u64,
    first_key: Vec<u8>,
}

/// A written block's index entry, encoded, and where it goes in the index.
#[derive(Debug)]
struct Indexed {
    vnode: u32,
    kind: u8,
    /// Its bytes in `RunWriter::index`.
    range: std::ops::Range<usize>,
}

/// Writes a run to `out` as its records arrive, holding one block (an interleaving
/// writer: one per vnode, at most [`OPEN_BYTES_MAX`] in all) and the index in memory
/// (about 30 bytes and a key per 64 KiB block).
pub struct RunWriter<W: Write> {
    out: W,
    /// Bytes written to `out` so far, and their CRC-32.
    written: u64,
    hasher: crc32fast::Hasher,
    block: OpenBlock,
    /// Once interleaving (`StateSink::interleave`): the open block of each vnode and kind,
    /// and their bytes.
    open: Option<VnodeMap<(u32, u8), OpenBlock>>,
    open_bytes: usize,
    /// [`OPEN_BYTES_MAX`] (tests hold less).
    open_bytes_max: usize,
    block_bytes: usize,
    index: Vec<u8>,
    indexed: Vec<Indexed>,
    entries: u64,
    order: OrderCheck,
    /// Whether blocks are compressed ([`RunWriter::compressed`]), and the buffer they are
    /// compressed into.
    compress: bool,
    packed: Vec<u8>,
    /// The first write error, kept so that every later call fails too.
    failed: bool,
}

impl<W: Write> std::fmt::Debug for RunWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunWriter").field("written", &self.written).field("blocks", &self.indexed.len()).finish()
    }
}

impl<W: Write> RunWriter<W> {
    /// A run written to `out`; `name` names it in errors (its path).
    pub fn new(out: W) -> Result<RunWriter<W>, SluiceError> {
        RunWriter::with_block_bytes(out, BLOCK_BYTES)
    }

    /// A run whose blocks end at `block_bytes` (tests make many small blocks).
    pub fn with_block_bytes(out: W, block_bytes: usize) -> Result<RunWriter<W>, SluiceError> {
        assert!(block_bytes > 0, "blocks hold bytes");
        let mut writer = RunWriter {
            out,
            written: 0,
            hasher: crc32fast::Hasher::new(),
            block: OpenBlock::default(),
            open: None,
            open_bytes: 0,
            open_bytes_max: OPEN_BYTES_MAX,
            block_bytes,
            index: Vec::new(),
            indexed: Vec::new(),
            entries: 0,
            order: OrderCheck::default(),
            compress: false,
            packed: Vec::new(),
            failed: false,
        };
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&RUN_FORMAT_VERSION.to_le_bytes());
        writer.emit(&header)?;
        Ok(writer)
    }

    /// The same writer compressing each block with LZ4 where that saves an eighth of its
    /// bytes (a checkpoint's runs, written once and read seldom, off the query's thread).
    pub fn compressed(mut self) -> RunWriter<W> {
        self.compress = true;
        self
    }

    /// Bytes written so far (the finished run is larger by the open blocks, index and footer).
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Entries so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<(), SluiceError> {
        if self.failed {
            return Err(write_failed("an earlier write failed"));
        }
        if let Err(error) = self.out.write_all(bytes) {
            self.failed = true;
            return Err(write_failed(error));
        }
        self.hasher.update(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Starts a block for an entry of `vnode` and `kind` unless the open one takes it.
    fn block_for(&mut self, vnode: u32, kind: u8, key: &[u8]) -> Result<(), SluiceError> {
        let open = &self.block;
        let fits = open.entries > 0 && open.vnode == vnode && open.kind == kind && open.bytes.len() < self.block_bytes;
        if !fits {
            let block = std::mem::take(&mut self.block);
            self.block = self.write_block(block)?;
            self.block.vnode = vnode;
            self.block.kind = kind;
            self.block.first_key.clear();
            self.block.first_key.extend_from_slice(key);
        }
        Ok(())
    }

    /// Writes `block` (nothing when it is empty) and returns it emptied, its buffers kept
    /// for the next block.
    fn write_block(&mut self, mut block: OpenBlock) -> Result<OpenBlock, SluiceError> {
        if block.entries == 0 {
            return Ok(block);
        }
        let written = self.emit_block(&block.bytes, block.entries)?;
        self.index_block(block.vnode, block.kind, written, &block.first_key);
        block.bytes.clear();
        block.entries = 0;
        Ok(block)
    }

    /// Writes a block of `entries` whose entries' bytes are `raw`: compressed when the
    /// writer compresses and LZ4 saves an eighth of them, else as they are.
    fn emit_block(&mut self, raw: &[u8], entries: u64) -> Result<Written, SluiceError> {
        let offset = self.written;
        let mut packed = std::mem::take(&mut self.packed);
        let packed_length = if self.compress { lz4(raw, &mut packed) } else { None };
        let stored = match packed_length {
            Some(length) => &packed[..length],
            None => raw,
        };
        let emitted = self.emit(stored);
        let (length, checksum) = (stored.len() as u64, crc32fast::hash(stored));
        self.packed = packed;
        emitted?;
        let raw_length = packed_length.map(|_| raw.len() as u64);
        Ok(Written { offset, length, raw_length, checksum, entries })
    }

    /// Adds a written block's entry to the index.
    fn index_block(&mut self, vnode: u32, kind: u8, written: Written, first_key: &[u8]) {
        let start = self.index.len();
        varint::put(&mut self.index, u64::from(vnode));
        varint::put(&mut self.index, written.offset);
        varint::put(&mut self.index, written.length);
        varint::put(&mut self.index, written.entries);
        self.index.push(kind);
        if let Some(raw_length) = written.raw_length {
            self.index.push(CODEC_LZ4);
            varint::put(&mut self.index, raw_length);
        } else {
            self.index.push(CODEC_STORED);
        }
        self.index.extend_from_slice(&written.checksum.to_le_bytes());
        varint::put(&mut self.index, first_key.len() as u64);
        self.index.extend_from_slice(first_key);
        self.indexed.push(Indexed { vnode, kind, range: start..self.index.len() });
    }

    /// The block an entry of `vnode` and `kind` starting with `key` goes to.
    fn block_of(&mut self, vnode: u32, kind: u8, key: &[u8]) -> Result<&mut OpenBlock, SluiceError> {
        if self.open.is_none() {
            self.block_for(vnode, kind, key)?;
            return Ok(&mut self.block);
        }
        let open = self.open.as_mut().expect("interleaving");
        if open.get(&(vnode, kind)).is_some_and(|block| block.bytes.len() >= self.block_bytes) {
            let full = open.remove(&(vnode, kind)).expect("the full block is open");
            self.open_bytes -= full.bytes.len();
            let emptied = self.write_block(full)?;
            self.open.as_mut().expect("interleaving").insert((vnode, kind), emptied);
        }
        let block = self.open.as_mut().expect("interleaving").entry((vnode, kind)).or_default();
        if block.entries == 0 {
            block.vnode = vnode;
            block.kind = kind;
            block.first_key.clear();
            block.first_key.extend_from_slice(key);
        }
        Ok(block)
    }

    fn add(&mut self, vnode: u32, tag: u8, key: &[u8], tail: Option<&[u8]>) -> Result<(), SluiceError> {
        let kind = if tag == TAG_RANGE { KIND_RANGES } else { KIND_POINTS };
        let block = self.block_of(vnode, kind, key)?;
        let before = block.bytes.len();
        let bytes = &mut block.bytes;
        bytes.push(tag);
        varint::put(bytes, key.len() as u64);
        bytes.extend_from_slice(key);
        if let Some(tail) = tail {
            varint::put(bytes, tail.len() as u64);
            bytes.extend_from_slice(tail);
        }
        block.entries += 1;
        let grown = bytes.len() - before;
        self.entries += 1;
        if self.open.is_some() {
            self.open_bytes += grown;
            if self.open_bytes > self.open_bytes_max {
                self.write_largest()?;
            }
        }
        Ok(())
    }

    /// Writes the largest open block of an interleaving writer.
    fn write_largest(&mut self) -> Result<(), SluiceError> {
        let open = self.open.as_mut().expect("interleaving");
        let largest = open.iter().max_by_key(|(_, block)| block.bytes.len()).map(|(at, _)| *at);
        let Some(at) = largest else { return Ok(()) };
        let block = open.remove(&at).expect("the largest block is open");
        self.open_bytes -= block.bytes.len();
        // Its buffers go: a vnode whose block filled first is not likely to need one soon.
        self.write_block(block)?;
        Ok(())
    }

    /// Ends the run: the open blocks, the index and the footer, then flushes `out`.
    pub fn finish(mut self) -> Result<(WrittenRun, W), SluiceError> {
        let block = std::mem::take(&mut self.block);
        self.write_block(block)?;
        if let Some(open) = self.open.take() {
            let mut blocks: Vec<OpenBlock> = open.into_values().collect();
            blocks.sort_by_key(|block| (block.vnode, block.kind != KIND_RANGES));
            for block in blocks {
                self.write_block(block)?;
            }
        }
        // Index order: by vnode, a vnode's range blocks first, then as written (a vnode's
        // blocks of one kind are written in key order).
        self.indexed.sort_by_key(|entry| (entry.vnode, entry.kind != KIND_RANGES));
        let index_offset = self.written;
        let mut index = Vec::with_capacity(self.index.len() + 10);
        varint::put(&mut index, self.indexed.len() as u64);
        for entry in &self.indexed {
            index.extend_from_slice(&self.index[entry.range.clone()]);
        }
        self.emit(&index)?;
        let mut footer = Vec::with_capacity(FOOTER_BYTES as usize);
        footer.extend_from_slice(&index_offset.to_le_bytes());
        footer.extend_from_slice(&(index.len() as u64).to_le_bytes());
        footer.extend_from_slice(&crc32fast::hash(&index).to_le_bytes());
        footer.extend_from_slice(&RUN_FORMAT_VERSION.to_le_bytes());
        footer.extend_from_slice(MAGIC);
        debug_assert_eq!(footer.len() as u64, FOOTER_BYTES);
        self.emit(&footer)?;
        self.out.flush().map_err(write_failed)?;
        let run = WrittenRun {
            bytes: self.written,
            checksum: self.hasher.clone().finalize(),
            entries: self.entries,
            blocks: self.indexed.len() as u64,
        };
        Ok((run, self.out))
    }
}

impl<W: Write> StateSink for RunWriter<W> {
    fn delete_range(&mut self, vnode: u32, start: &[u8], end: &[u8]) -> Result<(), SluiceError> {
        self.order.range(vnode, start, end);
        self.add(vnode, TAG_RANGE, start, Some(end))
    }

    fn put(&mut self, vnode: u32, key: &[u8], value: &[u8]) -> Result<(), SluiceError> {
        self.order.point(vnode, key);
        self.add(vnode, TAG_PUT, key, Some(value))
    }

    fn delete(&mut self, vnode: u32, key: &[u8]) -> Result<(), SluiceError> {
        self.order.point(vnode, key);
        self.add(vnode, TAG_DELETE, key, None)
    }

    fn interleave(&mut self) {
        self.order.interleave();
        self.open = Some(VnodeMap::default());
    }

    /// Blocks holding at least half a block's bytes are taken whole, unless interleaving.
    fn copies_blocks(&self) -> Option<u64> {
        self.open.is_none().then_some(self.block_bytes as u64 / 2)
    }

    /// The block is written as it is, after the block open so far: its bytes, codec,
    /// checksum and entries unchanged, except that a compressing writer compresses a
    /// stored block (its bytes are its entries; it is not decoded). The order check sees
    /// its first key only (the merge that gives it checked that its keys come after the
    /// ones before and before the ones after).
    fn copy_block(&mut self, vnode: u32, info: &crate::read::BlockInfo, bytes: &[u8]) -> Result<(), SluiceError> {
        assert!(self.open.is_none() && !info.ranges, "whole blocks go to a writer in order, points only");
        assert_eq!(bytes.len() as u64, info.length, "a block is copied with its bytes");
        self.order.point(vnode, &info.first_key);
        let open = std::mem::take(&mut self.block);
        self.block = self.write_block(open)?;
        let written = match info.raw_length {
            // A stored block's bytes are its entries: written as a block of this writer's.
            None => self.emit_block(bytes, info.entries)?,
            Some(_) => {
                let offset = self.written;
                self.emit(bytes)?;
                let (length, raw_length, checksum, entries) =
                    (info.length, info.raw_length, info.checksum, info.entries);
                Written { offset, length, raw_length, checksum, entries }
            }
        };
        self.index_block(vnode, KIND_POINTS, written, &info.first_key);
        self.entries += info.entries;
        Ok(())
    }
}

/// `raw` compressed into `packed` as an LZ4 block, and its length, when that saves at
/// least an eighth of `raw`'s bytes.
fn lz4(raw: &[u8], packed: &mut Vec<u8>) -> Option<usize> {
    let bound = lz4_flex::block::get_maximum_output_size(raw.len());
    if packed.len() < bound {
        packed.resize(bound, 0);
    }
    let length = lz4_flex::block::compress_into(raw, packed).expect("the buffer holds LZ4's bound");
    (length <= raw.len() - raw.len() / 8).then_some(length)
}

fn write_failed(error: impl std::fmt::Display) -> SluiceError {
    SluiceError::external("state.run_write", format!("writing a state run failed: {error}"))
}

#[cfg(test)]
mod tests;
