//! Properties: random good rows with random bad rows and blank lines among them, cut
//! into random chunks, decode to exactly the good rows, and the bad rows are reported
//! with their line numbers; rows written by the CSV [`crate::Encoder`] (line breaks,
//! quotes and delimiters in their text) decode back to the same rows.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray, TimestampMillisecondArray};
use arrow::record_batch::RecordBatch;
use arrow::temporal_conversions::timestamp_ms_to_datetime;
use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
struct Bid {
    auction: i64,
    bidder: i64,
    price: i64,
    channel: String,
    millis: i64,
    extra: Option<String>,
    /// Which accepted timestamp form the row uses.
    form: u8,
}

#[derive(Debug, Clone)]
enum Row {
    Good(Bid),
    /// A bad row of kind `0..6`, made from a good one.
    Bad(Bid, u8),
    Blank(&'static str),
}

fn bid() -> impl Strategy<Value = Bid> {
    (
        any::<i64>(),
        0..1_000_000i64,
        0..100_000_000i64,
        "[a-z ,\"é\r\n]{1,8}",
        0..4_000_000_000_000i64,
        proptest::option::of("[a-z0-9]{1,12}"),
        0..3u8,
    )
        .prop_map(|(auction, bidder, price, channel, millis, extra, form)| Bid {
            auction,
            bidder,
            price,
            channel,
            millis,
            extra,
            form,
        })
}

fn row() -> impl Strategy<Value = Row> {
    prop_oneof![
        12 => bid().prop_map(Row::Good),
        2 => (bid(), 0..6u8).prop_map(|(bid, kind)| Row::Bad(bid, kind)),
        1 => prop_oneof![Just(""), Just("  "), Just("\r")].prop_map(Row::Blank),
    ]
}

fn timestamp(bid: &Bid, json: bool) -> String {
    let Some(time) = timestamp_ms_to_datetime(bid.millis) else { panic!("timestamp {}", bid.millis) };
    match bid.form {
        0 => time.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
        1 => time.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        _ if json => bid.millis.to_string(),
        _ => time.format("%Y-%m-%dT%H:%M:%S%.3f+00:00").to_string(),
    }
}

fn url(bid: &Bid) -> String {
    format!("https://example.com/{}", bid.auction)
}

fn csv_line(bid: &Bid, bad: Option<u8>) -> String {
    let channel = format!("\"{}\"", bid.channel.replace('"', "\"\""));
    let extra = bid.extra.clone().unwrap_or_default();
    let (a, b, p, u, t) = (bid.auction, bid.bidder, bid.price, url(bid), timestamp(bid, false));
    match bad {
        None => format!("{a},{b},{p},{channel},{u},{t},{extra}"),
        Some(0) => format!("{a},{b},abc,{channel},{u},{t},{extra}"),
        Some(1) => format!("{a},{b},{p},{channel},{u},{t}"),
        Some(2) => format!("{a},{b},{p},{channel},{u},{t},{extra},more"),
        Some(3) => format!("{a},{b},{p},{channel},{u},2026-99-01 00:00:00,{extra}"),
        Some(4) => format!("{a},,{p},{channel},{u},{t},{extra}"),
        // A quote inside an unquoted field is data, here in a BIGINT column.
        Some(_) => format!("{a},{b},{p}\"x,{channel},{u},{t},{extra}"),
    }
}

fn json_line(bid: &Bid, bad: Option<u8>) -> String {
    let time = timestamp(bid, true);
    let time = if bid.form == 2 { serde_json::json!(bid.millis) } else { serde_json::json!(time) };
    let mut object = serde_json::json!({
        "auction": bid.auction, "bidder": bid.bidder, "price": bid.price, "channel": bid.channel,
        "url": url(bid), "dateTime": time, "extra": bid.extra, "ignored": [1, 2],
    });
    match bad {
        None => {}
        Some(0) => object["price"] = serde_json::json!("abc"),
        Some(1) => object["bidder"] = serde_json::Value::Null,
        Some(2) => object["channel"] = serde_json::json!(7),
        Some(3) => object["dateTime"] = serde_json::json!("2026-99-01 00:00:00"),
        Some(4) => return format!("{{\"auction\": {}, \"bidder\"", bid.auction),
        Some(_) => return object.to_string().replacen(':', " ", 1),
    }
    object.to_string()
}

fn expected_batch(bids: &[&Bid]) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(bids.iter().map(|b| b.auction))),
        Arc::new(Int64Array::from_iter_values(bids.iter().map(|b| b.bidder))),
        Arc::new(Int64Array::from_iter_values(bids.iter().map(|b| b.price))),
        Arc::new(StringArray::from_iter_values(bids.iter().map(|b| b.channel.clone()))),
        Arc::new(StringArray::from_iter_values(bids.iter().map(|b| url(b)))),
        Arc::new(TimestampMillisecondArray::from_iter_values(bids.iter().map(|b| b.millis))),
        Arc::new(StringArray::from_iter(bids.iter().map(|b| b.extra.clone()))),
    ];
    match RecordBatch::try_new(bid_schema(), columns) {
        Ok(batch) => batch,
        Err(error) => panic!("expected batch: {error}"),
    }
}

fn run(format: RowFormat, rows: &[Row], slack: usize, batch_size: usize) -> Result<(), TestCaseError> {
    let mut input = String::new();
    let mut expected_bad = Vec::new();
    let mut good = Vec::new();
    let mut longest = 1;
    if format == CSV_HEADER {
        input.push_str("auction,bidder,price,channel,url,dateTime,extra\n");
        longest = input.len();
    }
    for row in rows {
        let line = count_lines(&input) + 1;
        let text = match (row, format) {
            (Row::Good(bid), RowFormat::Json) => json_line(bid, None),
            (Row::Good(bid), _) => csv_line(bid, None),
            (Row::Bad(bid, kind), RowFormat::Json) => json_line(bid, Some(*kind)),
            (Row::Bad(bid, kind), _) => csv_line(bid, Some(*kind)),
            (Row::Blank(text), _) => text.to_string(),
        };
        match row {
            Row::Good(bid) => good.push(bid),
            Row::Bad(..) => expected_bad.push(line),
            Row::Blank(_) => {}
        }
        longest = longest.max(text.len() + 1);
        input.push_str(&text);
        input.push('\n');
    }
    let (batches, bad) = decode_chunked(format, &bid_schema(), input.as_bytes(), longest + slack, batch_size);
    let lines: Vec<u64> = bad.iter().map(|row| row.line).collect();
    prop_assert_eq!(lines, expected_bad, "bad rows: {:#?}\ninput:\n{}", bad, input);
    prop_assert!(batches.iter().all(|batch| batch.num_rows() <= batch_size));
    let decoded = arrow::compute::concat_batches(&bid_schema(), &batches);
    let Ok(decoded) = decoded else { panic!("concat") };
    prop_assert_eq!(decoded, expected_batch(&good));
    Ok(())
}

/// `id BIGINT NOT NULL, a VARCHAR, b VARCHAR, ts TIMESTAMP(3)`.
fn text_schema() -> SchemaRef {
    Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, false),
        arrow::datatypes::Field::new("a", arrow::datatypes::DataType::Utf8, true),
        arrow::datatypes::Field::new("b", arrow::datatypes::DataType::Utf8, true),
        arrow::datatypes::Field::new("ts", ts_ms(), true),
    ]))
}

type TextRow = (i64, Option<String>, Option<String>, Option<i64>);

/// Rows whose text holds line breaks (LF, CR, CRLF), quotes and delimiters; never an
/// empty string, which CSV writes as NULL.
fn text_rows() -> impl Strategy<Value = Vec<TextRow>> {
    let text = || proptest::option::of("[a-z ,;\"\r\n]{1,12}|\r\n|\"|\n");
    proptest::collection::vec((any::<i64>(), text(), text(), proptest::option::of(0..4_000_000_000_000i64)), 0..40)
}

fn text_batch(rows: &[TextRow]) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|row| row.0))),
        Arc::new(StringArray::from_iter(rows.iter().map(|row| row.1.clone()))),
        Arc::new(StringArray::from_iter(rows.iter().map(|row| row.2.clone()))),
        Arc::new(TimestampMillisecondArray::from_iter(rows.iter().map(|row| row.3))),
    ];
    match RecordBatch::try_new(text_schema(), columns) {
        Ok(batch) => batch,
        Err(error) => panic!("text batch: {error}"),
    }
}

/// Encodes `rows` with the CSV encoder and decodes them back in chunks.
fn round_trip(rows: &[TextRow], header: bool, slack: usize, batch_size: usize) -> Result<(), TestCaseError> {
    let expected = text_batch(rows);
    let mut encoder = crate::Encoder::new(crate::OutputFormat::Csv { header }, text_schema(), false);
    let mut written = Vec::new();
    if let Err(error) = encoder.encode(&sluice_types::Batch::inserts(expected.clone()), &mut written) {
        panic!("encode: {error}");
    }
    let format = if header { CSV_HEADER } else { CSV };
    let capacity = longest_record(format, &written) + slack;
    let (batches, bad) = decode_chunked(format, &text_schema(), &written, capacity, batch_size);
    let text = String::from_utf8_lossy(&written);
    prop_assert!(bad.is_empty(), "bad rows {:#?} in:\n{}", bad, text);
    let Ok(decoded) = arrow::compute::concat_batches(&text_schema(), &batches) else { panic!("concat") };
    prop_assert_eq!(decoded, expected, "written:\n{}", text);
    Ok(())
}

fn count_lines(text: &str) -> u64 {
    text.bytes().filter(|b| *b == b'\n').count() as u64
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn csv_good_rows_decode_and_bad_rows_are_found(
        rows in proptest::collection::vec(row(), 0..120),
        header in any::<bool>(),
        slack in 0..600usize,
        batch_size in 1..40usize,
    ) {
        run(if header { CSV_HEADER } else { CSV }, &rows, slack, batch_size)?;
    }

    #[test]
    fn csv_rows_written_by_the_encoder_decode_back_regression(
        rows in text_rows(),
        header in any::<bool>(),
        slack in 0..300usize,
        batch_size in 1..20usize,
    ) {
        round_trip(&rows, header, slack, batch_size)?;
    }

    #[test]
    fn json_good_rows_decode_and_bad_rows_are_found(
        rows in proptest::collection::vec(row(), 0..120),
        slack in 0..600usize,
        batch_size in 1..40usize,
    ) {
        run(JSON, &rows, slack, batch_size)?;
    }
}
