//! NEXMark: writing generated events to a file, and the benchmark's pipelines, built in
//! code from the engine's configuration types.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use sluice_config::{
    CheckpointSection, DEFAULT_MAX_FAILED_CHECKPOINTS, DEFAULT_RETAIN, Guarantee, Located, PipelineConfig,
    PipelineSection, Position, SinkConfig, SourceConfig, ViewConfig,
};
use sluice_formats::{Encoder, OutputFormat};
use sluice_nexmark::{GeneratorConfig, LaneGenerator, Table, TableSet};
use sluice_types::{Batch, ErrorKind, SluiceError};

/// The benchmark's queries.
pub const QUERIES: &[&str] = &["source", "q0", "q1", "q2", "tumble", "running", "state", "state_day"];

/// The keyed-state query over a one-`$unit` tumbling window.
macro_rules! state_query {
    ($unit:literal) => {
        concat!(
            "SELECT auction, bidder, COUNT(*) AS bids, SUM(price) AS total, window_start ",
            "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' ",
            $unit,
            ")) GROUP BY auction, bidder, window_start, window_end"
        )
    };
}

/// A benchmark query's SQL, in Flink's NEXMark text.
pub fn query_sql(query: &str) -> Option<&'static str> {
    Some(match query {
        // The input's ceiling: rows reach the sink untouched (no operator runs).
        "source" => "SELECT * FROM bid",
        "q0" => "SELECT auction, bidder, price, dateTime, extra FROM bid",
        "q1" => "SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid",
        "q2" => "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
        // Keyed window state that grows with the input: one group per (auction, bidder)
        // pair in an hour-long window; used to measure checkpoints of a given state size.
        "state" => state_query!("HOUR"),
        // The same over a day-long window: the state keeps growing for 864 M events of
        // event time, so a run reaches gigabytes of state.
        "state_day" => state_query!("DAY"),
        "tumble" => {
            "SELECT auction, COUNT(*) AS bids, window_start, window_end \
             FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) \
             GROUP BY auction, window_start, window_end"
        }
        // A running (updating) aggregate: every auction's bid count and highest price,
        // kept up to date as bids arrive (the changelog of a non-windowed GROUP BY).
        "running" => "SELECT auction, COUNT(*) AS bids, MAX(price) AS top FROM bid GROUP BY auction",
        _ => return None,
    })
}

/// The columns of a bid CSV written by [`generate`].
pub const BID_CSV_SCHEMA: &str =
    "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, dateTime TIMESTAMP(3), extra VARCHAR";

/// What a benchmark run reads and how it checkpoints.
#[derive(Debug, Clone)]
pub struct BenchSetup<'a> {
    pub query: &'a str,
    pub events: u64,
    pub threads: u32,
    /// Read bids from this CSV file (with a header line) instead of the generator.
    pub csv: Option<&'a Path>,
    /// Checkpoints at this interval into the store at this URL.
    pub checkpoint: Option<(Duration, String)>,
}

fn at() -> Position {
    Position::new(1, 1)
}

/// The pipeline of one benchmark query: the input, the query as view `result`, a
/// blackhole sink.
pub fn bench_config(setup: &BenchSetup<'_>) -> Result<PipelineConfig, SluiceError> {
    let sql = query_sql(setup.query).ok_or_else(|| {
        SluiceError::user("bench.query", format!("unknown query `{}`", setup.query))
            .with_fix(format!("choose among {}", QUERIES.join(", ")))
    })?;
    let source = match setup.csv {
        None => {
            let mut source = SourceConfig::new("nexmark", "nexmark");
            let events = i64::try_from(setup.events).unwrap_or(i64::MAX);
            source.options.set("events", events);
            source
        }
        Some(path) => {
            let mut source = SourceConfig::new("bid", "file");
            source.format = Some(Located::new("csv".into(), at()));
            source.schema = Some(Located::new(BID_CSV_SCHEMA.into(), at()));
            source.event_time = Some("dateTime".into());
            source.options.set("path", path.display().to_string()).set("header", true);
            source
        }
    };
    let mut pipeline = PipelineSection::named(&format!("nexmark-{}", setup.query));
    pipeline.threads = setup.threads;
    let checkpoint = setup.checkpoint.as_ref().map(|(interval, store)| CheckpointSection {
        interval: *interval,
        timeout: sluice_config::DEFAULT_CHECKPOINT_TIMEOUT,
        store: store.clone(),
        guarantee: Guarantee::ExactlyOnce,
        retain: DEFAULT_RETAIN,
        max_failed_checkpoints: DEFAULT_MAX_FAILED_CHECKPOINTS,
    });
    Ok(PipelineConfig {
        pipeline,
        checkpoint,
        sources: vec![source],
        views: vec![ViewConfig {
            name: "result".into(),
            sql: Located::new(sql.into(), at()),
            materialized: None,
            position: at(),
        }],
        sinks: vec![SinkConfig::new("blackhole", "result", "blackhole")],
    })
}

/// How generated events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFormat {
    /// With a header line.
    Csv,
    JsonLines,
}

/// Writes `events` NEXMark events' rows of `table` (seeded by `seed`) to `out`.
pub fn generate(
    events: u64,
    seed: u64,
    table: Table,
    format: EventFormat,
    out: &mut dyn Write,
) -> Result<(), SluiceError> {
    let config = GeneratorConfig { seed, events: Some(events), ..GeneratorConfig::default() };
    let mut generator = LaneGenerator::new(&config, 0, 1, TableSet::only(table));
    let format = match format {
        EventFormat::Csv => OutputFormat::Csv { header: true },
        EventFormat::JsonLines => OutputFormat::JsonLines,
    };
    let mut encoder = Encoder::new(format, sluice_nexmark::schema(table), false);
    let mut buffer = Vec::new();
    let write_error = |e: std::io::Error| {
        let error = SluiceError::external("nexmark.write", format!("cannot write the events: {e}"))
            .with_fix("check the output path and the free space");
        if e.kind() == std::io::ErrorKind::BrokenPipe { error.with_kind(ErrorKind::OutputClosed) } else { error }
    };
    while let Some(batch) = generator.next_batch(8192) {
        if let Some(rows) = batch.table(table) {
            buffer.clear();
            encoder.encode(&Batch::inserts(rows.clone()), &mut buffer)?;
            out.write_all(&buffer).map_err(write_error)?;
        }
    }
    out.flush().map_err(write_error)
}
