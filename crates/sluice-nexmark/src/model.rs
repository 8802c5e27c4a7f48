//! The immutable generation model shared by all lanes of one configuration:
//! the configuration, derived constants, the seeded string tables, and the
//! standard random choices of referenced ids (hot and recent persons and
//! auctions), prices and auction lengths.

use std::sync::Arc;

use crate::config::{
    AUCTION_PROPORTION, FIRST_AUCTION_ID, FIRST_PERSON_ID, GeneratorConfig, HOT_AUCTION_GROUP, HOT_BIDDER_GROUP,
    HOT_SELLER_GROUP, PROPORTION_DENOMINATOR, last_base0_auction_id, last_base0_person_id,
};
use crate::rng::{EventRng, derive_key};
use crate::text::{ExtraRule, TextTables};

/// Size of a bid without `extra` in the standard's accounting
/// (auction, bidder, price, dateTime at 8 bytes each).
pub(crate) const BID_FIXED_SIZE: usize = 8 + 8 + 8 + 8;

/// Domain tag of the per-event randomness.
const DOMAIN_EVENTS: u64 = 0x6576_656E_7473_0001;

/// Everything needed to generate any event of a configuration.
#[derive(Debug)]
pub(crate) struct Model {
    pub(crate) config: GeneratorConfig,
    pub(crate) text: TextTables,
    event_key: u64,
    hot_auction_ratio: u64,
    hot_sellers_ratio: u64,
    hot_bidders_ratio: u64,
    in_flight_auctions: u64,
    active_people: u64,
    person_lead: u64,
    auction_lead: u64,
    /// Events until `num_in_flight_auctions` more auctions have been created.
    auction_horizon_events: u64,
    pub(crate) avg_person: usize,
    pub(crate) avg_auction: usize,
    pub(crate) avg_bid: usize,
    /// Padding rule of bids (their other fields have a fixed size).
    pub(crate) bid_extra: ExtraRule,
}

impl Model {
    /// Builds the model; the config must be valid.
    pub(crate) fn new(config: &GeneratorConfig) -> Arc<Model> {
        if let Err(e) = config.validate() {
            panic!("{e}");
        }
        let c = config;
        Arc::new(Model {
            config: c.clone(),
            text: TextTables::new(c.seed, c.max_extra_len()),
            event_key: derive_key(c.seed, DOMAIN_EVENTS),
            hot_auction_ratio: u64::from(c.hot_auction_ratio),
            hot_sellers_ratio: u64::from(c.hot_sellers_ratio),
            hot_bidders_ratio: u64::from(c.hot_bidders_ratio),
            in_flight_auctions: u64::from(c.num_in_flight_auctions),
            active_people: u64::from(c.num_active_people),
            person_lead: u64::from(c.person_id_lead),
            auction_lead: u64::from(c.auction_id_lead),
            auction_horizon_events: u64::from(c.num_in_flight_auctions) * PROPORTION_DENOMINATOR / AUCTION_PROPORTION,
            avg_person: c.avg_person_byte_size as usize,
            avg_auction: c.avg_auction_byte_size as usize,
            avg_bid: c.avg_bid_byte_size as usize,
            bid_extra: ExtraRule::new(BID_FIXED_SIZE, c.avg_bid_byte_size as usize),
        })
    }

    /// The random generator of event `event_number`.
    #[inline]
    pub(crate) fn rng(&self, event_number: u64) -> EventRng {
        EventRng::for_event(self.event_key, event_number)
    }

    /// A random recent person (base 0): one of the latest `num_active_people`
    /// persons, or up to `person_id_lead - 1` ids past the newest.
    #[inline]
    fn next_base0_person_id(&self, event_number: u64, rng: &mut EventRng) -> u64 {
        let num_people = last_base0_person_id(event_number) + 1;
        let active = num_people.min(self.active_people);
        num_people - active + rng.below(active + self.person_lead)
    }

    /// A random in-flight auction (base 0): one of the latest
    /// `num_in_flight_auctions + 1` auctions, or up to `auction_id_lead`
    /// ids past the newest.
    #[inline]
    fn next_base0_auction_id(&self, event_number: u64, rng: &mut EventRng) -> u64 {
        let max = last_base0_auction_id(event_number);
        let min = max.saturating_sub(self.in_flight_auctions);
        min + rng.below(max - min + 1 + self.auction_lead)
    }

    /// The seller of the auction created by event `event_number`.
    #[inline]
    pub(crate) fn auction_seller(&self, event_number: u64, rng: &mut EventRng) -> i64 {
        let base0 = if rng.below(self.hot_sellers_ratio) > 0 {
            (last_base0_person_id(event_number) / HOT_SELLER_GROUP) * HOT_SELLER_GROUP
        } else {
            self.next_base0_person_id(event_number, rng)
        };
        base0 as i64 + FIRST_PERSON_ID
    }

    /// The auction the bid of event `event_number` is for.
    #[inline]
    pub(crate) fn bid_auction(&self, event_number: u64, rng: &mut EventRng) -> i64 {
        let base0 = if rng.below(self.hot_auction_ratio) > 0 {
            (last_base0_auction_id(event_number) / HOT_AUCTION_GROUP) * HOT_AUCTION_GROUP
        } else {
            self.next_base0_auction_id(event_number, rng)
        };
        base0 as i64 + FIRST_AUCTION_ID
    }

    /// The bidder of the bid of event `event_number`. The hot bidder is the
    /// second person of its group; it never exceeds the newest person by more
    /// than the configured lead.
    #[inline]
    pub(crate) fn bid_bidder(&self, event_number: u64, rng: &mut EventRng) -> i64 {
        let base0 = if rng.below(self.hot_bidders_ratio) > 0 {
            let last = last_base0_person_id(event_number);
            ((last / HOT_BIDDER_GROUP) * HOT_BIDDER_GROUP + 1).min(last + self.person_lead)
        } else {
            self.next_base0_person_id(event_number, rng)
        };
        base0 as i64 + FIRST_PERSON_ID
    }

    /// Length of the auction created at `event_number` (event time
    /// `timestamp_ms`): uniform in `1 ..= 2 * horizon`, where the horizon is
    /// the event time until `num_in_flight_auctions` more auctions exist.
    #[inline]
    pub(crate) fn auction_length_ms(&self, event_number: u64, timestamp_ms: i64, rng: &mut EventRng) -> i64 {
        let future = self.config.event_time_ms(event_number.saturating_add(self.auction_horizon_events));
        let horizon_ms = future.saturating_sub(timestamp_ms).max(0) as u64;
        1 + rng.below(horizon_ms.saturating_mul(2).max(1)) as i64
    }
}

/// A random price in cents: `round(10^(u * 6) * 100)` for uniform `u`,
/// i.e. log-uniform between $1 and $1,000,000.
#[inline]
pub(crate) fn next_price(rng: &mut EventRng) -> i64 {
    // 10^(6u) computed as e^(6u ln 10), which is cheaper than powf; the
    // value is positive, so adding 0.5 and truncating rounds it.
    ((rng.next_f64() * 6.0 * std::f64::consts::LN_10).exp() * 100.0 + 0.5) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_are_log_uniform_in_range() {
        let mut rng = EventRng::from_seed(9);
        let n = 60_000;
        let mut per_decade = [0u32; 6];
        for _ in 0..n {
            let p = next_price(&mut rng);
            assert!((100..=100_000_000).contains(&p), "{p}");
            let decade = ((p as f64 / 100.0).log10().floor() as usize).min(5);
            per_decade[decade] += 1;
        }
        assert!(per_decade.iter().all(|&c| (9_000..11_000).contains(&c)), "{per_decade:?}");
    }

    #[test]
    fn auction_length_averages_the_horizon() {
        let model = Model::new(&GeneratorConfig::default());
        let mut sum = 0i64;
        let n = 20_000;
        for i in 0..n {
            let mut rng = model.rng(i);
            let l = model.auction_length_ms(1_000_000, model.config.event_time_ms(1_000_000), &mut rng);
            // 1666 events ahead at 100 µs per event: horizon 166 ms.
            assert!((1..=333).contains(&l), "{l}");
            sum += l;
        }
        let avg = sum as f64 / n as f64;
        assert!((avg - 167.0).abs() < 5.0, "{avg}");
    }

    #[test]
    fn hot_choices_use_their_groups() {
        let model = Model::new(&GeneratorConfig {
            hot_auction_ratio: 1_000_000,
            hot_bidders_ratio: 1_000_000,
            hot_sellers_ratio: 1_000_000,
            ..GeneratorConfig::default()
        });
        // Event 50_010: epoch 1000 (persons 0..=1000, auctions 0..=3002).
        let n = 50_010;
        let mut hot = (0, 0, 0);
        for i in 0..100 {
            let mut rng = model.rng(i);
            let a = model.bid_auction(n, &mut rng);
            let b = model.bid_bidder(n, &mut rng);
            let s = model.auction_seller(n, &mut rng);
            hot.0 += i64::from(a == 3000 + FIRST_AUCTION_ID);
            hot.1 += i64::from(b == 1001 + FIRST_PERSON_ID);
            hot.2 += i64::from(s == 1000 + FIRST_PERSON_ID);
        }
        assert!(hot.0 > 95 && hot.1 > 95 && hot.2 > 95, "{hot:?}");
    }
}
