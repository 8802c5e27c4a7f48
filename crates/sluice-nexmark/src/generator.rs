//! Lane generators: the public entry point producing Arrow record batches.
//!
//! The event stream (event numbers `0 ..` below `GeneratorConfig::events`) is
//! split round-robin into `lanes` lanes: lane `l` generates event numbers
//! `l, l + lanes, l + 2 * lanes, ...`. Because every event is generated from
//! its own number alone (kind, ids, event time and per-event random values),
//! the union of all lanes is exactly the single-lane stream, and neither the
//! lane split nor the batch sizes change any value. A lane's position is a
//! single event number, which makes checkpointing ([`LaneGenerator::
//! next_event_number`]) and resuming ([`LaneGenerator::seek`]) trivial.

use std::fmt;
use std::sync::Arc;

use arrow::record_batch::RecordBatch;

use crate::auction::AuctionColumns;
use crate::bid::BidColumns;
use crate::config::{GeneratorConfig, event_kind};
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
        LaneGenerator {
            model,
            lane: u64::from(lane),
            lanes: u64::from(lanes),
            tables,
            next: u64::from(lane),
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
    /// belong to this lane is rounded up to this lane's next event number.
    pub fn seek(&mut self, next_event_number: u64) {
        let misalignment = (self.lane + self.lanes - next_event_number % self.lanes) % self.lanes;
        self.next = next_event_number.saturating_add(misalignment);
    }

    /// Event time (ms) of the next event of this lane.
    pub fn next_event_time_ms(&self) -> i64 {
        self.model.config.event_time_ms(self.next)
    }

    /// Events this lane still has to generate (`None` when unbounded).
    pub fn remaining_events(&self) -> Option<u64> {
        let total = self.model.config.events?;
        Some(if self.next >= total { 0 } else { (total - self.next - 1) / self.lanes + 1 })
    }

    /// Whether the lane has generated all its events.
    pub fn is_exhausted(&self) -> bool {
        self.remaining_events() == Some(0)
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
        count = count.min(((u64::MAX - self.next) / self.lanes).saturating_add(1));
        let start = self.next;
        let mut columns = Columns::new(self.tables, &self.model, start, self.lanes, count);
        let mut clock = EventClock::new(&self.model.config, start, self.lanes);
        let mut event_number = start;
        for _ in 0..count {
            columns.append(&self.model, event_number, clock.now(), &mut self.scratch);
            clock.advance();
            event_number = event_number.wrapping_add(self.lanes);
        }
        let last = start + (count - 1) * self.lanes;
        self.next = last.saturating_add(self.lanes);
        Some(GeneratedBatch {
            person: columns.person.map(PersonColumns::finish),
            auction: columns.auction.map(AuctionColumns::finish),
            bid: columns.bid.map(BidColumns::finish),
            events: count,
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
    /// Builders sized exactly for the events `start, start + step, ...`
    /// (`count` of them).
    fn new(tables: TableSet, model: &Model, start: u64, step: u64, count: u64) -> Self {
        let mut rows = [0usize; 3];
        if tables.contains(Table::Person) || tables.contains(Table::Auction) {
            let mut n = start;
            for _ in 0..count {
                rows[event_kind(n) as usize] += 1;
                n = n.wrapping_add(step);
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
    }
}
