//! The pre-commit record of the exactly-once Kafka sink: which transaction holds a
//! writer's epoch, and a copy of that epoch's messages, so that a restart can write them
//! again when the transaction was never committed (see `sink.rs`, "Recovery").
//!
//! It is stored in checkpoint manifests (a sink record, opaque to the runtime), so its
//! encoding is the project's: versioned by its first byte, specified here, pinned by
//! the golden vectors below. Integers are little-endian.
//!
//! # Version 3 (written by this build)
//!
//! ```text
//! version   u8 = 3
//! epoch     u64
//! run       u32, the writing run's token (random per process, never 0): its markers
//!           carry it, so a marker left by another run (an earlier store of the same
//!           pipeline) is never taken for this record's (see `sink.rs`, "Recovery")
//! id        u32 length, then the transactional id (UTF-8)
//! messages  u32 count, then each message:
//!   flags     u8: bit 0 the message has a key, bit 1 it has a value (a tombstone has
//!             none); the other bits are 0
//!   key       if flagged: u32 length, then the bytes
//!   value     if flagged: u32 length, then the bytes
//!   headers   u32 count, then each: u32 length + the name (UTF-8), u8 0 (no value) or
//!             1 (a value: u32 length, then the bytes)
//! ```
//!
//! No message names a partition: the sink never fixes one (librdkafka's partitioner
//! hashes the key), so a message written again goes where the same key goes.
//!
//! # Version 2 (read only)
//!
//! Version 3 without `run`: read with run 0, the token its markers carried (their
//! offset was the epoch alone).
//!
//! # Version 1 (read only)
//!
//! `u8 version = 1, u64 epoch, u32 id length, the transactional id`: no messages. A
//! version 1 record cannot be written again at recovery.
//!
//! A decoder accepts exactly these layouts: nothing may follow the last field, every
//! length must fit in what remains, names must be UTF-8; anything else is
//! `sink.record` (a damaged record), never a panic.

use rdkafka::message::{Header, Headers, OwnedHeaders};
use sluice_types::SluiceError;

/// The record version this build writes.
pub const RECORD_VERSION: u8 = 3;
const KEY: u8 = 0b01;
const VALUE: u8 = 0b10;

/// The messages a writer sent in its open transaction, encoded as they are sent (the
/// `messages` field of version 2, without its count).
#[derive(Debug, Default)]
pub struct SavedMessages {
    bytes: Vec<u8>,
    count: u32,
}

impl SavedMessages {
    /// Adds one message.
    pub fn push(&mut self, key: Option<&[u8]>, value: Option<&[u8]>, headers: Option<&OwnedHeaders>) {
        let flags = if key.is_some() { KEY } else { 0 } | if value.is_some() { VALUE } else { 0 };
        self.bytes.push(flags);
        for part in [key, value].into_iter().flatten() {
            put_bytes(&mut self.bytes, part);
        }
        let count = headers.map_or(0, Headers::count);
        put_u32(&mut self.bytes, count);
        for header in headers.iter().flat_map(|h| h.iter()) {
            put_bytes(&mut self.bytes, header.key.as_bytes());
            match header.value {
                None => self.bytes.push(0),
                Some(value) => {
                    self.bytes.push(1);
                    put_bytes(&mut self.bytes, value);
                }
            }
        }
        self.count += 1;
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.count = 0;
    }
}

fn put_u32(bytes: &mut Vec<u8>, value: usize) {
    bytes.extend_from_slice(&u32::try_from(value).expect("lengths are bounded far below 4 GiB").to_le_bytes());
}

fn put_bytes(bytes: &mut Vec<u8>, part: &[u8]) {
    put_u32(bytes, part.len());
    bytes.extend_from_slice(part);
}

/// Encodes a version 3 record of `epoch`, written by run `run`, transaction
/// `transactional_id`, holding `messages`.
pub fn encode(epoch: u64, run: u32, transactional_id: &str, messages: &SavedMessages) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(1 + 8 + 4 + 4 + transactional_id.len() + 4 + messages.bytes.len());
    bytes.push(RECORD_VERSION);
    bytes.extend_from_slice(&epoch.to_le_bytes());
    bytes.extend_from_slice(&run.to_le_bytes());
    put_bytes(&mut bytes, transactional_id.as_bytes());
    put_u32(&mut bytes, messages.count as usize);
    bytes.extend_from_slice(&messages.bytes);
    bytes
}

/// A decoded record, borrowing the bytes it was decoded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionRecord<'a> {
    pub epoch: u64,
    /// The token of the run that wrote it (0 before version 3).
    pub run: u32,
    pub transactional_id: &'a str,
    /// The epoch's messages; `None` in a version 1 record (no copy was kept).
    pub messages: Option<RecordMessages<'a>>,
}

/// The messages of a record, checked when the record was decoded and read one by one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMessages<'a> {
    count: usize,
    bytes: &'a [u8],
}

impl<'a> RecordMessages<'a> {
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The messages in the order they were sent.
    pub fn iter(&self) -> impl Iterator<Item = SavedMessage<'a>> + use<'a> {
        let mut reader = Reader { rest: self.bytes };
        (0..self.count).map(move |_| reader.message().expect("checked when the record was decoded"))
    }
}

/// One message of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedMessage<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// The headers: `headers` of them encoded in `header_bytes`.
    headers: usize,
    header_bytes: &'a [u8],
}

impl<'a> SavedMessage<'a> {
    /// The headers, in order: name and value (`None`: a header without value).
    pub fn headers(&self) -> Vec<(&'a str, Option<&'a [u8]>)> {
        let mut reader = Reader { rest: self.header_bytes };
        (0..self.headers).map(|_| reader.header().expect("checked when the record was decoded")).collect()
    }

    /// The message's headers as the producer takes them (`None`: no headers).
    pub fn owned_headers(&self) -> Option<OwnedHeaders> {
        if self.headers == 0 {
            return None;
        }
        let mut headers = OwnedHeaders::new_with_capacity(self.headers);
        for (key, value) in self.headers() {
            headers = headers.insert(Header { key, value });
        }
        Some(headers)
    }
}

/// Reads fields off the front of a record, every length checked.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.rest.split_at_checked(n)?;
        self.rest = rest;
        Some(taken)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u32(&mut self) -> Option<usize> {
        self.take(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let length = self.u32()?;
        self.take(length)
    }

    fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }

    fn header(&mut self) -> Option<(&'a str, Option<&'a [u8]>)> {
        let name = self.text()?;
        let value = match self.u8()? {
            0 => None,
            1 => Some(self.bytes()?),
            _ => return None,
        };
        Some((name, value))
    }

    fn message(&mut self) -> Option<SavedMessage<'a>> {
        let flags = self.u8()?;
        if flags & !(KEY | VALUE) != 0 {
            return None;
        }
        let key = if flags & KEY != 0 { Some(self.bytes()?) } else { None };
        let value = if flags & VALUE != 0 { Some(self.bytes()?) } else { None };
        let headers = self.u32()?;
        let start = self.rest;
        for _ in 0..headers {
            self.header()?;
        }
        let header_bytes = &start[..start.len() - self.rest.len()];
        Some(SavedMessage { key, value, headers, header_bytes })
    }
}

impl<'a> TransactionRecord<'a> {
    /// Decodes a record of `sink` (version 1, 2 or 3), checking every message; never
    /// panics.
    pub fn decode(sink: &str, bytes: &'a [u8]) -> Result<TransactionRecord<'a>, SluiceError> {
        let damaged = || {
            SluiceError::internal("sink.record", format!("sink `{sink}`: a damaged Kafka sink record"))
                .with_fix("restore from another checkpoint, or start over with --from-scratch")
        };
        Self::read(bytes).ok_or_else(damaged)
    }

    fn read(bytes: &'a [u8]) -> Option<TransactionRecord<'a>> {
        let mut reader = Reader { rest: bytes };
        let version = reader.u8()?;
        let epoch = reader.u64()?;
        let run = match version {
            3 => u32::try_from(reader.u32()?).ok()?,
            _ => 0,
        };
        let transactional_id = reader.text()?;
        let messages = match version {
            1 => None,
            2 | 3 => {
                let count = reader.u32()?;
                let bytes = reader.rest;
                for _ in 0..count {
                    reader.message()?;
                }
                Some(RecordMessages { count, bytes })
            }
            _ => return None,
        };
        reader.rest.is_empty().then_some(TransactionRecord { epoch, run, transactional_id, messages })
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::message::{Header, Headers, OwnedHeaders};

    use super::{SavedMessage, SavedMessages, TransactionRecord, encode};

    #[test]
    fn version_1_records_are_pinned_by_a_golden_vector() {
        let golden = [1, 3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, b'a', b'b'];
        let record = TransactionRecord::decode("s", &golden).expect("decodes");
        assert_eq!(record, TransactionRecord { epoch: 3, run: 0, transactional_id: "ab", messages: None });
        for cut in 0..golden.len() {
            assert!(TransactionRecord::decode("s", &golden[..cut]).is_err(), "cut at {cut}");
        }
    }

    /// Two messages: a keyed value with a header without value and one with, then a
    /// tombstone (a key, no value, no headers).
    fn sample() -> SavedMessages {
        let mut messages = SavedMessages::default();
        let headers = OwnedHeaders::new()
            .insert(Header { key: "h", value: None::<&[u8]> })
            .insert(Header { key: "t", value: Some(&b"x"[..]) });
        messages.push(Some(b"k"), Some(b"vv"), Some(&headers));
        messages.push(Some(b"k"), None, None);
        messages
    }

    #[rustfmt::skip]
    const GOLDEN: [u8; 66] = [
        3,                                  // version 3
        7, 0, 0, 0, 0, 0, 0, 0,             // epoch 7
        0x78, 0x56, 0x34, 0x12,             // run 0x12345678
        2, 0, 0, 0, b'i', b'd',             // id "id"
        2, 0, 0, 0,                         // 2 messages
        0b11,                               //   key and value
        1, 0, 0, 0, b'k',                   //   key "k"
        2, 0, 0, 0, b'v', b'v',             //   value "vv"
        2, 0, 0, 0,                         //   2 headers
        1, 0, 0, 0, b'h', 0,                //     "h", no value
        1, 0, 0, 0, b't', 1, 1, 0, 0, 0, b'x', //  "t" = "x"
        0b01,                               //   a key only (a tombstone)
        1, 0, 0, 0, b'k',                   //   key "k"
        0, 0, 0, 0,                         //   no headers
    ];

    #[test]
    fn version_3_records_are_pinned_by_a_golden_vector() {
        let messages = sample();
        assert_eq!(messages.count(), 2);
        assert_eq!(encode(7, 0x1234_5678, "id", &messages), GOLDEN);
        let record = TransactionRecord::decode("s", &GOLDEN).expect("decodes");
        assert_eq!((record.epoch, record.run, record.transactional_id), (7, 0x1234_5678, "id"));
        let messages: Vec<SavedMessage<'_>> = record.messages.expect("version 3 has messages").iter().collect();
        assert_eq!(messages.len(), 2);
        assert_eq!((messages[0].key, messages[0].value), (Some(&b"k"[..]), Some(&b"vv"[..])));
        assert_eq!(messages[0].headers(), [("h", None), ("t", Some(&b"x"[..]))]);
        assert_eq!((messages[1].key, messages[1].value), (Some(&b"k"[..]), None));
        assert_eq!(messages[1].headers(), []);
        assert_eq!(messages[0].owned_headers().expect("headers").count(), 2);
        assert!(messages[1].owned_headers().is_none());
        // The same record as version 2 wrote it (no run) reads with run 0.
        let version_2 = [&[2][..], &GOLDEN[1..9], &GOLDEN[13..]].concat();
        let record = TransactionRecord::decode("s", &version_2).expect("version 2 decodes");
        assert_eq!((record.epoch, record.run, record.transactional_id), (7, 0, "id"));
        assert_eq!(record.messages.expect("version 2 has messages").len(), 2);
    }

    #[test]
    fn damaged_records_are_refused_without_panic() {
        for cut in 0..GOLDEN.len() {
            assert!(TransactionRecord::decode("s", &GOLDEN[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = GOLDEN.to_vec();
        trailing.push(0);
        let mut version = GOLDEN;
        version[0] = 4;
        let mut flags = GOLDEN;
        flags[23] = 0b111;
        let mut huge = GOLDEN;
        huge[19..23].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut id = GOLDEN;
        id[17] = 0xff;
        for (what, bytes) in
            [("trailing", &trailing[..]), ("version", &version), ("flags", &flags), ("count", &huge), ("utf-8", &id)]
        {
            let error = TransactionRecord::decode("s", bytes).expect_err(what);
            assert_eq!(error.code, "sink.record", "{what}");
        }
    }

    /// The bytes of `record` in its own version's layout, from what it reads back: its
    /// fields and every message's key, value and headers.
    fn encode_again(version: u8, record: &TransactionRecord<'_>) -> Vec<u8> {
        let Some(messages) = &record.messages else {
            let mut bytes = vec![version];
            bytes.extend_from_slice(&record.epoch.to_le_bytes());
            bytes.extend_from_slice(&(record.transactional_id.len() as u32).to_le_bytes());
            bytes.extend_from_slice(record.transactional_id.as_bytes());
            return bytes;
        };
        // By hand, from what the decoder read: `SavedMessages::push` takes librdkafka's
        // headers, which end a name at a NUL byte.
        let mut saved = SavedMessages::default();
        for message in messages.iter() {
            let flags = u8::from(message.key.is_some()) | (u8::from(message.value.is_some()) << 1);
            saved.bytes.push(flags);
            for part in [message.key, message.value].into_iter().flatten() {
                super::put_bytes(&mut saved.bytes, part);
            }
            let headers = message.headers();
            super::put_u32(&mut saved.bytes, headers.len());
            for (name, value) in headers {
                super::put_bytes(&mut saved.bytes, name.as_bytes());
                saved.bytes.push(u8::from(value.is_some()));
                if let Some(value) = value {
                    super::put_bytes(&mut saved.bytes, value);
                }
            }
            saved.count += 1;
        }
        let mut bytes = encode(record.epoch, record.run, record.transactional_id, &saved);
        if version == 2 {
            // Version 2 has no run: its 4 bytes follow the version and the epoch.
            bytes.drain(9..13);
            bytes[0] = 2;
        }
        bytes
    }

    /// Every one-byte change of the golden record decodes or is refused, never panics,
    /// and what decodes reads back: its fields and messages encode to the same bytes.
    #[test]
    fn any_one_byte_change_is_decoded_or_refused() {
        let mut decoded = 0;
        for at in 0..GOLDEN.len() {
            for byte in 0..=u8::MAX {
                let mut bytes = GOLDEN;
                bytes[at] = byte;
                if let Ok(record) = TransactionRecord::decode("s", &bytes) {
                    assert_eq!(encode_again(bytes[0], &record), bytes, "byte {at} set to {byte}: {record:?}");
                    decoded += 1;
                }
            }
        }
        // The epoch's and the run's bytes, the payloads' and the names' (UTF-8 kept).
        assert!(decoded > 8 * 256, "only {decoded} changes decoded");
    }

    #[test]
    fn an_empty_epoch_encodes_no_messages() {
        let record = encode(1, 9, "t", &SavedMessages::default());
        assert_eq!(record, [3, 1, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, b't', 0, 0, 0, 0]);
        let messages = TransactionRecord::decode("s", &record).expect("decodes").messages.expect("version 3");
        assert!(messages.is_empty() && messages.iter().next().is_none());
    }
}
