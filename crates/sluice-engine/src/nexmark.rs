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

/// The benchmark's queries: NEXMark's, as Flink's NEXMark repository writes them (all
/// but q6's OVER window, q10's partitioned file sink, q12's processing time, q13's side
/// input file and q14's user-defined function), and a few of Sluice's own.
pub const QUERIES: &[&str] = &[
    "source",
    "q0",
    "q1",
    "q2",
    "q3",
    "q4",
    "q5",
    "q7",
    "q8",
    "q9",
    "q11",
    "q15",
    "q16",
    "q17",
    "q18",
    "q19",
    "q20",
    "q21",
    "q22",
    "tumble",
    "running",
    "state",
    "state_day",
];

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
        "q0" => "SELECT auction, bidder, price, `dateTime`, extra FROM bid",
        "q1" => Q1,
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
        "q3" => Q3,
        "q4" => Q4,
        "q5" => Q5,
        "q7" => Q7,
        "q8" => Q8,
        "q9" => Q9,
        "q11" => Q11,
        "q15" => Q15,
        "q16" => Q16,
        "q17" => Q17,
        "q18" => Q18,
        "q19" => Q19,
        "q20" => Q20,
        "q21" => Q21,
        "q22" => Q22,
        _ => return None,
    })
}

/// The tables a query reads (the CSV mode needs a file of each).
pub fn query_tables(query: &str) -> Vec<Table> {
    let Some(sql) = query_sql(query) else { return Vec::new() };
    let read = sluice_sql::tables_read(sql).unwrap_or_default();
    [(Table::Person, "person"), (Table::Auction, "auction"), (Table::Bid, "bid")]
        .into_iter()
        .filter(|(_, name)| read.iter().any(|table| table.eq_ignore_ascii_case(name)))
        .map(|(table, _)| table)
        .collect()
}

// NEXMark's queries, their SELECT text as in Flink's NEXMark repository
// (`nexmark-flink/src/main/resources/queries/qN.sql`, the statement after `INSERT INTO`).

const Q1: &str = "SELECT
    auction,
    bidder,
    0.908 * price as price, -- convert dollar to euro
    `dateTime`,
    extra
FROM bid";

const Q3: &str = "SELECT
    P.name, P.city, P.state, A.id
FROM
    auction AS A INNER JOIN person AS P on A.seller = P.id
WHERE
    A.category = 10 and (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')";

const Q4: &str = "SELECT
    Q.category,
    AVG(Q.final)
FROM (
    SELECT MAX(B.price) AS final, A.category
    FROM auction A, bid B
    WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires
    GROUP BY A.id, A.category
) Q
GROUP BY Q.category";

const Q5: &str = "SELECT AuctionBids.auction, AuctionBids.num
 FROM (
   SELECT
     auction,
     count(*) AS num,
     window_start AS starttime,
     window_end AS endtime
     FROM TABLE(
             HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
     GROUP BY auction, window_start, window_end
 ) AS AuctionBids
 JOIN (
   SELECT
     max(CountBids.num) AS maxn,
     CountBids.starttime,
     CountBids.endtime
   FROM (
     SELECT
       count(*) AS num,
       window_start AS starttime,
       window_end AS endtime
     FROM TABLE(
                HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
     GROUP BY auction, window_start, window_end
     ) AS CountBids
   GROUP BY CountBids.starttime, CountBids.endtime
 ) AS MaxBids
 ON AuctionBids.starttime = MaxBids.starttime AND
    AuctionBids.endtime = MaxBids.endtime AND
    AuctionBids.num >= MaxBids.maxn";

const Q7: &str = "SELECT B.auction, B.price, B.bidder, B.`dateTime`, B.extra
from bid B
JOIN (
  SELECT MAX(price) AS maxprice, window_end as `dateTime`
  FROM TABLE(
          TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
  GROUP BY window_start, window_end
) B1
ON B.price = B1.maxprice
WHERE B.`dateTime` BETWEEN B1.`dateTime`  - INTERVAL '10' SECOND AND B1.`dateTime`";

const Q8: &str = "SELECT P.id, P.name, P.starttime
FROM (
  SELECT id, name,
        window_start AS starttime,
        window_end AS endtime
  FROM TABLE(
            TUMBLE(TABLE person, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
  GROUP BY id, name, window_start, window_end
) P
JOIN (
  SELECT seller,
        window_start AS starttime,
        window_end AS endtime
  FROM TABLE(
        TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
  GROUP BY seller, window_start, window_end
) A
ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime";

const Q9: &str = "SELECT
    id, itemName, description, initialBid, reserve, `dateTime`, expires, seller, category, extra,
    auction, bidder, price, bid_dateTime, bid_extra
FROM (
   SELECT A.*, B.auction, B.bidder, B.price, B.`dateTime` AS bid_dateTime, B.extra AS bid_extra,
     ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.`dateTime` ASC) AS rownum
   FROM auction A, bid B
   WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires
)
WHERE rownum <= 1";

const Q11: &str = "SELECT
    B.bidder,
    count(*) as bid_count,
    SESSION_START(B.`dateTime`, INTERVAL '10' SECOND) as starttime,
    SESSION_END(B.`dateTime`, INTERVAL '10' SECOND) as endtime
FROM bid B
GROUP BY B.bidder, SESSION(B.`dateTime`, INTERVAL '10' SECOND)";

const Q15: &str = "SELECT
     DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`,
     count(*) AS total_bids,
     count(*) filter (where price < 10000) AS rank1_bids,
     count(*) filter (where price >= 10000 and price < 1000000) AS rank2_bids,
     count(*) filter (where price >= 1000000) AS rank3_bids,
     count(distinct bidder) AS total_bidders,
     count(distinct bidder) filter (where price < 10000) AS rank1_bidders,
     count(distinct bidder) filter (where price >= 10000 and price < 1000000) AS rank2_bidders,
     count(distinct bidder) filter (where price >= 1000000) AS rank3_bidders,
     count(distinct auction) AS total_auctions,
     count(distinct auction) filter (where price < 10000) AS rank1_auctions,
     count(distinct auction) filter (where price >= 10000 and price < 1000000) AS rank2_auctions,
     count(distinct auction) filter (where price >= 1000000) AS rank3_auctions
FROM bid
GROUP BY DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')";

const Q16: &str = "SELECT
    channel,
    DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`,
    max(DATE_FORMAT(`dateTime`, 'HH:mm')) as `minute`,
    count(*) AS total_bids,
    count(*) filter (where price < 10000) AS rank1_bids,
    count(*) filter (where price >= 10000 and price < 1000000) AS rank2_bids,
    count(*) filter (where price >= 1000000) AS rank3_bids,
    count(distinct bidder) AS total_bidders,
    count(distinct bidder) filter (where price < 10000) AS rank1_bidders,
    count(distinct bidder) filter (where price >= 10000 and price < 1000000) AS rank2_bidders,
    count(distinct bidder) filter (where price >= 1000000) AS rank3_bidders,
    count(distinct auction) AS total_auctions,
    count(distinct auction) filter (where price < 10000) AS rank1_auctions,
    count(distinct auction) filter (where price >= 10000 and price < 1000000) AS rank2_auctions,
    count(distinct auction) filter (where price >= 1000000) AS rank3_auctions
FROM bid
GROUP BY channel, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')";

const Q17: &str = "SELECT
     auction,
     DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`,
     count(*) AS total_bids,
     count(*) filter (where price < 10000) AS rank1_bids,
     count(*) filter (where price >= 10000 and price < 1000000) AS rank2_bids,
     count(*) filter (where price >= 1000000) AS rank3_bids,
     min(price) AS min_price,
     max(price) AS max_price,
     avg(price) AS avg_price,
     sum(price) AS sum_price
FROM bid
GROUP BY auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')";

const Q18: &str = "SELECT auction, bidder, price, channel, url, `dateTime`, extra
 FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY `dateTime` DESC) AS rank_number
       FROM bid)
 WHERE rank_number <= 1";

const Q19: &str = "SELECT * FROM
(SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number FROM bid)
WHERE rank_number <= 10";

const Q20: &str = "SELECT
    auction, bidder, price, channel, url, B.`dateTime`, B.extra,
    itemName, description, initialBid, reserve, A.`dateTime`, expires, seller, category, A.extra
FROM
    bid AS B INNER JOIN auction AS A on B.auction = A.id
WHERE A.category = 10";

const Q21: &str = "SELECT
    auction, bidder, price, channel,
    CASE
        WHEN lower(channel) = 'apple' THEN '0'
        WHEN lower(channel) = 'google' THEN '1'
        WHEN lower(channel) = 'facebook' THEN '2'
        WHEN lower(channel) = 'baidu' THEN '3'
        ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)
        END
    AS channel_id FROM bid
    where REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) is not null or
          lower(channel) in ('apple', 'google', 'facebook', 'baidu')";

const Q22: &str = "SELECT
    auction, bidder, price, channel,
    SPLIT_INDEX(url, '/', 3) as dir1,
    SPLIT_INDEX(url, '/', 4) as dir2,
    SPLIT_INDEX(url, '/', 5) as dir3 FROM bid";

/// The state memory a benchmark keeps unless told otherwise: the pipeline's default.
pub use sluice_config::DEFAULT_STATE_MEMORY_MIB;

/// What a benchmark run reads and how it checkpoints.
#[derive(Debug, Clone)]
pub struct BenchSetup<'a> {
    pub query: &'a str,
    pub events: u64,
    pub threads: u32,
    /// Read bids from this CSV file (with a header line) instead of the generator; a
    /// directory holds `person.csv`, `auction.csv` and `bid.csv` (those the query reads).
    pub csv: Option<&'a Path>,
    /// Checkpoints at this interval into the store at this URL.
    pub checkpoint: Option<(Duration, String)>,
    /// `[pipeline] state_memory_mib`.
    pub state_memory_mib: u32,
}

fn at() -> Position {
    Position::new(1, 1)
}

/// `query` is none of [`QUERIES`].
pub fn unknown_query(query: &str) -> SluiceError {
    SluiceError::user("bench.query", format!("unknown query `{query}`"))
        .with_fix(format!("choose among {}", QUERIES.join(", ")))
}

/// The pipeline of one benchmark query: the input, the query as view `result`, a
/// blackhole sink.
pub fn bench_config(setup: &BenchSetup<'_>) -> Result<PipelineConfig, SluiceError> {
    let sql = query_sql(setup.query).ok_or_else(|| unknown_query(setup.query))?;
    let sources = match setup.csv {
        None => {
            let mut source = SourceConfig::new("nexmark", "nexmark");
            let events = i64::try_from(setup.events).unwrap_or(i64::MAX);
            source.options.set("events", events);
            vec![source]
        }
        Some(path) if path.is_dir() => query_tables(setup.query)
            .into_iter()
            .map(|table| csv_source(table, &path.join(format!("{}.csv", table_name(table)))))
            .collect::<Result<Vec<_>, _>>()?,
        Some(path) => {
            let others: Vec<&str> =
                query_tables(setup.query).into_iter().filter(|t| *t != Table::Bid).map(table_name).collect();
            if !others.is_empty() {
                return Err(SluiceError::user(
                    "bench.csv",
                    format!("query {} reads {} besides bid; {} is one file", setup.query, others.join(" and "), path.display()),
                )
                .with_fix("give --csv a directory holding person.csv, auction.csv and bid.csv (`sluice nexmark generate --table …`)"));
            }
            vec![csv_source(Table::Bid, path)?]
        }
    };
    let mut pipeline = PipelineSection::named(&format!("nexmark-{}", setup.query));
    pipeline.threads = setup.threads;
    pipeline.state_memory_mib = setup.state_memory_mib;
    let checkpoint = setup.checkpoint.as_ref().map(|(interval, store)| CheckpointSection {
        interval: *interval,
        timeout: sluice_config::DEFAULT_CHECKPOINT_TIMEOUT,
        store: store.clone(),
        guarantee: Guarantee::ExactlyOnce,
        retain: DEFAULT_RETAIN,
        max_failed_checkpoints: DEFAULT_MAX_FAILED_CHECKPOINTS,
        compression: sluice_config::Compression::Lz4Merged,
    });
    Ok(PipelineConfig {
        pipeline,
        checkpoint,
        sources,
        views: vec![ViewConfig {
            name: "result".into(),
            sql: Located::new(sql.into(), at()),
            materialized: None,
            state_ttl: None,
            position: at(),
        }],
        sinks: vec![SinkConfig::new("blackhole", "result", "blackhole")],
    })
}

fn table_name(table: Table) -> &'static str {
    match table {
        Table::Person => "person",
        Table::Auction => "auction",
        Table::Bid => "bid",
    }
}

/// A file source named after `table`, reading its CSV (with a header line) at `path`.
fn csv_source(table: Table, path: &Path) -> Result<SourceConfig, SluiceError> {
    let columns = sluice_nexmark::schema(table)
        .fields()
        .iter()
        .map(|field| Ok(format!("{} {}", field.name(), crate::fingerprint::canonical_type(field.data_type())?)))
        .collect::<Result<Vec<_>, SluiceError>>()?;
    let mut source = SourceConfig::new(table_name(table), "file");
    source.format = Some(Located::new("csv".into(), at()));
    source.schema = Some(Located::new(columns.join(", "), at()));
    source.event_time = Some("dateTime".into());
    source.options.set("path", path.display().to_string()).set("header", true);
    Ok(source)
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

#[cfg(test)]
mod query_tests {
    use super::*;

    #[test]
    fn each_query_reads_the_tables_in_its_from_clauses_not_columns_named_alike() {
        assert_eq!(query_tables("q2"), [Table::Bid], "`auction` is a column of bid there");
        assert_eq!(query_tables("q3"), [Table::Person, Table::Auction], "in the order of the three tables");
        assert_eq!(query_tables("q8"), [Table::Person, Table::Auction]);
        assert_eq!(query_tables("q9"), [Table::Auction, Table::Bid]);
        assert!(QUERIES.iter().all(|q| !query_tables(q).is_empty()), "every query reads a table");
    }

    /// The `explain` text of a bench query's pipeline.
    fn explained(query: &str) -> String {
        let setup = BenchSetup {
            query,
            events: 1000,
            threads: 1,
            csv: None,
            checkpoint: None,
            state_memory_mib: sluice_config::DEFAULT_STATE_MEMORY_MIB,
        };
        let config = bench_config(&setup).expect("config");
        let pipeline = crate::Engine::default()
            .configure(config, &format!("<nexmark {query}>"), Path::new("."), crate::load::Overrides::default())
            .expect("the query plans");
        pipeline.explain().expect("explain").to_string()
    }

    /// q8 joins two window aggregates on their bounds: planned as a window join, whose
    /// rows are freed as the watermark passes each window's end.
    #[test]
    fn q8_is_planned_as_a_window_join() {
        let explained = explained("q8");
        assert!(
            explained
                .contains("(window join: state kept until the watermark passes P.endtime - 1 ms / A.endtime - 1 ms)"),
            "{explained}"
        );
    }

    /// q7 joins bids to each window's highest price, the bid's time within the 10 s
    /// before the window's end: planned as an interval join (the window's end bounds as an
    /// event time), each bid freed 10 s after its time and each window's maximum at its
    /// end, instead of a regular join holding every bid.
    #[test]
    fn q7_is_planned_as_an_interval_join() {
        let explained = explained("q7");
        assert!(
            explained.contains(
                "(interval join: state kept until the watermark passes B.dateTime + 10000 ms / B1.dateTime + 0 ms)"
            ),
            "{explained}"
        );
    }
}
