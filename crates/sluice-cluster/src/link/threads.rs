//! The two threads of a link: the reader decodes frames into inboxes and applies
//! credits; the writer encodes queued messages under credit, grants credit back as
//! consumers take messages, and half-closes once everything is sent (see the parent
//! module for the protocol and its bounds).

use super::*;

pub(super) struct Reader {
    pub(super) peer: u32,
    pub(super) closed: Arc<Halves>,
    pub(super) channels: HashMap<ChannelId, InChannel>,
    pub(super) granted: HashMap<ChannelId, Arc<AtomicU64>>,
    pub(super) wake: Sender<()>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) metrics: Arc<LinkMetrics>,
    pub(super) events: Sender<LinkEvent>,
}

impl Reader {
    pub(super) fn run(mut self, stream: TcpStream) {
        let mut stream = BufReader::with_capacity(COALESCE_BYTES, stream);
        let mut ended = 0usize;
        // Per channel: bytes received, to check the peer against the credit granted.
        let mut received: HashMap<ChannelId, u64> = HashMap::new();
        let outcome = loop {
            match read_frame(&mut stream) {
                Ok(None) if ended == self.channels.len() => break Ok(()),
                Ok(None) => {
                    break Err(format!(
                        "worker {} closed the link before ending {} channels",
                        self.peer,
                        self.channels.len() - ended
                    ));
                }
                Ok(Some(Frame::Credit { channel, bytes })) => match self.granted.get(&channel) {
                    Some(granted) => {
                        granted.fetch_add(bytes, Ordering::AcqRel);
                        let _ = self.wake.try_send(());
                    }
                    None => {
                        break Err(format!(
                            "worker {} granted credit on channel {channel}, which this worker does not send on",
                            self.peer
                        ));
                    }
                },
                Ok(Some(Frame::Message { channel, kind, body })) => {
                    let bytes = (body.len() + crate::frame::HEADER_BYTES) as u64;
                    self.metrics.bytes_received.fetch_add(bytes, Ordering::Relaxed);
                    match self.deliver(channel, kind, body, bytes, &mut received) {
                        Ok(true) => ended += 1,
                        Ok(false) => {}
                        Err(error) => break Err(error),
                    }
                }
                Err(error) => break Err(error.message),
            }
        };
        match outcome {
            Ok(()) => self.closed.finish(&self.events, self.peer),
            Err(reason) if !self.stop.load(Ordering::Acquire) => {
                tracing::warn!(peer = self.peer, "exchange link lost: {reason}");
                let _ = self.events.send(LinkEvent::Lost { peer: self.peer, reason });
            }
            Err(_) => {}
        }
        // Dropping the inboxes' senders tells their readers the peer is gone.
    }

    /// Decodes one message into its inbox; true when it was the channel's end.
    fn deliver(
        &mut self,
        channel: ChannelId,
        kind: u8,
        body: Vec<u8>,
        bytes: u64,
        received: &mut HashMap<ChannelId, u64>,
    ) -> Result<bool, String> {
        let Some(input) = self.channels.get_mut(&channel) else {
            return Err(format!(
                "worker {} sent on channel {channel}, which this worker does not receive on",
                self.peer
            ));
        };
        if input.state.ended.load(Ordering::Acquire) {
            return Err(format!("worker {} sent on channel {channel} after ending it", self.peer));
        }
        let total = received.entry(channel).or_default();
        *total += bytes;
        let granted = input.state.granted.load(Ordering::Acquire);
        if *total > granted {
            return Err(format!(
                "worker {} sent {} bytes on channel {channel}, past the {granted} bytes granted",
                self.peer, *total
            ));
        }
        let message = input.decoder.decode_message(channel, kind, body).map_err(|error| error.message)?;
        let end = matches!(message, Message::EndOfData);
        if end {
            input.state.ended.store(true, Ordering::Release);
            // The writer may be waiting for every incoming channel to end.
            let _ = self.wake.try_send(());
        }
        // A consumer that went away (its run is ending) needs nothing more.
        let _ = input.inbox.send((message, bytes as u32));
        Ok(end)
    }
}

pub(super) struct Writer {
    pub(super) peer: u32,
    pub(super) closed: Arc<Halves>,
    pub(super) stream: TcpStream,
    pub(super) channels: Vec<OutChannel>,
    pub(super) in_states: Vec<Arc<InState>>,
    pub(super) window_bytes: u64,
    pub(super) max_frame_bytes: u32,
    pub(super) wakes: Receiver<()>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) metrics: Arc<LinkMetrics>,
    pub(super) events: Sender<LinkEvent>,
    pub(super) buffer: Vec<u8>,
}

impl Writer {
    pub(super) fn run(mut self) {
        // The initial grant of every incoming channel.
        for state in &self.in_states {
            encode_credit(state.channel, self.window_bytes, &mut self.buffer);
        }
        if let Err(reason) = self.serve()
            && !self.stop.load(Ordering::Acquire)
        {
            tracing::warn!(peer = self.peer, "exchange link lost: {reason}");
            let _ = self.events.send(LinkEvent::Lost { peer: self.peer, reason });
            let _ = self.stream.shutdown(Shutdown::Both);
        }
    }

    fn serve(&mut self) -> Result<(), String> {
        while !self.stop.load(Ordering::Acquire) {
            self.return_credit();
            let moved = self.fill()?;
            if !self.buffer.is_empty() {
                self.flush()?;
                continue;
            }
            if self.done() {
                // Everything is sent and nothing more is needed from this side: close
                // the sending half, so the peer reads to a clean end of stream.
                self.stream
                    .shutdown(Shutdown::Write)
                    .map_err(|error| format!("closing the link to worker {}: {error}", self.peer))?;
                self.closed.finish(&self.events, self.peer);
                return Ok(());
            }
            if !moved {
                self.wait();
            }
        }
        Ok(())
    }

    /// Every outgoing channel ended and went out, and every incoming channel ended (so
    /// the peer needs no more credit).
    fn done(&self) -> bool {
        self.channels.iter().all(|c| c.ended && c.pending.is_empty())
            && self.in_states.iter().all(|state| state.ended.load(Ordering::Acquire))
    }

    /// Grants back what consumers took, in quarter-window steps.
    fn return_credit(&mut self) {
        for state in &self.in_states {
            let consumed = state.consumed.load(Ordering::Acquire);
            if consumed >= state.grant_step && !state.ended.load(Ordering::Acquire) {
                state.consumed.fetch_sub(consumed, Ordering::AcqRel);
                state.granted.fetch_add(consumed, Ordering::AcqRel);
                encode_credit(state.channel, consumed, &mut self.buffer);
            }
        }
    }

    /// Moves queued messages into the write buffer while credit allows. Returns whether
    /// anything moved.
    fn fill(&mut self) -> Result<bool, String> {
        let mut moved = false;
        for channel in &mut self.channels {
            loop {
                if self.buffer.len() >= COALESCE_BYTES {
                    return Ok(true);
                }
                let available = channel.granted.load(Ordering::Acquire).saturating_sub(channel.sent);
                if !channel.pending.is_empty() {
                    // A split batch is several frames: each goes as soon as its own
                    // credit is there (one frame is at most half a window).
                    let frame = next_frame_bytes(&channel.pending);
                    if frame as u64 > available {
                        self.metrics.credit_stalls.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    channel.sent += frame as u64;
                    if frame >= DIRECT_WRITE_BYTES {
                        // A big frame goes to the socket from where it was encoded,
                        // after what was gathered before it (no copy into the buffer).
                        write(&mut self.stream, &self.buffer, self.peer, &self.metrics)?;
                        self.buffer.clear();
                        write(&mut self.stream, &channel.pending[..frame], self.peer, &self.metrics)?;
                        channel.pending.drain(..frame);
                    } else {
                        self.buffer.extend(channel.pending.drain(..frame));
                    }
                    moved = true;
                    continue;
                }
                if channel.ended || available == 0 {
                    break;
                }
                match channel.queue.try_recv() {
                    Ok(message) => {
                        channel.ended = matches!(message, Message::EndOfData);
                        channel
                            .encoder
                            .encode(channel.id, &message, self.max_frame_bytes, &mut channel.pending)
                            .map_err(|error| error.message)?;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        channel.ended = true;
                        break;
                    }
                }
            }
        }
        Ok(moved)
    }

    fn flush(&mut self) -> Result<(), String> {
        write(&mut self.stream, &self.buffer, self.peer, &self.metrics)?;
        self.buffer.clear();
        Ok(())
    }

    /// Waits for a queued message on a channel with credit, a credit, or a consumer's
    /// grant (bounded, so a stop is seen within a second at worst).
    fn wait(&self) {
        let mut select = Select::new();
        select.recv(&self.wakes);
        for channel in &self.channels {
            let available = channel.granted.load(Ordering::Acquire).saturating_sub(channel.sent);
            if !channel.ended && channel.pending.is_empty() && available > 0 {
                select.recv(&channel.queue);
            }
        }
        if let Ok(0) = select.ready_timeout(Duration::from_secs(1)) {
            let _ = self.wakes.try_recv();
        }
    }
}

/// Frames at least this long are written from where they were encoded, not gathered.
const DIRECT_WRITE_BYTES: usize = 64 << 10;

fn write(stream: &mut TcpStream, bytes: &[u8], peer: u32, metrics: &LinkMetrics) -> Result<(), String> {
    if bytes.is_empty() {
        return Ok(());
    }
    stream.write_all(bytes).map_err(|error| format!("writing to worker {peer} failed: {error}"))?;
    metrics.bytes_sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// The length of the first frame (header and body) in a buffer of whole frames we encoded.
fn next_frame_bytes(frames: &[u8]) -> usize {
    let header: &[u8; crate::frame::HEADER_BYTES] =
        frames[..crate::frame::HEADER_BYTES].try_into().expect("a whole header");
    let length = u32::from_le_bytes([header[5], header[6], header[7], header[8]]) as usize;
    crate::frame::HEADER_BYTES + length
}
