//! The control connection's encoding: one connection between the leader and each other
//! worker carries registration, the member set, and the checkpoint and lifecycle
//! commands of the run. Owned by the project, versioned by [`WIRE_VERSION`], pinned by
//! the golden vectors in `wire/tests.rs`.
//!
//! # Frame
//!
//! Every message is one frame:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 4 | magic, ASCII `SLCC` = `53 4c 43 43` |
//! | 4 | 2 | wire version, u16 little-endian (this build: [`WIRE_VERSION`]) |
//! | 6 | 1 | kind (below) |
//! | 7 | 4 | body length `n`, u32 little-endian, at most [`MAX_CONTROL_BODY_BYTES`] |
//! | 11 | n | body |
//!
//! | kind | message | body | sent by |
//! |---|---|---|---|
//! | 0 | refusal | plain UTF-8 text: why the sender refuses the other side | either, then it closes |
//! | 1 | [`Register`] | postcard | a joining worker, once, first |
//! | 2 | [`Welcome`] | postcard | the leader, once, answering a register |
//! | 3 | [`ToWorker`] | postcard | the leader, after the welcome |
//! | 4 | [`ToLeader`] | postcard | a worker, after the welcome |
//!
//! **What never changes across versions**: the header layout (magic, version, kind,
//! length, in this order and these sizes) and the refusal (kind 0, a UTF-8 body of at most
//! [`MAX_CONTROL_BODY_BYTES`]). A decoder accepts a refusal whatever version its header
//! names, so a worker on another version still learns why it was refused. By convention
//! a refusal reads `MESSAGE` or `MESSAGE\n  fix: FIX` (the `Display` of a `SluiceError`).
//! Any other change (a field, a variant, a kind, the bound) needs a new wire version:
//! workers of one cluster speak one version, and both sides of the rendezvous refuse a
//! peer that speaks another (see `rendezvous`).
//!
//! # Bodies
//!
//! Bodies are the messages below serialized by postcard 1.x, whose wire format is
//! specified and stable across 1.x releases (postcard's "wire format" specification; the
//! checkpoint manifest relies on the same rules, see `sluice-checkpoint/src/manifest.rs`).
//! The golden vectors pin the bytes, so an upgrade that changed them fails a test. The
//! rules used here:
//! - **varint** (`u32`, `u64`): unsigned LEB128, 7 bits per byte, least significant group
//!   first, the high bit (`0x80`) set on every byte but the last: 0 = `00`, 127 = `7f`,
//!   128 = `80 01`, 300 = `ac 02`.
//! - **string**: its byte length as a varint, then the UTF-8 bytes.
//! - **bytes** (`Vec<u8>`): the length as a varint, then the bytes.
//! - **seq**: the element count as a varint, then the elements.
//! - **struct**: the fields in declaration order, nothing between them.
//! - **enum**: the variant index (declaration order, from 0) as a varint, then the
//!   variant's fields.
//!
//! ```text
//! Register   exchange_addr: string, threads: varint u32, fingerprint: string,
//!            host: string, pid: varint u32, build: string, admin_addr: string
//! Welcome    members: seq of Member, you: varint u32, fingerprint: string
//! Member     id: varint u32, exchange_addr: string, threads: varint u32, admin_addr: string
//! ToWorker   0 Barrier { epoch: varint u64, final_epoch: bool } | 1 Commit { epoch: varint u64,
//!            final_epoch: bool } | 2 Stop | 3 Abort { reason: string } | 4 Heartbeat
//!            | 5 Resume { restored_epoch: varint u64, first_epoch: varint u64 }
//!            | 6 Rejoin { reason: string } | 7 Pause { paused: bool }
//! ToLeader   0 Acked { epoch: varint u64, part: bytes } | 1 Finished { report: bytes }
//!            | 2 Failed { message: string } | 3 Heartbeat | 4 DriversFinished | 5 StopRequested
//!            | 6 PauseRequested { paused: bool }
//! ```
//!
//! A `bool` is one byte, `00` or `01` (any other byte is refused).
//!
//! Example: `ToWorker::Barrier { epoch: 300, final_epoch: false }` is
//! `53 4c 43 43 05 00 03 04 00 00 00 00 ac 02 00`.
//!
//! History: version 1 had no `final_epoch`, no `Resume`, `DriversFinished` or
//! `StopRequested` and no `Rejoin` (clusters did not checkpoint); version 2 is the
//! distributed epochs of `sluice-runtime`'s coordinator and the re-forming of a cluster
//! after a lost worker; version 3 adds each worker's admin API address to `Register` and
//! `Member` (a cluster's query reads every worker's slice through it); version 4 was
//! each of two changes made side by side before they met (pausing, and manifest parts
//! of version 2); version 5 has both: `Pause` and `PauseRequested` (pausing the sources
//! of every worker from any of them), and `Acked` carrying manifest parts of version 3
//! (a vnode's state is a range of an object, and a sink record may name an object the
//! worker wrote: `sluice-engine`'s `checkpointing::part`); version 6 carries manifest
//! parts of version 4 (an operator's state is the runs of its instances, incremental
//! checkpoints) and bounds a `Register`'s or `Welcome`'s thread counts as the config does.
//!
//! A body must be consumed exactly (trailing bytes are refused). Bodies are not required
//! to be canonical (postcard also accepts over-long varints): a control message is never
//! stored, so only `decode(encode(m)) == m` matters, which the proptests check.
//!
//! # Correctness argument for decoding bytes from the network
//!
//! - **Never panics**: every length and index is checked before use; postcard returns an
//!   error for a bad varint, an unknown variant, invalid UTF-8 or a body that ends early.
//! - **Bounded allocation**: the header is checked (magic, version, kind, then the length
//!   against [`MAX_CONTROL_BODY_BYTES`]) before a byte of the body is read, and the body
//!   is buffered only as it arrives (the `FrameReader` reads at most the rest of the
//!   current frame), so a peer that announces 4 GiB and sends nothing costs nothing.
//!   Inside a body, postcard checks every string length against the remaining input and
//!   serde caps a sequence's pre-allocation, so decoding allocates no more than a small
//!   multiple of the body.
//! - **Early refusal**: the magic is compared on every prefix, so a stray client (an HTTP
//!   request, random bytes) is refused at its first wrong byte, without waiting for more.

use std::io::{self, Read};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sluice_types::SluiceError;

/// The control encoding this build speaks.
pub const WIRE_VERSION: u16 = 6;
/// The first bytes of every control frame.
pub const CONTROL_MAGIC: [u8; 4] = *b"SLCC";
/// The header's length: magic, version, kind, body length.
pub const HEADER_BYTES: usize = 11;
/// The largest body a frame may announce (1 MiB).
pub const MAX_CONTROL_BODY_BYTES: u32 = 1 << 20;

/// How many bytes [`FrameReader::fill`] reads at most per call.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// The kind byte of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Plain UTF-8 text; readable by every wire version.
    Refusal = 0,
    Register = 1,
    Welcome = 2,
    ToWorker = 3,
    ToLeader = 4,
}

impl Kind {
    /// Every kind, in byte order.
    pub const ALL: [Kind; 5] = [Kind::Refusal, Kind::Register, Kind::Welcome, Kind::ToWorker, Kind::ToLeader];

    /// The kind of a byte, if any.
    pub fn of_byte(byte: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| *kind as u8 == byte)
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Refusal => "refusal",
            Kind::Register => "register",
            Kind::Welcome => "welcome",
            Kind::ToWorker => "to-worker",
            Kind::ToLeader => "to-leader",
        }
    }
}

/// A joining worker introduces itself to the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Register {
    /// Where other workers reach its exchange (data) listener.
    pub exchange_addr: String,
    /// Its driver threads.
    pub threads: u32,
    /// Its topology fingerprint: must equal the leader's.
    pub fingerprint: String,
    /// For people: its host name, pid and sluice build.
    pub host: String,
    pub pid: u32,
    pub build: String,
    /// Where its admin HTTP API listens (`host:port`), or empty when it has none: a
    /// query on any worker reads every worker's slice of the materialized tables there.
    pub admin_addr: String,
}

/// One worker of the cluster as every worker sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// 0 for the leader, then 1.. in the order of the others' exchange addresses.
    pub id: u32,
    pub exchange_addr: String,
    pub threads: u32,
    /// Its admin API's address (empty: none); see [`Register::admin_addr`].
    pub admin_addr: String,
}

/// The leader's answer once every worker registered: the member set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub members: Vec<Member>,
    /// The receiver's id in `members`.
    pub you: u32,
    /// The leader's topology fingerprint.
    pub fingerprint: String,
}

/// The leader's commands during the run. Ordering (the leader keeps it, a worker checks
/// it): `Resume` once, first, when the pipeline checkpoints; then per epoch one `Barrier`,
/// and a `Commit` of that epoch only after every worker acked it and its manifest was
/// published; the next `Barrier` only after the previous epoch was committed or failed.
/// After a `Commit` with `final_epoch` nothing but `Abort` follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToWorker {
    /// Inject the barrier of `epoch` into every source lane (`final_epoch`: pause every
    /// lane, this is the last checkpoint of the run).
    Barrier { epoch: u64, final_epoch: bool },
    /// Every worker acked `epoch` and its manifest is published: commit the sinks' records
    /// of `epoch` and of every earlier epoch not committed yet (`final_epoch`: then leave).
    Commit { epoch: u64, final_epoch: bool },
    /// Stop the sources, drain, and report.
    Stop,
    /// Stop at once: the run failed (`reason` says where).
    Abort { reason: String },
    /// Nothing to say; proves the leader is alive.
    Heartbeat,
    /// Restore from checkpoint `restored_epoch` (0: start fresh) and number the run's
    /// epochs from `first_epoch`.
    Resume { restored_epoch: u64, first_epoch: u64 },
    /// Stop at once and join this leader again once it closed this session: a worker was
    /// lost (`reason`), and the cluster re-forms to resume from its last checkpoint.
    Rejoin { reason: String },
    /// Stop polling the sources' lanes (`paused`), or poll them again: the whole
    /// cluster's sources pause and resume together. Sent whenever the leader's own flag
    /// changes, and once at the start of a round in which it is paused.
    Pause { paused: bool },
}

/// A worker's reports during the run: at most one `Acked` per `Barrier`, then one
/// `DriversFinished` (every local driver ended its input) and at most one
/// `StopRequested`, then one `Finished` or `Failed` last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToLeader {
    /// Every driver of this worker passed the barrier of `epoch`, and its state objects
    /// are durable; `part` is this worker's part of the manifest (bytes the engine
    /// encodes).
    Acked { epoch: u64, part: Vec<u8> },
    /// The worker's run ended; `report` is its final report (opaque bytes).
    Finished { report: Vec<u8> },
    /// The worker's run failed.
    Failed { message: String },
    /// Nothing to say; proves the worker is alive.
    Heartbeat,
    /// Every driver of this worker reached the end of its input: the leader may take the
    /// last checkpoint once every worker said so.
    DriversFinished,
    /// A stop was requested on this worker (a signal): the leader stops the cluster.
    StopRequested,
    /// A pause (`paused`) or a resume was asked of this worker (its admin API): the
    /// leader applies it to itself and tells every worker (`ToWorker::Pause`).
    PauseRequested { paused: bool },
}

/// Any control frame, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlMessage {
    /// Why the sender refuses (it closes the connection after sending it).
    Refusal(String),
    Register(Register),
    Welcome(Welcome),
    ToWorker(ToWorker),
    ToLeader(ToLeader),
}

impl ControlMessage {
    /// Its kind byte.
    pub fn kind(&self) -> Kind {
        match self {
            ControlMessage::Refusal(_) => Kind::Refusal,
            ControlMessage::Register(_) => Kind::Register,
            ControlMessage::Welcome(_) => Kind::Welcome,
            ControlMessage::ToWorker(_) => Kind::ToWorker,
            ControlMessage::ToLeader(_) => Kind::ToLeader,
        }
    }
}

/// A message with a postcard body, for the generic encoder.
pub(crate) trait Body: Serialize {
    const KIND: Kind;
}

impl Body for Register {
    const KIND: Kind = Kind::Register;
}
impl Body for Welcome {
    const KIND: Kind = Kind::Welcome;
}
impl Body for ToWorker {
    const KIND: Kind = Kind::ToWorker;
}
impl Body for ToLeader {
    const KIND: Kind = Kind::ToLeader;
}

/// Encodes one frame of this build's version.
pub fn encode(message: &ControlMessage) -> Result<Vec<u8>, SluiceError> {
    encode_as(message, WIRE_VERSION)
}

/// Encodes one frame announcing `version` (tests announce other versions).
pub(crate) fn encode_as(message: &ControlMessage, version: u16) -> Result<Vec<u8>, SluiceError> {
    match message {
        ControlMessage::Refusal(text) => Ok(refusal_frame(text, version)),
        ControlMessage::Register(body) => frame_of(body, version),
        ControlMessage::Welcome(body) => frame_of(body, version),
        ControlMessage::ToWorker(body) => frame_of(body, version),
        ControlMessage::ToLeader(body) => frame_of(body, version),
    }
}

/// The frame of a postcard body.
pub(crate) fn frame_of<B: Body>(body: &B, version: u16) -> Result<Vec<u8>, SluiceError> {
    let mut frame = postcard::to_extend(body, header(version, B::KIND, 0)).map_err(|error| {
        SluiceError::internal("cluster.wire_encode", format!("a {} message does not encode: {error}", B::KIND.name()))
    })?;
    let len = frame.len() - HEADER_BYTES;
    if len > MAX_CONTROL_BODY_BYTES as usize {
        return Err(SluiceError::internal(
            "cluster.wire_too_large",
            format!(
                "a {} message takes {len} bytes, more than the {MAX_CONTROL_BODY_BYTES} a control frame carries",
                B::KIND.name()
            ),
        )
        .with_fix("keep checkpoint slices and reports small (they travel on the control connection)"));
    }
    frame[7..HEADER_BYTES].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(frame)
}

/// A refusal frame; a text longer than the bound is cut (at a character boundary).
pub(crate) fn refusal_frame(text: &str, version: u16) -> Vec<u8> {
    let mut end = text.len().min(MAX_CONTROL_BODY_BYTES as usize);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let body = &text.as_bytes()[..end];
    let mut frame = header(version, Kind::Refusal, body.len() as u32);
    frame.extend_from_slice(body);
    frame
}

fn header(version: u16, kind: Kind, len: u32) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_BYTES + len as usize);
    bytes.extend_from_slice(&CONTROL_MAGIC);
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.push(kind as u8);
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes
}

/// Decodes exactly one frame of this build's version (or a refusal of any version);
/// never panics. Truncated input, trailing bytes and every problem of the module doc are
/// typed errors (`cluster.wire_*`).
pub fn decode(bytes: &[u8]) -> Result<ControlMessage, SluiceError> {
    match decode_prefix(bytes, WIRE_VERSION).map_err(Problem::into_error)? {
        Some((message, used)) if used == bytes.len() => Ok(message),
        Some((_, used)) => Err(SluiceError::external(
            "cluster.wire_trailing",
            format!("{} bytes follow a control frame of {used} bytes", bytes.len() - used),
        )),
        None => Err(Problem::Truncated { have: bytes.len() }.into_error()),
    }
}

/// Why bytes are not a control frame this side accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// The bytes do not start with `SLCC`: what arrived (at most [`HEADER_BYTES`]).
    Magic { found: Vec<u8> },
    /// A non-refusal frame of another wire version.
    Version { found: u16, expected: u16 },
    /// An unknown kind byte.
    Kind { found: u8 },
    /// A body length above the bound.
    TooLarge { kind: Kind, len: u32 },
    /// The input ended inside a frame.
    Truncated { have: usize },
    /// The body does not decode as its kind.
    Body { kind: Kind, detail: String },
}

impl Problem {
    /// The typed error (the rendezvous words version problems itself, naming roles).
    pub(crate) fn into_error(self) -> SluiceError {
        match self {
            Problem::Magic { found } => SluiceError::external(
                "cluster.wire_magic",
                format!("not a Sluice control connection: it sent {}", escaped(&found)),
            )
            .with_fix("point only Sluice workers at the control port"),
            Problem::Version { found, expected } => SluiceError::user(
                "cluster.wire_version",
                format!("the peer speaks control wire version {found}, this worker speaks {expected}"),
            )
            .with_fix("run the same sluice version on every worker"),
            Problem::Kind { found } => {
                SluiceError::external("cluster.wire_kind", format!("unknown control frame kind {found}"))
            }
            Problem::TooLarge { kind, len } => SluiceError::external(
                "cluster.wire_too_large",
                format!(
                    "a {} frame announces {len} bytes, more than the {MAX_CONTROL_BODY_BYTES} allowed",
                    kind.name()
                ),
            ),
            Problem::Truncated { have } => SluiceError::external(
                "cluster.wire_truncated",
                format!("the control connection ended inside a frame ({have} bytes of it arrived)"),
            ),
            Problem::Body { kind, detail } => SluiceError::external(
                "cluster.wire_body",
                format!("a {} frame's body does not decode: {detail}", kind.name()),
            ),
        }
    }
}

/// Bytes as escaped ASCII in quotes, for messages: `"GET / HTTP/1.1\r\n"`.
pub(crate) fn escaped(bytes: &[u8]) -> String {
    format!("\"{}\"", bytes.escape_ascii())
}

/// The checked header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    kind: Kind,
    len: u32,
}

/// Checks what has arrived of a header: `Ok(None)` while it is incomplete and its prefix
/// is still a valid magic. Order: magic, then (unless a refusal) version and kind, then
/// the length.
fn check_header(bytes: &[u8], version: u16) -> Result<Option<Header>, Problem> {
    let magic_len = bytes.len().min(CONTROL_MAGIC.len());
    if bytes[..magic_len] != CONTROL_MAGIC[..magic_len] {
        return Err(Problem::Magic { found: bytes[..bytes.len().min(HEADER_BYTES)].to_vec() });
    }
    let Some(header) = bytes.get(..HEADER_BYTES) else { return Ok(None) };
    let found = u16::from_le_bytes([header[4], header[5]]);
    let kind_byte = header[6];
    let len = u32::from_le_bytes([header[7], header[8], header[9], header[10]]);
    let kind = match Kind::of_byte(kind_byte) {
        Some(Kind::Refusal) => Kind::Refusal,
        _ if found != version => return Err(Problem::Version { found, expected: version }),
        Some(kind) => kind,
        None => return Err(Problem::Kind { found: kind_byte }),
    };
    if len > MAX_CONTROL_BODY_BYTES {
        return Err(Problem::TooLarge { kind, len });
    }
    Ok(Some(Header { kind, len }))
}

/// Decodes the frame at the start of `bytes`: `Ok(None)` while it is incomplete, else the
/// message and the bytes it took. Never panics.
pub(crate) fn decode_prefix(bytes: &[u8], version: u16) -> Result<Option<(ControlMessage, usize)>, Problem> {
    let Some(header) = check_header(bytes, version)? else { return Ok(None) };
    let end = HEADER_BYTES + header.len as usize;
    let Some(body) = bytes.get(HEADER_BYTES..end) else { return Ok(None) };
    Ok(Some((decode_body(header.kind, body)?, end)))
}

/// The most driver threads a worker may announce, as `[pipeline] threads` is bounded:
/// slots are summed over the members, so a peer's count is checked before it is used.
pub const MAX_WORKER_THREADS: u32 = 1024;

/// Refuses a worker's thread count outside `1..=MAX_WORKER_THREADS`.
fn check_threads(kind: Kind, threads: u32) -> Result<(), Problem> {
    if (1..=MAX_WORKER_THREADS).contains(&threads) {
        return Ok(());
    }
    Err(Problem::Body { kind, detail: format!("it announces {threads} threads, outside 1..={MAX_WORKER_THREADS}") })
}

fn decode_body(kind: Kind, body: &[u8]) -> Result<ControlMessage, Problem> {
    Ok(match kind {
        Kind::Refusal => ControlMessage::Refusal(String::from_utf8_lossy(body).into_owned()),
        Kind::Register => {
            let register: Register = postcard_exact(kind, body)?;
            check_threads(kind, register.threads)?;
            ControlMessage::Register(register)
        }
        Kind::Welcome => {
            let welcome: Welcome = postcard_exact(kind, body)?;
            for member in &welcome.members {
                check_threads(kind, member.threads)?;
            }
            ControlMessage::Welcome(welcome)
        }
        Kind::ToWorker => ControlMessage::ToWorker(postcard_exact(kind, body)?),
        Kind::ToLeader => ControlMessage::ToLeader(postcard_exact(kind, body)?),
    })
}

fn postcard_exact<T: DeserializeOwned>(kind: Kind, body: &[u8]) -> Result<T, Problem> {
    match postcard::take_from_bytes::<T>(body) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(Problem::Body { kind, detail: format!("{} bytes follow the message", rest.len()) }),
        Err(error) => Err(Problem::Body { kind, detail: error.to_string() }),
    }
}

/// Reads frames from a stream whose reads may time out: keeps a partial frame across
/// calls, and holds at most one frame (the header is checked before its body is read,
/// and a read never goes past the current frame).
#[derive(Debug)]
pub(crate) struct FrameReader {
    buffer: Vec<u8>,
    version: u16,
}

/// What one [`FrameReader::fill`] call saw.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Some bytes arrived.
    Data,
    /// The peer closed the connection (`buffered` bytes of a frame were pending).
    Closed { buffered: usize },
}

impl FrameReader {
    /// A reader accepting frames of `version` (and refusals of any version).
    pub(crate) fn new(version: u16) -> FrameReader {
        FrameReader { buffer: Vec::new(), version }
    }

    /// The next complete frame already buffered, if any.
    pub(crate) fn next_buffered(&mut self) -> Result<Option<ControlMessage>, Problem> {
        let Some((message, used)) = decode_prefix(&self.buffer, self.version)? else { return Ok(None) };
        self.buffer.drain(..used);
        Ok(Some(message))
    }

    /// One read from `source` of at most the rest of the current frame. Call it only after
    /// [`FrameReader::next_buffered`] returned `Ok(None)` (so the buffered header, if
    /// complete, was checked). Timeouts come back as the `io::Error` of the read.
    pub(crate) fn fill(&mut self, source: &mut impl Read) -> io::Result<Fill> {
        let wanted = self.wanted().clamp(1, READ_CHUNK_BYTES);
        let mut chunk = [0u8; READ_CHUNK_BYTES];
        let read = loop {
            match source.read(&mut chunk[..wanted]) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                outcome => break outcome?,
            }
        };
        if read == 0 {
            return Ok(Fill::Closed { buffered: self.buffer.len() });
        }
        self.buffer.extend_from_slice(&chunk[..read]);
        Ok(Fill::Data)
    }

    /// The bytes missing from the current frame (its header's length is trusted only after
    /// `next_buffered` checked it).
    fn wanted(&self) -> usize {
        match self.buffer.get(..HEADER_BYTES) {
            None => HEADER_BYTES - self.buffer.len(),
            Some(header) => {
                let len = u32::from_le_bytes([header[7], header[8], header[9], header[10]]);
                let len = len.min(MAX_CONTROL_BODY_BYTES) as usize;
                (HEADER_BYTES + len).saturating_sub(self.buffer.len())
            }
        }
    }

    /// Bytes held (tests check the bound).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.buffer.capacity()
    }
}

#[cfg(test)]
mod tests;
