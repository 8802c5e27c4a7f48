//! Bid events, written straight into Arrow column builders (the hot path:
//! 46 of every 50 events are bids).
//!
//! A bid goes to the hot auction with probability `1 - 1/hot_auction_ratio`,
//! otherwise to a random in-flight auction; its bidder is the hot bidder with
//! probability `1 - 1/hot_bidders_ratio`, otherwise a random active person.
//! The price follows the standard distribution; the channel is one of the
//! four hot channels (probability 1/2) or one of `channel-0` ..
//! `channel-9999`, with its url; `extra` pads the byte size (counted as
//! 4 * 8 bytes plus `extra`, as the standard does) to average
//! `avg_bid_byte_size`. No per-bid allocation happens: every string comes
//! from a precomputed table and is copied into the builders.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringBuilder, TimestampMillisecondArray};
use arrow::record_batch::RecordBatch;

use crate::model::{Model, next_price};
use crate::schema::{Table, make_batch};

/// Column builders of one `bid` batch.
pub(crate) struct BidColumns {
    auction: Vec<i64>,
    bidder: Vec<i64>,
    price: Vec<i64>,
    channel: StringBuilder,
    url: StringBuilder,
    date_time: Vec<i64>,
    extra: StringBuilder,
}

impl BidColumns {
    /// Builders sized for `rows` bids.
    pub(crate) fn with_capacity(rows: usize, avg_size: usize) -> Self {
        BidColumns {
            auction: Vec::with_capacity(rows),
            bidder: Vec::with_capacity(rows),
            price: Vec::with_capacity(rows),
            channel: StringBuilder::with_capacity(rows, rows * 12),
            url: StringBuilder::with_capacity(rows, rows * 72),
            date_time: Vec::with_capacity(rows),
            extra: StringBuilder::with_capacity(rows, rows * avg_size),
        }
    }

    /// Appends the bid of event `event_number` at `timestamp_ms`.
    #[inline]
    pub(crate) fn append(&mut self, model: &Model, event_number: u64, timestamp_ms: i64) {
        let mut rng = model.rng(event_number);
        let rng = &mut rng;
        self.auction.push(model.bid_auction(event_number, rng));
        self.bidder.push(model.bid_bidder(event_number, rng));
        self.price.push(next_price(rng));
        let (channel, url) = model.text.channel(rng);
        self.channel.append_value(channel);
        self.url.append_value(url);
        self.date_time.push(timestamp_ms);
        let len = model.bid_extra.sample(rng);
        self.extra.append_value(model.text.extra(rng, len));
    }

    /// The finished batch.
    pub(crate) fn finish(mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(self.auction)),
            Arc::new(Int64Array::from(self.bidder)),
            Arc::new(Int64Array::from(self.price)),
            Arc::new(self.channel.finish()),
            Arc::new(self.url.finish()),
            Arc::new(TimestampMillisecondArray::from(self.date_time)),
            Arc::new(self.extra.finish()),
        ];
        make_batch(Table::Bid, columns)
    }
}
