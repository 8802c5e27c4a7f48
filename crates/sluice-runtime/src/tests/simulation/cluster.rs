//! One run of a simulated cluster (a "generation": the first start, or a restart after
//! a failure or a stop): the event loop on the simulated clock, which decides, from one
//! seeded [`Rng`], when each driver reads rows and answers, when each frame arrives,
//! when the writer is done and how, and which faults strike (crashes, resets,
//! partitions, slow links, stop signals, store and sink failures). It ends when every
//! process exited or crashed; a run that has not ended by [`RUN_LIMIT_MS`] of simulated
//! time, or within [`RUN_EVENTS_MAX`] events, is a hang and fails the seed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sluice_cluster::wire::{ToLeader, ToWorker};

use crate::coordinator::SIMULATED_NOW;

use super::driver::SimDriver;
use super::network::{Arrival, Frame, LEADER_END, Session, WORKER_END};
use super::process::{Life, Process, outbox};
use super::rng::Rng;
use super::run::{DriverNext, Place, Run, Settings};
use super::world::{Shared, WriteFate, lock};

/// Longest a run may take in simulated time before it counts as a hang: far beyond
/// every bound the protocol keeps (input, timeouts, loss detection, shutdown).
pub(super) const RUN_LIMIT_MS: u64 = 30 * 60 * 1000;

/// Most events a run may take: a run that spins without its clock moving is a hang too.
const RUN_EVENTS_MAX: u64 = 1_000_000;

/// What stays the same across the runs of one seed.
#[derive(Debug, Clone)]
pub(super) struct Shape {
    pub workers: u32,
    pub drivers_per_worker: u32,
    /// Rows of each lane (lane = slot).
    pub totals: Vec<u64>,
    pub settings: Settings,
}

/// Where one run starts.
#[derive(Debug, Clone, Default)]
pub(super) struct Start {
    pub generation: u32,
    pub restored_epoch: u64,
    /// Rows already read per lane (from the restored manifest).
    pub positions: BTreeMap<u32, u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Wake(u32),
    DriverReads(u32, usize),
    DriverRows(u32, usize),
    DriverAcks(u32, usize),
    DriverFinished(u32, usize),
    ControllerTakes(u32),
    WriterDone(u32),
    /// The next frame of session `.0` from end `.1`.
    Deliver(u32, usize),
    /// End `.1` of session `.0` checks heartbeats and loss.
    Check(u32, usize),
    Reset(u32),
    ResetSeen(u32, usize),
    Partition(u32, u64),
    /// Crash a process (with FIN: its kernel closes its connections).
    Crash(u32, bool),
    Signal(u32),
    /// The next sink commit of a worker fails half-way.
    SinkFails(u32),
}

/// What strikes one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Weather {
    /// No faults, short delays: the run must complete and process its input.
    Calm,
    /// Only stop signals: the run must complete (stopped, with a final checkpoint).
    Stops,
    /// Crashes, resets, partitions, slow links and acknowledgements, store failures and
    /// stop signals: the run may fail, and the next one recovers.
    Hostile,
}

/// How hostile this run is.
#[derive(Debug, Clone, Copy)]
struct Faults {
    weather: Weather,
    network_delay_ms: u64,
}

pub(super) struct Cluster<'w> {
    shape: &'w Shape,
    world: &'w Shared,
    rng: Rng,
    base: Instant,
    now_ms: u64,
    sequence: u64,
    queue: BTreeMap<(u64, u64), Event>,
    processes: Vec<Process>,
    /// Session with worker `w` at index `w` (none at 0).
    sessions: Vec<Option<Session>>,
    wakes: Vec<Option<u64>>,
    /// When the last scheduled control read of each (process, driver) happens (FIFO).
    reads_at: Vec<Vec<u64>>,
    takes_at: Vec<u64>,
    faults: Faults,
    events: u64,
}

impl<'w> Cluster<'w> {
    pub(super) fn new(shape: &'w Shape, start: &Start, weather: Weather, seed: u64, world: &'w Shared) -> Self {
        let mut rng = Rng::new(seed);
        let hostile = weather == Weather::Hostile;
        let network_delay_ms = if hostile { rng.pick(&[20, 200, 2_000, 4_500]) } else { 20 };
        let faults = Faults { weather, network_delay_ms };
        let base = Instant::now();
        let workers = shape.workers;
        let mut cluster = Cluster {
            shape,
            world,
            rng,
            base,
            now_ms: 0,
            sequence: 0,
            queue: BTreeMap::new(),
            processes: Vec::new(),
            sessions: (0..workers).map(|w| (w > 0).then(|| Session::new(0))).collect(),
            wakes: vec![None; workers as usize],
            reads_at: vec![vec![0; shape.drivers_per_worker as usize]; workers as usize],
            takes_at: vec![0; workers as usize],
            faults,
            events: 0,
        };
        cluster.set_clock();
        for worker in 0..workers {
            let process = cluster.start_process(worker, start);
            cluster.processes.push(process);
        }
        cluster
    }

    fn start_process(&mut self, worker: u32, start: &Start) -> Process {
        let shape = self.shape;
        let per = shape.drivers_per_worker;
        let slots = worker * per..(worker + 1) * per;
        let mut process = Process::new(worker, shape.workers, shape.settings.shutdown_ms);
        let drivers = slots
            .clone()
            .map(|slot| {
                let position = start.positions.get(&slot).copied().unwrap_or(0);
                let total = shape.totals[slot as usize];
                SimDriver::new(slot, start.generation, worker, total, position, start.restored_epoch + 1)
            })
            .collect();
        let place = Place { worker, slots, total_slots: shape.totals.len() as u32, base: self.base, now_ms: 0 };
        let run = Run::new(&place, shape.settings, process.cluster(), drivers, self.world, start.restored_epoch);
        process.run = Some(run);
        process
    }

    fn set_clock(&self) {
        SIMULATED_NOW.set(Some(self.base + Duration::from_millis(self.now_ms)));
    }

    fn schedule(&mut self, at_ms: u64, event: Event) {
        self.sequence += 1;
        self.queue.insert((at_ms, self.sequence), event);
    }

    fn after(&mut self, low_ms: u64, high_ms: u64, event: Event) {
        let at = self.now_ms + self.rng.between(low_ms, high_ms);
        self.schedule(at, event);
    }

    fn note(&self, line: String) {
        lock(self.world).note(self.now_ms, line);
    }

    /// Runs until every process exited or crashed; returns how each ended.
    pub(super) fn run(mut self) -> Vec<Life> {
        self.begin();
        while self.processes.iter().any(Process::alive) {
            let Some(((at, _), event)) = self.queue.pop_first() else {
                self.hang("nothing more can happen");
            };
            if at > RUN_LIMIT_MS || self.events == RUN_EVENTS_MAX {
                self.hang("the run did not end in time");
            }
            self.now_ms = at;
            self.events += 1;
            self.set_clock();
            if !matches!(event, Event::Check(..) | Event::Deliver(..)) {
                self.note(format!("{event:?}"));
            }
            self.handle(event);
        }
        SIMULATED_NOW.set(None);
        self.processes.iter().map(|p| p.life.clone()).collect()
    }

    fn hang(&self, why: &str) -> ! {
        let states: Vec<String> = self.processes.iter().map(Process::describe).collect();
        panic!("the cluster hangs ({why}) at {} ms: {}", self.now_ms, states.join("; "))
    }

    fn begin(&mut self) {
        for worker in 0..self.shape.workers {
            for index in 0..self.shape.drivers_per_worker as usize {
                self.after(0, 500, Event::DriverRows(worker, index));
            }
            if worker > 0 {
                self.after(0, 1_000, Event::Check(worker, LEADER_END));
                self.after(0, 1_000, Event::Check(worker, WORKER_END));
            }
            self.settle(worker);
        }
        match self.faults.weather {
            Weather::Calm => {}
            Weather::Stops => {
                for _ in 0..self.rng.between(1, 2) {
                    let at = self.rng.between(0, 20_000);
                    let worker = self.rng.between(0, u64::from(self.shape.workers) - 1) as u32;
                    self.schedule(at, Event::Signal(worker));
                }
            }
            Weather::Hostile => self.plan_faults(),
        }
    }

    /// Up to three faults at random times within the first half minute.
    fn plan_faults(&mut self) {
        let workers = self.shape.workers;
        for _ in 0..self.rng.between(1, 3) {
            let at = self.rng.between(0, 30_000);
            let worker = self.rng.between(0, u64::from(workers) - 1) as u32;
            let follower = self.rng.between(1, u64::from(workers.max(2)) - 1) as u32;
            let event = match self.rng.between(0, 5) {
                0 => Event::Crash(worker, self.rng.percent(50)),
                1 => Event::Signal(worker),
                4 => Event::SinkFails(worker),
                2 if workers > 1 => Event::Reset(follower),
                3 if workers > 1 => Event::Partition(follower, self.rng.pick(&[500, 3_000, 4_500, 6_000, 15_000])),
                _ => Event::Crash(worker, true),
            };
            self.schedule(at, event);
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Wake(worker) => {
                if self.wakes[worker as usize] == Some(self.now_ms) {
                    self.wakes[worker as usize] = None;
                }
                self.settle(worker);
            }
            Event::DriverReads(worker, index) => self.driver_reads(worker, index),
            Event::DriverRows(worker, index) => self.driver_rows(worker, index),
            Event::DriverAcks(worker, index) => {
                let Some(run) = self.run_of(worker) else { return };
                let next = run.driver_acks(index);
                self.driver_next(worker, index, next);
                self.settle(worker);
            }
            Event::DriverFinished(worker, index) => {
                let now = self.now_ms;
                let Some(run) = self.run_of(worker) else { return };
                run.driver_finished(index, now);
                self.settle(worker);
            }
            Event::ControllerTakes(worker) => {
                let Some(run) = self.run_of(worker) else { return };
                run.take_routed();
                self.settle(worker);
            }
            Event::WriterDone(worker) => self.writer_done(worker),
            Event::Deliver(session, from) => self.deliver(session, from),
            Event::Check(session, end) => self.check(session, end),
            Event::Reset(session) => {
                self.session(session).reset();
                self.after(1, 200, Event::ResetSeen(session, LEADER_END));
                self.after(1, 200, Event::ResetSeen(session, WORKER_END));
            }
            Event::ResetSeen(session, end) => {
                let now = self.now_ms;
                if !self.session(session).is_closed(end) {
                    self.session(session).close(end, now, false);
                    self.lose(session, end);
                }
            }
            Event::Partition(session, duration_ms) => {
                let until = self.now_ms + duration_ms;
                self.session(session).partition(until);
            }
            Event::Crash(worker, fin) => self.crash(worker, fin),
            Event::SinkFails(worker) => {
                lock(self.world).failing_commits.insert(worker);
            }
            Event::Signal(worker) => {
                if self.processes[worker as usize].life == Life::Running {
                    self.processes[worker as usize].signal_stop();
                    self.settle(worker);
                }
            }
        }
    }

    /// The running part of `worker`, if it runs.
    fn run_of(&mut self, worker: u32) -> Option<&mut Run> {
        let process = &mut self.processes[worker as usize];
        if process.life != Life::Running {
            return None;
        }
        process.run.as_mut()
    }

    fn session(&mut self, worker: u32) -> &mut Session {
        self.sessions[worker as usize].as_mut().expect("a session per worker but the leader")
    }

    fn driver_reads(&mut self, worker: u32, index: usize) {
        let Some(run) = self.run_of(worker) else { return };
        let next = run.driver_reads(index);
        self.driver_next(worker, index, next);
        self.settle(worker);
    }

    fn driver_rows(&mut self, worker: u32, index: usize) {
        let rows = self.rng.between(1, 4);
        let Some(run) = self.run_of(worker) else { return };
        let driver = &mut run.drivers[index];
        if driver.read(rows) {
            let next = if driver.done() { DriverNext::Leave(false) } else { DriverNext::Nothing };
            self.driver_next(worker, index, next);
        } else if driver.reads() {
            self.after(100, 1_000, Event::DriverRows(worker, index));
        }
    }

    fn driver_next(&mut self, worker: u32, index: usize, next: DriverNext) {
        match next {
            DriverNext::Nothing => {}
            DriverNext::Ack => {
                let slow = self.faults.weather == Weather::Hostile && self.rng.percent(10);
                let high = if slow { self.shape.settings.timeout_ms * 3 / 2 } else { 500 };
                self.after(0, high, Event::DriverAcks(worker, index));
            }
            DriverNext::Leave(exit) => {
                let Some(run) = self.run_of(worker) else { return };
                run.driver_leaves(index, exit);
                self.after(0, 100, Event::DriverFinished(worker, index));
            }
        }
    }

    fn writer_done(&mut self, worker: u32) {
        let fate = if self.faults.weather == Weather::Hostile && self.rng.percent(20) {
            self.rng.pick(&[
                WriteFate::FailPart,
                WriteFate::FailPublish,
                WriteFate::CrashAfterPart,
                WriteFate::CrashAfterPublish,
            ])
        } else {
            WriteFate::Succeed
        };
        let world = self.world;
        let Some(run) = self.run_of(worker) else { return };
        if run.writer_done(fate, world) {
            self.settle(worker);
        } else {
            self.note(format!("worker {worker} dies in its checkpoint writer ({fate:?})"));
            self.crash(worker, true);
        }
    }

    /// The process at end `end` of session `session`, and its peer.
    fn ends(session: u32, end: usize) -> (u32, u32) {
        if end == LEADER_END { (0, session) } else { (session, 0) }
    }

    fn deliver(&mut self, session: u32, from: usize) {
        let now = self.now_ms;
        match self.session(session).deliver(from, now) {
            Arrival::Nothing => {}
            Arrival::Later(at) => self.schedule(at, Event::Deliver(session, from)),
            Arrival::Frame(frame) => {
                let (sender, receiver) = Self::ends(session, from);
                if !matches!(frame, Frame::ToWorker(ToWorker::Heartbeat) | Frame::ToLeader(ToLeader::Heartbeat)) {
                    self.note(format!("worker {receiver} hears {frame:?} from worker {sender}"));
                }
                if matches!(frame, Frame::Close) {
                    self.session(session).close(1 - from, now, false);
                }
                if self.processes[receiver as usize].alive()
                    && self.processes[receiver as usize].on_frame(sender, frame)
                {
                    let at = (now + self.rng.between(0, 50)).max(self.takes_at[receiver as usize]);
                    self.takes_at[receiver as usize] = at;
                    self.schedule(at, Event::ControllerTakes(receiver));
                }
                self.settle(receiver);
            }
        }
    }

    fn check(&mut self, session: u32, end: usize) {
        let (me, _) = Self::ends(session, end);
        if self.session(session).is_closed(end) || !self.processes[me as usize].alive() {
            return;
        }
        let (now, base) = (self.now_ms, self.base);
        let (lost, heartbeat, next) = self.session(session).check(end, now, base);
        if lost {
            self.note(format!("session {session}: end {end} declares its peer lost"));
            if let Some(at) = self.session(session).close(end, now, true) {
                self.schedule(at, Event::Deliver(session, end));
            }
            self.lose(session, end);
            return;
        }
        if heartbeat {
            let frame = if end == LEADER_END {
                Frame::ToWorker(ToWorker::Heartbeat)
            } else {
                Frame::ToLeader(ToLeader::Heartbeat)
            };
            self.send(session, end, frame);
        }
        self.schedule(next, Event::Check(session, end));
    }

    /// End `end` of `session` lost its peer.
    fn lose(&mut self, session: u32, end: usize) {
        let (me, peer) = Self::ends(session, end);
        self.processes[me as usize].on_lost(peer);
        self.settle(me);
    }

    fn send(&mut self, session: u32, end: usize, frame: Frame) {
        let delay = self.rng.between(1, self.faults.network_delay_ms);
        let now = self.now_ms;
        if let Some(at) = self.session(session).send(end, frame, now, delay) {
            self.schedule(at, Event::Deliver(session, end));
        }
    }

    fn crash(&mut self, worker: u32, fin: bool) {
        if !self.processes[worker as usize].alive() {
            return;
        }
        self.processes[worker as usize].crash();
        self.close_sessions(worker, fin);
    }

    /// `worker` is gone: its connections close (with FIN, or silently).
    fn close_sessions(&mut self, worker: u32, fin: bool) {
        let now = self.now_ms;
        let sessions: Vec<(u32, usize)> = if worker == 0 {
            (1..self.shape.workers).map(|w| (w, LEADER_END)).collect()
        } else {
            vec![(worker, WORKER_END)]
        };
        for (session, end) in sessions {
            if let Some(at) = self.session(session).close(end, now, fin) {
                self.schedule(at, Event::Deliver(session, end));
            }
        }
    }

    /// After any event at `worker`: its loop tail, then what it sent, posted and asked
    /// for goes to the network, its drivers and its writer; its next wake-up is booked.
    fn settle(&mut self, worker: u32) {
        let now = self.now_ms;
        let process = &mut self.processes[worker as usize];
        if !process.alive() {
            return;
        }
        let exited = process.after(now);
        let frames = std::mem::take(&mut outbox(&process.outbox).frames);
        for (peer, frame) in frames {
            let (session, end) = if worker == 0 { (peer, LEADER_END) } else { (worker, WORKER_END) };
            self.send(session, end, frame);
        }
        self.feed_drivers_and_writer(worker);
        if exited {
            self.close_sessions(worker, true);
            return;
        }
        if let Some(wake) = self.processes[worker as usize].next_wake_ms() {
            let wake = wake.max(now + 1);
            if self.wakes[worker as usize].is_none_or(|booked| wake < booked) {
                self.wakes[worker as usize] = Some(wake);
                self.schedule(wake, Event::Wake(worker));
            }
        }
    }

    fn feed_drivers_and_writer(&mut self, worker: u32) {
        let now = self.now_ms;
        let Some(run) = self.processes[worker as usize].run.as_mut() else { return };
        let mut reads = Vec::new();
        for index in 0..run.drivers.len() {
            while run.reads_scheduled[index] < run.queued_controls(index) {
                run.reads_scheduled[index] += 1;
                reads.push(index);
            }
        }
        let write = run.take_request();
        for index in reads {
            let at = (now + self.rng.between(0, 100)).max(self.reads_at[worker as usize][index]);
            self.reads_at[worker as usize][index] = at;
            self.schedule(at, Event::DriverReads(worker, index));
        }
        if write {
            self.after(10, 1_500, Event::WriterDone(worker));
        }
    }
}
