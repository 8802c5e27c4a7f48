//! Auction events, written straight into Arrow column builders.
//!
//! An auction gets the next dense id, a seller (hot seller or a recent active
//! person), a category `FIRST_CATEGORY_ID + random(NUM_CATEGORIES)`, an
//! initial bid from the standard price distribution, a reserve of initial bid
//! plus another price, a random item name (< 20 chars) and description
//! (< 100 chars), an expiry a random length after its event time (averaging
//! the time until `num_in_flight_auctions` more auctions exist), and `extra`
//! padding so that its byte size averages `avg_auction_byte_size`.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringBuilder, TimestampMillisecondArray};
use arrow::record_batch::RecordBatch;

use crate::config::{FIRST_AUCTION_ID, FIRST_CATEGORY_ID, NUM_CATEGORIES, last_base0_auction_id};
use crate::model::{Model, next_price};
use crate::schema::{Table, make_batch};
use crate::text::{extra_len, push_random_string};

/// Column builders of one `auction` batch.
pub(crate) struct AuctionColumns {
    id: Vec<i64>,
    item_name: StringBuilder,
    description: StringBuilder,
    initial_bid: Vec<i64>,
    reserve: Vec<i64>,
    date_time: Vec<i64>,
    expires: Vec<i64>,
    seller: Vec<i64>,
    category: Vec<i64>,
    extra: StringBuilder,
}

impl AuctionColumns {
    /// Builders sized for `rows` auctions.
    pub(crate) fn with_capacity(rows: usize, avg_size: usize) -> Self {
        AuctionColumns {
            id: Vec::with_capacity(rows),
            item_name: StringBuilder::with_capacity(rows, rows * 12),
            description: StringBuilder::with_capacity(rows, rows * 52),
            initial_bid: Vec::with_capacity(rows),
            reserve: Vec::with_capacity(rows),
            date_time: Vec::with_capacity(rows),
            expires: Vec::with_capacity(rows),
            seller: Vec::with_capacity(rows),
            category: Vec::with_capacity(rows),
            extra: StringBuilder::with_capacity(rows, rows * avg_size),
        }
    }

    /// Appends the auction created by event `event_number` at `timestamp_ms`.
    pub(crate) fn append(&mut self, model: &Model, event_number: u64, timestamp_ms: i64, scratch: &mut String) {
        let mut rng = model.rng(event_number);
        let rng = &mut rng;
        self.id.push(last_base0_auction_id(event_number) as i64 + FIRST_AUCTION_ID);
        self.seller.push(model.auction_seller(event_number, rng));
        self.category.push(FIRST_CATEGORY_ID + rng.below(NUM_CATEGORIES) as i64);
        let initial_bid = next_price(rng);
        self.initial_bid.push(initial_bid);
        self.date_time.push(timestamp_ms);
        let length = model.auction_length_ms(event_number, timestamp_ms, rng);
        self.expires.push(timestamp_ms.saturating_add(length));

        // The standard's size accounting: 8 + item name + description + 5 * 8.
        let mut size = 8 + 5 * 8;
        scratch.clear();
        push_random_string(rng, 20, ' ', true, scratch);
        size += scratch.len();
        self.item_name.append_value(scratch.as_str());
        scratch.clear();
        push_random_string(rng, 100, ' ', true, scratch);
        size += scratch.len();
        self.description.append_value(scratch.as_str());

        self.reserve.push(initial_bid + next_price(rng));
        let len = extra_len(rng, size, model.avg_auction);
        self.extra.append_value(model.text.extra(rng, len));
    }

    /// The finished batch.
    pub(crate) fn finish(mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(self.id)),
            Arc::new(self.item_name.finish()),
            Arc::new(self.description.finish()),
            Arc::new(Int64Array::from(self.initial_bid)),
            Arc::new(Int64Array::from(self.reserve)),
            Arc::new(TimestampMillisecondArray::from(self.date_time)),
            Arc::new(TimestampMillisecondArray::from(self.expires)),
            Arc::new(Int64Array::from(self.seller)),
            Arc::new(Int64Array::from(self.category)),
            Arc::new(self.extra.finish()),
        ];
        make_batch(Table::Auction, columns)
    }
}
