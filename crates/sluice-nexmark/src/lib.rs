//! The standard NEXMark event generator, producing Apache Arrow record
//! batches directly.
//!
//! NEXMark models an online auction site with three event streams: new
//! persons, new auctions and bids (see [`Table`] and [`schema`] for the
//! Arrow layouts, which follow the Flink NEXMark DDL). This crate follows the
//! behaviour of the well-known reference generator (Apache Beam's and the
//! Flink port's `GeneratorConfig` / `PersonGenerator` / `AuctionGenerator` /
//! `BidGenerator`): the 1:3:46 person:auction:bid mix per 50 events, ids
//! derived from event numbers starting at 1000, hot auctions, sellers and
//! bidders, the standard word lists and value distributions, and `extra`
//! padding to the standard average event sizes.
//!
//! Differences in mechanics (not in distributions): every event is generated
//! from a hash of `(seed, event number)`, so output is byte-identical for a
//! seed regardless of how the stream is split into lanes ([`LaneGenerator`])
//! or batches; event time is derived from the event number alone
//! (`base_time_ms + event_number * 1000 / first_event_rate`).
//!
//! ```
//! use sluice_nexmark::{GeneratorConfig, LaneGenerator, TableSet, Table};
//!
//! let config = GeneratorConfig { events: Some(1_000), ..GeneratorConfig::default() };
//! let mut lane = LaneGenerator::new(&config, 0, 1, TableSet::only(Table::Bid));
//! let mut bids = 0;
//! while let Some(batch) = lane.next_batch(256) {
//!     bids += batch.bid.map_or(0, |b| b.num_rows());
//! }
//! assert_eq!(bids, 920);
//! ```

mod auction;
mod bid;
mod config;
mod generator;
mod model;
mod person;
mod rng;
mod schema;
mod text;

#[cfg(test)]
mod tests;

pub use config::{
    AUCTION_PROPORTION, BID_PROPORTION, ConfigError, DEFAULT_BASE_TIME_MS, FIRST_AUCTION_ID, FIRST_CATEGORY_ID,
    FIRST_PERSON_ID, GeneratorConfig, HOT_AUCTION_GROUP, HOT_BIDDER_GROUP, HOT_SELLER_GROUP, MAX_AVG_BYTE_SIZE,
    NUM_CATEGORIES, PERSON_PROPORTION, PROPORTION_DENOMINATOR, event_kind, last_base0_auction_id, last_base0_person_id,
};
pub use generator::{GeneratedBatch, LaneGenerator, MAX_BATCH_EVENTS};
pub use schema::{Table, TableSet, schema};
