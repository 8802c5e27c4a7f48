//! The run encoding, pinned: a golden vector, round trips, and damage refused.

use super::*;
use crate::read::{BytesSource, RunIndex, block_entries, read_block};

fn write(records: impl FnOnce(&mut RunWriter<Vec<u8>>), block_bytes: usize) -> (WrittenRun, Vec<u8>) {
    let mut writer = RunWriter::with_block_bytes(Vec::new(), block_bytes).expect("a writer over memory");
    records(&mut writer);
    writer.finish().expect("a run in memory")
}

/// [`write`] with a writer that compresses its blocks.
fn write_compressed(records: impl FnOnce(&mut RunWriter<Vec<u8>>), block_bytes: usize) -> (WrittenRun, Vec<u8>) {
    let mut writer = RunWriter::with_block_bytes(Vec::new(), block_bytes).expect("a writer over memory").compressed();
    records(&mut writer);
    writer.finish().expect("a run in memory")
}

fn source(bytes: &[u8]) -> BytesSource {
    BytesSource { name: "golden".into(), bytes: bytes.to_vec() }
}

/// The bytes of a run with one range delete and one put of vnode 1 and a delete of
/// vnode 3, in format version `version` (a version 1 run is laid out as a version 2
/// one; version 3 adds each block's codec, 0 here): a change of this vector is a change
/// of the format, which needs a new version.
fn golden(version: u8) -> Vec<u8> {
    // A block's kind, then from version 3 its codec (stored as is).
    let kind = |kind: u8| if version >= 3 { vec![kind, 0] } else { vec![kind] };
    let mut expected: Vec<u8> = [
        &b"SLUICERN"[..],
        &[version, 0, 0, 0],
        // block 0, offset 12: vnode 1's range delete [a, c)
        &[2, 1, b'a', 1, b'c'],
        // block 1, offset 17: vnode 1's put b = xy
        &[0, 1, b'b', 2, b'x', b'y'],
        // block 2, offset 23: vnode 3's delete k
        &[1, 1, b'k'],
        // index, offset 26: 3 blocks
        &[3],
        &[1, 12, 5, 1],
        &kind(1),
        &crc32fast::hash(&[2, 1, b'a', 1, b'c']).to_le_bytes(),
        &[1, b'a'],
        &[1, 17, 6, 1],
        &kind(0),
        &crc32fast::hash(&[0, 1, b'b', 2, b'x', b'y']).to_le_bytes(),
        &[1, b'b'],
        &[3, 23, 3, 1],
        &kind(0),
        &crc32fast::hash(&[1, 1, b'k']).to_le_bytes(),
        &[1, b'k'],
    ]
    .concat();
    let index_length = expected.len() as u64 - 26;
    let index_checksum = crc32fast::hash(&expected[26..]);
    expected.extend_from_slice(&26u64.to_le_bytes());
    expected.extend_from_slice(&index_length.to_le_bytes());
    expected.extend_from_slice(&index_checksum.to_le_bytes());
    expected.extend_from_slice(&[version, 0, 0, 0]);
    expected.extend_from_slice(b"SLUICERN");
    expected
}

#[test]
fn the_golden_vector() {
    let records = |w: &mut RunWriter<Vec<u8>>| {
        w.delete_range(1, b"a", b"c").expect("range");
        w.put(1, b"b", b"xy").expect("put");
        w.delete(3, b"k").expect("delete");
    };
    let (run, bytes) = write(records, BLOCK_BYTES);
    assert_eq!(bytes, golden(3));
    assert_eq!(run, WrittenRun { bytes: bytes.len() as u64, checksum: crc32fast::hash(&bytes), entries: 3, blocks: 3 });
    // Pinned as numbers too, so that the test cannot drift with its own helper.
    assert_eq!(bytes.len(), 95);
    assert_eq!(run.checksum, crc32fast::hash(&golden(3)));
    // A compressing writer stores blocks that LZ4 would not shrink by an eighth as is.
    let (_, compressed) = write_compressed(records, BLOCK_BYTES);
    assert_eq!(compressed, golden(3));
}

/// The keys of every entry of `bytes`, a run, with their vnodes.
fn keys_of(bytes: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let index = RunIndex::read(&source(bytes)).expect("the run reads");
    index
        .blocks
        .iter()
        .flat_map(|block| {
            let read = read_block(&source(bytes), block).expect("a block");
            block_entries(&read, block)
                .expect("entries")
                .iter()
                .map(|e| (block.vnode, e.key().to_vec()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Runs of format versions 1 (before interleaving) and 2 (before compression) still read.
#[test]
fn runs_of_versions_1_and_2_read() {
    for version in [1, 2] {
        assert_eq!(keys_of(&golden(version)), [(1, b"a".to_vec()), (1, b"b".to_vec()), (3, b"k".to_vec())]);
    }
}

/// A run of one LZ4 block, made by hand from the LZ4 block format (not by the writer's
/// compressor, whose choices of matches may differ between versions and still decode
/// alike): vnode 1's put of `k` = forty `a`s, 44 bytes of entries.
fn golden_compressed() -> Vec<u8> {
    let lz4: &[u8] = &[
        0x5f, 0, 1, b'k', 40, b'a', // 5 literals, a match of 4 + 15 + 15 bytes...
        1, 0, 15, // ...at offset 1 (the last `a`), its length's extra byte
        0x50, b'a', b'a', b'a', b'a', b'a', // 5 literals to end
    ];
    let mut bytes: Vec<u8> = [&b"SLUICERN"[..], &[3, 0, 0, 0], lz4].concat();
    let index_offset = bytes.len() as u64;
    let index: Vec<u8> = [
        &[1][..],           // 1 block
        &[1, 12, 15, 1, 0], // vnode 1, offset 12, 15 bytes, 1 entry, puts
        &[1, 44],           // codec LZ4, 44 bytes decompressed
        &crc32fast::hash(lz4).to_le_bytes(),
        &[1, b'k'],
    ]
    .concat();
    bytes.extend_from_slice(&index);
    bytes.extend_from_slice(&index_offset.to_le_bytes());
    bytes.extend_from_slice(&(index.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&index).to_le_bytes());
    bytes.extend_from_slice(&[3, 0, 0, 0]);
    bytes.extend_from_slice(b"SLUICERN");
    bytes
}

#[test]
fn the_golden_vector_of_a_compressed_block() {
    let bytes = golden_compressed();
    let index = RunIndex::read(&source(&bytes)).expect("it reads");
    assert_eq!(index.blocks[0].raw_length, Some(44));
    let block = read_block(&source(&bytes), &index.blocks[0]).expect("it decompresses");
    let entries = block_entries(&block, &index.blocks[0]).expect("entries");
    assert_eq!(entries.len(), 1);
    assert!(matches!(entries[0], crate::read::Entry::Put { key: b"k", value } if value == [b'a'; 40]));
    // The writer compresses the same put into a block that reads back alike.
    let (_, written) = write_compressed(|w| w.put(1, b"k", &[b'a'; 40]).expect("put"), BLOCK_BYTES);
    let index = RunIndex::read(&source(&written)).expect("it reads");
    assert_eq!(index.blocks[0].raw_length, Some(44));
    assert!(index.blocks[0].length < 44);
    assert_eq!(read_block(&source(&written), &index.blocks[0]).expect("it decompresses"), block);
}

/// A compressed block that does not give back its raw length, or claims more than LZ4
/// can give, is refused by name, never trusted.
#[test]
fn a_compressed_block_that_lies_about_its_length_is_refused() {
    let with_raw_length = |raw: u8| {
        let mut bytes = golden_compressed();
        let index_offset = 12 + 15;
        bytes[index_offset + 7] = raw;
        let index_end = bytes.len() - 32;
        let checksum = crc32fast::hash(&bytes[index_offset..index_end]);
        let at = bytes.len() - 16;
        bytes[at..at + 4].copy_from_slice(&checksum.to_le_bytes());
        bytes
    };
    let shorter = with_raw_length(43);
    let index = RunIndex::read(&source(&shorter)).expect("the index is well formed");
    let error = read_block(&source(&shorter), &index.blocks[0]).expect_err("it decompresses to 44");
    assert_eq!(error.code, "state.run_damaged");
    let longer = with_raw_length(45);
    let index = RunIndex::read(&source(&longer)).expect("the index is well formed");
    let error = read_block(&source(&longer), &index.blocks[0]).expect_err("it decompresses to 44");
    assert!(error.message.contains("44"), "{}", error.message);
    // More than 255 times its 15 bytes: refused at the index.
    let mut bomb = golden_compressed();
    let index_offset = 12 + 15;
    bomb.splice(index_offset + 7..index_offset + 8, [0xff, 0x1e]); // 3,967 bytes
    let index_end = bomb.len() - 32;
    let index_length = (index_end - index_offset) as u64;
    let checksum = crc32fast::hash(&bomb[index_offset..index_end]);
    let at = bomb.len() - 24;
    bomb[at..at + 8].copy_from_slice(&index_length.to_le_bytes());
    bomb[at + 8..at + 12].copy_from_slice(&checksum.to_le_bytes());
    let error = RunIndex::read(&source(&bomb)).expect_err("a ratio no LZ4 block has");
    assert!(error.message.contains("decompressed"), "{}", error.message);
}

/// Compressed and stored blocks mixed: a run of many vnodes reads back every key.
#[test]
fn compressed_runs_read_back_what_was_written() {
    let records = |w: &mut RunWriter<Vec<u8>>| {
        for vnode in 0..4u32 {
            for key in 0u32..300 {
                let value: Vec<u8> = if key % 2 == 0 { vec![vnode as u8; 50] } else { key.to_le_bytes().repeat(3) };
                w.put(vnode, &key.to_be_bytes(), &value).expect("put");
            }
        }
    };
    let (plain_run, plain) = write(records, 1024);
    let (packed_run, packed) = write_compressed(records, 1024);
    assert_eq!(keys_of(&plain), keys_of(&packed));
    assert_eq!(plain_run.entries, packed_run.entries);
    assert!(packed.len() < plain.len() / 2, "{} bytes against {}", packed.len(), plain.len());
    let index = RunIndex::read(&source(&packed)).expect("it reads");
    assert!(index.blocks.iter().all(|block| block.raw_length.is_some()), "every block of repeated bytes shrinks");
}

/// An interleaving writer: vnode 3's first block fills (2 bytes a block here) and is
/// written first; at the end the open blocks follow by vnode. The index lists the
/// blocks by vnode; their bytes are where they were written.
#[test]
fn the_golden_vector_of_interleaved_vnodes() {
    let (run, bytes) = write(
        |w| {
            w.interleave();
            w.put(3, b"k", b"z").expect("put");
            w.put(1, b"a", b"x").expect("put");
            w.delete(3, b"l").expect("delete");
        },
        2,
    );
    let mut expected: Vec<u8> = [
        &b"SLUICERN"[..],
        &[3, 0, 0, 0],
        // offset 12: vnode 3's first block, full when its delete came
        &[0, 1, b'k', 1, b'z'],
        // offset 17: at the end, the open blocks by vnode: vnode 1's
        &[0, 1, b'a', 1, b'x'],
        // offset 22: vnode 3's second
        &[1, 1, b'l'],
        // index, offset 25: 3 blocks, vnode 1's, then vnode 3's two in key order
        &[3],
        &[1, 17, 5, 1, 0, 0],
        &crc32fast::hash(&[0, 1, b'a', 1, b'x']).to_le_bytes(),
        &[1, b'a'],
        &[3, 12, 5, 1, 0, 0],
        &crc32fast::hash(&[0, 1, b'k', 1, b'z']).to_le_bytes(),
        &[1, b'k'],
        &[3, 22, 3, 1, 0, 0],
        &crc32fast::hash(&[1, 1, b'l']).to_le_bytes(),
        &[1, b'l'],
    ]
    .concat();
    let index_length = expected.len() as u64 - 25;
    let index_checksum = crc32fast::hash(&expected[25..]);
    expected.extend_from_slice(&25u64.to_le_bytes());
    expected.extend_from_slice(&index_length.to_le_bytes());
    expected.extend_from_slice(&index_checksum.to_le_bytes());
    expected.extend_from_slice(&[3, 0, 0, 0]);
    expected.extend_from_slice(b"SLUICERN");
    assert_eq!(bytes, expected);
    assert_eq!(run, WrittenRun { bytes: 94, checksum: crc32fast::hash(&expected), entries: 3, blocks: 3 });
    let index = RunIndex::read(&source(&bytes)).expect("it reads");
    assert_eq!(index.vnodes().collect::<Vec<_>>(), [1, 3]);
}

/// Vnodes interleaved at random, with a small cap on the bytes held open: the run reads
/// back every vnode's records in key order, its blocks not in index order in the file.
#[test]
fn interleaved_vnodes_read_back_in_order() {
    let mut writer = RunWriter::with_block_bytes(Vec::new(), 64).expect("a writer over memory");
    writer.open_bytes_max = 300;
    writer.interleave();
    let mut expected: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut seed = 7u64;
    let mut next = [0u32; 9];
    for _ in 0..2_000 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let vnode = (seed >> 33) as u32 % 9;
        if next[vnode as usize] == 0 && vnode.is_multiple_of(3) {
            writer.delete_range(vnode, b"\x00", b"\x01").expect("range");
        }
        let key = next[vnode as usize].to_be_bytes().to_vec();
        next[vnode as usize] += 1;
        writer.put(vnode, &key, &[vnode as u8; 5]).expect("put");
        expected.push((vnode, key));
    }
    let (run, bytes) = writer.finish().expect("a run");
    expected.sort();
    let index = RunIndex::read(&source(&bytes)).expect("its index reads");
    assert_eq!(index.blocks.len() as u64, run.blocks);
    let offsets: Vec<u64> = index.blocks.iter().map(|block| block.offset).collect();
    assert!(offsets.windows(2).any(|pair| pair[0] > pair[1]), "some blocks are out of index order in the file");
    let mut read = Vec::new();
    let mut ranges = 0;
    for vnode in index.vnodes() {
        for block in index.vnode_blocks(vnode) {
            let bytes = read_block(&source(&bytes), block).expect("a block");
            for entry in block_entries(&bytes, block).expect("entries") {
                match entry {
                    crate::read::Entry::Range { .. } => ranges += 1,
                    entry => read.push((vnode, entry.key().to_vec())),
                }
            }
        }
    }
    assert_eq!(read, expected);
    assert_eq!(ranges, 3);
}

/// A run whose blocks overlap or leave a gap is refused, though each block's
/// checksum holds.
#[test]
fn interleaved_blocks_that_do_not_tile_are_refused() {
    let (_, bytes) = write(
        |w| {
            w.put(1, b"a", b"x").expect("put");
            w.put(2, b"b", b"y").expect("put");
        },
        BLOCK_BYTES,
    );
    // Both blocks are 5 bytes: point the second block's offset (17) at the first (12).
    let index_offset = u64::from_le_bytes(bytes[bytes.len() - 32..bytes.len() - 24].try_into().expect("8")) as usize;
    let mut damaged = bytes.clone();
    let second = index_offset + 1 + 6 + 4 + 2;
    assert_eq!(damaged[second..second + 2], [2, 17]);
    damaged[second + 1] = 12;
    let index_end = bytes.len() - 32;
    let checksum = crc32fast::hash(&damaged[index_offset..index_end]);
    damaged[bytes.len() - 16..bytes.len() - 12].copy_from_slice(&checksum.to_le_bytes());
    let error = RunIndex::read(&source(&damaged)).expect_err("overlapping blocks");
    assert!(error.message.contains("tile"), "{}", error.message);
}

#[test]
fn blocks_hold_one_vnode_and_end_at_their_size() {
    let (run, bytes) = write(
        |w| {
            for vnode in [0, 7] {
                for key in 0u32..100 {
                    w.put(vnode, &key.to_be_bytes(), &[7; 20]).expect("put");
                }
            }
        },
        256,
    );
    let index = RunIndex::read(&source(&bytes)).expect("its index reads");
    assert_eq!(index.blocks.len() as u64, run.blocks);
    assert!(index.blocks.iter().all(|b| b.length < 256 + 30), "a block ends once it passes 256 bytes");
    assert_eq!(index.vnodes().collect::<Vec<_>>(), [0, 7]);
    let mut keys = Vec::new();
    for block in index.vnode_blocks(7) {
        let bytes = read_block(&source(&bytes), block).expect("a block");
        keys.extend(block_entries(&bytes, block).expect("entries").iter().map(|e| e.key().to_vec()));
    }
    assert_eq!(keys, (0u32..100).map(|k| k.to_be_bytes().to_vec()).collect::<Vec<_>>());
}

#[test]
fn an_empty_run_is_a_header_an_index_and_a_footer() {
    let (run, bytes) = write(|_| {}, BLOCK_BYTES);
    assert_eq!(run.bytes, HEADER_BYTES + 1 + FOOTER_BYTES);
    assert!(RunIndex::read(&source(&bytes)).expect("reads").blocks.is_empty());
}

#[test]
#[should_panic(expected = "strictly ascending")]
fn keys_out_of_order_are_a_bug() {
    write(
        |w| {
            w.put(0, b"b", b"").expect("put");
            w.put(0, b"a", b"").expect("put");
        },
        BLOCK_BYTES,
    );
}

#[test]
#[should_panic(expected = "before its puts")]
fn a_range_after_a_point_of_its_vnode_is_a_bug() {
    write(
        |w| {
            w.put(0, b"b", b"").expect("put");
            w.delete_range(0, b"a", b"c").expect("range");
        },
        BLOCK_BYTES,
    );
}

#[test]
#[should_panic(expected = "ascending order")]
fn vnodes_out_of_order_are_a_bug() {
    write(
        |w| {
            w.put(2, b"a", b"").expect("put");
            w.put(1, b"a", b"").expect("put");
        },
        BLOCK_BYTES,
    );
}

#[test]
fn every_damaged_byte_of_the_index_and_footer_is_refused() {
    let (_, bytes) = write(
        |w| {
            w.put(1, b"b", b"xy").expect("put");
            w.delete(3, b"k").expect("delete");
        },
        BLOCK_BYTES,
    );
    let index_start = u64::from_le_bytes(bytes[bytes.len() - 32..bytes.len() - 24].try_into().expect("8")) as usize;
    for at in (0..12).chain(index_start..bytes.len()) {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x01;
        let error = RunIndex::read(&source(&damaged)).expect_err(&format!("byte {at} flipped"));
        assert_eq!(error.code, "state.run_damaged", "byte {at}");
    }
    for length in 0..bytes.len() {
        assert!(RunIndex::read(&source(&bytes[..length])).is_err(), "cut to {length} bytes");
    }
}

#[test]
fn a_damaged_block_fails_its_checksum() {
    let (_, mut bytes) = write(|w| w.put(1, b"b", b"xy").expect("put"), BLOCK_BYTES);
    let index = RunIndex::read(&source(&bytes)).expect("reads");
    bytes[14] ^= 0x40;
    let error = read_block(&source(&bytes), &index.blocks[0]).expect_err("damaged");
    assert!(error.message.contains("checksum"), "{}", error.message);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever bytes a run source holds, reading its index and every block never
        /// panics (it is read from a store).
        #[test]
        fn any_bytes_read_as_a_run_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let source = source(&bytes);
            if let Ok(index) = RunIndex::read(&source) {
                for block in &index.blocks {
                    if let Ok(bytes) = read_block(&source, block) {
                        let _ = block_entries(&bytes, block);
                    }
                }
            }
        }

        /// A real run with one byte changed anywhere: reading never panics, and either
        /// fails or (where the byte is a value's) reads entries of the same keys.
        #[test]
        fn a_run_with_one_byte_changed_never_panics(at in 0usize..10_000, bit in 0u8..8, packed: bool) {
            let mut w = RunWriter::with_block_bytes(Vec::new(), 64).expect("a writer over memory");
            if packed {
                w = w.compressed();
            }
            for vnode in 0..3 {
                w.delete_range(vnode, b"a", b"b").ok();
                for key in 0u16..40 {
                    w.put(vnode, &key.to_be_bytes(), &[key as u8; 9]).ok();
                }
            }
            let (_, mut bytes) = w.finish().expect("a run in memory");
            let at = at % bytes.len();
            bytes[at] ^= 1 << bit;
            let source = source(&bytes);
            if let Ok(index) = RunIndex::read(&source) {
                for block in &index.blocks {
                    if let Ok(bytes) = read_block(&source, block) {
                        let _ = block_entries(&bytes, block);
                    }
                }
            }
        }
    }
}
