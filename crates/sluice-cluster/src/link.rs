//! The exchange mesh between workers: one TCP link per worker pair carrying every
//! exchange channel between the two, each with credit-based flow control.
//!
//! ## Setup
//!
//! Every worker binds its exchange listener before the rendezvous (so its address is in
//! the member set). After the rendezvous, each worker registers the channels it sends and
//! receives on every peer ([`NetworkBuilder::outgoing`], [`NetworkBuilder::incoming`]);
//! both sides derive the same [`ChannelId`]s from the plan. Then [`NetworkBuilder::connect`]
//! opens the links: a worker *connects* to every peer with a lower id and *accepts* from
//! every peer with a higher id; the connecting side's preamble names both ids and the run
//! (see [`crate::frame`]), so one listener sorts its incoming links and refuses strays
//! (another program, another run, a peer already linked) without stopping. The
//! shared-secret proof runs on every link right after the preamble.
//!
//! ## Flow control
//!
//! A channel's sender never has more bytes in flight than its receiver granted: the
//! receiver grants `window_bytes` when the link starts, and grants again only as the
//! consuming operator takes messages out of its [`RemoteInbox`] (not when the socket is
//! read), in steps of a quarter window. A frame is at most half a window (bigger batches
//! are split by rows), so a sender whose consumer has taken everything always has room
//! for its next frame: credit never deadlocks. A sender without credit leaves messages in
//! its bounded local queue; the driver's outbox then fills and the driver stops polling
//! its lanes, so a slow operator on one host pauses the sources on every host, while the
//! other channels of the same link keep flowing (each has its own credit).
//!
//! Bounds: a sender's queue holds `queue_messages` messages; a receiver's inbox holds at
//! most `window_bytes` of frames (a peer that sends past its credit is a protocol error);
//! the writer coalesces frames up to [`COALESCE_BYTES`] per write; the wake-up channels
//! have capacity one and are only ever nudged (`try_send`, a full channel already means
//! "look again").
//!
//! ## Threads and failure
//!
//! Per link, a writer thread (encodes queued messages, sends credits) and a reader thread
//! (decodes frames into inboxes, applies credits). A read or write failure, or an end of
//! stream while some incoming channel has not ended, reports [`LinkEvent::Lost`] once and
//! drops that link's inboxes, so the exchange reading them fails with a lost peer instead
//! of waiting forever. Writes time out after `io_timeout`.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use crossbeam_channel::{Receiver, Select, Sender, TryRecvError, bounded, unbounded};
use sluice_types::{ErrorKind, Message, SluiceError};

use crate::frame::{
    ChannelDecoder, ChannelEncoder, ChannelId, DATA_VERSION, Frame, PREAMBLE_BYTES, Preamble, encode_credit,
    read_answer, read_frame, write_answer,
};

/// Frames are gathered into one write up to this many bytes.
pub const COALESCE_BYTES: usize = 256 << 10;

/// How the mesh behaves.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// Bytes a receiver grants each channel: what may be in flight on it.
    pub window_bytes: u64,
    /// Messages a sender queues locally per channel before its driver feels backpressure.
    pub queue_messages: usize,
    /// How long opening the mesh may take, and how long one write may block.
    pub io_timeout: Duration,
}

impl Default for LinkConfig {
    fn default() -> LinkConfig {
        LinkConfig { window_bytes: 16 << 20, queue_messages: 8, io_timeout: Duration::from_secs(30) }
    }
}

/// Proves the shared secret on a freshly opened link; `initiator` is the connecting side.
pub type Authenticator = Arc<dyn Fn(&mut TcpStream, bool) -> Result<(), SluiceError> + Send + Sync>;

/// What happened to a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// The link to `peer` failed; its incoming channels were closed.
    Lost { peer: u32, reason: String },
    /// Both directions of the link to `peer` ended cleanly: every channel ended and was
    /// delivered, and both sides closed their sending half.
    Closed { peer: u32 },
}

/// Counters of one link.
#[derive(Debug, Default)]
pub struct LinkMetrics {
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Times a channel had a message ready and no credit for it.
    pub credit_stalls: AtomicU64,
}

/// Where an incoming channel's messages arrive. The consumer reports each message it
/// takes with [`RemoteInbox::consumed`]: that is what grants the sender more credit.
pub struct RemoteInbox {
    pub messages: Receiver<(Message, u32)>,
    /// The worker the messages come from.
    pub peer: u32,
    state: Arc<InState>,
    wake: Sender<()>,
}

impl std::fmt::Debug for RemoteInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteInbox").field("channel", &self.state.channel).finish()
    }
}

impl RemoteInbox {
    /// The consumer took a message of `bytes` wire bytes.
    pub fn consumed(&self, bytes: u32) {
        let before = self.state.consumed.fetch_add(u64::from(bytes), Ordering::AcqRel);
        if before < self.state.grant_step && before + u64::from(bytes) >= self.state.grant_step {
            // Capacity one: a full channel already holds a wake-up.
            let _ = self.wake.try_send(());
        }
    }
}

/// The receiving state of one channel, shared by its inbox and the link's threads.
struct InState {
    channel: ChannelId,
    /// Bytes taken by the consumer and not yet granted back.
    consumed: AtomicU64,
    /// Bytes granted to the sender in total (the writer adds before it sends a grant, so
    /// the reader never sees bytes the grant did not yet cover).
    granted: AtomicU64,
    grant_step: u64,
    /// The channel's end arrived: it needs no more credit.
    ended: AtomicBool,
}

struct OutChannel {
    id: ChannelId,
    queue: Receiver<Message>,
    encoder: ChannelEncoder,
    /// Bytes granted by the receiver in total (added by the reader thread).
    granted: Arc<AtomicU64>,
    sent: u64,
    /// Frames encoded but not yet covered by credit.
    pending: Vec<u8>,
    ended: bool,
}

struct InChannel {
    id: ChannelId,
    inbox: Sender<(Message, u32)>,
    decoder: ChannelDecoder,
    state: Arc<InState>,
}

#[derive(Default)]
struct PeerChannels {
    outgoing: Vec<OutChannel>,
    incoming: Vec<InChannel>,
}

/// Registers channels, then opens the links.
pub struct NetworkBuilder {
    me: u32,
    run: u64,
    peers: HashMap<u32, SocketAddr>,
    config: LinkConfig,
    channels: HashMap<u32, PeerChannels>,
    wakes: HashMap<u32, (Sender<()>, Receiver<()>)>,
    cancelled: Arc<AtomicBool>,
}

impl NetworkBuilder {
    /// A flag that, once set, makes [`NetworkBuilder::connect`] give up at once (a peer
    /// was lost while the links opened: waiting for it would only run out the timeout).
    pub fn canceller(&self) -> Arc<AtomicBool> {
        self.cancelled.clone()
    }

    fn check_cancelled(&self) -> Result<(), SluiceError> {
        if self.cancelled.load(Ordering::Acquire) {
            return Err(SluiceError::external(
                "cluster.link_cancelled",
                "the exchange links were not opened: the cluster is stopping",
            )
            .with_kind(ErrorKind::LostPeer));
        }
        Ok(())
    }

    /// `peers`: every other worker's id and exchange address; `run`: a token both sides
    /// share (the topology fingerprint's hash).
    pub fn new(
        me: u32,
        run: u64,
        peers: impl IntoIterator<Item = (u32, SocketAddr)>,
        config: LinkConfig,
    ) -> NetworkBuilder {
        assert!(config.window_bytes >= 1024, "an exchange window below 1 KiB cannot carry a batch");
        assert!(config.queue_messages > 0, "a sender queue needs room for one message");
        let peers: HashMap<u32, SocketAddr> = peers.into_iter().collect();
        assert!(!peers.contains_key(&me), "a worker is not its own peer");
        let wakes = peers.keys().map(|peer| (*peer, bounded(1))).collect();
        NetworkBuilder { me, run, peers, config, channels: HashMap::new(), wakes, cancelled: Arc::default() }
    }

    /// The largest frame body a sender emits: half a window, so credit never deadlocks.
    pub fn max_frame_bytes(&self) -> u32 {
        (self.config.window_bytes / 2).min(u64::from(crate::frame::MAX_FRAME_BODY_BYTES)) as u32
    }

    /// A channel this worker sends to `peer` on; the returned sender's queue is bounded.
    pub fn outgoing(&mut self, peer: u32, channel: ChannelId) -> Sender<Message> {
        assert!(self.peers.contains_key(&peer), "worker {peer} is not a peer");
        let (sender, queue) = bounded(self.config.queue_messages);
        let out = OutChannel {
            id: channel,
            queue,
            encoder: ChannelEncoder::default(),
            granted: Arc::new(AtomicU64::new(0)),
            sent: 0,
            pending: Vec::new(),
            ended: false,
        };
        let entry = self.channels.entry(peer).or_default();
        assert!(entry.outgoing.iter().all(|c| c.id != channel), "channel {channel} to worker {peer} registered twice");
        entry.outgoing.push(out);
        sender
    }

    /// A channel this worker receives from `peer` on; `schema`, when known, is checked
    /// against every batch.
    pub fn incoming(&mut self, peer: u32, channel: ChannelId, schema: Option<SchemaRef>) -> RemoteInbox {
        assert!(self.peers.contains_key(&peer), "worker {peer} is not a peer");
        let (inbox, messages) = unbounded();
        let state = Arc::new(InState {
            channel,
            consumed: AtomicU64::new(0),
            granted: AtomicU64::new(self.config.window_bytes),
            grant_step: (self.config.window_bytes / 4).max(1),
            ended: AtomicBool::new(false),
        });
        let wake = self.wakes[&peer].0.clone();
        let entry = self.channels.entry(peer).or_default();
        assert!(
            entry.incoming.iter().all(|c| c.id != channel),
            "channel {channel} from worker {peer} registered twice"
        );
        entry.incoming.push(InChannel {
            id: channel,
            inbox,
            decoder: ChannelDecoder::new(schema),
            state: state.clone(),
        });
        RemoteInbox { messages, peer, state, wake }
    }

    /// Opens one link to every peer (connecting to lower ids, accepting higher ids on
    /// `listener`) and starts its threads. Every wait ends by `config.io_timeout`.
    pub fn connect(mut self, listener: &TcpListener, authenticate: Authenticator) -> Result<Network, SluiceError> {
        let deadline = Instant::now() + self.config.io_timeout;
        let mut streams: HashMap<u32, TcpStream> = HashMap::new();
        let mut lower: Vec<u32> = self.peers.keys().copied().filter(|peer| *peer < self.me).collect();
        lower.sort_unstable();
        for peer in lower {
            let stream = self.connect_to(peer, deadline, &authenticate)?;
            streams.insert(peer, stream);
        }
        let higher = self.peers.keys().filter(|peer| **peer > self.me).count();
        self.accept_from(listener, higher, deadline, &authenticate, &mut streams)?;

        let (events_tx, events) = unbounded();
        let mut links = Vec::new();
        for (peer, stream) in streams {
            let channels = self.channels.remove(&peer).unwrap_or_default();
            let (wake_tx, wake_rx) = self.wakes.remove(&peer).expect("one wake channel per peer");
            links.push(Link::start(
                peer,
                stream,
                channels,
                wake_tx,
                wake_rx,
                &self.config,
                self.max_frame_bytes(),
                events_tx.clone(),
            )?);
        }
        Ok(Network { links, events })
    }

    fn connect_to(&self, peer: u32, deadline: Instant, authenticate: &Authenticator) -> Result<TcpStream, SluiceError> {
        let address = self.peers[&peer];
        let mut backoff = Duration::from_millis(10);
        let mut stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            self.check_cancelled()?;
            // Short attempts: a cancel (a peer lost meanwhile) is seen between them,
            // where one long attempt to an unreachable host would hold the whole wait.
            let attempt = left.min(CONNECT_ATTEMPT).max(Duration::from_millis(1));
            match TcpStream::connect_timeout(&address, attempt) {
                Ok(stream) => break stream,
                Err(error) if Instant::now() + backoff < deadline => {
                    tracing::debug!(peer, %address, %error, "exchange connect retry");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(error) => {
                    return Err(SluiceError::external(
                        "cluster.link_connect",
                        format!("could not open the exchange link to worker {peer} at {address}: {error}"),
                    )
                    .with_kind(ErrorKind::LostPeer)
                    .with_fix(
                        "check that the worker runs and that its --advertise address is reachable from this host",
                    ));
                }
            }
        };
        configure(&stream, self.config.io_timeout)?;
        let preamble = Preamble { version: DATA_VERSION, run: self.run, from: self.me, to: peer };
        let io = |error: std::io::Error| link_error(peer, &format!("opening the link failed: {error}"));
        stream.write_all(&preamble.encode()).map_err(io)?;
        let answered = read_answer(&mut stream).map_err(|error| match error.kind() {
            // A read timeout (EAGAIN on Linux): connected, but nobody answered.
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                unanswered(peer, address, self.config.io_timeout.min(HANDSHAKE_READ))
            }
            _ => io(error),
        });
        if let Some(reason) = answered? {
            return Err(SluiceError::external(
                "cluster.link_refused",
                format!("worker {peer} at {address} refused the exchange link: {reason}"),
            )
            .with_fix("every worker must run the same sluice build and pipeline, joined to the same leader"));
        }
        authenticate(&mut stream, true).map_err(silent_peer_is_lost)?;
        Ok(stream)
    }

    /// Accepts the links of the `expected` higher peers. Each accepted connection is
    /// handshaken on a thread of its own (at most [`MAX_PENDING_LINK_HANDSHAKES`] at once,
    /// each ending within [`HANDSHAKE_READ`]), so connections that send nothing (a
    /// scanner, a client holding the port) never hold up the peers behind them.
    fn accept_from(
        &self,
        listener: &TcpListener,
        expected: usize,
        deadline: Instant,
        authenticate: &Authenticator,
        streams: &mut HashMap<u32, TcpStream>,
    ) -> Result<(), SluiceError> {
        let accepted_before = streams.len();
        listener
            .set_nonblocking(true)
            .map_err(|error| link_error(self.me, &format!("the exchange listener: {error}")))?;
        let admission = Admission {
            me: self.me,
            run: self.run,
            peers: self.peers.keys().copied().collect(),
            io_timeout: self.config.io_timeout,
        };
        // Each handshake thread sends one result; at most MAX_PENDING_LINK_HANDSHAKES run,
        // so a send never blocks (and fails harmlessly once this wait is over).
        let (admitted, results) = bounded(MAX_PENDING_LINK_HANDSHAKES);
        let mut in_flight = 0usize;
        while streams.len() - accepted_before < expected {
            self.check_cancelled()?;
            if Instant::now() >= deadline {
                let mut missing: Vec<u32> =
                    self.peers.keys().copied().filter(|p| *p > self.me && !streams.contains_key(p)).collect();
                missing.sort_unstable();
                return Err(SluiceError::external(
                    "cluster.link_accept",
                    format!(
                        "workers {missing:?} did not open their exchange links within {:?}",
                        self.config.io_timeout
                    ),
                )
                .with_kind(ErrorKind::LostPeer)
                .with_fix("check that those workers run and can reach this worker's --advertise address"));
            }
            while let Ok(result) = results.try_recv() {
                in_flight -= 1;
                take_admitted(result, streams);
            }
            match listener.accept() {
                Ok((stream, from)) if in_flight >= MAX_PENDING_LINK_HANDSHAKES => {
                    tracing::warn!(%from, "dropped an exchange connection: {in_flight} handshakes are under way");
                    drop(stream);
                }
                Ok((stream, from)) => {
                    let (admission, authenticate, admitted) =
                        (admission.clone(), authenticate.clone(), admitted.clone());
                    let spawned = std::thread::Builder::new().name("sluice-link-handshake".into()).spawn(move || {
                        let result = admission.admit(stream, &authenticate).map_err(|error| (from, error));
                        // The wait may be over (the mesh opened without it): nobody needs it.
                        let _ = admitted.send(result);
                    });
                    match spawned {
                        Ok(_) => in_flight += 1,
                        Err(error) => tracing::warn!(%from, "dropped an exchange connection: no thread: {error}"),
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    // Waits for a handshake to end, or a little for the next connection.
                    if let Ok(result) = results.recv_timeout(ACCEPT_POLL) {
                        in_flight -= 1;
                        take_admitted(result, streams);
                    }
                }
                Err(error) => tracing::warn!("accepting an exchange connection failed: {error}"),
            }
        }
        Ok(())
    }
}

/// How many accepted exchange connections are handshaken at once; more are dropped
/// until one ends (each ends within [`HANDSHAKE_READ`]).
pub const MAX_PENDING_LINK_HANDSHAKES: usize = 16;
/// How long the accepting side waits between looks at its listener.
const ACCEPT_POLL: Duration = Duration::from_millis(5);

/// One handshake's outcome: the peer and its link, or where the refused one came from.
type Admitted = Result<(u32, TcpStream), (SocketAddr, SluiceError)>;

/// Keeps an admitted link, unless its peer is linked already (the first one to prove
/// itself stays); logs a refused one.
fn take_admitted(result: Admitted, streams: &mut HashMap<u32, TcpStream>) {
    match result {
        Ok((peer, _)) if streams.contains_key(&peer) => {
            tracing::warn!(peer, "dropped a second exchange link from worker {peer}: it is already linked");
        }
        Ok((peer, stream)) => {
            streams.insert(peer, stream);
        }
        Err((from, error)) => tracing::warn!(%from, "refused an exchange connection: {error}"),
    }
}

/// What the accepting side checks an incoming preamble against, for a handshake thread.
#[derive(Debug, Clone)]
struct Admission {
    me: u32,
    run: u64,
    peers: Vec<u32>,
    io_timeout: Duration,
}

impl Admission {
    /// Reads and checks one incoming preamble; answers it, then runs the secret's proof.
    /// A refusal's answer never names this worker's run (a stranger learns nothing of
    /// it); the error, which stays in this worker's log, does.
    fn admit(&self, mut stream: TcpStream, authenticate: &Authenticator) -> Result<(u32, TcpStream), SluiceError> {
        stream.set_nonblocking(false).map_err(|error| link_error(self.me, &error.to_string()))?;
        configure(&stream, self.io_timeout)?;
        let mut bytes = [0u8; PREAMBLE_BYTES];
        stream.read_exact(&mut bytes).map_err(|error| link_error(self.me, &format!("reading a preamble: {error}")))?;
        let preamble = Preamble::decode(&bytes)?;
        // What the connecting side is told, and what this worker's log says.
        let refusal = if preamble.version != DATA_VERSION {
            let reason = format!(
                "it speaks exchange version {}, this worker {DATA_VERSION}; run the same sluice build on every worker",
                preamble.version
            );
            Some((reason.clone(), reason))
        } else if preamble.run != self.run {
            Some((
                format!("it belongs to run {:016x}, not to this worker's; join both to the same leader", preamble.run),
                format!("it belongs to run {:016x}, this worker to run {:016x}", preamble.run, self.run),
            ))
        } else if preamble.to != self.me {
            let reason = format!("it addressed worker {}, this is worker {}", preamble.to, self.me);
            Some((reason.clone(), reason))
        } else if preamble.from <= self.me || !self.peers.contains(&preamble.from) {
            let reason = format!(
                "worker {} does not connect to worker {} (only higher ids connect to lower ones)",
                preamble.from, self.me
            );
            Some((reason.clone(), reason))
        } else {
            None
        };
        let answer = write_answer(&mut stream, refusal.as_ref().map(|(answer, _)| answer.as_str()));
        if let Some((_, reason)) = refusal {
            return Err(SluiceError::external("cluster.link_refused", reason));
        }
        answer.map_err(|error| link_error(preamble.from, &error.to_string()))?;
        authenticate(&mut stream, false).map_err(silent_peer_is_lost)?;
        Ok((preamble.from, stream))
    }
}

/// A peer that went silent or away during the handshake (a cut link, a dead process) is
/// a lost peer: the control session's account of it, which names the worker, is the
/// cause to report. A refusal (another secret) stays what it is.
fn silent_peer_is_lost(error: SluiceError) -> SluiceError {
    match error.code {
        "cluster.auth_timeout" | "cluster.auth_io" | "cluster.auth_closed" => error.with_kind(ErrorKind::LostPeer),
        _ => error,
    }
}

/// The longest one connection attempt of a link takes (attempts repeat until the mesh's
/// `io_timeout`).
const CONNECT_ATTEMPT: Duration = Duration::from_secs(1);
/// The longest a handshake read waits: a peer cut off while the links open is given up
/// after this, not after the whole `io_timeout`.
const HANDSHAKE_READ: Duration = Duration::from_secs(10);

fn configure(stream: &TcpStream, io_timeout: Duration) -> Result<(), SluiceError> {
    let io = |error: std::io::Error| {
        SluiceError::external("cluster.link_socket", format!("configuring an exchange socket failed: {error}"))
    };
    stream.set_nodelay(true).map_err(io)?;
    stream.set_write_timeout(Some(io_timeout)).map_err(io)?;
    // Reads on an established link wait for data as long as the run lasts (an idle
    // pipeline sends nothing); a lost peer is found by the control heartbeats, which
    // then shut the link down. The timeout bounds only the handshake.
    stream.set_read_timeout(Some(io_timeout.min(HANDSHAKE_READ))).map_err(io)
}

/// The accepting worker took the connection but never answered its preamble.
fn unanswered(peer: u32, address: SocketAddr, waited: Duration) -> SluiceError {
    SluiceError::external(
        "cluster.link_unanswered",
        format!(
            "worker {peer} at {address} accepted the exchange link but did not answer its opening within {} s: \
             that worker is stalled, or its exchange port is held by other connections (a worker of an older \
             build handshakes one connection at a time, so one idle client on the port holds every link)",
            waited.as_secs()
        ),
    )
    .with_kind(ErrorKind::LostPeer)
    .with_fix(format!(
        "check what else connects to {address} (only workers should reach the exchange port: keep it off public \
         networks, or behind --secret-file), run the same sluice build on every worker, and start the cluster again"
    ))
}

fn link_error(peer: u32, message: &str) -> SluiceError {
    SluiceError::external("cluster.link_lost", format!("the exchange link to worker {peer}: {message}"))
        .with_kind(ErrorKind::LostPeer)
}

/// The open mesh. Dropping it shuts every link down.
pub struct Network {
    links: Vec<Link>,
    events: Receiver<LinkEvent>,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network").field("links", &self.links.len()).finish()
    }
}

impl Network {
    /// Lost links, as they happen.
    pub fn events(&self) -> &Receiver<LinkEvent> {
        &self.events
    }

    /// Waits until every link closed cleanly (every channel in both directions ended
    /// and was delivered) or `timeout` passes. Call it once the local drivers finished:
    /// closing a link earlier could cut off an end of data still on its way.
    pub fn drain(&self, timeout: Duration) -> Result<(), SluiceError> {
        let deadline = Instant::now() + timeout;
        let mut open: std::collections::BTreeSet<u32> = self.links.iter().map(|link| link.peer).collect();
        while let Some(first) = open.first().copied() {
            match self.events.recv_deadline(deadline) {
                Ok(LinkEvent::Closed { peer }) => {
                    open.remove(&peer);
                }
                Ok(LinkEvent::Lost { peer, reason }) => return Err(link_error(peer, &reason)),
                Err(_) => {
                    return Err(SluiceError::external(
                        "cluster.drain_timeout",
                        format!("the exchange links to workers {open:?} did not close within {timeout:?} (first: worker {first})"),
                    )
                    .with_kind(ErrorKind::LostPeer)
                    .with_fix("check that every worker is still running; one may be stuck or cut off"));
                }
            }
        }
        Ok(())
    }

    /// Each peer's link counters.
    pub fn metrics(&self) -> Vec<(u32, Arc<LinkMetrics>)> {
        self.links.iter().map(|link| (link.peer, link.metrics.clone())).collect()
    }

    /// Closes every link and waits for its threads (on drop).
    fn close(&mut self) {
        for link in &mut self.links {
            link.close();
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.close();
    }
}

/// The two halves of a link ending cleanly: the reader saw the peer's end of stream
/// after every incoming channel ended, the writer sent everything and closed its half.
/// Whichever finishes second reports [`LinkEvent::Closed`].
#[derive(Default)]
struct Halves {
    finished: std::sync::atomic::AtomicU8,
}

impl Halves {
    fn finish(&self, events: &Sender<LinkEvent>, peer: u32) {
        if self.finished.fetch_add(1, Ordering::AcqRel) == 1 {
            let _ = events.send(LinkEvent::Closed { peer });
        }
    }
}

struct Link {
    peer: u32,
    stream: TcpStream,
    stop: Arc<AtomicBool>,
    wake: Sender<()>,
    metrics: Arc<LinkMetrics>,
    threads: Vec<JoinHandle<()>>,
}

impl Link {
    #[allow(clippy::too_many_arguments)]
    fn start(
        peer: u32,
        stream: TcpStream,
        channels: PeerChannels,
        wake: Sender<()>,
        wakes: Receiver<()>,
        config: &LinkConfig,
        max_frame_bytes: u32,
        events: Sender<LinkEvent>,
    ) -> Result<Link, SluiceError> {
        let clone = |stream: &TcpStream| stream.try_clone().map_err(|error| link_error(peer, &error.to_string()));
        let read_half = clone(&stream)?;
        read_half.set_read_timeout(None).map_err(|error| link_error(peer, &error.to_string()))?;
        let write_half = clone(&stream)?;
        let stop = Arc::new(AtomicBool::new(false));
        let metrics = Arc::new(LinkMetrics::default());
        let granted: HashMap<ChannelId, Arc<AtomicU64>> =
            channels.outgoing.iter().map(|c| (c.id, c.granted.clone())).collect();
        let in_states: Vec<Arc<InState>> = channels.incoming.iter().map(|c| c.state.clone()).collect();
        let closed = Arc::new(Halves::default());
        let reader = Reader {
            peer,
            closed: closed.clone(),
            channels: channels.incoming.into_iter().map(|c| (c.id, c)).collect(),
            granted,
            wake: wake.clone(),
            stop: stop.clone(),
            metrics: metrics.clone(),
            events: events.clone(),
        };
        let writer = Writer {
            peer,
            closed,
            stream: write_half,
            channels: channels.outgoing,
            in_states,
            window_bytes: config.window_bytes,
            max_frame_bytes,
            wakes,
            stop: stop.clone(),
            metrics: metrics.clone(),
            events,
            buffer: Vec::with_capacity(COALESCE_BYTES),
        };
        let spawn = |name: String, body: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name).spawn(body).map_err(|error| {
                SluiceError::external("cluster.thread", format!("starting a link thread failed: {error}"))
            })
        };
        let threads = vec![
            spawn(format!("link-{peer}-read"), Box::new(move || reader.run(read_half)))?,
            spawn(format!("link-{peer}-write"), Box::new(move || writer.run()))?,
        ];
        Ok(Link { peer, stream, stop, wake, metrics, threads })
    }

    fn close(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.try_send(());
        let _ = self.stream.shutdown(Shutdown::Both);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

mod threads;
use threads::{Reader, Writer};

#[cfg(test)]
mod tests;
