//! The encodings a Kafka source leaves in checkpoints: a lane's position and the
//! source's layout. Both are versioned, little-endian, and pinned by golden vectors.
//!
//! # Position (one per lane = partition), version 2, 41 bytes
//!
//! ```text
//! u8  version = 2
//! i64 next offset: the offset of the first record not yet handed out, or -1 when no
//!     record was handed out and the start rule (`start`) was not resolved to an offset
//! i64 watermark in ms, i64::MIN for none
//! i64 the offset of the last record handed out since the lane's offset was resolved,
//!     -1 for none (then the next two fields are i64::MIN and 0)
//! i64 its timestamp in ms, i64::MIN for none
//! u64 its hash: XXH3-64 (seed 0) of its key and value (see `last_record`)
//! ```
//!
//! The last record lets a resumed lane confirm that the partition still holds what it
//! read ([`last_record`](super::last_record)): a topic recreated and refilled past the
//! next offset looks, by offsets alone, like a partition that grew. It is a data record,
//! with its own offset, not the record before the next offset: that one may be a
//! transaction's marker, which consumers never see.
//!
//! Version 1 (17 bytes: the first three fields) is still read, as a position without a
//! last record known ([`LastRead::Unrecorded`]): its lane resumes unconfirmed.
//!
//! # Layout, version 1
//!
//! ```text
//! u8  version = 1
//! u32 topics, then per topic: u32 name length, the name (UTF-8), u32 partitions
//! ```
//!
//! Lanes are numbered topic by topic in the layout's order, partitions ascending. A
//! resumed run must find the same topics with the same partition counts: a topic that
//! gained partitions would otherwise have lanes the checkpoint knows nothing of.

use sluice_types::{SluiceError, TimestampMs};

/// A record as a resumed lane recognizes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordFingerprint {
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
    /// XXH3-64 (seed 0) of the key and value, see [`RecordFingerprint::of`].
    pub hash: u64,
}

impl RecordFingerprint {
    /// The fingerprint of a record. The hash covers, for the key then the value, a byte
    /// 0 when absent, else a byte 1, its length (u64 little-endian) and its bytes: a key
    /// and value are never confused with another split of the same bytes.
    pub fn of(offset: i64, timestamp_ms: Option<i64>, key: Option<&[u8]>, value: Option<&[u8]>) -> RecordFingerprint {
        let length = key.map_or(0, <[u8]>::len) + value.map_or(0, <[u8]>::len);
        let mut bytes = Vec::with_capacity(18 + length);
        for part in [key, value] {
            match part {
                None => bytes.push(0),
                Some(part) => {
                    bytes.push(1);
                    bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
                    bytes.extend_from_slice(part);
                }
            }
        }
        RecordFingerprint { offset, timestamp_ms, hash: twox_hash::XxHash3_64::oneshot(&bytes) }
    }
}

impl std::fmt::Display for RecordFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.timestamp_ms {
            Some(ms) => write!(f, "offset {}, timestamp {ms} ms, hash {:016x}", self.offset, self.hash),
            None => write!(f, "offset {}, no timestamp, hash {:016x}", self.offset, self.hash),
        }
    }
}

/// What a position knows of the last record its lane handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastRead {
    /// A position of version 1, from before the last record was recorded.
    Unrecorded,
    /// No record handed out since the lane's offset was resolved (or reset).
    Nothing,
    /// The last data record handed out.
    Record(RecordFingerprint),
}

const POSITION_VERSION: u8 = 2;
const POSITION_BYTES: usize = 41;
/// Version 1: a position without the last record.
const POSITION_V1_BYTES: usize = 17;
const LAYOUT_VERSION: u8 = 1;
/// The longest topic name Kafka allows.
const TOPIC_NAME_BYTES_MAX: usize = 249;

/// Where a lane stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The next offset to read; `None`: not resolved yet (apply the start rule).
    pub next_offset: Option<i64>,
    pub watermark: Option<TimestampMs>,
    /// The last record handed out, to confirm the partition still holds it on resume.
    pub last_read: LastRead,
}

impl Position {
    pub fn encode(&self) -> Vec<u8> {
        let last = match self.last_read {
            LastRead::Record(record) => Some(record),
            LastRead::Unrecorded | LastRead::Nothing => None,
        };
        if let Some(last) = last {
            assert!(last.offset >= 0, "a record's offset is never negative");
            assert!(self.next_offset.is_some_and(|next| last.offset < next), "the last record is before the next");
        }
        let mut bytes = Vec::with_capacity(POSITION_BYTES);
        bytes.push(POSITION_VERSION);
        bytes.extend_from_slice(&self.next_offset.unwrap_or(-1).to_le_bytes());
        bytes.extend_from_slice(&self.watermark.unwrap_or(i64::MIN).to_le_bytes());
        bytes.extend_from_slice(&last.map_or(-1, |last| last.offset).to_le_bytes());
        bytes.extend_from_slice(&last.and_then(|last| last.timestamp_ms).unwrap_or(i64::MIN).to_le_bytes());
        bytes.extend_from_slice(&last.map_or(0, |last| last.hash).to_le_bytes());
        debug_assert_eq!(bytes.len(), POSITION_BYTES);
        bytes
    }

    pub fn decode(source: &str, bytes: &[u8]) -> Result<Position, SluiceError> {
        let damaged = |why: String| {
            SluiceError::internal("source.position", format!("source `{source}`: a damaged Kafka position: {why}"))
        };
        let expected = match bytes.first() {
            Some(1) => POSITION_V1_BYTES,
            Some(&POSITION_VERSION) => POSITION_BYTES,
            Some(version) => {
                return Err(damaged(format!("version {version}, this build reads 1 and {POSITION_VERSION}")));
            }
            None => return Err(damaged("empty".to_owned())),
        };
        if bytes.len() != expected {
            return Err(damaged(format!("{} bytes, not {expected} for version {}", bytes.len(), bytes[0])));
        }
        let word = |at: usize| i64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let (offset, watermark) = (word(1), word(9));
        if offset < -1 {
            return Err(damaged(format!("offset {offset}")));
        }
        let next_offset = (offset >= 0).then_some(offset);
        let last_read = match expected {
            POSITION_V1_BYTES => LastRead::Unrecorded,
            _ => Position::decode_last(next_offset, word(17), word(25), u64::from_le_bytes(word(33).to_le_bytes()))
                .map_err(damaged)?,
        };
        Ok(Position { next_offset, watermark: (watermark != i64::MIN).then_some(watermark), last_read })
    }

    /// The last record's fields of a version 2 position, checked against `next_offset`.
    fn decode_last(next_offset: Option<i64>, offset: i64, timestamp: i64, hash: u64) -> Result<LastRead, String> {
        if offset == -1 {
            return match (timestamp, hash) {
                (i64::MIN, 0) => Ok(LastRead::Nothing),
                _ => Err("a last record without an offset".to_owned()),
            };
        }
        match next_offset {
            Some(next) if (0..next).contains(&offset) => {}
            _ => return Err(format!("last record at offset {offset}, next offset {next_offset:?}")),
        }
        let timestamp_ms = (timestamp != i64::MIN).then_some(timestamp);
        Ok(LastRead::Record(RecordFingerprint { offset, timestamp_ms, hash }))
    }
}

/// The topics of a source and their partition counts, in lane order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub topics: Vec<(String, u32)>,
}

impl Layout {
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![LAYOUT_VERSION];
        bytes.extend_from_slice(&u32::try_from(self.topics.len()).expect("few topics").to_le_bytes());
        for (name, partitions) in &self.topics {
            assert!(name.len() <= TOPIC_NAME_BYTES_MAX, "a topic name is at most {TOPIC_NAME_BYTES_MAX} bytes");
            bytes.extend_from_slice(&u32::try_from(name.len()).expect("short name").to_le_bytes());
            bytes.extend_from_slice(name.as_bytes());
            bytes.extend_from_slice(&partitions.to_le_bytes());
        }
        bytes
    }

    pub fn decode(source: &str, bytes: &[u8]) -> Result<Layout, SluiceError> {
        let damaged = |why: &str| {
            SluiceError::internal("source.layout", format!("source `{source}`: a damaged Kafka layout: {why}"))
        };
        let (&version, mut rest) = bytes.split_first().ok_or_else(|| damaged("empty"))?;
        if version != LAYOUT_VERSION {
            return Err(damaged(&format!("version {version}, this build reads {LAYOUT_VERSION}")));
        }
        let take_u32 = |rest: &mut &[u8]| -> Result<u32, SluiceError> {
            let (head, tail) = rest.split_at_checked(4).ok_or_else(|| damaged("truncated"))?;
            *rest = tail;
            Ok(u32::from_le_bytes(head.try_into().expect("4 bytes")))
        };
        let count = take_u32(&mut rest)?;
        let mut topics = Vec::new();
        for _ in 0..count {
            let length = take_u32(&mut rest)? as usize;
            if length > TOPIC_NAME_BYTES_MAX {
                return Err(damaged("a topic name is too long"));
            }
            let (name, tail) = rest.split_at_checked(length).ok_or_else(|| damaged("truncated"))?;
            rest = tail;
            let name = std::str::from_utf8(name).map_err(|_| damaged("a topic name is not UTF-8"))?.to_owned();
            topics.push((name, take_u32(&mut rest)?));
        }
        if !rest.is_empty() {
            return Err(damaged("trailing bytes"));
        }
        Ok(Layout { topics })
    }

    /// Checks that the topics found now are those recorded.
    pub fn check_resume(&self, source: &str, found: &Layout) -> Result<(), SluiceError> {
        if self == found {
            return Ok(());
        }
        let show = |layout: &Layout| {
            layout
                .topics
                .iter()
                .map(|(name, count)| format!("{name} ({count} partitions)"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        Err(SluiceError::user(
            "source.layout_changed",
            format!(
                "source `{source}`: the checkpoint was taken reading {}, the brokers now have {}",
                show(self),
                show(found)
            ),
        )
        .with_fix("restore the topics as they were, or start over with --from-scratch"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_pinned_by_golden_vectors() {
        let last = RecordFingerprint { offset: 257, timestamp_ms: Some(3), hash: 0x0102_0304_0506_0708 };
        let position = Position { next_offset: Some(258), watermark: Some(-2), last_read: LastRead::Record(last) };
        #[rustfmt::skip]
        let golden = [
            2,
            2, 1, 0, 0, 0, 0, 0, 0,
            254, 255, 255, 255, 255, 255, 255, 255,
            1, 1, 0, 0, 0, 0, 0, 0,
            3, 0, 0, 0, 0, 0, 0, 0,
            8, 7, 6, 5, 4, 3, 2, 1,
        ];
        assert_eq!(position.encode(), golden);
        assert_eq!(Position::decode("s", &golden).expect("decodes"), position);
        let unresolved = Position { next_offset: None, watermark: None, last_read: LastRead::Nothing };
        #[rustfmt::skip]
        let golden = [
            2,
            255, 255, 255, 255, 255, 255, 255, 255,
            0, 0, 0, 0, 0, 0, 0, 128,
            255, 255, 255, 255, 255, 255, 255, 255,
            0, 0, 0, 0, 0, 0, 0, 128,
            0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(unresolved.encode(), golden);
        assert_eq!(Position::decode("s", &golden).expect("decodes"), unresolved);
    }

    /// Checkpoints taken before the last record was recorded resume, unconfirmed.
    #[test]
    fn version_1_positions_are_read_without_a_last_record() {
        let golden = [1, 2, 1, 0, 0, 0, 0, 0, 0, 254, 255, 255, 255, 255, 255, 255, 255];
        let expected = Position { next_offset: Some(258), watermark: Some(-2), last_read: LastRead::Unrecorded };
        assert_eq!(Position::decode("s", &golden).expect("decodes"), expected);
        let golden = [1, 255, 255, 255, 255, 255, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 128];
        let expected = Position { next_offset: None, watermark: None, last_read: LastRead::Unrecorded };
        assert_eq!(Position::decode("s", &golden).expect("decodes"), expected);
        // Written again, it is a version 2 position that read nothing since.
        assert_eq!(expected.encode()[0], 2);
    }

    #[test]
    fn damaged_positions_are_refused() {
        let last = LastRead::Record(RecordFingerprint { offset: 6, timestamp_ms: None, hash: 9 });
        let good = Position { next_offset: Some(7), watermark: None, last_read: last }.encode();
        let v1 = [1u8; POSITION_V1_BYTES];
        for bad in [&good[..40], &good[..17], &v1[..16], &[3u8; 41][..], &[2u8; 17][..], &[]] {
            let error = Position::decode("bids", bad).expect_err("refused");
            assert!(error.message.contains("bids"), "{error:?}");
        }
        let field = |at: usize, value: i64| {
            let mut bytes = good.clone();
            bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
            bytes
        };
        // A negative next offset; a last record at or past the next offset, or without one.
        for bad in [field(1, -5), field(17, 7), field(17, -2), field(1, -1)] {
            assert!(Position::decode("bids", &bad).is_err(), "{bad:?}");
        }
        // No last record, but its timestamp or hash set.
        let nothing = Position { next_offset: Some(7), watermark: None, last_read: LastRead::Nothing }.encode();
        let mut bad = nothing.clone();
        bad[33] = 1;
        assert!(Position::decode("bids", &bad).is_err());
    }

    #[test]
    fn layouts_are_pinned_by_golden_vectors() {
        let layout = Layout { topics: vec![("ab".to_owned(), 3), ("c".to_owned(), 1)] };
        let golden = [1, 2, 0, 0, 0, 2, 0, 0, 0, b'a', b'b', 3, 0, 0, 0, 1, 0, 0, 0, b'c', 1, 0, 0, 0];
        assert_eq!(layout.encode(), golden);
        assert_eq!(Layout::decode("s", &golden).expect("decodes"), layout);
        for cut in 0..golden.len() {
            assert!(Layout::decode("s", &golden[..cut]).is_err(), "a layout cut at {cut} is refused");
        }
    }

    #[test]
    fn a_topic_that_gained_partitions_is_refused_on_resume() {
        let recorded = Layout { topics: vec![("bids".to_owned(), 2)] };
        let found = Layout { topics: vec![("bids".to_owned(), 4)] };
        let error = recorded.check_resume("s", &found).expect_err("refused");
        assert_eq!(error.code, "source.layout_changed");
        assert!(error.message.contains("bids (2 partitions)") && error.message.contains("bids (4 partitions)"));
        recorded.check_resume("s", &recorded.clone()).expect("the same layout resumes");
    }
}
