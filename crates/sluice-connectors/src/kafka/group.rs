//! Group mode (`assignment = "group"`): the process's one consumer subscribes to the
//! topics as a member of `group_id`, and the group decides which partitions it reads.
//!
//! The runtime's lanes are fixed at planning, one per partition as in manual mode; a
//! lane reads only while its partition is *granted* to this process, and is idle (no
//! rows, the other lanes' watermark) otherwise.
//!
//! # Who runs what
//!
//! - Every partition's queue is split off the consumer *before* it subscribes, so no
//!   message ever reaches the main queue (a message there would be handed to nobody).
//! - A poller thread ([`Poller`]) polls the main queue every [`MAIN_POLL_WAIT`]:
//!   librdkafka serves rebalance callbacks only from that poll, and lanes may not be
//!   polled at all while their downstream is full. The rebalance callback
//!   ([`Group::rebalance`]) therefore always runs on the poller (or, at the end, on the
//!   thread closing the consumer), never on a lane's thread.
//! - A lane checks its grant at every poll ([`Group::turn`]): one atomic load while
//!   nothing changed.
//!
//! # Assignment
//!
//! Partitions granted start at the group's committed offset, or per `start` when the
//! group has none (`committed` meaning `earliest`). The offset is resolved in the
//! callback (bounded by `client::METADATA_TIMEOUT`) so that the grant knows where it
//! began: its *floor*.
//!
//! # Revocation: the drain barrier
//!
//! 1. The revoked lanes' grants become *revoking*: each lane, at its next poll, stops
//!    reading and records where it stopped.
//! 2. The callback waits, at most `revoke_timeout`, until every revoked lane stopped and
//!    a committed checkpoint acknowledged everything it read (its position at or past
//!    where it stopped): the rows it read are then in every sink.
//! 3. The grants become *unowned* (under the lock that `checkpoint_committed` takes, so
//!    no commit of theirs can follow), then the acknowledged offsets are committed
//!    synchronously, then the partitions are released to librdkafka. librdkafka bounds
//!    that commit: waiting for the group's coordinator by `session.timeout.ms`, the
//!    request by `socket.timeout.ms`; a failed commit leaves the offsets committed
//!    before (duplicates for the next owner, never a loss).
//!
//! Rows read past the acknowledged offsets (the deadline passed first) are read again by
//! the next owner: at-least-once, never a loss. A lost assignment (the session expired:
//! another member may own the partitions already) commits nothing.
//!
//! # Which offsets may be committed
//!
//! Only a checkpoint's position of a lane that is owned or revoking, and not below its
//! grant's floor. A position is a committed checkpoint's, so every row before it is
//! acknowledged by every sink whichever grant read it; the floor keeps a checkpoint
//! taken before the partition left and came back from moving the group's offset
//! backwards. A partition this process no longer owns is never committed: its new owner
//! commits it.
//!
//! # The cooperative protocol: refused, cause not found
//!
//! A cooperative `partition.assignment.strategy` is refused at validation (`options.rs`):
//! under load, the rebalance test (`check_rebalance_between_two_members` in
//! `sluice-cli/tests/cli/kafka.rs`) with `cooperative-sticky` saw 476 of its 480 bids in
//! the sink in 2 of about 10 runs, the missing ones a batch of a partition that moved.
//! What was ruled out, by reading this module and the bundled librdkafka's cooperative
//! path, and by record-level traces (every batch a lane read, the offset each grant
//! started at, where each revoked lane stopped, what each revocation committed) of 73
//! runs of that test under load, revocations mid-read and drains cut short by
//! `revoke_timeout` among them, none of which lost a row:
//!
//! - Committing past an unacknowledged row: every offset committed is a committed
//!   checkpoint's position in a grant that is still this process's, and no commit follows
//!   a release (`checkpoint_committed` commits under the lock a revocation takes to make
//!   its grants unowned). Such a position is where the member had read to from its
//!   grant's floor (a committed offset), every row before it acknowledged.
//! - Records fetched before a revocation: librdkafka pauses every assigned partition
//!   before it hands an incremental rebalance to the callback, dropping what it
//!   prefetched, and fetches a kept partition again from the record after the last one a
//!   lane took. In the traces every grant, kept or new, read on from its floor with no
//!   gap.
//! - The new owner's start: in the traces its floor was the offset the revocation
//!   committed every time (the cooperative protocol gives a revoked partition away only
//!   in the next round, which the revoking member joins once its callback returned).
//! - The callback racing the lanes: a lane notices every change of its grant by its
//!   generation, records where it stopped under the lock, and reads nothing once revoked.
//!
//! Not ruled out: the test's broker (its fetches while several producers append, its
//! group coordination under load) and the sink. A failure of that test reports each
//! missing bid's partition and offset, whether a fresh reader finds it stored, and both
//! members' logs; with `--log-level debug` a member also logs each batch it read
//! (`kafka: read t/p offsets a..=b`), offsets skipped, and each offset it committed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{CommitMode, Consumer, RebalanceProtocol};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use sluice_types::SluiceError;

use super::client::{self, METADATA_TIMEOUT, Rebalance, SluiceClientContext, SourceConsumer};
use super::offsets::start_offset;
use super::options::{KafkaSourceOptions, StartAt};

/// How long the poller waits on the main queue between checks of its stop flag.
pub const MAIN_POLL_WAIT: Duration = Duration::from_millis(100);
/// How long closing the consumer (leaving the group) may take before it is abandoned.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a lane's partition stands with the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ownership {
    /// Another member's, or nobody's yet.
    Unowned,
    /// Granted: the lane reads it.
    Owned,
    /// Being revoked: the lane stops; the callback waits for its rows to be acknowledged.
    Revoking,
}

/// One lane's grant.
#[derive(Debug, Clone, Copy)]
struct Grant {
    ownership: Ownership,
    /// Bumped at every change, so a lane sees each one.
    generation: u64,
    /// The offset the grant started at (`None`: librdkafka resolves it).
    floor: Option<i64>,
    /// The next offset of the newest committed checkpoint's position in this grant.
    acknowledged: Option<i64>,
    /// Revoking: where the lane stopped (`Some(None)`: before reading any record), or
    /// `None` while it has not noticed.
    stopped_at: Option<Option<i64>>,
}

impl Grant {
    const UNOWNED: Grant =
        Grant { ownership: Ownership::Unowned, generation: 0, floor: None, acknowledged: None, stopped_at: None };

    /// Whether a committed checkpoint's `next` offset may be committed for this grant.
    fn accepts(&self, next: i64) -> bool {
        self.ownership != Ownership::Unowned && self.floor.is_none_or(|floor| next >= floor)
    }

    /// Revoking: whether the lane stopped and everything it read is acknowledged.
    fn drained(&self) -> bool {
        if self.ownership != Ownership::Revoking {
            return true;
        }
        match self.stopped_at {
            None => false,
            Some(None) => true,
            Some(Some(stopped)) => {
                self.floor.is_some_and(|floor| stopped <= floor) || self.acknowledged.is_some_and(|a| a >= stopped)
            }
        }
    }
}

/// What a lane does at its poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Read on: the grant it read under still holds.
    Read,
    /// A new grant: read from this offset (`None`: from the first record's).
    Start(Option<i64>),
    /// Not this process's partition now: stay idle.
    Idle,
}

/// A lane's view of its grant, kept by the lane.
#[derive(Debug, Default)]
pub struct Seen {
    generation: u64,
    owned: bool,
}

impl Seen {
    /// Whether the lane reads under a grant.
    pub fn owned(&self) -> bool {
        self.owned
    }
}

/// The group state of one source in this process, shared by its lanes, its
/// `checkpoint_committed` and the consumer's rebalance callback.
#[derive(Debug)]
pub struct Group {
    source: String,
    group_id: String,
    start: StartAt,
    brokers: String,
    revoke_timeout: Duration,
    /// The lane of each (topic, partition).
    lanes: HashMap<(String, i32), usize>,
    /// The (topic, partition) of each lane.
    partitions: Vec<(String, i32)>,
    grants: Mutex<Vec<Grant>>,
    /// Signalled when a lane stops or a checkpoint is acknowledged.
    changed: Condvar,
    /// Per lane, its grant's generation, read by the lane without the lock.
    generations: Vec<AtomicU64>,
    /// The newest generation given out.
    generation: AtomicU64,
    /// The consumer is closing: revocations do not wait for lanes that are gone.
    closing: AtomicBool,
}

impl Group {
    pub fn new(source: &str, options: &KafkaSourceOptions, partitions: &[(String, i32)]) -> Group {
        Group {
            source: source.to_owned(),
            group_id: options.group_id.clone().unwrap_or_default(),
            start: options.start,
            brokers: options.brokers.clone(),
            revoke_timeout: options.revoke_timeout,
            lanes: partitions.iter().enumerate().map(|(lane, p)| (p.clone(), lane)).collect(),
            partitions: partitions.to_vec(),
            grants: Mutex::new(vec![Grant::UNOWNED; partitions.len()]),
            changed: Condvar::new(),
            generations: partitions.iter().map(|_| AtomicU64::new(0)).collect(),
            generation: AtomicU64::new(0),
            closing: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Grant>> {
        // A panic while holding the lock leaves plain data, still consistent per lane.
        self.grants.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets `lane`'s grant, with a new generation the lane will notice.
    fn set(&self, grants: &mut [Grant], lane: usize, grant: Grant) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        grants[lane] = Grant { generation, ..grant };
        self.generations[lane].store(generation, Ordering::Release);
    }

    /// The lane's turn: read on, start a new grant, or idle. `next_offset` is where the
    /// lane stands, recorded as where it stopped when its grant is being revoked.
    pub fn turn(&self, lane: usize, seen: &mut Seen, next_offset: Option<i64>) -> Turn {
        if self.generations[lane].load(Ordering::Acquire) == seen.generation {
            return if seen.owned { Turn::Read } else { Turn::Idle };
        }
        let mut grants = self.lock();
        let grant = &mut grants[lane];
        seen.generation = grant.generation;
        seen.owned = grant.ownership == Ownership::Owned;
        match grant.ownership {
            Ownership::Owned => Turn::Start(grant.floor),
            Ownership::Revoking => {
                tracing::debug!(source = %self.source, "kafka: lane {lane} stopped at {next_offset:?} for the revocation");
                grant.stopped_at.get_or_insert(next_offset);
                self.changed.notify_all();
                Turn::Idle
            }
            Ownership::Unowned => Turn::Idle,
        }
    }

    /// A checkpoint holding `positions` ((lane, next offset)) is committed: acknowledges
    /// them and commits those this process may commit (see the module docs) to the group,
    /// asynchronously, under the lock a revocation takes.
    pub fn checkpoint_committed(&self, consumer: &SourceConsumer, positions: &[(usize, i64)]) {
        let mut grants = self.lock();
        let mut offsets = TopicPartitionList::new();
        for (lane, next) in positions {
            let Some(grant) = grants.get_mut(*lane) else { continue };
            if !grant.accepts(*next) {
                continue;
            }
            grant.acknowledged = grant.acknowledged.max(Some(*next));
            if let Some((topic, partition)) = self.partition_of(*lane) {
                let _ = offsets.add_partition_offset(topic, partition, Offset::Offset(*next));
            }
        }
        self.changed.notify_all();
        if offsets.count() == 0 {
            return;
        }
        tracing::debug!(source = %self.source, group = %self.group_id, "kafka: committing offsets {offsets:?}");
        if let Err(error) = consumer.commit(&offsets, CommitMode::Async) {
            tracing::warn!(source = %self.source, group = %self.group_id, "kafka: committing offsets failed: {error}");
        }
    }

    fn partition_of(&self, lane: usize) -> Option<(&str, i32)> {
        self.partitions.get(lane).map(|(topic, partition)| (topic.as_str(), *partition))
    }

    /// The consumer is closing: revocations no longer wait for lanes.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
        self.changed.notify_all();
    }

    /// The consumer's rebalance callback (see the module docs).
    pub fn rebalance(&self, consumer: &SourceConsumer, event: RDKafkaRespErr, partitions: &TopicPartitionList) {
        match event {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self.assign(consumer, partitions),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.revoke(consumer, partitions),
            other => {
                // librdkafka's advice for an unexpected rebalance event: drop the assignment.
                tracing::warn!(source = %self.source, group = %self.group_id,
                    "kafka: rebalance error {other:?}; releasing every partition");
                self.revoke(consumer, partitions);
            }
        }
    }

    fn lanes_of(&self, partitions: &TopicPartitionList) -> Vec<(usize, String, i32)> {
        let mut lanes = Vec::new();
        for element in partitions.elements() {
            let key = (element.topic().to_owned(), element.partition());
            match self.lanes.get(&key) {
                Some(lane) => lanes.push((*lane, key.0, key.1)),
                None => tracing::warn!(source = %self.source, group = %self.group_id,
                    "kafka: the group gave {}/{}, which has no lane (the topic gained partitions after the \
                     pipeline started; restart it to read them)", key.0, key.1),
            }
        }
        lanes
    }

    fn assign(&self, consumer: &SourceConsumer, partitions: &TopicPartitionList) {
        let lanes = self.lanes_of(partitions);
        let mut query = TopicPartitionList::new();
        for (_, topic, partition) in &lanes {
            query.add_partition(topic, *partition);
        }
        let committed = consumer.committed_offsets(query, METADATA_TIMEOUT);
        if let Err(error) = &committed {
            tracing::warn!(source = %self.source, group = %self.group_id,
                "kafka: reading the group's offsets failed ({error}); the client looks them up");
        }
        let mut assignment = TopicPartitionList::new();
        let mut floors = Vec::with_capacity(lanes.len());
        for (lane, topic, partition) in &lanes {
            let offset = match &committed {
                Ok(committed) => match committed.find_partition(topic, *partition).map(|e| e.offset()) {
                    Some(Offset::Offset(offset)) if offset >= 0 => Offset::Offset(offset),
                    _ => self.start_of(consumer, topic, *partition),
                },
                Err(_) => Offset::Stored,
            };
            if let Err(error) = assignment.add_partition_offset(topic, *partition, offset) {
                tracing::warn!(source = %self.source, "kafka: {topic}/{partition}: {error}");
                continue;
            }
            floors.push((*lane, if let Offset::Offset(offset) = offset { Some(offset) } else { None }));
        }
        let done = match consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => consumer.incremental_assign(&assignment),
            _ => consumer.assign(&assignment),
        };
        if let Err(error) = done {
            tracing::error!(source = %self.source, group = %self.group_id,
                "kafka: taking the partitions the group gave failed: {error}");
            return;
        }
        let mut grants = self.lock();
        for (lane, floor) in floors {
            let grant = Grant { ownership: Ownership::Owned, floor, ..Grant::UNOWNED };
            self.set(&mut grants, lane, grant);
        }
        if !lanes.is_empty() {
            tracing::info!(source = %self.source, group = %self.group_id,
                "kafka: the group assigned {} partitions: {}", lanes.len(), show(&assignment));
        }
    }

    /// Where a partition the group has no offset for starts, per `start`.
    fn start_of(&self, consumer: &SourceConsumer, topic: &str, partition: i32) -> Offset {
        let start = match self.start {
            StartAt::Committed => StartAt::Earliest,
            other => other,
        };
        start_offset(consumer, &start, topic, partition, &self.brokers).unwrap_or_else(|error| {
            tracing::warn!(source = %self.source, "kafka: {error}; the client resolves the start of {topic}/{partition}");
            Offset::Stored
        })
    }

    fn revoke(&self, consumer: &SourceConsumer, partitions: &TopicPartitionList) {
        let lanes = self.lanes_of(partitions);
        let lost = consumer.assignment_lost();
        {
            let mut grants = self.lock();
            for (lane, _, _) in &lanes {
                if grants[*lane].ownership == Ownership::Owned {
                    let grant = Grant { ownership: Ownership::Revoking, stopped_at: None, ..grants[*lane] };
                    self.set(&mut grants, *lane, grant);
                }
            }
        }
        tracing::info!(source = %self.source, group = %self.group_id, lost,
            "kafka: the group revokes {} partitions: {}", lanes.len(), show(partitions));
        // Closing: the lanes are gone, their last positions in the final checkpoint.
        let closing = self.closing.load(Ordering::Relaxed);
        let drained = lost || closing || self.wait_drained(&lanes);
        let mut offsets = TopicPartitionList::new();
        {
            let mut grants = self.lock();
            for (lane, topic, partition) in &lanes {
                if let (false, Some(next)) = (lost, grants[*lane].acknowledged) {
                    let _ = offsets.add_partition_offset(topic, *partition, Offset::Offset(next));
                }
                self.set(&mut grants, *lane, Grant::UNOWNED);
            }
        }
        if !drained {
            tracing::warn!(source = %self.source, group = %self.group_id,
                "kafka: the revoked partitions were not drained within revoke_timeout ({:?}); the rows read \
                 after the offsets committed now will be read again by their next owner", self.revoke_timeout);
        }
        if offsets.count() > 0 {
            tracing::info!(source = %self.source, group = %self.group_id,
                "kafka: committing the revoked partitions' acknowledged offsets: {}", show(&offsets));
            if let Err(error) = consumer.commit(&offsets, CommitMode::Sync) {
                tracing::warn!(source = %self.source, group = %self.group_id,
                    "kafka: committing the revoked partitions' offsets failed ({error}); their next owner \
                     reads again from the offsets committed before");
            }
        }
        let done = match consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => consumer.incremental_unassign(partitions),
            _ => consumer.unassign(),
        };
        if let Err(error) = done {
            tracing::warn!(source = %self.source, group = %self.group_id, "kafka: releasing partitions failed: {error}");
        }
    }

    /// Waits until the revoked lanes are drained, at most `revoke_timeout` (not at all
    /// while closing: the lanes are gone); whether they are.
    fn wait_drained(&self, lanes: &[(usize, String, i32)]) -> bool {
        let deadline = Instant::now() + self.revoke_timeout;
        let mut grants = self.lock();
        loop {
            if lanes.iter().all(|(lane, _, _)| grants[*lane].drained()) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.closing.load(Ordering::Relaxed) {
                return false;
            }
            grants = match self.changed.wait_timeout(grants, left) {
                Ok((grants, _)) => grants,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

/// `t/p` per partition, `t/p at N` where the list holds an offset.
fn show(partitions: &TopicPartitionList) -> String {
    let names: Vec<String> = (partitions.elements().iter())
        .map(|e| match e.offset() {
            Offset::Offset(offset) => format!("{}/{} at {offset}", e.topic(), e.partition()),
            _ => format!("{}/{}", e.topic(), e.partition()),
        })
        .collect();
    names.join(", ")
}

/// The thread polling the consumer's main queue (see the module docs); stopped and
/// joined by [`Poller::stop`].
pub struct Poller {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    fn start(source: &str, consumer: Arc<SourceConsumer>) -> Result<Poller, SluiceError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let name = source.to_owned();
        let thread = std::thread::Builder::new()
            .name("kafka-group".to_owned())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    match consumer.poll(MAIN_POLL_WAIT) {
                        Some(Ok(message)) => tracing::error!(source = %name,
                            "kafka: a message of {}/{} reached the main queue, which no lane reads",
                            rdkafka::Message::topic(&message), rdkafka::Message::partition(&message)),
                        Some(Err(error)) => tracing::debug!(source = %name, "kafka client event: {error}"),
                        None => {}
                    }
                }
            })
            .map_err(|e| SluiceError::internal("source.kafka", format!("cannot start the group poller: {e}")))?;
        Ok(Poller { stop, thread: Some(thread) })
    }

    /// Stops the thread; returns once it ended (its longest turn is a rebalance callback,
    /// bounded by `revoke_timeout` and the client's timeouts).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("kafka: the group poller panicked");
        }
    }
}

/// A group-mode consumer with every lane's partition queue split off, subscribed to the
/// topics, and its poller running.
pub struct Member {
    pub consumer: Arc<SourceConsumer>,
    pub queues: Vec<Option<PartitionQueue<SluiceClientContext>>>,
    pub poller: Poller,
}

/// Creates the consumer of a group-mode source and joins the group.
pub fn join(
    source: &str,
    options: &KafkaSourceOptions,
    group: &Arc<Group>,
    partitions: &[(String, i32)],
) -> Result<Member, SluiceError> {
    let brokers = &options.brokers;
    // A partition the client starts without an offset (the group's could not be read)
    // reaches its lane as an "offset reset" error, and the lane starts it per `start`.
    let config = client::consumer_config(brokers, options.group_id.as_deref(), &options.client);
    let context = SluiceClientContext::new(brokers).with_group(Arc::clone(group) as Arc<dyn Rebalance>);
    let consumer: SourceConsumer =
        config.create_with_context(context).map_err(|e| client::create_error(brokers, &e))?;
    let consumer = Arc::new(consumer);
    let mut queues = Vec::with_capacity(partitions.len());
    for (topic, partition) in partitions {
        let queue = consumer.split_partition_queue(topic, *partition).ok_or_else(|| {
            SluiceError::internal("source.kafka", format!("cannot split the queue of {topic}/{partition}"))
        })?;
        queues.push(Some(queue));
    }
    let topics: Vec<&str> = options.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics).map_err(|e| {
        SluiceError::external("kafka.subscribe", format!("cannot join group `{}`: {e}", group.group_id))
            .with_fix("check `brokers` and that the brokers support consumer groups")
    })?;
    tracing::info!(source = %source, group = %group.group_id, "kafka: joining the group for {}", topics.join(", "));
    let poller = Poller::start(source, Arc::clone(&consumer))?;
    Ok(Member { consumer, queues, poller })
}

/// Leaves the group: stops the poller, then closes the consumer (its last revocation
/// commits what is acknowledged), polling for at most [`CLOSE_TIMEOUT`]; a consumer not
/// closed by then is dropped on a thread of its own, so the caller never waits longer.
pub fn leave(group: &Group, mut poller: Poller, consumer: Arc<SourceConsumer>) {
    group.close();
    poller.stop();
    let Ok(consumer) = Arc::try_unwrap(consumer) else {
        tracing::warn!(source = %group.source, "kafka: the consumer is still in use; it leaves the group when dropped");
        return;
    };
    if let Err(error) = consumer.close_queue() {
        tracing::warn!(source = %group.source, group = %group.group_id, "kafka: leaving the group failed: {error}");
        std::thread::spawn(move || drop(consumer));
        return;
    }
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    while !consumer.closed() && Instant::now() < deadline {
        let _ = consumer.poll(MAIN_POLL_WAIT);
    }
    if consumer.closed() {
        tracing::info!(source = %group.source, group = %group.group_id, "kafka: left the group");
        drop(consumer);
    } else {
        tracing::warn!(source = %group.source, group = %group.group_id,
            "kafka: leaving the group took longer than {CLOSE_TIMEOUT:?}; abandoned");
        std::thread::spawn(move || drop(consumer));
    }
}

impl Rebalance for Group {
    fn rebalance(&self, consumer: &SourceConsumer, event: RDKafkaRespErr, partitions: &TopicPartitionList) {
        Group::rebalance(self, consumer, event, partitions);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(ownership: Ownership, floor: Option<i64>) -> Grant {
        Grant { ownership, floor, ..Grant::UNOWNED }
    }

    #[test]
    fn only_owned_partitions_at_or_past_their_floor_are_committed() {
        assert!(!grant(Ownership::Unowned, None).accepts(5), "a partition not owned is never committed");
        assert!(grant(Ownership::Owned, Some(5)).accepts(5));
        assert!(!grant(Ownership::Owned, Some(5)).accepts(4), "never behind where the grant began");
        assert!(grant(Ownership::Revoking, Some(5)).accepts(9), "still ours while revoking");
        assert!(grant(Ownership::Owned, None).accepts(0), "no floor known: any acknowledged offset");
    }

    #[test]
    fn a_revoked_lane_is_drained_once_stopped_and_acknowledged_where_it_stopped() {
        let revoking = grant(Ownership::Revoking, Some(10));
        assert!(!revoking.drained(), "the lane has not stopped yet");
        assert!(Grant { stopped_at: Some(None), ..revoking }.drained(), "stopped having read nothing");
        assert!(Grant { stopped_at: Some(Some(10)), ..revoking }.drained(), "stopped at its floor: nothing read");
        let read = Grant { stopped_at: Some(Some(15)), acknowledged: Some(12), ..revoking };
        assert!(!read.drained(), "rows 12..15 are not acknowledged yet");
        assert!(Grant { acknowledged: Some(15), ..read }.drained());
        assert!(grant(Ownership::Owned, None).drained() && grant(Ownership::Unowned, None).drained());
    }

    fn group(partitions: usize) -> Group {
        let options = super::super::options::KafkaSourceOptions {
            brokers: "b:1".to_owned(),
            topics: vec!["t".to_owned()],
            group_id: Some("g".to_owned()),
            assignment: super::super::options::Assignment::Group,
            revoke_timeout: Duration::from_millis(1),
            start: StartAt::Earliest,
            offset_out_of_range: super::super::options::OffsetOutOfRange::Fail,
            format: super::super::options::KafkaFormat::Json,
            bounded: false,
            idle_timeout: None,
            client: Vec::new(),
            schema_registry: None,
            dead_letter: None,
        };
        let partitions: Vec<(String, i32)> = (0..partitions as i32).map(|p| ("t".to_owned(), p)).collect();
        Group::new("s", &options, &partitions)
    }

    /// A lane sees each change of its grant once: a grant starts it at the floor, a
    /// revocation stops it (recording where) and nothing starts it again until the next
    /// grant.
    #[test]
    fn a_lane_follows_its_grants() {
        let group = group(2);
        let mut seen = Seen::default();
        assert_eq!(group.turn(0, &mut seen, None), Turn::Idle, "nothing granted yet");
        {
            let mut grants = group.lock();
            group.set(&mut grants, 0, grant(Ownership::Owned, Some(7)));
        }
        assert_eq!(group.turn(0, &mut seen, None), Turn::Start(Some(7)));
        assert_eq!(group.turn(0, &mut seen, Some(9)), Turn::Read);
        {
            let mut grants = group.lock();
            let revoking = Grant { ownership: Ownership::Revoking, ..grants[0] };
            group.set(&mut grants, 0, revoking);
        }
        assert_eq!(group.turn(0, &mut seen, Some(12)), Turn::Idle);
        assert_eq!(group.lock()[0].stopped_at, Some(Some(12)), "where the lane stopped");
        assert_eq!(group.turn(0, &mut seen, Some(12)), Turn::Idle);
        assert_eq!(group.turn(1, &mut Seen::default(), None), Turn::Idle, "the other lane is untouched");
    }
}
