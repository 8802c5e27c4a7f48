//! Lane generators: the public entry point producing Arrow record batches.
//!
//! The event stream (event numbers `0 ..` below `GeneratorConfig::events`) is
//! split into `lanes` lanes that take turns by blocks of
//! [`GeneratorConfig::lane_block`] consecutive events: block `b` (event numbers
//! `b * block .. (b + 1) * block`) belongs to lane `b % lanes`. With a block of
//! 1, lane `l` generates `l, l + lanes, l + 2 * lanes, ...`. Because every event
//! is generated from its own number alone (kind, ids, event time and per-event
//! random values), the union of all lanes is exactly the single-lane stream, and
//! neither the lane split nor the batch sizes change any value. A lane's
//! position is a single event number, which makes checkpointing
//! ([`LaneGenerator::next_event_number`]) and resuming
//! ([`LaneGenerator::seek`]) trivial.
//!
//! Blocks are for throughput: a batch of consecutive events spans less event
//! time, so fewer windows and keys per batch, than a batch of events taken
//! every `lanes`-th.

use std::fmt;
use std::sync::Arc;

use arrow::record_batch::RecordBatch;

use crate::auction::AuctionColumns;
use crate::bid::BidColumns;
use crate::config::{GeneratorConfig, event_kind, lane_events_below};
use crate::model::Model;
use crate::person::PersonColumns;
use crate::schema::{Table, TableSet};

/// Upper bound on the events of one batch (larger requests are cut down);
/// keeps every string column far below Arrow's 2 GiB offset limit.
pub const MAX_BATCH_EVENTS: usize = 1 << 20;

/// The output of one [`LaneGenerator::next_batch`] call.
#[derive(Clone, Debug, PartialEq)]
pub struct GeneratedBatch {
    /// Persons of the batch; `Some` (possibly empty) iff requested.
    pub person: Option<RecordBatch>,
    /// Auctions of the batch; `Some` (possibly empty) iff requested.
    pub auction: Option<RecordBatch>,
    /// Bids of the batch; `Some` (possibly empty) iff requested.
    pub bid: Option<RecordBatch>,
    /// Number of events the batch covers (all kinds, requested or not).
    pub events: u64,
    /// Event time of the last event covered (the largest, as event time is
    /// monotonic in the event number).
    pub max_event_time_ms: i64,
}

impl GeneratedBatch {
    /// The batch of `table`, if that table was requested.
    pub fn table(&self, table: Table) -> Option<&RecordBatch> {
        match table {
            Table::Person => self.person.as_ref(),
            Table::Auction => self.auction.as_ref(),
            Table::Bid => self.bid.as_ref(),
        }
    }

    /// Total number of rows over all materialized tables.
    pub fn num_rows(&self) -> usize {
        Table::all().into_iter().filter_map(|t| self.table(t)).map(RecordBatch::num_rows).sum()
    }
}

/// Generates one lane of the NEXMark event stream as Arrow batches.
pub struct LaneGenerator {
    model: Arc<Model>,
    lane: u64,
    lanes: u64,
    /// Consecutive events per turn (at least 1).
    block: u64,
    tables: TableSet,
    next: u64,
    scratch: String,
}

impl fmt::Debug for LaneGenerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaneGenerator")
            .field("config", &self.model.config)
            .field("lane", &self.lane)
            .field("lanes", &self.lanes)
            .field("block", &self.block)
            .field("tables", &self.tables)
            .field("next_event_number", &self.next)
            .finish()
    }
}

impl LaneGenerator {
    /// Lane `lane` of `lanes`, materializing `tables`.
    ///
    /// Panics if `lane >= lanes` or the config is invalid
    /// (see [`GeneratorConfig::validate`]).
    pub fn new(config: &GeneratorConfig, lane: u32, lanes: u32, tables: TableSet) -> Self {
        Self::with_model(Model::new(config), lane, lanes, tables)
    }

    /// All `lanes` lanes of one configuration, sharing their precomputed
    /// string tables.
    pub fn new_lanes(config: &GeneratorConfig, lanes: u32, tables: TableSet) -> Vec<Self> {
        let model = Model::new(config);
        (0..lanes).map(|lane| Self::with_model(Arc::clone(&model), lane, lanes, tables)).collect()
    }

    fn with_model(model: Arc<Model>, lane: u32, lanes: u32, tables: TableSet) -> Self {
        assert!(lane < lanes, "lane {lane} out of range for {lanes} lanes");
        let block = model.config.lane_block.max(1);
        LaneGenerator {
            model,
            lane: u64::from(lane),
            lanes: u64::from(lanes),
            block,
            tables,
            next: u64::from(lane).saturating_mul(block),
            scratch: String::with_capacity(128),
        }
    }

    /// The configuration this lane generates.
    pub fn config(&self) -> &GeneratorConfig {
        &self.model.config
    }

    /// This lane's index.
    pub fn lane(&self) -> u32 {
        self.lane as u32
    }

    /// The number of lanes the stream is split into.
    pub fn lanes(&self) -> u32 {
        self.lanes as u32
    }

    /// The tables this lane materializes.
    pub fn tables(&self) -> TableSet {
        self.tables
    }

    /// The number of the next event this lane will generate (its position).
    pub fn next_event_number(&self) -> u64 {
        self.next
    }

    /// Resumes from a position previously returned by
    /// [`next_event_number`](Self::next_event_number). A number that does not
    /// belong to this lane is rounded up to the start of this lane's next block.
    pub fn seek(&mut self, next_event_number: u64) {
        let block = next_event_number / self.block;
        self.next = if block % self.lanes == self.lane {
            next_event_number
        } else {
            let after = block.saturating_add(1);
            let ahead = (self.lane + self.lanes - after % self.lanes) % self.lanes;
            after.saturating_add(ahead).saturating_mul(self.block)
        };
    }

    /// Event time (ms) of the next event of this lane.
    pub fn next_event_time_ms(&self) -> i64 {
        self.model.config.event_time_ms(self.next)
    }

    /// Events this lane still has to generate (`None` when unbounded).
    pub fn remaining_events(&self) -> Option<u64> {
        let total = self.model.config.events?;
        if self.next >= total {
            return Some(0);
        }
        let below = |limit| lane_events_below(limit, self.lane, self.lanes, self.block);
        Some(below(total) - below(self.next))
    }

    /// Whether the lane has generated all its events.
    pub fn is_exhausted(&self) -> bool {
        self.remaining_events() == Some(0)
    }

    /// The runs of consecutive event numbers the next `count` events of this lane
    /// form, as (first, length): the rest of the current block, then whole blocks
    /// of this lane (fewer events where the numbers run out at `u64::MAX`).
    fn runs(&self, count: u64) -> impl Iterator<Item = (u64, u64)> + use<> {
        let (block, skip) = (self.block, (self.lanes - 1).saturating_mul(self.block));
        let (mut next, mut left) = (self.next, count);
        std::iter::from_fn(move || {
            let block_end = (next / block).checked_add(1).and_then(|b| b.checked_mul(block)).unwrap_or(u64::MAX);
            let length = left.min(block_end - next);
            if length == 0 {
                return None;
            }
            let run = (next, length);
            left -= length;
            next = if next + length == block_end { block_end.saturating_add(skip) } else { next + length };
            Some(run)
        })
    }

    /// Generates up to `max_events` next events of this lane (all kinds
    /// count; at least 1 and at most [`MAX_BATCH_EVENTS`]), returning one
    /// batch per requested table (possibly empty), or `None` when the lane is
    /// exhausted.
    pub fn next_batch(&mut self, max_events: usize) -> Option<GeneratedBatch> {
        let mut count = max_events.clamp(1, MAX_BATCH_EVENTS) as u64;
        if let Some(remaining) = self.remaining_events() {
            if remaining == 0 {
                return None;
            }
            count = count.min(remaining);
        }
        let mut columns = Columns::new(self.tables, &self.model, self.runs(count));
        let (mut generated, mut last) = (0, self.next);
        for (first, length) in self.runs(count) {
            let mut clock = EventClock::new(&self.model.config, first, 1);
            for event_number in first..first + length {
                columns.append(&self.model, event_number, clock.now(), &mut self.scratch);
                clock.advance();
            }
            generated += length;
            last = first + length - 1;
        }
        if generated == 0 {
            return None; // Only at u64::MAX: no event number is left.
        }
        self.next = last.saturating_add(1);
        if self.next.is_multiple_of(self.block) {
            self.seek(self.next);
        }
        Some(GeneratedBatch {
            person: columns.person.map(PersonColumns::finish),
            auction: columns.auction.map(AuctionColumns::finish),
            bid: columns.bid.map(BidColumns::finish),
            events: generated,
            max_event_time_ms: self.model.config.event_time_ms(last),
        })
    }
}

/// The builders of the requested tables.
struct Columns {
    person: Option<PersonColumns>,
    auction: Option<AuctionColumns>,
    bid: Option<BidColumns>,
}

impl Columns {
    /// Builders sized exactly for the events of `runs` (first, length).
    fn new(tables: TableSet, model: &Model, runs: impl Iterator<Item = (u64, u64)>) -> Self {
        let mut rows = [0usize; 3];
        let mut count = 0;
        let count_kinds = tables.contains(Table::Person) || tables.contains(Table::Auction);
        for (first, length) in runs {
            count += length;
            if count_kinds {
                for n in first..first + length {
                    rows[event_kind(n) as usize] += 1;
                }
            }
        }
        let [persons, auctions, bids] = rows;
        let bids = if tables.contains(Table::Person) || tables.contains(Table::Auction) {
            bids
        } else {
            count as usize // Upper bound; saves the counting pass.
        };
        Columns {
            person: tables.contains(Table::Person).then(|| PersonColumns::with_capacity(persons, model.avg_person)),
            auction: tables
                .contains(Table::Auction)
                .then(|| AuctionColumns::with_capacity(auctions, model.avg_auction)),
            bid: tables.contains(Table::Bid).then(|| BidColumns::with_capacity(bids, model.avg_bid)),
        }
    }

    #[inline]
    fn append(&mut self, model: &Model, event_number: u64, ts: i64, scratch: &mut String) {
        match event_kind(event_number) {
            Table::Bid => {
                if let Some(bid) = &mut self.bid {
                    bid.append(model, event_number, ts);
                }
            }
            Table::Auction => {
                if let Some(auction) = &mut self.auction {
                    auction.append(model, event_number, ts, scratch);
                }
            }
            Table::Person => {
                if let Some(person) = &mut self.person {
                    person.append(model, event_number, ts, scratch);
                }
            }
        }
    }
}

/// Incremental event-time computation for event numbers advancing by a
/// fixed step: keeps `event_number * 1000 = ms * rate + frac`, so each step
/// costs an addition instead of a division.
struct EventClock {
    base: i64,
    ms: u64,
    frac: u64,
    rate: u64,
    step_ms: u64,
    step_frac: u64,
}

impl EventClock {
    fn new(config: &GeneratorConfig, start: u64, step: u64) -> Self {
        let rate = config.first_event_rate.max(1);
        let split = |n: u64| {
            let total = u128::from(n) * 1000;
            let ms = u64::try_from(total / u128::from(rate)).unwrap_or(u64::MAX);
            (ms, (total % u128::from(rate)) as u64)
        };
        let (ms, frac) = split(start);
        let (step_ms, step_frac) = split(step);
        EventClock { base: config.base_time_ms, ms, frac, rate, step_ms, step_frac }
    }

    #[inline]
    fn now(&self) -> i64 {
        self.base.saturating_add(i64::try_from(self.ms).unwrap_or(i64::MAX))
    }

    #[inline]
    fn advance(&mut self) {
        self.frac += self.step_frac;
        if self.frac >= self.rate {
            self.frac -= self.rate;
            self.ms = self.ms.saturating_add(1);
        }
        self.ms = self.ms.saturating_add(self.step_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_matches_closed_form() {
        for rate in [1, 3, 7, 10_000, 1_000_000, 3_333_333, 50_000_000] {
            for (start, step) in [(0, 1), (5, 3), (17, 50), (1_000_003, 7)] {
                let config = GeneratorConfig { first_event_rate: rate, ..GeneratorConfig::default() };
                let mut clock = EventClock::new(&config, start, step);
                for i in 0..2_000 {
                    let n = start + i * step;
                    assert_eq!(clock.now(), config.event_time_ms(n), "rate {rate} n {n}");
                    clock.advance();
                }
            }
        }
    }

    #[test]
    fn seek_rounds_up_to_the_lane() {
        let mut g = LaneGenerator::new(&GeneratorConfig::default(), 2, 5, TableSet::ALL);
        assert_eq!(g.next_event_number(), 2);
        g.seek(12);
        assert_eq!(g.next_event_number(), 12);
        g.seek(13);
        assert_eq!(g.next_event_number(), 17);
        g.seek(16);
        assert_eq!(g.next_event_number(), 17);
        // Blocks of 10 over 3 lanes: lane 1 holds 10..20, 40..50, 70..80, ...
        let config = GeneratorConfig { lane_block: 10, ..GeneratorConfig::default() };
        let mut g = LaneGenerator::new(&config, 1, 3, TableSet::ALL);
        assert_eq!(g.next_event_number(), 10);
        for (to, at) in
            [(0, 10), (10, 10), (19, 19), (20, 40), (39, 40), (45, 45), (50, 70), (u64::MAX - 3, u64::MAX - 3)]
        {
            g.seek(to);
            assert_eq!(g.next_event_number(), at, "seek to {to}");
        }
        // Lane 0's next block would start past the last event number.
        let mut g = LaneGenerator::new(&config, 0, 3, TableSet::ALL);
        g.seek(u64::MAX - 3);
        assert_eq!(g.next_event_number(), u64::MAX);
        // One event per turn: u64::MAX (block u64::MAX, lane 0 of 3) is not lane 1's.
        let mut g = LaneGenerator::new(&GeneratorConfig::default(), 1, 3, TableSet::ALL);
        g.seek(u64::MAX);
        assert_eq!(g.next_event_number(), u64::MAX);
        assert!(g.next_batch(10).is_none(), "no event number is left");
    }

    #[test]
    fn a_batch_takes_the_rest_of_its_block_then_the_lane_s_next_blocks() {
        let config = GeneratorConfig { lane_block: 10, events: Some(95), ..GeneratorConfig::default() };
        let mut g = LaneGenerator::new(&config, 0, 2, TableSet::ALL);
        g.seek(7);
        let runs: Vec<(u64, u64)> = g.runs(25).collect();
        assert_eq!(runs, vec![(7, 3), (20, 10), (40, 10), (60, 2)]);
        let batch = g.next_batch(25).expect("events left");
        assert_eq!((batch.events, batch.max_event_time_ms), (25, config.event_time_ms(61)));
        assert_eq!(g.next_event_number(), 62);
        assert_eq!(g.remaining_events(), Some(8 + 10));
        assert_eq!(g.next_batch(100).map(|b| b.events), Some(18));
        assert!(g.is_exhausted());
        // A block's last event moves the lane on to its next block at once.
        let mut g = LaneGenerator::new(&config, 1, 2, TableSet::ALL);
        assert_eq!(g.next_batch(10).map(|b| b.events), Some(10));
        assert_eq!(g.next_event_number(), 30);
    }
}
