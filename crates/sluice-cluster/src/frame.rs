//! The data connection's encoding: the link preamble and the frames that carry exchange
//! messages and credits between two workers. Owned by the project, versioned by
//! [`DATA_VERSION`], pinned by the golden vectors in this module's tests.
//!
//! ## Preamble (sent once by the connecting worker, the higher id)
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `SLCD` |
//! | 2 | data version, u16 LE |
//! | 8 | run token, u64 LE (the topology fingerprint's hash: a link from another run is refused) |
//! | 4 | the connecting worker's id, u32 LE |
//! | 4 | the accepting worker's id, u32 LE |
//!
//! The acceptor answers one byte, `0` (accepted), or `1` followed by a u16 LE length and
//! that many bytes of UTF-8 text saying why it refuses (this answer's layout never
//! changes across versions, so a worker on another version still learns why).
//!
//! ## Frames (both directions, after the preamble and the shared-secret proof)
//!
//! | bytes | field |
//! |---|---|
//! | 1 | kind |
//! | 4 | channel id, u32 LE (a stable id both sides derive from the plan) |
//! | 4 | body length, u32 LE, at most [`MAX_FRAME_BODY_BYTES`] |
//! | n | body |
//!
//! | kind | message | body |
//! |---|---|---|
//! | 1 | data | flags u8 (bit 0: a weight column follows; clear: every row +1; bit 7: the frame starts a new Arrow IPC stream, the schema message comes first and the receiver starts a fresh decoder, always set on a channel's first frame), 3 zero bytes, u32 LE row count of the weights (0 without them), one i64 LE per row when bit 0 is set; then Arrow IPC stream messages: the schema when bit 7 is set, dictionaries when needed, one record batch. The 8-byte prefix keeps the IPC messages 8-byte aligned in the body, so the receiver decodes them in place. |
//! | 2 | watermark | i64 LE, milliseconds |
//! | 3 | barrier | u64 LE, the epoch |
//! | 4 | end of data | empty |
//! | 5 | credit | u64 LE, bytes the receiver grants the sender on this channel |
//!
//! Arrow IPC is Arrow's own specified, versioned format (the columnar format's "IPC
//! streaming format"), not an implementation detail of the arrow crate.
//!
//! Decoding never trusts a length before checking it against the bound, and never
//! panics on any bytes ([`decode_message`] also turns a panic inside the third-party
//! IPC decoder into an error): the proptests below run arbitrary bytes through it.

use std::io::{Read, Write};

use arrow::array::Int64Array;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use sluice_types::{Batch, Epoch, ErrorKind, Message, SluiceError, Weights};

/// The data connection's encoding version (preamble and frames).
pub const DATA_VERSION: u16 = 2;
/// The preamble's magic.
pub const DATA_MAGIC: [u8; 4] = *b"SLCD";
/// The preamble's length in bytes.
pub const PREAMBLE_BYTES: usize = 22;
/// A frame header's length in bytes.
pub const HEADER_BYTES: usize = 9;
/// The largest frame body either side sends or accepts. A batch whose encoding would be
/// larger is sent as several frames of fewer rows.
pub const MAX_FRAME_BODY_BYTES: u32 = 64 << 20;
/// The longest refusal text.
pub const MAX_REFUSAL_BYTES: usize = 4096;

const KIND_DATA: u8 = 1;
const KIND_WATERMARK: u8 = 2;
const KIND_BARRIER: u8 = 3;
const KIND_END: u8 = 4;
const KIND_CREDIT: u8 = 5;
const FLAG_WEIGHTS: u8 = 1;
const FLAG_NEW_STREAM: u8 = 0x80;

/// A stable channel id: the same number on both workers for one logical channel.
pub type ChannelId = u32;

/// The link preamble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    pub version: u16,
    pub run: u64,
    pub from: u32,
    pub to: u32,
}

impl Preamble {
    pub fn encode(&self) -> [u8; PREAMBLE_BYTES] {
        let mut out = [0u8; PREAMBLE_BYTES];
        out[0..4].copy_from_slice(&DATA_MAGIC);
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        out[6..14].copy_from_slice(&self.run.to_le_bytes());
        out[14..18].copy_from_slice(&self.from.to_le_bytes());
        out[18..22].copy_from_slice(&self.to.to_le_bytes());
        out
    }

    /// Decodes a preamble; the version is returned as sent (the caller compares it).
    pub fn decode(bytes: &[u8; PREAMBLE_BYTES]) -> Result<Preamble, SluiceError> {
        if bytes[0..4] != DATA_MAGIC {
            return Err(SluiceError::external(
                "cluster.data_preamble",
                format!(
                    "a connection to the exchange port did not start with a Sluice data preamble (it began with {:?})",
                    String::from_utf8_lossy(&bytes[0..4])
                ),
            )
            .with_fix("only Sluice workers of this cluster connect to the exchange port (--exchange-bind)"));
        }
        let u32_at = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let mut run = [0u8; 8];
        run.copy_from_slice(&bytes[6..14]);
        Ok(Preamble {
            version: u16::from_le_bytes([bytes[4], bytes[5]]),
            run: u64::from_le_bytes(run),
            from: u32_at(14),
            to: u32_at(18),
        })
    }
}

/// Writes the acceptor's answer: accepted, or refused with a reason.
pub fn write_answer(stream: &mut impl Write, refusal: Option<&str>) -> std::io::Result<()> {
    match refusal {
        None => stream.write_all(&[0]),
        Some(text) => {
            let mut end = text.len().min(MAX_REFUSAL_BYTES);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let mut out = vec![1u8];
            out.extend_from_slice(&(end as u16).to_le_bytes());
            out.extend_from_slice(&text.as_bytes()[..end]);
            stream.write_all(&out)
        }
    }
    .and_then(|()| stream.flush())
}

/// Reads the acceptor's answer: `Ok(None)` accepted, `Ok(Some(reason))` refused.
pub fn read_answer(stream: &mut impl Read) -> std::io::Result<Option<String>> {
    let mut status = [0u8; 1];
    stream.read_exact(&mut status)?;
    match status[0] {
        0 => Ok(None),
        1 => {
            let mut length = [0u8; 2];
            stream.read_exact(&mut length)?;
            let length = usize::from(u16::from_le_bytes(length)).min(MAX_REFUSAL_BYTES);
            let mut text = vec![0u8; length];
            stream.read_exact(&mut text)?;
            Ok(Some(String::from_utf8_lossy(&text).into_owned()))
        }
        other => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the peer answered the data preamble with byte {other}, not 0 or 1"),
        )),
    }
}

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    pub channel: ChannelId,
    pub length: u32,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0] = self.kind;
        out[1..5].copy_from_slice(&self.channel.to_le_bytes());
        out[5..9].copy_from_slice(&self.length.to_le_bytes());
        out
    }

    /// Decodes and checks a header: a known kind, a body within the bound.
    pub fn decode(bytes: &[u8; HEADER_BYTES]) -> Result<Header, SluiceError> {
        let header = Header {
            kind: bytes[0],
            channel: u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]),
            length: u32::from_le_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]),
        };
        if !(KIND_DATA..=KIND_CREDIT).contains(&header.kind) {
            return Err(corrupt(format!("unknown frame kind {} on channel {}", header.kind, header.channel)));
        }
        if header.length > MAX_FRAME_BODY_BYTES {
            return Err(corrupt(format!(
                "a frame on channel {} announces {} body bytes, above the limit of {MAX_FRAME_BODY_BYTES}",
                header.channel, header.length
            )));
        }
        Ok(header)
    }
}

fn corrupt(message: String) -> SluiceError {
    SluiceError::external("cluster.data_frame", message)
        .with_kind(ErrorKind::LostPeer)
        .with_fix("every worker must run the same sluice build; check the network path between the workers")
}

/// A frame as read from the wire: either a credit for one of our outgoing channels or an
/// exchange message for one of our incoming channels (still encoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Credit { channel: ChannelId, bytes: u64 },
    Message { channel: ChannelId, kind: u8, body: Vec<u8> },
}

/// Reads one frame (blocking). `Ok(None)` at a clean end of stream between frames.
pub fn read_frame(stream: &mut impl Read) -> Result<Option<Frame>, SluiceError> {
    let mut header = [0u8; HEADER_BYTES];
    match read_full(stream, &mut header).map_err(lost)? {
        0 => return Ok(None),
        HEADER_BYTES => {}
        partial => {
            return Err(corrupt(format!("the link ended inside a frame header ({partial} of {HEADER_BYTES} bytes)")));
        }
    }
    let header = Header::decode(&header)?;
    // One read_exact of the whole body: a buffered reader hands a read this large
    // straight to the socket instead of copying it through its own buffer.
    let mut body = vec![0u8; header.length as usize];
    stream.read_exact(&mut body).map_err(lost)?;
    if header.kind == KIND_CREDIT {
        return Ok(Some(Frame::Credit { channel: header.channel, bytes: fixed_u64(&body, header.channel)? }));
    }
    Ok(Some(Frame::Message { channel: header.channel, kind: header.kind, body }))
}

fn lost(error: std::io::Error) -> SluiceError {
    SluiceError::external("cluster.link_lost", format!("the link to a peer worker failed: {error}"))
        .with_kind(ErrorKind::LostPeer)
}

/// Reads until `buffer` is full or the stream ends; returns the bytes read.
fn read_full(stream: &mut impl Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match stream.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

fn fixed_u64(body: &[u8], channel: ChannelId) -> Result<u64, SluiceError> {
    let bytes: [u8; 8] = body.try_into().map_err(|_| {
        corrupt(format!("a frame on channel {channel} has {} body bytes where 8 were expected", body.len()))
    })?;
    Ok(u64::from_le_bytes(bytes))
}

/// Appends a credit frame.
pub fn encode_credit(channel: ChannelId, bytes: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&Header { kind: KIND_CREDIT, channel, length: 8 }.encode());
    out.extend_from_slice(&bytes.to_le_bytes());
}

/// The sending side of one channel: remembers whether the channel's schema was sent.
#[derive(Default)]
pub struct ChannelEncoder {
    writer: Option<StreamWriter<Vec<u8>>>,
}

impl std::fmt::Debug for ChannelEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelEncoder").field("schema_sent", &self.writer.is_some()).finish()
    }
}

impl ChannelEncoder {
    /// Appends the frames of `message` to `out`. A batch whose body would exceed
    /// `max_body_bytes` is split into frames of fewer rows; a single row that does not
    /// fit is an error naming the sizes.
    pub fn encode(
        &mut self,
        channel: ChannelId,
        message: &Message,
        max_body_bytes: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), SluiceError> {
        let max_body_bytes = max_body_bytes.min(MAX_FRAME_BODY_BYTES);
        match message {
            Message::Data(batch) => self.encode_batch(channel, batch, max_body_bytes, out),
            Message::Watermark(watermark) => {
                fixed_frame(out, KIND_WATERMARK, channel, &watermark.to_le_bytes());
                Ok(())
            }
            Message::Barrier(epoch) => {
                fixed_frame(out, KIND_BARRIER, channel, &epoch.0.to_le_bytes());
                Ok(())
            }
            Message::EndOfData => {
                fixed_frame(out, KIND_END, channel, &[]);
                Ok(())
            }
        }
    }

    fn encode_batch(
        &mut self,
        channel: ChannelId,
        batch: &Batch,
        max_body_bytes: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), SluiceError> {
        let start = out.len();
        out.extend_from_slice(&[0u8; HEADER_BYTES]);
        let new_stream = if self.writer.is_none() { FLAG_NEW_STREAM } else { 0 };
        match &batch.weights {
            Weights::Inserts => out.extend_from_slice(&[new_stream, 0, 0, 0, 0, 0, 0, 0]),
            Weights::Column(weights) => {
                out.extend_from_slice(&[new_stream | FLAG_WEIGHTS, 0, 0, 0]);
                out.extend_from_slice(&(weights.len() as u32).to_le_bytes());
                for weight in weights.values().iter() {
                    out.extend_from_slice(&weight.to_le_bytes());
                }
            }
        }
        self.append_ipc(&batch.rows, out, start)?;
        let length = out.len() - start - HEADER_BYTES;
        if length <= max_body_bytes as usize {
            let header = Header { kind: KIND_DATA, channel, length: length as u32 };
            out[start..start + HEADER_BYTES].copy_from_slice(&header.encode());
            return Ok(());
        }
        // Too big: nothing of it is sent. The IPC writer believes the receiver saw its
        // schema and dictionaries, so the next frame starts a new IPC stream.
        out.truncate(start);
        self.writer = None;
        let rows = batch.rows.num_rows();
        if rows <= 1 {
            return Err(SluiceError::user(
                "cluster.row_too_large",
                format!("one row encodes to {length} bytes, above the exchange frame limit of {max_body_bytes} bytes"),
            )
            .with_fix(
                "a row that crosses between workers must encode to at most half the exchange window (8 MiB of \
                 16 MiB): shrink the row, or run the pipeline on one worker",
            ));
        }
        let half = rows / 2;
        for (offset, count) in [(0, half), (half, rows - half)] {
            let part = Batch {
                rows: batch.rows.slice(offset, count),
                weights: match &batch.weights {
                    Weights::Inserts => Weights::Inserts,
                    Weights::Column(weights) => Weights::Column(std::sync::Arc::new(weights.slice(offset, count))),
                },
            };
            self.encode_batch(channel, &part, max_body_bytes, out)?;
        }
        Ok(())
    }

    /// Appends the IPC messages of `rows` to the frame that starts at `out[start]`. The
    /// IPC writer encodes into its own buffer; the frame's head moves there first, so
    /// when `out` holds nothing else (the usual case) the two buffers swap instead of
    /// copying the batch.
    fn append_ipc(&mut self, rows: &RecordBatch, out: &mut Vec<u8>, start: usize) -> Result<(), SluiceError> {
        let ipc = |error: arrow::error::ArrowError| {
            SluiceError::internal("cluster.ipc_encode", format!("encoding a batch as Arrow IPC failed: {error}"))
        };
        if self.writer.is_none() {
            self.writer = Some(StreamWriter::try_new(Vec::new(), &rows.schema()).map_err(ipc)?);
        }
        let writer = self.writer.as_mut().expect("the writer was just created");
        // The writer's buffer holds the schema message when the stream is new.
        let schema = std::mem::take(writer.get_mut());
        let buffer = writer.get_mut();
        buffer.extend_from_slice(&out[start..]);
        buffer.extend_from_slice(&schema);
        out.truncate(start);
        writer.write(rows).map_err(ipc)?;
        if out.is_empty() {
            std::mem::swap(out, writer.get_mut());
        } else {
            out.append(writer.get_mut());
        }
        writer.get_mut().clear();
        Ok(())
    }
}

fn fixed_frame(out: &mut Vec<u8>, kind: u8, channel: ChannelId, body: &[u8]) {
    out.extend_from_slice(&Header { kind, channel, length: body.len() as u32 }.encode());
    out.extend_from_slice(body);
}

/// The receiving side of one channel: the IPC decoder that has seen the schema.
pub struct ChannelDecoder {
    decoder: StreamDecoder,
    /// The schema the plan expects on this channel, when known: a batch of another
    /// schema is refused.
    expected: Option<SchemaRef>,
}

impl std::fmt::Debug for ChannelDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelDecoder").field("expected", &self.expected).finish()
    }
}

impl ChannelDecoder {
    pub fn new(expected: Option<SchemaRef>) -> ChannelDecoder {
        ChannelDecoder { decoder: StreamDecoder::new(), expected }
    }

    /// Decodes one message frame's body. Never panics on any bytes.
    pub fn decode_message(&mut self, channel: ChannelId, kind: u8, body: Vec<u8>) -> Result<Message, SluiceError> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.decode_unguarded(channel, kind, body))) {
            Ok(result) => result,
            Err(panic) => Err(corrupt(format!(
                "decoding a frame on channel {channel} failed: {}",
                sluice_types::panic_message(panic.as_ref())
            ))),
        }
    }

    fn decode_unguarded(&mut self, channel: ChannelId, kind: u8, body: Vec<u8>) -> Result<Message, SluiceError> {
        match kind {
            KIND_WATERMARK => Ok(Message::Watermark(fixed_u64(&body, channel)? as i64)),
            KIND_BARRIER => Ok(Message::Barrier(Epoch(fixed_u64(&body, channel)?))),
            KIND_END if body.is_empty() => Ok(Message::EndOfData),
            KIND_END => Err(corrupt(format!("an end-of-data frame on channel {channel} has a body"))),
            KIND_DATA => self.decode_data(channel, body),
            other => Err(corrupt(format!("frame kind {other} on channel {channel} carries no exchange message"))),
        }
    }

    fn decode_data(&mut self, channel: ChannelId, body: Vec<u8>) -> Result<Message, SluiceError> {
        let short = || corrupt(format!("a data frame on channel {channel} ends inside its flags or weights"));
        let flags = *body.first().ok_or_else(short)?;
        if flags & !(FLAG_WEIGHTS | FLAG_NEW_STREAM) != 0 {
            return Err(corrupt(format!("a data frame on channel {channel} has unknown flags {flags:#04x}")));
        }
        let prefix = body.get(..8).ok_or_else(short)?;
        if prefix[1..4] != [0, 0, 0] {
            return Err(corrupt(format!("a data frame on channel {channel} has non-zero padding")));
        }
        let count = u32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]) as usize;
        let (weights, ipc_start) = if flags & FLAG_WEIGHTS == 0 {
            if count != 0 {
                return Err(corrupt(format!(
                    "a data frame on channel {channel} counts {count} weights it does not carry"
                )));
            }
            (None, 8)
        } else {
            let end = count.checked_mul(8).and_then(|bytes| bytes.checked_add(8)).ok_or_else(short)?;
            let raw = body.get(8..end).ok_or_else(short)?;
            let values: Vec<i64> =
                raw.chunks_exact(8).map(|w| i64::from_le_bytes(w.try_into().expect("chunks of 8"))).collect();
            (Some(Int64Array::from(values)), end)
        };
        if flags & FLAG_NEW_STREAM != 0 {
            self.decoder = StreamDecoder::new();
        }
        let mut buffer = Buffer::from_vec(body).slice(ipc_start);
        let mut decoded = None;
        while !buffer.is_empty() {
            let batch = self.decoder.decode(&mut buffer).map_err(|error| {
                corrupt(format!("a data frame on channel {channel} is not valid Arrow IPC: {error}"))
            })?;
            if let Some(batch) = batch
                && decoded.replace(batch).is_some()
            {
                return Err(corrupt(format!("a data frame on channel {channel} holds more than one batch")));
            }
        }
        let rows = decoded.ok_or_else(|| corrupt(format!("a data frame on channel {channel} holds no batch")))?;
        if let Some(expected) = &self.expected
            && rows.schema().fields() != expected.fields()
        {
            return Err(corrupt(format!(
                "a data frame on channel {channel} has columns {:?}, the plan expects {:?}",
                rows.schema().fields().iter().map(|f| f.name()).collect::<Vec<_>>(),
                expected.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
            )));
        }
        match weights {
            None => Ok(Message::Data(Batch::inserts(rows))),
            Some(weights) if weights.len() == rows.num_rows() => Ok(Message::Data(Batch::with_weights(rows, weights))),
            Some(weights) => Err(corrupt(format!(
                "a data frame on channel {channel} has {} weights for {} rows",
                weights.len(),
                rows.num_rows()
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
