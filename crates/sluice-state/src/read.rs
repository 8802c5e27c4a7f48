//! Reading runs: the index from the footer, then blocks on demand, every byte checked
//! (`crate::run` has the format). A damaged run is a typed `state.run_damaged` error
//! naming the run, never a panic, and never a read larger than the run.

use std::fs::File;
use std::os::unix::fs::FileExt;

use sluice_types::SluiceError;

use crate::run::{
    CODEC_LZ4, CODEC_STORED, FOOTER_BYTES, HEADER_BYTES, KIND_POINTS, KIND_RANGES, LZ4_RATIO_MAX, MAGIC,
    RUN_FORMAT_VERSION, RUN_FORMAT_VERSION_1, RUN_FORMAT_VERSION_2, TAG_DELETE, TAG_PUT, TAG_RANGE,
};
use crate::{damaged, varint};

/// Where a run's bytes are: a local file, bytes in memory, or a store object.
pub trait RunSource: Send + Sync {
    /// The run's name in errors (its path).
    fn name(&self) -> &str;
    /// Its length in bytes.
    fn size(&self) -> u64;
    /// `length` bytes at `offset`, which the caller keeps within `size`.
    fn read_at(&self, offset: u64, length: usize) -> Result<Vec<u8>, SluiceError>;
}

/// A run in memory.
#[derive(Debug, Clone)]
pub struct BytesSource {
    pub name: String,
    pub bytes: Vec<u8>,
}

impl RunSource for BytesSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_at(&self, offset: u64, length: usize) -> Result<Vec<u8>, SluiceError> {
        let start = usize::try_from(offset).map_err(|_| damaged(&self.name, "offset past the end"))?;
        let end = start.checked_add(length).filter(|end| *end <= self.bytes.len());
        let end = end.ok_or_else(|| damaged(&self.name, format!("{length} bytes at {offset} pass its end")))?;
        Ok(self.bytes[start..end].to_vec())
    }
}

/// A run in a local file.
#[derive(Debug)]
pub struct FileSource {
    name: String,
    file: File,
    size: u64,
}

impl FileSource {
    pub fn open(path: &std::path::Path) -> Result<FileSource, SluiceError> {
        let name = path.display().to_string();
        let opened = File::open(path).and_then(|file| Ok((file.metadata()?.len(), file)));
        let (size, file) = opened.map_err(|error| {
            SluiceError::external("state.run_read", format!("cannot open the state run {name}: {error}"))
        })?;
        Ok(FileSource { name, file, size })
    }

    /// A run in `file`, already open (an anonymous file, which has no path), named
    /// `name` in errors.
    pub fn from_file(name: String, file: File) -> Result<FileSource, SluiceError> {
        let size = file.metadata().map(|metadata| metadata.len()).map_err(|error| {
            SluiceError::external("state.run_read", format!("cannot read the size of the state run {name}: {error}"))
        })?;
        Ok(FileSource { name, file, size })
    }
}

impl RunSource for FileSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, length: usize) -> Result<Vec<u8>, SluiceError> {
        let mut bytes = vec![0; length];
        self.file.read_exact_at(&mut bytes, offset).map_err(|error| {
            SluiceError::external(
                "state.run_read",
                format!("reading {length} bytes at {offset} of the state run {}: {error}", self.name),
            )
        })?;
        Ok(bytes)
    }
}

/// One block as the index lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    pub vnode: u32,
    pub offset: u64,
    /// Its bytes in the file.
    pub length: u64,
    /// Its entries' bytes when the file holds them compressed (LZ4).
    pub raw_length: Option<u64>,
    pub entries: u64,
    /// Range deletes (`true`) or puts and deletes.
    pub ranges: bool,
    pub checksum: u32,
    pub first_key: Vec<u8>,
}

/// A run's index, read and checked.
#[derive(Debug, Clone)]
pub struct RunIndex {
    pub blocks: Vec<BlockInfo>,
}

impl RunIndex {
    /// Reads and checks the footer and index of `source`.
    pub fn read(source: &dyn RunSource) -> Result<RunIndex, SluiceError> {
        let name = source.name();
        let size = source.size();
        if size < HEADER_BYTES + FOOTER_BYTES {
            return Err(damaged(name, format!("{size} bytes, fewer than a run's header and footer")));
        }
        let header = source.read_at(0, HEADER_BYTES as usize)?;
        if &header[..8] != MAGIC {
            return Err(damaged(name, "it does not start as a state run"));
        }
        let footer = source.read_at(size - FOOTER_BYTES, FOOTER_BYTES as usize)?;
        let version = u32::from_le_bytes(footer[20..24].try_into().expect("4 bytes"));
        if &footer[24..] != MAGIC || header[8..12] != footer[20..24] {
            return Err(damaged(name, "its footer is not a state run's"));
        }
        if ![RUN_FORMAT_VERSION, RUN_FORMAT_VERSION_2, RUN_FORMAT_VERSION_1].contains(&version) {
            let reads = format!("this build reads {RUN_FORMAT_VERSION_1} to {RUN_FORMAT_VERSION}");
            return Err(damaged(name, format!("format version {version}; {reads}")));
        }
        let index_offset = u64::from_le_bytes(footer[0..8].try_into().expect("8 bytes"));
        let index_length = u64::from_le_bytes(footer[8..16].try_into().expect("8 bytes"));
        let checksum = u32::from_le_bytes(footer[16..20].try_into().expect("4 bytes"));
        let index_end = index_offset.checked_add(index_length);
        if index_offset < HEADER_BYTES || index_end != Some(size - FOOTER_BYTES) {
            return Err(damaged(name, format!("its index at {index_offset} of {index_length} bytes does not fit")));
        }
        let index = source.read_at(index_offset, index_length as usize)?;
        if crc32fast::hash(&index) != checksum {
            return Err(damaged(name, "its index fails its checksum"));
        }
        let blocks = parse_index(&index, index_offset, version).map_err(|problem| damaged(name, problem))?;
        Ok(RunIndex { blocks })
    }

    /// The blocks of `vnode`: its range-delete blocks, then its others.
    pub fn vnode_blocks(&self, vnode: u32) -> &[BlockInfo] {
        let start = self.blocks.partition_point(|block| block.vnode < vnode);
        let end = self.blocks.partition_point(|block| block.vnode <= vnode);
        &self.blocks[start..end]
    }

    /// The vnodes with blocks, ascending, each once.
    pub fn vnodes(&self) -> impl Iterator<Item = u32> + '_ {
        let mut last = None;
        self.blocks.iter().filter_map(move |block| {
            let new = last != Some(block.vnode);
            last = Some(block.vnode);
            new.then_some(block.vnode)
        })
    }

    /// The bytes of the blocks of the vnodes in `vnodes`.
    pub fn bytes_of(&self, vnodes: std::ops::Range<u32>) -> u64 {
        self.blocks.iter().filter(|block| vnodes.contains(&block.vnode)).map(|block| block.length).sum()
    }
}

/// The blocks an index of format `version` lists, checked: in index order, and tiling
/// the bytes between the header and the index (in index order too in version 1).
fn parse_index(index: &[u8], index_offset: u64, version: u32) -> Result<Vec<BlockInfo>, String> {
    let in_file_order = version == RUN_FORMAT_VERSION_1;
    let mut at = 0;
    let truncated = || "its index is truncated".to_string();
    let count = varint::get(index, &mut at).ok_or_else(truncated)?;
    // Every block's entry takes at least 10 bytes: never allocate past the index.
    if count > index.len() as u64 / 10 {
        return Err(format!("its index lists {count} blocks in {} bytes", index.len()));
    }
    let mut blocks: Vec<BlockInfo> = Vec::with_capacity(count as usize);
    let mut next_offset = HEADER_BYTES;
    for number in 0..count {
        let vnode = varint::get(index, &mut at).ok_or_else(truncated)?;
        let offset = varint::get(index, &mut at).ok_or_else(truncated)?;
        let length = varint::get(index, &mut at).ok_or_else(truncated)?;
        let entries = varint::get(index, &mut at).ok_or_else(truncated)?;
        let kind = *index.get(at).ok_or_else(truncated)?;
        at += 1;
        let codec = if version >= RUN_FORMAT_VERSION { *index.get(at).ok_or_else(truncated)? } else { CODEC_STORED };
        at += usize::from(version >= RUN_FORMAT_VERSION);
        let raw_length = match codec {
            CODEC_STORED => None,
            CODEC_LZ4 => Some(varint::get(index, &mut at).ok_or_else(truncated)?),
            _ => return Err(format!("block {number} is of unknown codec {codec}")),
        };
        let checksum = index.get(at..at + 4).ok_or_else(truncated)?;
        let checksum = u32::from_le_bytes(checksum.try_into().expect("4 bytes"));
        at += 4;
        let key_length = varint::get(index, &mut at).ok_or_else(truncated)?;
        let key_end = usize::try_from(key_length).ok().and_then(|length| at.checked_add(length));
        let first_key = index.get(at..key_end.ok_or_else(truncated)?).ok_or_else(truncated)?.to_vec();
        at += first_key.len();
        let vnode = u32::try_from(vnode).map_err(|_| format!("block {number} names vnode {vnode}"))?;
        let placed = !in_file_order || offset == next_offset;
        let raw = raw_length.unwrap_or(length);
        if !placed || offset < HEADER_BYTES || length == 0 || entries == 0 || entries > raw {
            return Err(format!("block {number} ({length} bytes at {offset}, {entries} entries) is misplaced"));
        }
        if raw > length.saturating_mul(LZ4_RATIO_MAX) {
            return Err(format!("block {number} of {length} bytes claims {raw} bytes decompressed"));
        }
        if kind != KIND_POINTS && kind != KIND_RANGES {
            return Err(format!("block {number} is of unknown kind {kind}"));
        }
        let ranges = kind == KIND_RANGES;
        let block = BlockInfo { vnode, offset, length, raw_length, entries, ranges, checksum, first_key };
        if let Some(previous) = blocks.last() {
            let ordered = previous.vnode < block.vnode
                || (previous.vnode == block.vnode
                    && match (previous.ranges, block.ranges) {
                        (true, true) => previous.first_key <= block.first_key,
                        (true, false) => true,
                        (false, true) => false,
                        (false, false) => previous.first_key < block.first_key,
                    });
            if !ordered {
                return Err(format!("block {number} (vnode {vnode}) is out of order"));
            }
        }
        next_offset = offset.checked_add(length).ok_or_else(|| format!("block {number} overflows"))?;
        blocks.push(block);
    }
    if !in_file_order {
        // Sorted by offset, the blocks must tile the bytes all the same.
        let mut extents: Vec<(u64, u64)> = blocks.iter().map(|block| (block.offset, block.length)).collect();
        extents.sort_unstable();
        next_offset = HEADER_BYTES;
        for (offset, length) in extents {
            if offset != next_offset {
                return Err(format!("its blocks do not tile the file: a gap or overlap at {offset}"));
            }
            next_offset = offset + length;
        }
    }
    if next_offset != index_offset || at != index.len() {
        return Err("its blocks and index do not tile the file".to_string());
    }
    Ok(blocks)
}

/// Reads block `block` of `source`, checks its checksum and gives its entries' bytes
/// (decompressed, when the file holds them compressed).
pub fn read_block(source: &dyn RunSource, block: &BlockInfo) -> Result<Vec<u8>, SluiceError> {
    let length = usize::try_from(block.length).map_err(|_| damaged(source.name(), "a block is too long"))?;
    let bytes = source.read_at(block.offset, length)?;
    let at = || format!("the block of vnode {} at {}", block.vnode, block.offset);
    if crc32fast::hash(&bytes) != block.checksum {
        return Err(damaged(source.name(), format!("{} fails its checksum", at())));
    }
    let Some(raw_length) = block.raw_length else { return Ok(bytes) };
    // Bounded by the index's check: at most LZ4_RATIO_MAX times the bytes just read.
    let raw_length = usize::try_from(raw_length).map_err(|_| damaged(source.name(), "a block is too long"))?;
    let mut raw = vec![0; raw_length];
    match lz4_flex::block::decompress_into(&bytes, &mut raw) {
        Ok(written) if written == raw_length => Ok(raw),
        Ok(written) => Err(damaged(source.name(), format!("{} gives {written} bytes, not {raw_length}", at()))),
        Err(error) => Err(damaged(source.name(), format!("{} does not decompress: {error}", at()))),
    }
}

/// One decoded entry, borrowing its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'a> {
    Put { key: &'a [u8], value: &'a [u8] },
    Delete { key: &'a [u8] },
    Range { start: &'a [u8], end: &'a [u8] },
}

impl<'a> Entry<'a> {
    pub fn key(&self) -> &'a [u8] {
        match *self {
            Entry::Put { key, .. } | Entry::Delete { key } => key,
            Entry::Range { start, .. } => start,
        }
    }
}

/// An entry as places in its block: its tag, its key (a range delete's start) and its
/// value or end (`None` for a delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEntry {
    pub tag: u8,
    pub key: std::ops::Range<usize>,
    pub tail: Option<std::ops::Range<usize>>,
}

/// Decodes the entry at `*at` of a block of kind `ranges`, advancing `*at`; checks tags
/// and lengths (the order across entries is the caller's to check).
pub fn decode_raw(block: &[u8], at: &mut usize, ranges: bool) -> Result<RawEntry, String> {
    let tag = *block.get(*at).ok_or("an entry is truncated")?;
    *at += 1;
    let bytes = |at: &mut usize| -> Result<std::ops::Range<usize>, String> {
        let length = varint::get(block, at).ok_or("an entry is truncated")?;
        let end = usize::try_from(length).ok().and_then(|length| at.checked_add(length));
        let end = end.filter(|end| *end <= block.len()).ok_or("an entry is truncated")?;
        let range = *at..end;
        *at = end;
        Ok(range)
    };
    let entry = match (tag, ranges) {
        (TAG_PUT, false) | (TAG_RANGE, true) => {
            let key = bytes(at)?;
            let tail = bytes(at)?;
            if tag == TAG_RANGE && block[key.clone()] >= block[tail.clone()] {
                return Err("a range delete does not end above its start".to_string());
            }
            RawEntry { tag, key, tail: Some(tail) }
        }
        (TAG_DELETE, false) => RawEntry { tag, key: bytes(at)?, tail: None },
        (tag, _) => {
            let kind = if ranges { "ranges" } else { "puts and deletes" };
            return Err(format!("an entry has tag {tag} in a block of {kind}"));
        }
    };
    Ok(entry)
}

/// Decodes the entry at `*at` as [`decode_raw`] does, borrowing the block.
pub fn decode_entry<'a>(block: &'a [u8], at: &mut usize, ranges: bool) -> Result<Entry<'a>, String> {
    let RawEntry { tag, key, tail } = decode_raw(block, at, ranges)?;
    let key = &block[key];
    Ok(match (tag, tail) {
        (TAG_PUT, Some(value)) => Entry::Put { key, value: &block[value] },
        (TAG_RANGE, Some(end)) => Entry::Range { start: key, end: &block[end] },
        _ => Entry::Delete { key },
    })
}

/// Every entry of a block, checked: its count against the index, its first key, and the
/// order of its keys (strictly increasing; a range block's starts non-decreasing).
pub fn block_entries<'a>(block: &'a [u8], info: &BlockInfo) -> Result<Vec<Entry<'a>>, String> {
    let mut entries = Vec::with_capacity(info.entries.min(block.len() as u64) as usize);
    let mut at = 0;
    while at < block.len() {
        let entry = decode_entry(block, &mut at, info.ranges)?;
        if let Some(previous) = entries.last().map(Entry::key) {
            let ordered = if info.ranges { previous <= entry.key() } else { previous < entry.key() };
            if !ordered {
                return Err(format!("the block of vnode {} at {} is out of order", info.vnode, info.offset));
            }
        } else if entry.key() != info.first_key {
            return Err(format!(
                "the block of vnode {} at {} does not start at its index's key",
                info.vnode, info.offset
            ));
        }
        entries.push(entry);
    }
    if entries.len() as u64 != info.entries {
        return Err(format!(
            "the block of vnode {} at {} has {} entries, its index {}",
            info.vnode,
            info.offset,
            entries.len(),
            info.entries
        ));
    }
    Ok(entries)
}
