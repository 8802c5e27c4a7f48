//! The replication stream's bytes: the CopyData payloads of a walsender (`XLogData` and
//! keepalives) and, inside an `XLogData`, the logical replication messages of the
//! `pgoutput` plugin, protocol version 1 (PostgreSQL's "Logical Replication Message
//! Formats"): Begin, Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate
//! and Message.
//!
//! Every read is bounds-checked: a short or malformed message is a [`DecodeError`]
//! naming what was being read, never a panic. Values are kept as the server's text
//! (`'t'`), NULL (`'n'`) or "unchanged TOAST value, not sent" (`'u'`); binary values
//! (`'b'`) only come with the `binary` option, which this source never asks for.

use bytes::Bytes;

/// A CopyData payload of the replication stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamMessage {
    /// `'w'`: WAL data starting at `start`; `end` is the server's end of WAL.
    XLogData { start: u64, end: u64, data: Bytes },
    /// `'k'`: the server's position; `reply`: it asks for a status update now.
    Keepalive { end: u64, reply: bool },
}

/// A malformed message: what was being read and why it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One column of a relation as the stream describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Part of the replica identity (the key the old tuples carry).
    pub key: bool,
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

/// A `'R'` message: a table's shape, sent before its first change in a session and
/// again after it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub oid: u32,
    pub namespace: String,
    pub name: String,
    /// `d` default (the primary key), `n` nothing, `f` full, `i` an index.
    pub replica_identity: u8,
    pub columns: Vec<RelationColumn>,
}

/// One value of a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    /// A TOASTed value the update did not change, which the server did not send.
    Unchanged,
    Text(Bytes),
}

/// Which old image an update or delete carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldImage {
    /// `'K'`: the replica identity's columns only, the others NULL.
    Key,
    /// `'O'`: the whole row (`REPLICA IDENTITY FULL`).
    Full,
}

/// A `pgoutput` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Begin {
        final_lsn: u64,
        commit_time: i64,
        xid: u32,
    },
    Commit {
        commit_lsn: u64,
        end_lsn: u64,
        commit_time: i64,
    },
    Origin {
        lsn: u64,
        name: String,
    },
    Relation(Relation),
    Type {
        oid: u32,
        namespace: String,
        name: String,
    },
    Insert {
        relation: u32,
        new: Vec<Value>,
    },
    Update {
        relation: u32,
        old: Option<(OldImage, Vec<Value>)>,
        new: Vec<Value>,
    },
    Delete {
        relation: u32,
        old: (OldImage, Vec<Value>),
    },
    Truncate {
        relations: Vec<u32>,
    },
    /// A logical decoding message (`pg_logical_emit_message`); ignored.
    Logical {
        prefix: String,
    },
}

/// A bounds-checked reader over one message.
struct Reader<'a> {
    bytes: &'a Bytes,
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a Bytes, what: &'static str) -> Reader<'a> {
        Reader { bytes, at: 0, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len()).ok_or_else(|| {
            DecodeError(format!(
                "{}: {} bytes needed at offset {}, {} left",
                self.what,
                n,
                self.at,
                self.bytes.len() - self.at
            ))
        })?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().expect("two bytes")))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("four bytes")))
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().expect("four bytes")))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("eight bytes")))
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().expect("eight bytes")))
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        let rest = &self.bytes[self.at..];
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| DecodeError(format!("{}: a string without its terminator at {}", self.what, self.at)))?;
        let text = std::str::from_utf8(&rest[..end])
            .map_err(|_| DecodeError(format!("{}: a string that is not UTF-8 at {}", self.what, self.at)))?
            .to_owned();
        self.at += end + 1;
        Ok(text)
    }

    fn bytes(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        let start = self.at;
        self.take(n)?;
        Ok(self.bytes.slice(start..start + n))
    }

    fn tuple(&mut self) -> Result<Vec<Value>, DecodeError> {
        let count = self.i16()?;
        let count =
            usize::try_from(count).map_err(|_| DecodeError(format!("{}: a tuple of {count} columns", self.what)))?;
        let mut values = Vec::with_capacity(count);
        for _ in 0..count {
            values.push(match self.u8()? {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                b't' => {
                    let length = self.i32()?;
                    let length = usize::try_from(length)
                        .map_err(|_| DecodeError(format!("{}: a value of {length} bytes", self.what)))?;
                    Value::Text(self.bytes(length)?)
                }
                kind => {
                    return Err(DecodeError(format!(
                        "{}: a value of kind '{}' (not n, u or t)",
                        self.what, kind as char
                    )));
                }
            });
        }
        Ok(values)
    }

    fn old_image(&mut self, kind: u8) -> Result<OldImage, DecodeError> {
        match kind {
            b'K' => Ok(OldImage::Key),
            b'O' => Ok(OldImage::Full),
            other => Err(DecodeError(format!("{}: an old image of kind '{}' (not K or O)", self.what, other as char))),
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), DecodeError> {
        let found = self.u8()?;
        if found == byte {
            Ok(())
        } else {
            Err(DecodeError(format!("{}: '{}' expected, found '{}'", self.what, byte as char, found as char)))
        }
    }

    fn done(&self) -> Result<(), DecodeError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(DecodeError(format!("{}: {} bytes after the message", self.what, self.bytes.len() - self.at)))
        }
    }
}

/// Decodes one CopyData payload of the replication stream.
pub fn decode_stream(payload: &Bytes) -> Result<StreamMessage, DecodeError> {
    let mut reader = Reader::new(payload, "replication stream message");
    match reader.u8()? {
        b'w' => {
            let start = reader.u64()?;
            let end = reader.u64()?;
            let _send_time = reader.i64()?;
            let data = payload.slice(reader.at..);
            Ok(StreamMessage::XLogData { start, end, data })
        }
        b'k' => {
            let end = reader.u64()?;
            let _send_time = reader.i64()?;
            let reply = reader.u8()? == 1;
            reader.done()?;
            Ok(StreamMessage::Keepalive { end, reply })
        }
        other => Err(DecodeError(format!("replication stream message of kind '{}' (not w or k)", other as char))),
    }
}

/// Decodes one `pgoutput` message (an `XLogData`'s data).
pub fn decode(data: &Bytes) -> Result<Message, DecodeError> {
    let kind = *data.first().ok_or_else(|| DecodeError("an empty pgoutput message".into()))?;
    let what = match kind {
        b'B' => "Begin",
        b'C' => "Commit",
        b'O' => "Origin",
        b'R' => "Relation",
        b'Y' => "Type",
        b'I' => "Insert",
        b'U' => "Update",
        b'D' => "Delete",
        b'T' => "Truncate",
        b'M' => "Message",
        other => return Err(DecodeError(format!("a pgoutput message of kind '{}'", other as char))),
    };
    let mut reader = Reader::new(data, what);
    reader.at = 1;
    let message = match kind {
        b'B' => Message::Begin { final_lsn: reader.u64()?, commit_time: reader.i64()?, xid: reader.u32()? },
        b'C' => {
            let _flags = reader.u8()?;
            Message::Commit { commit_lsn: reader.u64()?, end_lsn: reader.u64()?, commit_time: reader.i64()? }
        }
        b'O' => Message::Origin { lsn: reader.u64()?, name: reader.string()? },
        b'R' => Message::Relation(relation(&mut reader)?),
        b'Y' => Message::Type { oid: reader.u32()?, namespace: reader.string()?, name: reader.string()? },
        b'I' => {
            let relation = reader.u32()?;
            reader.expect(b'N')?;
            Message::Insert { relation, new: reader.tuple()? }
        }
        b'U' => {
            let relation = reader.u32()?;
            let mut marker = reader.u8()?;
            let old = if marker == b'K' || marker == b'O' {
                let image = reader.old_image(marker)?;
                let tuple = reader.tuple()?;
                marker = reader.u8()?;
                Some((image, tuple))
            } else {
                None
            };
            if marker != b'N' {
                return Err(DecodeError(format!("Update: 'N' expected, found '{}'", marker as char)));
            }
            Message::Update { relation, old, new: reader.tuple()? }
        }
        b'D' => {
            let relation = reader.u32()?;
            let marker = reader.u8()?;
            let image = reader.old_image(marker)?;
            Message::Delete { relation, old: (image, reader.tuple()?) }
        }
        b'T' => {
            let count = reader.u32()?;
            let _options = reader.u8()?;
            // Each relation takes four bytes: a count beyond the message is refused
            // before anything is allocated for it.
            if (count as usize).saturating_mul(4) > data.len() {
                return Err(DecodeError(format!("Truncate: {count} relations in a message of {} bytes", data.len())));
            }
            let relations = (0..count).map(|_| reader.u32()).collect::<Result<_, _>>()?;
            Message::Truncate { relations }
        }
        b'M' => {
            let _flags = reader.u8()?;
            let _lsn = reader.u64()?;
            let prefix = reader.string()?;
            let length = reader.u32()? as usize;
            reader.take(length)?;
            Message::Logical { prefix }
        }
        _ => unreachable!("kinds are matched above"),
    };
    reader.done()?;
    Ok(message)
}

fn relation(reader: &mut Reader<'_>) -> Result<Relation, DecodeError> {
    let oid = reader.u32()?;
    let namespace = reader.string()?;
    let name = reader.string()?;
    let replica_identity = reader.u8()?;
    let count = reader.i16()?;
    let count = usize::try_from(count).map_err(|_| DecodeError(format!("Relation: {count} columns")))?;
    let mut columns = Vec::with_capacity(count);
    for _ in 0..count {
        let flags = reader.u8()?;
        columns.push(RelationColumn {
            key: flags & 1 == 1,
            name: reader.string()?,
            type_oid: reader.u32()?,
            type_modifier: reader.i32()?,
        });
    }
    Ok(Relation { oid, namespace, name, replica_identity, columns })
}

#[cfg(test)]
#[path = "pgoutput_tests.rs"]
mod tests;
