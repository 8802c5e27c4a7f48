use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use crossbeam_channel::RecvTimeoutError;
use sluice_types::{Batch, Epoch};

use super::*;

/// Generous: the machine is shared; nothing below asserts on time.
const PATIENCE: Duration = Duration::from_secs(60);

fn open_mesh(workers: u32, config: &LinkConfig, channels: &[(u32, u32, ChannelId)]) -> Vec<Worker> {
    let listeners: Vec<TcpListener> = (0..workers).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    open_mesh_on(listeners, config, channels)
}

/// [`open_mesh`] on listeners bound already, one per worker.
fn open_mesh_on(listeners: Vec<TcpListener>, config: &LinkConfig, channels: &[(u32, u32, ChannelId)]) -> Vec<Worker> {
    let workers = listeners.len() as u32;
    let addresses: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().expect("address")).collect();
    let mut builders: Vec<NetworkBuilder> = (0..workers)
        .map(|me| {
            let peers = (0..workers).filter(|p| *p != me).map(|p| (p, addresses[p as usize]));
            NetworkBuilder::new(me, 42, peers, config.clone())
        })
        .collect();
    let mut senders = HashMap::new();
    let mut inboxes = HashMap::new();
    for &(from, to, channel) in channels {
        senders.insert(channel, builders[from as usize].outgoing(to, channel));
        inboxes.insert(channel, builders[to as usize].incoming(from, channel, None));
    }
    let no_secret: Authenticator = Arc::new(|_, _| Ok(()));
    let handles: Vec<_> = builders
        .into_iter()
        .zip(listeners)
        .map(|(builder, listener)| {
            let authenticate = no_secret.clone();
            std::thread::spawn(move || builder.connect(&listener, authenticate))
        })
        .collect();
    let networks: Vec<Network> = handles.into_iter().map(|h| h.join().expect("thread").expect("mesh")).collect();
    let mut workers: Vec<Worker> = networks
        .into_iter()
        .map(|network| Worker { network, senders: HashMap::new(), inboxes: HashMap::new() })
        .collect();
    for &(from, to, channel) in channels {
        workers[from as usize].senders.insert(channel, senders.remove(&channel).unwrap());
        workers[to as usize].inboxes.insert(channel, inboxes.remove(&channel).unwrap());
    }
    workers
}

struct Worker {
    network: Network,
    senders: HashMap<ChannelId, Sender<Message>>,
    inboxes: HashMap<ChannelId, RemoteInbox>,
}

impl Worker {
    fn receive(&self, channel: ChannelId) -> Message {
        let inbox = &self.inboxes[&channel];
        let (message, bytes) = inbox.messages.recv_timeout(PATIENCE).expect("a message within the patience");
        inbox.consumed(bytes);
        message
    }
}

fn rows(count: usize, width: usize) -> Batch {
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("pad", DataType::Utf8, false)]));
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..count as i64));
    let pad: ArrayRef = Arc::new(StringArray::from_iter_values((0..count).map(|_| "x".repeat(width))));
    Batch::inserts(RecordBatch::try_new(schema, vec![ids, pad]).expect("batch"))
}

fn ids(message: &Message) -> Vec<i64> {
    let Message::Data(batch) = message else { panic!("expected data, got {message:?}") };
    let column = batch.rows.column(0).as_any().downcast_ref::<Int64Array>().expect("ids");
    column.values().to_vec()
}

#[test]
fn three_workers_link_every_pair_and_keep_each_channel_in_order() {
    let channels = [(0, 1, 10), (1, 0, 11), (0, 2, 12), (2, 0, 13), (1, 2, 14), (2, 1, 15)];
    let workers = open_mesh(3, &LinkConfig::default(), &channels);
    for &(from, _, channel) in &channels {
        let sender = &workers[from as usize].senders[&channel];
        sender.send(Message::Watermark(5)).unwrap();
        sender.send(Message::Data(rows(3, 4))).unwrap();
        sender.send(Message::Barrier(Epoch(1))).unwrap();
        sender.send(Message::EndOfData).unwrap();
    }
    for &(_, to, channel) in &channels {
        let worker = &workers[to as usize];
        assert!(matches!(worker.receive(channel), Message::Watermark(5)));
        assert_eq!(ids(&worker.receive(channel)), [0, 1, 2]);
        assert!(matches!(worker.receive(channel), Message::Barrier(Epoch(1))));
        assert!(matches!(worker.receive(channel), Message::EndOfData));
    }
    // Every channel ended: each link closes cleanly on both sides.
    for worker in &workers {
        worker.network.drain(PATIENCE).expect("every link closes cleanly");
    }
}

#[test]
fn a_slow_channel_holds_its_sender_within_the_window_while_another_channel_flows() {
    let config = LinkConfig { window_bytes: 64 << 10, queue_messages: 2, io_timeout: PATIENCE };
    let workers = open_mesh(2, &config, &[(1, 0, 1), (1, 0, 2)]);
    let slow = &workers[1].senders[&1];
    // Fill the slow channel until its bounded queue refuses: the receiver never consumes.
    let mut sent = 0usize;
    let deadline = Instant::now() + PATIENCE;
    loop {
        match slow.try_send(Message::Data(rows(64, 100))) {
            Ok(()) => sent += 1,
            Err(crossbeam_channel::TrySendError::Full(_))
                if slow.is_full() && workers[1].network.metrics()[0].1.credit_stalls.load(Ordering::Relaxed) > 0 =>
            {
                break;
            }
            Err(crossbeam_channel::TrySendError::Full(_)) => std::thread::yield_now(),
            Err(error) => panic!("{error}"),
        }
        assert!(Instant::now() < deadline, "the slow channel never filled");
    }
    // Take (without consuming) what arrives until half a window is held: more than a
    // window of batches waits behind it, so the sender is now held by its credit.
    let inbox = &workers[0].inboxes[&1];
    let mut held = Vec::new();
    let mut arrived = 0u64;
    while arrived < config.window_bytes / 2 {
        let (message, bytes) = inbox.messages.recv_timeout(PATIENCE).expect("batches arrive up to the window");
        arrived += u64::from(bytes);
        held.push((message, bytes));
    }
    held.extend(inbox.messages.try_iter());
    let arrived: u64 = held.iter().map(|(_, bytes)| u64::from(*bytes)).sum();
    assert!(arrived <= config.window_bytes, "{arrived} bytes in flight past a window of {}", config.window_bytes);
    assert!(sent >= 2, "some batches were accepted before backpressure");

    // The other channel of the same link still flows.
    workers[1].senders[&2].send(Message::Data(rows(2, 1))).unwrap();
    assert_eq!(ids(&workers[0].receive(2)), [0, 1]);

    // Consuming releases the rest: the sender's end follows once its queue has room.
    for (_, bytes) in &held {
        inbox.consumed(*bytes);
    }
    let end = workers[1].senders[&1].clone();
    let ender = std::thread::spawn(move || end.send(Message::EndOfData));
    let mut received_batches = held.len();
    while !matches!(workers[0].receive(1), Message::EndOfData) {
        received_batches += 1;
    }
    ender.join().expect("thread").expect("the end was queued");
    assert_eq!(received_batches, sent, "every accepted batch arrived once");
    assert!(
        !workers[0].network.events().try_iter().any(|event| matches!(event, LinkEvent::Lost { .. })),
        "the sender never passed its credit"
    );
}

#[test]
fn a_stray_connection_and_another_run_are_refused_and_the_mesh_still_opens() {
    let listeners: Vec<TcpListener> = (0..2).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addresses: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    // A stray client speaking HTTP, and a worker of another run, reach worker 0 first.
    let mut stray = TcpStream::connect(addresses[0]).unwrap();
    stray.write_all(b"GET / HTTP/1.1\r\nHost: sluice\r\n\r\n").unwrap();
    let mut foreign = TcpStream::connect(addresses[0]).unwrap();
    foreign.write_all(&Preamble { version: DATA_VERSION, run: 7, from: 1, to: 0 }.encode()).unwrap();

    let config = LinkConfig { io_timeout: PATIENCE, ..LinkConfig::default() };
    let mut zero = NetworkBuilder::new(0, 42, [(1, addresses[1])], config.clone());
    let mut one = NetworkBuilder::new(1, 42, [(0, addresses[0])], config);
    let sender = one.outgoing(0, 5);
    let inbox = zero.incoming(1, 5, None);
    let no_secret: Authenticator = Arc::new(|_, _| Ok(()));
    let mut listeners = listeners.into_iter();
    let (l0, l1) = (listeners.next().unwrap(), listeners.next().unwrap());
    let auth = no_secret.clone();
    let accepting = std::thread::spawn(move || zero.connect(&l0, auth));
    // The foreign worker learns why it was refused.
    let reason = read_answer(&mut foreign).unwrap().expect("refused");
    assert!(reason.contains("run 0000000000000007"), "{reason}");
    assert!(!reason.contains(&format!("{:016x}", 42)), "a refusal never names this run: {reason}");
    let _network_one = one.connect(&l1, no_secret).expect("worker 1 links");
    let _network_zero = accepting.join().unwrap().expect("worker 0 links despite the strays");
    sender.send(Message::Watermark(9)).unwrap();
    let (message, _) = inbox.messages.recv_timeout(PATIENCE).unwrap();
    assert!(matches!(message, Message::Watermark(9)));
}

#[test]
fn two_silent_connections_on_the_exchange_port_do_not_stop_a_mesh_from_opening() {
    let listeners: Vec<TcpListener> = (0..3).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    // Held for the whole test, sending nothing, ahead of every worker on worker 0's port:
    // a handshake waits up to 10 s for a preamble, and the workers' wait for an answer
    // is as long, so handshaking them in turn would fail workers 1 and 2.
    let silent: Vec<TcpStream> =
        (0..2).map(|_| TcpStream::connect(listeners[0].local_addr().unwrap()).unwrap()).collect();
    let config = LinkConfig { io_timeout: PATIENCE, ..LinkConfig::default() };
    let workers = open_mesh_on(listeners, &config, &[(1, 0, 1), (2, 0, 2), (2, 1, 3)]);
    for (from, channel) in [(1, 1), (2, 2)] {
        workers[from].senders[&channel].send(Message::Watermark(channel as i64)).unwrap();
        assert!(matches!(workers[0].receive(channel), Message::Watermark(w) if w == channel as i64));
    }
    drop(silent);
}

#[test]
fn a_lost_peer_is_reported_once_and_closes_its_inboxes() {
    let mut workers = open_mesh(2, &LinkConfig::default(), &[(1, 0, 3)]);
    workers[1].senders[&3].send(Message::Watermark(1)).unwrap();
    assert!(matches!(workers[0].receive(3), Message::Watermark(1)));
    // Worker 1 goes away without ending its channel (its process died).
    let one = workers.pop().unwrap();
    drop(one);
    let event = workers[0].network.events().recv_timeout(PATIENCE).expect("a lost link");
    let LinkEvent::Lost { peer, reason } = event else { panic!("expected a lost link, got {event:?}") };
    assert_eq!(peer, 1);
    assert!(reason.contains("before ending 1 channels") || reason.contains("failed"), "{reason}");
    assert_eq!(
        workers[0].inboxes[&3].messages.recv_timeout(PATIENCE).map(|_| ()),
        Err(RecvTimeoutError::Disconnected),
        "the inbox reports the peer gone"
    );
    assert!(workers[0].network.events().try_recv().is_err(), "reported once");
}

#[test]
fn a_peer_that_sends_after_ending_a_channel_is_lost_not_a_panic() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let unused = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut zero = NetworkBuilder::new(0, 42, [(1, unused.local_addr().unwrap())], LinkConfig::default());
    let inbox = zero.incoming(1, 3, None);
    let address = listener.local_addr().unwrap();
    // A hand-made worker 1: the right preamble, then frames past the channel's end.
    let impostor = std::thread::spawn(move || {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(&Preamble { version: DATA_VERSION, run: 42, from: 1, to: 0 }.encode()).unwrap();
        assert_eq!(read_answer(&mut stream).unwrap(), None);
        let mut frames = Vec::new();
        let mut encoder = ChannelEncoder::default();
        encoder.encode(3, &Message::EndOfData, 1 << 20, &mut frames).unwrap();
        encoder.encode(3, &Message::Watermark(5), 1 << 20, &mut frames).unwrap();
        stream.write_all(&frames).unwrap();
        stream
    });
    let no_secret: Authenticator = Arc::new(|_, _| Ok(()));
    let network = zero.connect(&listener, no_secret).expect("the link opens");
    let _stream = impostor.join().unwrap();
    assert!(matches!(inbox.messages.recv_timeout(PATIENCE).unwrap().0, Message::EndOfData));
    let event = network.events().recv_timeout(PATIENCE).expect("a lost link");
    let LinkEvent::Lost { peer: 1, reason } = event else { panic!("expected worker 1 lost, got {event:?}") };
    assert!(reason.contains("after ending it"), "{reason}");
}
