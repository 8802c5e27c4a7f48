//! The NEXMark source: the standard generator, one lane per driver thread.
//!
//! Contract:
//! - Tables `person`, `auction`, `bid`, in that order (table indexes 0, 1, 2), with
//!   [`sluice_nexmark::schema`]; the event-time column of each is `dateTime`.
//! - `threads` lanes, taking turns by blocks of consecutive event numbers ([`lane_block`]):
//!   block `b` belongs to lane `b % n`, so the lanes together produce exactly the
//!   single-stream events (`events` of them when bounded, split 1:3:46
//!   person:auction:bid), whatever the thread count.
//! - A lane generates only the tables some flow reads
//!   ([`LaneContext::tables_needed`]); one that reads none is exhausted at once.
//! - After each batch the lane's watermark is the largest event time it has produced
//!   minus `watermark_delay`: it never decreases.
//! - `rate` (events per second of wall clock, for the whole source) is split evenly
//!   over the lanes. A lane ahead of its schedule answers [`LanePoll::Wait`] with the
//!   instant it may go on (it never sleeps). Batches hold at most `batch_size` events
//!   and, under a rate, about 100 ms worth of events, so a slow rate still delivers
//!   rows promptly. A lane that fell behind (its consumer was slow) catches up in
//!   full batches.

use std::time::{Duration, Instant};

use std::sync::Arc;

use sluice_config::{ConfigError, SourceConfig};
use sluice_nexmark::{GeneratorConfig, LaneGenerator, Table, TableSet};
use sluice_runtime::{LaneContext, LanePoll, LaneReader, SourceFactory, TableDef};
use sluice_types::{SluiceError, TimestampMs};

use crate::connector::{ConfiguredSource, OptionDoc, SourceConnector, SourceContext, forbid_item};
use crate::lanes::duration_ms;

/// The event-time column of every nexmark table.
pub const EVENT_TIME_COLUMN: &str = "dateTime";

/// The tables a nexmark source provides to SQL, whatever the source's name.
pub const NEXMARK_TABLES: [&str; 3] = ["person", "auction", "bid"];
/// Default `first_event_rate` (events per second of event time) without a `rate`.
pub const DEFAULT_FIRST_EVENT_RATE: u64 = 10_000;

/// The most consecutive events a lane generates before the next lane's turn: one
/// batch of the default `batch_size`.
pub const MAX_LANE_BLOCK: u64 = 8192;

/// How many consecutive events each lane takes per turn, at most [`MAX_LANE_BLOCK`]
/// and at least one. Without a `rate`, as many as one second of event time holds: a
/// lane's batch then holds consecutive events, which span `lanes` times less event time
/// (so fewer windows and keys per batch) than every `lanes`-th event would. Under a
/// `rate`, as many as 10 ms of event time holds, so the lanes' watermarks, which follow
/// the wall clock, stay within milliseconds of each other. A round of every lane's turn
/// spans at most half of `max_drift_ms`, so watermark alignment never holds a lane back
/// only because the others have not had their turn yet; and a bounded run of at least
/// `16 × lanes` events gives each lane at least [`MIN_TURNS_PER_LANE`] turns.
pub fn lane_block(rate: Option<f64>, first_event_rate: u64, events: Option<u64>, lanes: u32, max_drift_ms: i64) -> u64 {
    let lanes = u64::from(lanes.max(1));
    let turn_ms = if rate.is_some() { 10 } else { 1000 }.min(max_drift_ms.max(0) as u64 / (2 * lanes));
    let span = u64::try_from(u128::from(first_event_rate) * u128::from(turn_ms) / 1000).unwrap_or(u64::MAX);
    let share = events.map_or(u64::MAX, |events| events / (lanes * MIN_TURNS_PER_LANE));
    span.min(share).clamp(1, MAX_LANE_BLOCK)
}

/// The fewest turns a lane of a bounded run takes (see [`lane_block`]).
pub const MIN_TURNS_PER_LANE: u64 = 16;

/// How much wall-clock time one rate-limited batch covers at most.
const RATE_BATCH_SPAN: Duration = Duration::from_millis(100);

/// `[source.options]` of a nexmark source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NexmarkOptions {
    /// Stop after this many events; `None`: unbounded.
    pub events: Option<u64>,
    /// Wall-clock rate limit in events per second; `None`: as fast as possible.
    pub rate: Option<f64>,
    /// Generator seed (default 0).
    pub seed: u64,
    /// Event-time spacing: events per second of event time (default: `rate` when set,
    /// so event time keeps pace with the wall clock, else 10000).
    pub first_event_rate: u64,
}

impl Default for NexmarkOptions {
    fn default() -> NexmarkOptions {
        NexmarkOptions { events: None, rate: None, seed: 0, first_event_rate: DEFAULT_FIRST_EVENT_RATE }
    }
}

const OPTIONS: &[OptionDoc] = &[
    OptionDoc { key: "events", kind: "integer >= 1", default: "unbounded", doc: "stop after this many events" },
    OptionDoc {
        key: "rate",
        kind: "number > 0",
        default: "unlimited",
        doc: "events per second of wall clock, for the whole source",
    },
    OptionDoc { key: "seed", kind: "integer >= 0", default: "0", doc: "the generator's seed" },
    OptionDoc {
        key: "first_event_rate",
        kind: "integer >= 1",
        default: "rate, else 10000",
        doc: "events per second of event time",
    },
];

/// The `nexmark` connector: the NEXMark generator, tables person, auction and bid.
#[derive(Debug, Clone, Copy)]
pub struct NexmarkConnector;

impl SourceConnector for NexmarkConnector {
    fn name(&self) -> &'static str {
        "nexmark"
    }

    fn options(&self) -> &'static [OptionDoc] {
        OPTIONS
    }

    fn configure(&self, config: &SourceConfig) -> Result<Box<dyn ConfiguredSource>, Vec<ConfigError>> {
        Ok(Box::new(ConfiguredNexmark { options: options_of(config)? }))
    }
}

/// The validated options of a `connector = "nexmark"` source, or every problem.
pub fn options_of(config: &SourceConfig) -> Result<NexmarkOptions, Vec<ConfigError>> {
    let options = &config.options;
    let mut errors = Vec::new();
    let format = config.format.as_ref().map(|f| format!("\"{}\"", f.value)).unwrap_or_default();
    forbid_item(
        config.format.as_ref(),
        "format",
        &format,
        options,
        "the nexmark connector generates its events itself",
        "remove `format`",
        &mut errors,
    );
    let schema = config.schema.as_ref().map(|s| format!("\"{}\"", s.value)).unwrap_or_default();
    forbid_item(
        config.schema.as_ref(),
        "schema",
        &schema,
        options,
        "nexmark tables person, auction and bid have fixed schemas",
        "remove `schema`",
        &mut errors,
    );
    let mut reader = options.read();
    reader.check_keys(&["events", "rate", "seed", "first_event_rate"]);
    let events = reader.integer(
        "events",
        1..=i64::MAX,
        "set events to the number of events to generate, e.g. events = 1000000, \
         or remove it for an unbounded stream",
    );
    let rate = reader.positive_number("rate", "set rate to events per second, e.g. rate = 100000");
    let seed = reader.integer("seed", 0..=i64::MAX, "set seed to an integer, e.g. seed = 42");
    let first_event_rate = reader.integer(
        "first_event_rate",
        1..=i64::MAX,
        "set first_event_rate to events per second of event time, e.g. first_event_rate = 10000",
    );
    let parsed = (|| {
        let rate = rate.optional()?;
        // With a rate limit and no explicit spacing, event time follows the wall clock.
        let spacing = rate.map_or(DEFAULT_FIRST_EVENT_RATE, |rate| (rate.round() as u64).max(1));
        Some(NexmarkOptions {
            events: events.optional()?,
            rate,
            seed: seed.or(0)?,
            first_event_rate: first_event_rate.or(spacing)?,
        })
    })();
    crate::connector::finish(reader, errors)?;
    Ok(parsed.expect("every option was valid"))
}

/// A validated nexmark source.
#[derive(Debug, Clone)]
pub struct ConfiguredNexmark {
    pub options: NexmarkOptions,
}

impl ConfiguredSource for ConfiguredNexmark {
    fn tables(&self) -> Vec<String> {
        NEXMARK_TABLES.iter().map(|t| t.to_string()).collect()
    }

    fn reads_declared_schema(&self) -> bool {
        false
    }

    fn build(&self, context: &SourceContext<'_>) -> Result<Arc<dyn SourceFactory>, SluiceError> {
        let mut source = NexmarkSource::new(context.config, &self.options, context.lane_threads)?;
        if let Some(layout) = context.layout.as_deref() {
            source.generator.lane_block = decode_layout(layout)?;
        }
        Ok(Arc::new(source))
    }
}

/// A planned nexmark source.
#[derive(Debug)]
pub struct NexmarkSource {
    name: String,
    tables: Vec<TableDef>,
    generator: GeneratorConfig,
    rate: Option<f64>,
    lanes: u32,
    watermark_delay_ms: i64,
    max_watermark_drift_ms: i64,
}

/// The generator's lanes interleave one stream, so keeping them within this much event
/// time of each other costs no parallelism and bounds what event-time operators hold
/// for a lane that ran ahead (`[[source]] max_watermark_drift` overrides it).
pub const DEFAULT_MAX_WATERMARK_DRIFT: Duration = Duration::from_secs(10);

impl NexmarkSource {
    /// The source of a `connector = "nexmark"` config, with one lane per thread.
    pub fn new(config: &SourceConfig, options: &NexmarkOptions, threads: u32) -> Result<NexmarkSource, SluiceError> {
        let NexmarkOptions { events, rate, seed, first_event_rate } = options;
        let max_watermark_drift_ms = duration_ms(config.max_watermark_drift.unwrap_or(DEFAULT_MAX_WATERMARK_DRIFT));
        let generator = GeneratorConfig {
            seed: *seed,
            events: *events,
            first_event_rate: *first_event_rate,
            lane_block: lane_block(*rate, *first_event_rate, *events, threads, max_watermark_drift_ms),
            ..GeneratorConfig::default()
        };
        generator.validate().map_err(|error| {
            SluiceError::user("source.nexmark_options", error.to_string())
                .with_fix("set first_event_rate to 1 or more in [source.options]")
        })?;
        if let Some(rate) = rate.filter(|rate| !rate.is_finite() || *rate <= 0.0) {
            return Err(SluiceError::user("source.nexmark_rate", format!("rate = {rate} is not a positive number"))
                .with_fix("set rate to events per second above 0, or remove it for no limit"));
        }
        let tables = Table::all()
            .into_iter()
            .map(|table| TableDef {
                name: table.name().to_string(),
                schema: sluice_nexmark::schema(table),
                event_time: Some(EVENT_TIME_COLUMN.to_string()),
                changelog: None,
            })
            .collect();
        Ok(NexmarkSource {
            name: config.name.clone(),
            tables,
            generator,
            rate: *rate,
            lanes: threads.max(1),
            watermark_delay_ms: duration_ms(config.watermark_delay),
            max_watermark_drift_ms,
        })
    }
}

impl SourceFactory for NexmarkSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn tables(&self) -> &[TableDef] {
        &self.tables
    }

    fn lanes(&self) -> u32 {
        self.lanes
    }

    fn open_lane(&self, context: LaneContext) -> Result<Box<dyn LaneReader>, SluiceError> {
        if context.lane >= self.lanes {
            return Err(SluiceError::internal(
                "source.lane",
                format!("source `{}` has {} lanes, not lane {}", self.name, self.lanes, context.lane),
            ));
        }
        let needed: TableSet = Table::all()
            .into_iter()
            .enumerate()
            .filter(|(index, _)| context.tables_needed.get(*index).copied().unwrap_or(false))
            .map(|(_, table)| table)
            .collect();
        let throttle = self.rate.map(|rate| Throttle::new(rate / f64::from(self.lanes), context.batch_size));
        let mut generator = LaneGenerator::new(&self.generator, context.lane, self.lanes, needed);
        let mut watermark = None;
        if let Some(position) = &context.start {
            let (next_event, restored) = decode_position(position, self.generator.lane_block)?;
            generator.seek(next_event);
            watermark = restored;
        }
        Ok(Box::new(NexmarkLane {
            generator,
            needed,
            batch_size: context.batch_size.max(1),
            throttle,
            watermark_delay_ms: self.watermark_delay_ms,
            watermark,
            resumed: context.start.is_some(),
        }))
    }

    fn describe(&self) -> String {
        let events = self.generator.events.map_or("unbounded".to_string(), |events| events.to_string());
        let rate = self.rate.map_or("unlimited".to_string(), |rate| rate.to_string());
        let drift = self.max_watermark_drift_ms;
        let (seed, block) = (self.generator.seed, self.generator.lane_block);
        let blocks = if block == 1 { "one event per turn".to_string() } else { format!("blocks of {block} events") };
        format!("nexmark(events={events}, rate={rate}, seed={seed}, {blocks}, lanes within {drift} ms)")
    }

    fn max_watermark_drift(&self) -> Option<TimestampMs> {
        Some(self.max_watermark_drift_ms)
    }

    /// The lanes' block size ([`encode_layout`]): a restore keeps it, whatever `events`
    /// or `rate` say then, so the positions keep their meaning.
    fn layout(&self) -> Vec<u8> {
        encode_layout(self.generator.lane_block)
    }

    /// What decides which events each lane makes, besides the lane count (which the
    /// cluster's layout fixes): every worker must generate the same stream.
    fn content_identity(&self) -> Vec<u8> {
        let mut identity = vec![1u8];
        for value in [
            self.generator.seed,
            self.generator.events.unwrap_or(u64::MAX),
            self.generator.first_event_rate,
            u64::from(self.rate.is_some()),
            self.max_watermark_drift_ms as u64,
        ] {
            identity.extend_from_slice(&value.to_le_bytes());
        }
        identity
    }
}

/// The version of [`encode_layout`]'s bytes.
const LAYOUT_VERSION: u8 = 1;

/// A nexmark source's layout (9 bytes): the version (1), then the lanes' block size
/// ([`lane_block`]) as u64, little-endian. An older build recorded none.
fn encode_layout(lane_block: u64) -> Vec<u8> {
    let mut bytes = vec![LAYOUT_VERSION];
    bytes.extend_from_slice(&lane_block.to_le_bytes());
    bytes
}

fn decode_layout(bytes: &[u8]) -> Result<u64, SluiceError> {
    match bytes {
        [LAYOUT_VERSION, block @ ..] if block.len() == 8 => {
            let block = u64::from_le_bytes(block.try_into().expect("8 bytes"));
            if block == 0 {
                return Err(SluiceError::internal("source.layout", "a nexmark layout with lane blocks of 0 events"));
            }
            Ok(block)
        }
        _ => Err(SluiceError::user(
            "checkpoint.nexmark_layout",
            format!("the checkpoint's nexmark layout ({} bytes) is not one this Sluice reads", bytes.len()),
        )
        .with_fix("start over with --from-scratch (the generator makes the same events again)")),
    }
}

/// One lane of the generator.
pub struct NexmarkLane {
    generator: LaneGenerator,
    needed: TableSet,
    batch_size: usize,
    throttle: Option<Throttle>,
    watermark_delay_ms: i64,
    /// The last watermark reported (part of the position).
    watermark: Option<TimestampMs>,
    /// Opened at a position: it first reports that it had ended, or its watermark there.
    resumed: bool,
}

/// The version of [`encode_position`]'s layout.
const POSITION_VERSION: u8 = 1;

/// A lane position (25 bytes): the layout version (1), the lane block size
/// ([`lane_block`]) as u64, the next event number as u64, then the last watermark as
/// i64 (`i64::MIN` for none), all little-endian. A checkpoint of an older build has
/// 16 bytes (no version, no block: its lanes took one event per turn).
fn encode_position(lane_block: u64, next_event: u64, watermark: Option<TimestampMs>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(25);
    bytes.push(POSITION_VERSION);
    bytes.extend_from_slice(&lane_block.to_le_bytes());
    bytes.extend_from_slice(&next_event.to_le_bytes());
    bytes.extend_from_slice(&watermark.unwrap_or(i64::MIN).to_le_bytes());
    bytes
}

/// The next event number and watermark of a position taken by lanes that took
/// blocks of `lane_block` events, as this source's lanes do.
fn decode_position(bytes: &[u8], lane_block: u64) -> Result<(u64, Option<TimestampMs>), SluiceError> {
    let word = |at: usize| bytes.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let refuse = |what: String| {
        SluiceError::user("checkpoint.nexmark_position", what)
            .with_fix("start over with --from-scratch (the generator makes the same events again)")
    };
    if bytes.len() == 16 {
        return Err(refuse(
            "the checkpoint's nexmark positions come from an older Sluice, whose lanes took one event per \
             turn; this one's take blocks of events, so those positions do not say which events were read"
                .to_string(),
        ));
    }
    let (Some(&version), Some(block), Some(next), Some(watermark), 25) =
        (bytes.first(), word(1), word(9), word(17), bytes.len())
    else {
        return Err(SluiceError::internal(
            "source.position",
            format!("a nexmark position has 25 bytes, not {}", bytes.len()),
        ));
    };
    if version != POSITION_VERSION {
        return Err(refuse(format!(
            "the checkpoint's nexmark positions have layout version {version}; this Sluice reads version \
             {POSITION_VERSION}"
        )));
    }
    if block != lane_block {
        return Err(refuse(format!(
            "the checkpoint's nexmark lanes took blocks of {block} events, this source's take {lane_block}"
        )));
    }
    let watermark = watermark as i64;
    Ok((next, (watermark != i64::MIN).then_some(watermark)))
}

impl NexmarkLane {
    /// Every event it reads was generated, or it reads none of the tables.
    fn ended(&self) -> bool {
        self.needed.is_empty() || self.generator.is_exhausted()
    }

    /// [`LaneReader::poll`] as of the instant `now` (the wall clock, or a test's).
    pub fn poll_at(&mut self, now: Instant) -> LanePoll {
        if let Some(answer) = self.resumed() {
            return answer;
        }
        if self.ended() {
            return LanePoll::Exhausted;
        }
        let mut events = self.batch_size as u64;
        if let Some(remaining) = self.generator.remaining_events() {
            events = events.min(remaining);
        }
        if let Some(throttle) = &mut self.throttle {
            match throttle.permit(now, events) {
                Ok(permitted) => events = permitted,
                Err(until) => return LanePoll::Wait(until),
            }
        }
        let Some(generated) = self.generator.next_batch(usize::try_from(events).unwrap_or(usize::MAX)) else {
            return LanePoll::Exhausted;
        };
        if let Some(throttle) = &mut self.throttle {
            throttle.emitted += generated.events;
        }
        let batches = Table::all()
            .into_iter()
            .enumerate()
            .filter_map(|(index, table)| generated.table(table).map(|batch| (index, batch.clone())))
            .filter(|(_, batch)| batch.num_rows() > 0)
            .collect();
        let watermark: TimestampMs = generated.max_event_time_ms.saturating_sub(self.watermark_delay_ms);
        self.watermark = Some(watermark);
        LanePoll::Data { batches, watermark: Some(watermark) }
    }
}

impl LaneReader for NexmarkLane {
    fn poll(&mut self) -> Result<LanePoll, SluiceError> {
        sluice_types::failpoint!("source.poll");
        Ok(self.poll_at(Instant::now()))
    }

    fn position(&self) -> Vec<u8> {
        encode_position(self.generator.config().lane_block, self.generator.next_event_number(), self.watermark)
    }

    fn resumed(&mut self) -> Option<LanePoll> {
        if !std::mem::take(&mut self.resumed) {
            return None;
        }
        if self.ended() {
            return Some(LanePoll::Exhausted);
        }
        self.watermark.map(|watermark| LanePoll::Data { batches: Vec::new(), watermark: Some(watermark) })
    }
}

/// Paces one lane to `rate` events per second of wall clock.
///
/// Event `i` of the lane is due at `start + i / rate`, where `start` is the first
/// poll; one batch worth (`chunk` events) may be ahead of that schedule, so the first
/// batch goes at once and the average rate is exact.
#[derive(Debug)]
struct Throttle {
    /// Events per second for this lane.
    rate: f64,
    /// The events of one rate-limited batch: about [`RATE_BATCH_SPAN`] worth.
    chunk: u64,
    start: Option<Instant>,
    emitted: u64,
}

impl Throttle {
    fn new(rate: f64, batch_size: usize) -> Throttle {
        let span = (rate * RATE_BATCH_SPAN.as_secs_f64()).floor();
        let chunk = if span >= 1.0 { span as u64 } else { 1 };
        Throttle { rate, chunk: chunk.min(batch_size.max(1) as u64), start: None, emitted: 0 }
    }

    /// How many of the `wanted` next events may go now, or the instant to come back.
    fn permit(&mut self, now: Instant, wanted: u64) -> Result<u64, Instant> {
        let start = *self.start.get_or_insert(now);
        let elapsed = now.saturating_duration_since(start).as_secs_f64();
        let due = (elapsed * self.rate).floor() as u64;
        let allowance = (due + self.chunk).saturating_sub(self.emitted);
        if allowance >= self.chunk.min(wanted) {
            return Ok(allowance.min(wanted));
        }
        // The allowance reaches a chunk once `elapsed * rate >= emitted`.
        let nanos = (self.emitted as f64 * 1e9 / self.rate).ceil() + 1.0;
        Err(start + Duration::from_nanos(nanos.min(u64::MAX as f64) as u64))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, AsArray};
    use arrow::datatypes::TimestampMillisecondType;
    use sluice_runtime::metrics::SourceMetrics;

    use super::*;

    /// A nexmark source "gen" (seed 7, 1000 events per second of event time, watermark
    /// delay 500 ms) with `lanes` lanes, taking turns by 1000 events (10 under a rate).
    fn nexmark_source(events: Option<u64>, rate: Option<f64>, lanes: u32) -> Result<NexmarkSource, SluiceError> {
        let mut config = SourceConfig::new("gen", "nexmark");
        config.watermark_delay = Duration::from_millis(500);
        let options = NexmarkOptions { events, rate, seed: 7, first_event_rate: 1_000 };
        NexmarkSource::new(&config, &options, lanes)
    }

    fn open(source: &NexmarkSource, lane: u32, batch_size: usize, needed: [bool; 3]) -> Box<dyn LaneReader> {
        let context = LaneContext {
            lane,
            batch_size,
            tables_needed: needed.to_vec(),
            metrics: Arc::new(SourceMetrics::new("gen", source.lanes())),
            start: None,
        };
        source.open_lane(context).expect("lane opens")
    }

    /// Polls a lane to its end; returns rows per table and the watermarks seen.
    fn drain(lane: &mut dyn LaneReader) -> ([usize; 3], Vec<TimestampMs>) {
        let mut rows = [0; 3];
        let mut watermarks = Vec::new();
        loop {
            match lane.poll().expect("poll") {
                LanePoll::Data { batches, watermark } => {
                    for (table, batch) in batches {
                        rows[table] += batch.num_rows();
                        check_event_times(&batch, watermark);
                    }
                    watermarks.extend(watermark);
                }
                LanePoll::Wait(_) => panic!("an unlimited lane never waits"),
                LanePoll::Exhausted => return (rows, watermarks),
            }
        }
    }

    /// Every row of a batch is at or before the watermark after it plus the delay.
    fn check_event_times(batch: &arrow::record_batch::RecordBatch, watermark: Option<TimestampMs>) {
        let column = batch.column_by_name(EVENT_TIME_COLUMN).expect("dateTime column");
        let times = column.as_primitive::<TimestampMillisecondType>();
        let watermark = watermark.expect("nexmark has a watermark");
        assert_eq!(times.null_count(), 0);
        assert!(times.values().iter().all(|t| *t - 500 <= watermark));
    }

    /// Every row of every table, as text, sorted: what a set of lanes produced.
    fn all_rows(source: &NexmarkSource) -> [Vec<String>; 3] {
        let mut rows: [Vec<String>; 3] = Default::default();
        for lane in 0..source.lanes() {
            let mut reader = open(source, lane, 777, [true; 3]);
            loop {
                match reader.poll().expect("poll") {
                    LanePoll::Data { batches, .. } => {
                        for (table, batch) in batches {
                            for row in 0..batch.num_rows() {
                                let cells = batch.columns().iter().map(|column| {
                                    arrow::util::display::array_value_to_string(column, row).expect("a value")
                                });
                                rows[table].push(cells.collect::<Vec<_>>().join("|"));
                            }
                        }
                    }
                    LanePoll::Wait(_) => panic!("an unlimited lane never waits"),
                    LanePoll::Exhausted => break,
                }
            }
        }
        rows.iter_mut().for_each(|table| table.sort());
        rows
    }

    #[test]
    fn lanes_together_produce_every_event_once_in_the_standard_mix() {
        let source = nexmark_source(Some(10_000), None, 3).expect("source");
        assert_eq!(source.lanes(), 3);
        let mut total = [0; 3];
        for lane in 0..3 {
            let mut reader = open(&source, lane, 777, [true; 3]);
            let (rows, watermarks) = drain(reader.as_mut());
            assert!(watermarks.windows(2).all(|w| w[0] <= w[1]), "watermarks never decrease");
            assert!(!watermarks.is_empty());
            for table in 0..3 {
                total[table] += rows[table];
            }
        }
        assert_eq!(total, [200, 600, 9_200]);
        // Not only as many rows: the very rows one lane generates alone, none twice.
        let single = nexmark_source(Some(10_000), None, 1).expect("source");
        let (split, whole) = (all_rows(&source), all_rows(&single));
        for table in 0..3 {
            assert_eq!(
                split[table].len(),
                whole[table].len(),
                "table {table}: {} rows in three lanes, {} in one",
                split[table].len(),
                whole[table].len()
            );
            assert!(split[table] == whole[table], "table {table}: three lanes differ from one");
            assert!(whole[table].windows(2).all(|pair| pair[0] != pair[1]), "table {table}: a row twice");
        }
    }

    #[test]
    fn only_needed_tables_are_produced() {
        let source = nexmark_source(Some(1_000), None, 1).expect("source");
        let mut reader = open(&source, 0, 100, [false, false, true]);
        let (rows, _) = drain(reader.as_mut());
        assert_eq!(rows, [0, 0, 920]);
        let mut nothing = open(&source, 0, 100, [false; 3]);
        assert!(matches!(nothing.poll().expect("poll"), LanePoll::Exhausted));
    }

    #[test]
    fn a_lane_without_events_is_exhausted() {
        let source = nexmark_source(Some(2), None, 4).expect("source");
        let mut reader = open(&source, 3, 100, [true; 3]);
        assert!(matches!(reader.poll().expect("poll"), LanePoll::Exhausted));
    }

    fn nexmark_lane(rate: f64, lanes: u32, batch_size: usize) -> NexmarkLane {
        let source = nexmark_source(None, Some(rate), lanes).expect("source");
        NexmarkLane {
            generator: LaneGenerator::new(&source.generator, 0, lanes, TableSet::all()),
            needed: TableSet::all(),
            batch_size,
            throttle: source.rate.map(|rate| Throttle::new(rate / f64::from(lanes), batch_size)),
            watermark_delay_ms: 0,
            watermark: None,
            resumed: false,
        }
    }

    #[test]
    fn a_lane_resumed_from_its_position_continues_with_the_same_rows_and_watermark() {
        let source = nexmark_source(Some(5_000), None, 2).expect("source");
        let open = |start: Option<Vec<u8>>| {
            let context = LaneContext {
                lane: 1,
                batch_size: 100,
                tables_needed: vec![true, true, true],
                metrics: Arc::new(SourceMetrics::new("gen", 2)),
                start,
            };
            source.open_lane(context).expect("lane opens")
        };
        let mut whole = open(None);
        assert!(whole.resumed().is_none(), "a lane opened at its start has nothing to tell");
        let mut rows_after = Vec::new();
        let mut position = None;
        let mut watermark_at_position = None;
        for poll in 0.. {
            match whole.poll().expect("poll") {
                LanePoll::Data { batches, watermark } => {
                    if poll == 3 {
                        position = Some(whole.position());
                        watermark_at_position = watermark;
                    } else if poll > 3 {
                        rows_after.extend(batches.into_iter().map(|(table, batch)| (table, batch.num_rows())));
                    }
                }
                LanePoll::Exhausted => break,
                LanePoll::Wait(_) => unreachable!("no rate limit"),
            }
        }
        let mut resumed = open(position.clone());
        let first = resumed.poll().expect("poll");
        assert!(
            matches!(&first, LanePoll::Data { batches, watermark } if batches.is_empty() && *watermark == watermark_at_position),
            "a resumed lane first reports its watermark"
        );
        let mut resumed_rows = Vec::new();
        while let LanePoll::Data { batches, .. } = resumed.poll().expect("poll") {
            resumed_rows.extend(batches.into_iter().map(|(table, batch)| (table, batch.num_rows())));
        }
        assert_eq!(resumed_rows, rows_after);
        // The driver takes the same answer without a poll, once; and a lane resumed at
        // its end says so without reading.
        let mut resumed = open(position);
        let told = resumed.resumed();
        assert!(
            matches!(&told, Some(LanePoll::Data { batches, watermark }) if batches.is_empty() && *watermark == watermark_at_position),
            "the resumed watermark, told without a poll"
        );
        assert!(resumed.resumed().is_none(), "told once");
        assert!(matches!(resumed.poll().expect("poll"), LanePoll::Data { batches, .. } if !batches.is_empty()));
        let mut ended = open(Some(whole.position()));
        assert!(matches!(ended.resumed(), Some(LanePoll::Exhausted)), "a lane resumed at its end says so");
    }

    fn events_of(poll: &LanePoll) -> Option<usize> {
        match poll {
            LanePoll::Data { batches, .. } => Some(batches.iter().map(|(_, b)| b.num_rows()).sum()),
            _ => None,
        }
    }

    #[test]
    fn a_rate_limited_lane_waits_until_its_next_batch_is_due() {
        // 2000 events/s over 2 lanes: 1000/s per lane, batches of 100 ms = 100 events.
        let mut lane = nexmark_lane(2_000.0, 2, 8192);
        let t0 = Instant::now();
        assert_eq!(events_of(&lane.poll_at(t0)), Some(100), "the first batch goes at once");
        let next = Duration::from_millis(100);
        for now in [t0, t0 + Duration::from_millis(50), t0 + Duration::from_millis(99)] {
            match lane.poll_at(now) {
                LanePoll::Wait(until) => {
                    assert!(until >= t0 + next && until <= t0 + next + Duration::from_millis(1));
                }
                _ => panic!("a lane ahead of its schedule waits"),
            }
        }
        assert_eq!(events_of(&lane.poll_at(t0 + next + Duration::from_micros(10))), Some(100));
        // After a stall it catches up, in batches of at most batch_size events.
        assert_eq!(events_of(&lane.poll_at(t0 + Duration::from_secs(20))), Some(8192));
    }

    #[test]
    fn a_tiny_rate_sends_one_event_at_a_time() {
        let mut lane = nexmark_lane(0.5, 1, 8192);
        let t0 = Instant::now();
        assert_eq!(events_of(&lane.poll_at(t0)), Some(1));
        let LanePoll::Wait(until) = lane.poll_at(t0 + Duration::from_secs(1)) else {
            panic!("waits for the next event");
        };
        let delay = until - t0;
        assert!(delay >= Duration::from_secs(2) && delay < Duration::from_millis(2_001), "{delay:?}");
        assert_eq!(events_of(&lane.poll_at(until)), Some(1));
    }

    #[test]
    fn describe_names_the_options() {
        let source = nexmark_source(Some(1_000_000), None, 2).expect("source");
        assert_eq!(
            source.describe(),
            "nexmark(events=1000000, rate=unlimited, seed=7, blocks of 1000 events, lanes within 10000 ms)"
        );
        let source = nexmark_source(None, Some(5000.0), 2).expect("source");
        assert_eq!(
            source.describe(),
            "nexmark(events=unbounded, rate=5000, seed=7, blocks of 10 events, lanes within 10000 ms)"
        );
        let source = nexmark_source(Some(10), None, 2).expect("source");
        assert_eq!(
            source.describe(),
            "nexmark(events=10, rate=unlimited, seed=7, one event per turn, lanes within 10000 ms)"
        );
        assert_eq!(source.tables()[2].name, "bid");
        assert_eq!(source.tables()[0].event_time.as_deref(), Some("dateTime"));
    }

    #[test]
    fn lanes_take_up_to_one_second_of_events_per_turn_10_ms_under_a_rate_and_16_turns_at_least() {
        let drift = 10_000;
        assert_eq!(lane_block(None, 10_000, None, 2, drift), 8192);
        assert_eq!(lane_block(None, 1_000, None, 2, drift), 1_000);
        assert_eq!(lane_block(None, 1, None, 2, drift), 1);
        assert_eq!(lane_block(Some(1e6), 1_000_000, None, 2, drift), 8192);
        assert_eq!(lane_block(Some(5000.0), 5000, None, 2, drift), 50);
        assert_eq!(lane_block(Some(10.0), 10, None, 2, drift), 1);
        // A round of 16 lanes' turns spans at most 5 s: 312 ms a turn.
        assert_eq!(lane_block(None, 10_000, None, 16, drift), 3_120);
        assert_eq!(lane_block(None, 10_000, None, 2, 100), 250);
        // A bounded run: at least 16 turns per lane.
        assert_eq!(lane_block(None, 10_000, Some(10_000_000), 2, drift), 8192);
        assert_eq!(lane_block(None, 10_000, Some(4_000), 2, drift), 125);
        assert_eq!(lane_block(None, 10_000, Some(4_031), 2, drift), 125);
        assert_eq!(lane_block(None, 10_000, Some(3), 4, drift), 1);
        for (events, lanes) in [(33u64, 2u32), (100, 4), (4_031, 2), (1_000_003, 7)] {
            let block = lane_block(None, 10_000, Some(events), lanes, drift);
            let turns_of_the_last_lane =
                (events / block).saturating_sub(u64::from(lanes) - 1).div_ceil(u64::from(lanes));
            assert!(turns_of_the_last_lane >= MIN_TURNS_PER_LANE, "{events} events over {lanes} lanes: block {block}");
        }
    }

    #[test]
    fn a_restore_keeps_the_recorded_block_and_a_cluster_agrees_on_the_stream() {
        let mut config = SourceConfig::new("gen", "nexmark");
        config.watermark_delay = Duration::from_millis(500);
        let options = NexmarkOptions { events: Some(1_000_000), rate: None, seed: 7, first_event_rate: 10_000 };
        let source = NexmarkSource::new(&config, &options, 2).expect("source");
        assert_eq!(source.layout(), encode_layout(8192));
        assert_eq!(decode_layout(&source.layout()).expect("decodes"), 8192);
        // Resumed with fewer events (a smaller block) but the recorded layout: blocks of 8192.
        let fewer = NexmarkOptions { events: Some(100_000), ..options };
        let context = |layout: Option<Vec<u8>>| SourceContext {
            config: &config,
            base_dir: std::path::Path::new("."),
            lane_threads: 2,
            schema: None,
            layout,
            exactly_once: false,
            workers: 1,
        };
        let resumed = ConfiguredNexmark { options: fewer }.build(&context(Some(source.layout()))).expect("builds");
        assert_eq!(resumed.layout(), encode_layout(8192));
        let fresh = ConfiguredNexmark { options: fewer }.build(&context(None)).expect("builds");
        assert_eq!(fresh.layout(), encode_layout(3_125));
        let damaged = ConfiguredNexmark { options: fewer }.build(&context(Some(vec![2, 0, 0]))).err().expect("refused");
        assert!(damaged.to_string().contains("--from-scratch"), "{damaged}");
        // Workers generating other streams would not agree.
        let other_seed = NexmarkSource::new(&config, &NexmarkOptions { seed: 8, ..options }, 2).expect("source");
        assert_ne!(source.content_identity(), other_seed.content_identity());
        let throttled = NexmarkSource::new(&config, &NexmarkOptions { rate: Some(1e6), ..options }, 2).expect("source");
        assert_ne!(source.content_identity(), throttled.content_identity());
        let more_threads = NexmarkSource::new(&config, &options, 4).expect("source");
        assert_eq!(source.content_identity(), more_threads.content_identity(), "lanes are the layout's to agree on");
    }

    #[test]
    fn positions_are_pinned_by_golden_vectors() {
        let golden: [(u64, u64, Option<TimestampMs>, &str); 2] = [
            (8192, 16_384, None, "01 0020000000000000 0040000000000000 0000000000000080"),
            (100, 12_345, Some(1_767_225_600_500), "01 6400000000000000 3930000000000000 f4a9da769b010000"),
        ];
        for (block, next, watermark, hex) in golden {
            let bytes = encode_position(block, next, watermark);
            let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(text, hex.replace(' ', ""));
            assert_eq!(decode_position(&bytes, block).expect("decodes"), (next, watermark));
        }
    }

    #[test]
    fn a_position_of_other_lanes_is_refused_with_the_fix() {
        let old = [0u8; 16];
        let refused = decode_position(&old, 8192).expect_err("an older layout");
        assert!(refused.to_string().contains("older Sluice"), "{refused}");
        assert!(refused.to_string().contains("--from-scratch"), "{refused}");
        let other_block = encode_position(100, 0, None);
        let refused = decode_position(&other_block, 8192).expect_err("another block");
        assert!(refused.to_string().contains("blocks of 100 events, this source's take 8192"), "{refused}");
        let mut future = encode_position(8192, 0, None);
        future[0] = 2;
        assert!(decode_position(&future, 8192).expect_err("a later version").to_string().contains("version 2"));
        assert!(decode_position(&[1, 2, 3], 8192).is_err());
    }

    #[test]
    fn a_bad_rate_is_a_user_error() {
        let error = nexmark_source(None, Some(0.0), 1).expect_err("rejected");
        assert_eq!(error.code, "source.nexmark_rate");
        assert!(error.fix.is_some());
    }
}
