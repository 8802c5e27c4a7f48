//! What the decode benches share: the NEXMark bid's schema and the pseudo-random
//! sequence their generated bids come from.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

pub const CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];

/// `auction, bidder, price, channel, url, dateTime, extra`.
pub fn bid_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("bidder", DataType::Int64, false),
        Field::new("price", DataType::Int64, false),
        Field::new("channel", DataType::Utf8, true),
        Field::new("url", DataType::Utf8, true),
        Field::new("dateTime", DataType::Timestamp(TimeUnit::Millisecond, None), false),
        Field::new("extra", DataType::Utf8, true),
    ]))
}

/// A deterministic pseudo-random sequence (SplitMix64).
pub struct Mix(pub u64);

impl Mix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next value below `bound`.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}
