//! Generator configuration and the standard NEXMark id and time arithmetic.
//!
//! Events are numbered 0, 1, 2, ... . The kind of an event follows from its
//! number alone: of every 50 consecutive numbers (an "epoch"), offset 0 is a
//! person, offsets 1..=3 are auctions and offsets 4..=49 are bids
//! (person:auction:bid = 1:3:46). Person and auction ids are dense and derived
//! from the event number too (`FIRST_PERSON_ID + epoch`, `FIRST_AUCTION_ID +
//! 3 * epoch + offset - 1`), so every generator lane agrees on which ids exist
//! at any point of the stream without talking to the others.
//!
//! Event time is `base_time_ms + floor(event_number * 1000 / first_event_rate)`,
//! i.e. `base_time_ms + event_number * inter_event_delay_us / 1000` with the
//! exact (fractional) inter-event delay of `1e6 / first_event_rate` µs. It does
//! not depend on the wall clock, so runs are reproducible.

use std::error::Error;
use std::fmt;

use crate::schema::Table;

/// Id of the first person ever generated.
pub const FIRST_PERSON_ID: i64 = 1000;
/// Id of the first auction ever generated.
pub const FIRST_AUCTION_ID: i64 = 1000;
/// Smallest auction category.
pub const FIRST_CATEGORY_ID: i64 = 10;
/// Number of distinct categories (`FIRST_CATEGORY_ID ..< FIRST_CATEGORY_ID + 5`).
pub const NUM_CATEGORIES: u64 = 5;

/// Persons per epoch.
pub const PERSON_PROPORTION: u64 = 1;
/// Auctions per epoch.
pub const AUCTION_PROPORTION: u64 = 3;
/// Bids per epoch.
pub const BID_PROPORTION: u64 = 46;
/// Events per epoch.
pub const PROPORTION_DENOMINATOR: u64 = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION;

/// A hot auction is the first auction of the latest group of this many.
pub const HOT_AUCTION_GROUP: u64 = 100;
/// A hot seller is the first person of the latest group of this many.
pub const HOT_SELLER_GROUP: u64 = 100;
/// A hot bidder is the second person of the latest group of this many
/// (so hot bidders and hot sellers differ).
pub const HOT_BIDDER_GROUP: u64 = 100;

/// Default event-time origin: 2026-01-01T00:00:00Z.
pub const DEFAULT_BASE_TIME_MS: i64 = 1_767_225_600_000;
/// Upper limit accepted for the average byte size knobs.
pub const MAX_AVG_BYTE_SIZE: u32 = 1 << 20;

/// Parameters of the generator. Defaults are the standard NEXMark defaults.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GeneratorConfig {
    /// Seed of all randomness; equal seeds give byte-identical output.
    pub seed: u64,
    /// Total number of events (all kinds, all lanes); `None` = unbounded.
    pub events: Option<u64>,
    /// Events per second of event time (sets the event-time spacing).
    pub first_event_rate: u64,
    /// Event time of event number 0, in ms since the Unix epoch.
    pub base_time_ms: i64,
    /// Average byte size of a person, padded with `extra` (standard: 200).
    pub avg_person_byte_size: u32,
    /// Average byte size of an auction, padded with `extra` (standard: 500).
    pub avg_auction_byte_size: u32,
    /// Average byte size of a bid, padded with `extra` (standard: 100).
    pub avg_bid_byte_size: u32,
    /// A bid goes to a hot auction with probability `1 - 1/hot_auction_ratio`.
    pub hot_auction_ratio: u32,
    /// An auction has a hot seller with probability `1 - 1/hot_sellers_ratio`.
    pub hot_sellers_ratio: u32,
    /// A bid has a hot bidder with probability `1 - 1/hot_bidders_ratio`.
    pub hot_bidders_ratio: u32,
    /// Number of recent auctions non-hot bids choose from.
    pub num_in_flight_auctions: u32,
    /// Number of recent persons non-hot sellers/bidders choose from.
    pub num_active_people: u32,
    /// How many not-yet-created person ids a reference may point to
    /// (standard: 10; 0 = references only ever point at existing persons).
    pub person_id_lead: u32,
    /// How many not-yet-created auction ids a bid may point to
    /// (standard: 10; 0 = bids only ever point at existing auctions).
    pub auction_id_lead: u32,
    /// How many consecutive events a lane generates before the next lane takes
    /// its turn (1 = lanes interleave event by event). Not part of the stream:
    /// any value gives the same union of lanes.
    pub lane_block: u64,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig {
            seed: 0,
            events: None,
            first_event_rate: 10_000,
            base_time_ms: DEFAULT_BASE_TIME_MS,
            avg_person_byte_size: 200,
            avg_auction_byte_size: 500,
            avg_bid_byte_size: 100,
            hot_auction_ratio: 2,
            hot_sellers_ratio: 4,
            hot_bidders_ratio: 4,
            num_in_flight_auctions: 100,
            num_active_people: 1000,
            person_id_lead: 10,
            auction_id_lead: 10,
            lane_block: 1,
        }
    }
}

/// How many events numbered below `limit` lane `lane` of `lanes` generates when
/// the lanes take turns by blocks of `block` consecutive events (block `b`,
/// events `b * block ..`, belongs to lane `b % lanes`).
pub(crate) fn lane_events_below(limit: u64, lane: u64, lanes: u64, block: u64) -> u64 {
    let (full, rest) = (limit / block, limit % block);
    let full_blocks = if full > lane { (full - lane - 1) / lanes + 1 } else { 0 };
    full_blocks * block + if full % lanes == lane { rest } else { 0 }
}

/// An invalid [`GeneratorConfig`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid NEXMark generator config: {}", self.message)
    }
}

impl Error for ConfigError {}

impl GeneratorConfig {
    /// Checks that the knobs are usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |message: String| Err(ConfigError { message });
        if self.first_event_rate == 0 {
            return fail("first_event_rate must be at least 1".into());
        }
        if self.lane_block == 0 {
            return fail("lane_block must be at least 1".into());
        }
        for (name, v) in [
            ("avg_person_byte_size", self.avg_person_byte_size),
            ("avg_auction_byte_size", self.avg_auction_byte_size),
            ("avg_bid_byte_size", self.avg_bid_byte_size),
        ] {
            if v > MAX_AVG_BYTE_SIZE {
                return fail(format!("{name} = {v} exceeds {MAX_AVG_BYTE_SIZE}"));
            }
        }
        for (name, v) in [
            ("hot_auction_ratio", self.hot_auction_ratio),
            ("hot_sellers_ratio", self.hot_sellers_ratio),
            ("hot_bidders_ratio", self.hot_bidders_ratio),
            ("num_active_people", self.num_active_people),
        ] {
            if v == 0 {
                return fail(format!("{name} must be at least 1"));
            }
        }
        Ok(())
    }

    /// Event time (ms since the Unix epoch) of event `event_number`.
    pub fn event_time_ms(&self, event_number: u64) -> i64 {
        let rate = u128::from(self.first_event_rate.max(1));
        let offset = u128::from(event_number) * 1000 / rate;
        self.base_time_ms.saturating_add(i64::try_from(offset).unwrap_or(i64::MAX))
    }

    /// Event-time spacing of consecutive events, in microseconds.
    pub fn inter_event_delay_us(&self) -> f64 {
        1_000_000.0 / self.first_event_rate.max(1) as f64
    }

    /// Number of events lane `lane` of `lanes` produces in total
    /// (`None` when unbounded).
    pub fn lane_event_count(&self, lane: u32, lanes: u32) -> Option<u64> {
        assert!(lane < lanes, "lane {lane} out of range for {lanes} lanes");
        let total = self.events?;
        Some(lane_events_below(total, u64::from(lane), u64::from(lanes), self.lane_block.max(1)))
    }

    /// The maximum byte size `extra` can reach under this config.
    pub(crate) fn max_extra_len(&self) -> usize {
        let max_avg = self.avg_person_byte_size.max(self.avg_auction_byte_size).max(self.avg_bid_byte_size) as usize;
        max_avg + max_avg / 5 + 2
    }
}

/// The kind (table) of event `event_number`.
#[inline]
pub fn event_kind(event_number: u64) -> Table {
    let offset = event_number % PROPORTION_DENOMINATOR;
    if offset < PERSON_PROPORTION {
        Table::Person
    } else if offset < PERSON_PROPORTION + AUCTION_PROPORTION {
        Table::Auction
    } else {
        Table::Bid
    }
}

/// The newest person id (base 0, i.e. without `FIRST_PERSON_ID`) that exists
/// when event `event_number` is generated; the id of the new person if the
/// event is a person.
#[inline]
pub fn last_base0_person_id(event_number: u64) -> u64 {
    let epoch = event_number / PROPORTION_DENOMINATOR;
    let offset = event_number % PROPORTION_DENOMINATOR;
    if offset >= PERSON_PROPORTION {
        // Auction or bid: the last person of this epoch.
        epoch * PERSON_PROPORTION + PERSON_PROPORTION - 1
    } else {
        epoch * PERSON_PROPORTION + offset
    }
}

/// The newest auction id (base 0) that exists when event `event_number` is
/// generated; the id of the new auction if the event is an auction. Before
/// the very first auction this is 0 (the standard's -1 clamped).
#[inline]
pub fn last_base0_auction_id(event_number: u64) -> u64 {
    let epoch = event_number / PROPORTION_DENOMINATOR;
    let offset = event_number % PROPORTION_DENOMINATOR;
    if offset < PERSON_PROPORTION {
        // Last auction of the previous epoch.
        (epoch * AUCTION_PROPORTION).saturating_sub(1)
    } else if offset >= PERSON_PROPORTION + AUCTION_PROPORTION {
        // Last auction of this epoch.
        epoch * AUCTION_PROPORTION + AUCTION_PROPORTION - 1
    } else {
        epoch * AUCTION_PROPORTION + offset - PERSON_PROPORTION
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_proportions() {
        let kinds: Vec<Table> = (0..PROPORTION_DENOMINATOR).map(event_kind).collect();
        assert_eq!(kinds.iter().filter(|k| **k == Table::Person).count(), 1);
        assert_eq!(kinds.iter().filter(|k| **k == Table::Auction).count(), 3);
        assert_eq!(kinds.iter().filter(|k| **k == Table::Bid).count(), 46);
        assert_eq!(event_kind(0), Table::Person);
        assert_eq!(event_kind(1), Table::Auction);
        assert_eq!(event_kind(4), Table::Bid);
        assert_eq!(event_kind(50), Table::Person);
    }

    #[test]
    fn base0_ids_are_dense_and_recent() {
        let mut next_person = 0;
        let mut next_auction = 0;
        for n in 0..5_000u64 {
            match event_kind(n) {
                Table::Person => {
                    assert_eq!(last_base0_person_id(n), next_person);
                    next_person += 1;
                }
                Table::Auction => {
                    assert_eq!(last_base0_auction_id(n), next_auction);
                    next_auction += 1;
                }
                Table::Bid => {
                    assert_eq!(last_base0_person_id(n) + 1, next_person);
                    assert_eq!(last_base0_auction_id(n) + 1, next_auction);
                }
            }
        }
    }

    #[test]
    fn event_time_is_deterministic_spacing() {
        let c = GeneratorConfig::default();
        assert_eq!(c.event_time_ms(0), DEFAULT_BASE_TIME_MS);
        assert_eq!(c.event_time_ms(9), DEFAULT_BASE_TIME_MS);
        assert_eq!(c.event_time_ms(10), DEFAULT_BASE_TIME_MS + 1);
        assert_eq!(c.event_time_ms(123_456), DEFAULT_BASE_TIME_MS + 12_345);
        assert!((c.inter_event_delay_us() - 100.0).abs() < 1e-9);
        let odd = GeneratorConfig { first_event_rate: 3, base_time_ms: 0, ..GeneratorConfig::default() };
        assert_eq!(odd.event_time_ms(1), 333);
        assert_eq!(odd.event_time_ms(2), 666);
        assert_eq!(odd.event_time_ms(3), 1000);
    }

    #[test]
    fn lane_counts_partition_the_events() {
        let c = GeneratorConfig { events: Some(1003), ..GeneratorConfig::default() };
        let total: u64 = (0..7).filter_map(|l| c.lane_event_count(l, 7)).sum();
        assert_eq!(total, 1003);
        assert_eq!(c.lane_event_count(0, 1), Some(1003));
        let tiny = GeneratorConfig { events: Some(2), ..GeneratorConfig::default() };
        assert_eq!(tiny.lane_event_count(3, 4), Some(0));
        assert_eq!(GeneratorConfig::default().lane_event_count(0, 2), None);
        // In blocks: 1003 = 10 blocks of 100 and 3 events of block 10, over 4 lanes.
        let blocks = GeneratorConfig { lane_block: 100, ..c };
        let counts: Vec<u64> = (0..4).filter_map(|l| blocks.lane_event_count(l, 4)).collect();
        assert_eq!(counts, vec![300, 300, 203, 200]);
        for (block, lanes) in [(1, 1), (1, 3), (7, 2), (64, 5), (5000, 3)] {
            let c = GeneratorConfig { lane_block: block, ..c };
            for limit in [0, 1, 6, 7, 8, 999, 1003, 12_345] {
                let counted: u64 = (0..lanes).map(|l| lane_events_below(limit, l, lanes, block)).sum();
                assert_eq!(counted, limit, "block {block}, {lanes} lanes, below {limit}");
                for lane in 0..lanes {
                    let by_hand = (0..limit).filter(|n| n / block % lanes == lane).count() as u64;
                    assert_eq!(lane_events_below(limit, lane, lanes, block), by_hand);
                }
            }
            assert_eq!(c.lane_event_count(0, 1), Some(1003));
        }
    }

    #[test]
    fn validation_rejects_bad_knobs() {
        assert!(GeneratorConfig::default().validate().is_ok());
        let bad = GeneratorConfig { first_event_rate: 0, ..GeneratorConfig::default() };
        assert!(bad.validate().is_err());
        let bad = GeneratorConfig { hot_bidders_ratio: 0, ..GeneratorConfig::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("hot_bidders_ratio"));
    }
}
