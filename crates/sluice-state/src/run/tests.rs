//! The run encoding, pinned: a golden vector, round trips, and damage refused.

use super::*;
use crate::read::{BytesSource, RunIndex, block_entries, read_block};

fn write(records: impl FnOnce(&mut RunWriter<Vec<u8>>), block_bytes: usize) -> (WrittenRun, Vec<u8>) {
    let mut writer = RunWriter::with_block_bytes(Vec::new(), block_bytes).expect("a writer over memory");
    records(&mut writer);
    writer.finish().expect("a run in memory")
}

fn source(bytes: &[u8]) -> BytesSource {
    BytesSource { name: "golden".into(), bytes: bytes.to_vec() }
}

/// The bytes of a run with one range delete and one put of vnode 1 and a delete of
/// vnode 3: a change of this vector is a change of the format, which needs a new version.
#[test]
fn the_golden_vector() {
    let (run, bytes) = write(
        |w| {
            w.delete_range(1, b"a", b"c").expect("range");
            w.put(1, b"b", b"xy").expect("put");
            w.delete(3, b"k").expect("delete");
        },
        BLOCK_BYTES,
    );
    let expected: Vec<u8> = [
        &b"SLUICERN"[..],
        &[1, 0, 0, 0],
        // block 0, offset 12: vnode 1's range delete [a, c)
        &[2, 1, b'a', 1, b'c'],
        // block 1, offset 17: vnode 1's put b = xy
        &[0, 1, b'b', 2, b'x', b'y'],
        // block 2, offset 23: vnode 3's delete k
        &[1, 1, b'k'],
        // index, offset 26: 3 blocks
        &[3],
        &[1, 12, 5, 1, 1],
        &crc32fast::hash(&[2, 1, b'a', 1, b'c']).to_le_bytes(),
        &[1, b'a'],
        &[1, 17, 6, 1, 0],
        &crc32fast::hash(&[0, 1, b'b', 2, b'x', b'y']).to_le_bytes(),
        &[1, b'b'],
        &[3, 23, 3, 1, 0],
        &crc32fast::hash(&[1, 1, b'k']).to_le_bytes(),
        &[1, b'k'],
    ]
    .concat();
    let index_length = expected.len() as u64 - 26;
    let index_checksum = crc32fast::hash(&expected[26..]);
    let mut expected = expected;
    expected.extend_from_slice(&26u64.to_le_bytes());
    expected.extend_from_slice(&index_length.to_le_bytes());
    expected.extend_from_slice(&index_checksum.to_le_bytes());
    expected.extend_from_slice(&[1, 0, 0, 0]);
    expected.extend_from_slice(b"SLUICERN");
    assert_eq!(bytes, expected);
    assert_eq!(run, WrittenRun { bytes: bytes.len() as u64, checksum: crc32fast::hash(&bytes), entries: 3, blocks: 3 });
    // Pinned as numbers too, so that the test cannot drift with its own helper.
    assert_eq!(bytes.len(), 92);
    assert_eq!(run.checksum, crc32fast::hash(&bytes));
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
        fn a_run_with_one_byte_changed_never_panics(at in 0usize..10_000, bit in 0u8..8) {
            let (_, mut bytes) = write(|w| {
                for vnode in 0..3 {
                    w.delete_range(vnode, b"a", b"b").ok();
                    for key in 0u16..40 {
                        w.put(vnode, &key.to_be_bytes(), &[key as u8; 9]).ok();
                    }
                }
            }, 64);
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
