//! NEXMark's queries against Apache Flink's own answers.
//!
//! `tests/nexmark-oracle/qN.csv` holds what Apache Flink answers to query qN (the text
//! `sluice nexmark sql qN` prints) over the events of `sluice nexmark generate --events
//! 20000 --seed 0`; `scripts/nexmark-oracle.py` wrote them and documents their canonical
//! form, which this test renders Sluice's rows in. Flink is not needed here.
//!
//! For every query with a stored answer, Sluice runs the same text over the same three
//! tables as CSV files (the file sources `nexmark query --csv DIR` builds), with 1 and 2
//! threads, into a JSON file sink; the changelog is integrated (every `+I`/`+U` added,
//! every `-U`/`-D` removed) and compared with Flink's answer. The query also runs over the
//! `nexmark` source with the same event count and seed (the same events), with 1 and 2
//! threads, and must give the same answer as the CSV run; the 2-thread run keeps no
//! spillable state in memory (`state_memory_mib = 0`), so a join's and a TopN's rows
//! are read back from their spill files, and a group aggregate's groups from its cold
//! runs.
//!
//! Comparisons are exact, row for row (duplicates count), except:
//! - Column names are compared where Flink names the column after the query's text; a
//!   name Flink makes up (`EXPR$1` for an unnamed expression, `dateTime0` for a second
//!   `dateTime`) is not compared, the number of columns is.
//! - ROW_NUMBER keeps one row (or ten) per partition, and among rows with equal sort keys
//!   the one kept is not determined by the query: each engine may keep another. For q9,
//!   q18 and q19 the test compares exactly what is determined, the multiset of the kept
//!   rows' partition and sort-key columns (and rank numbers for q19, whose `SELECT *`
//!   shows them; the price at each rank is determined), checks that every row Sluice
//!   kept is a row of the input (its bid columns are a row of bid.csv), and compares
//!   whole every kept row that ties with no other bid (no other bid has its partition and
//!   sort key). See `TOP_N`. (With this input, q18 keeps another of two tied bids than
//!   Flink in about 20 of its 4988 partitions; q9 and q19 happen to agree whole.)
//! - Queries in `KNOWN_DIFFERENT` are where Sluice's answer is not Flink's: the test
//!   checks that the difference is still there (so that a fix moves the query back to the
//!   exact comparison) and that Sluice at least agrees with itself across threads and
//!   inputs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::harness::{Scratch, crate_dir, stderr, stdout};

/// The input of the stored answers (also in the directory's README, checked below).
const EVENTS: u64 = 20_000;
const SEED: u64 = 0;

/// Columns of the tables, in their CSV files' order, with the types the file sources read.
const TABLES: &[(&str, &str)] = &[
    (
        "person",
        "id BIGINT, name VARCHAR, emailAddress VARCHAR, creditCard VARCHAR, city VARCHAR, state VARCHAR, \
         dateTime TIMESTAMP(3), extra VARCHAR",
    ),
    (
        "auction",
        "id BIGINT, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT, \
         dateTime TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra VARCHAR",
    ),
    (
        "bid",
        "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, dateTime TIMESTAMP(3), extra VARCHAR",
    ),
];

/// A ROW_NUMBER query: the columns whose values the query determines (partition key, sort
/// key, rank), where the kept row's bid columns are (as indexes into the answer, in
/// bid.csv's column order; `None` for a bid column the answer does not show), and the bid
/// columns (indexes into bid.csv's) that make up partition and sort key: a kept row whose
/// values of these are those of no other bid has no tie, and is compared whole.
struct TopN {
    query: &'static str,
    determined: &'static [usize],
    bid_columns: [Option<usize>; 7],
    tie_key: &'static [usize],
}

const TOP_N: &[TopN] = &[
    // PARTITION BY A.id ORDER BY B.price DESC, B.dateTime ASC: the auction's columns
    // (0-9), price (12) and bid_dateTime (13); bidder and bid_extra are not determined.
    TopN {
        query: "q9",
        determined: &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13],
        bid_columns: [Some(10), Some(11), Some(12), None, None, Some(13), Some(14)],
        tie_key: &[0, 2, 5],
    },
    // PARTITION BY bidder, auction ORDER BY dateTime DESC.
    TopN {
        query: "q18",
        determined: &[0, 1, 5],
        bid_columns: [Some(0), Some(1), Some(2), Some(3), Some(4), Some(5), Some(6)],
        tie_key: &[0, 1, 5],
    },
    // PARTITION BY auction ORDER BY price DESC, rank_number <= 10: auction, price, rank.
    // A bid whose price no other bid of its auction has has a determined rank, too.
    TopN {
        query: "q19",
        determined: &[0, 2, 7],
        bid_columns: [Some(0), Some(1), Some(2), Some(3), Some(4), Some(5), Some(6)],
        tie_key: &[0, 2],
    },
];

/// Queries whose answer in Sluice is not Flink's, and how (the exact rows are in the
/// failure message when the test is run with the query removed from this list).
const KNOWN_DIFFERENT: &[(&str, &str)] = &[];

fn oracle_dir() -> PathBuf {
    crate_dir().join("tests").join("nexmark-oracle")
}

/// Flink's answer: column names and canonical rows, sorted.
struct Answer {
    names: Vec<String>,
    rows: Vec<String>,
}

fn stored_answer(query: &str) -> Option<Answer> {
    let text = std::fs::read_to_string(oracle_dir().join(format!("{query}.csv"))).ok()?;
    let mut lines = text.lines();
    let names = lines.next().expect("a header line").split(',').map(str::to_string).collect();
    let rows: Vec<String> = lines.map(str::to_string).collect();
    let mut sorted = rows.clone();
    sorted.sort();
    assert_eq!(rows, sorted, "{query}.csv is not sorted: regenerate it with scripts/nexmark-oracle.py");
    Some(Answer { names, rows })
}

/// The exact decimal text of a JSON number: no exponent, no sign for zero, no trailing
/// zeros after the point (the oracle's canonical form).
fn number_text(raw: &str) -> String {
    let (negative, unsigned) = raw.strip_prefix('-').map_or((false, raw), |rest| (true, rest));
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], unsigned[at + 1..].parse::<i64>().expect("exponent")),
        None => (unsigned, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = format!("{whole}{fraction}");
    let point = whole.len() as i64 + exponent;
    let (int_part, frac_part) = if point <= 0 {
        ("0".to_string(), format!("{}{digits}", "0".repeat((-point) as usize)))
    } else if point as usize >= digits.len() {
        (format!("{digits}{}", "0".repeat(point as usize - digits.len())), String::new())
    } else {
        (digits[..point as usize].to_string(), digits[point as usize..].to_string())
    };
    let int_part = int_part.trim_start_matches('0');
    let frac_part = frac_part.trim_end_matches('0');
    let int_part = if int_part.is_empty() { "0" } else { int_part };
    if int_part == "0" && frac_part.is_empty() {
        return "0".into();
    }
    let sign = if negative { "-" } else { "" };
    if frac_part.is_empty() { format!("{sign}{int_part}") } else { format!("{sign}{int_part}.{frac_part}") }
}

fn quoted(text: &str) -> String {
    assert!(!text.contains(['\n', '\r']), "a value with a line break: {text:?}");
    format!("\"{}\"", text.replace('"', "\"\""))
}

/// One JSON line of the sink (a flat object), as (name, canonical field) in column order:
/// read by hand so that the column order, repeated names and numbers' exact text stay.
fn json_row(line: &str) -> Vec<(String, String)> {
    let bytes = line.as_bytes();
    let mut at = 0;
    let skip_space = |at: &mut usize| {
        while *at < bytes.len() && bytes[*at].is_ascii_whitespace() {
            *at += 1;
        }
    };
    // The end (exclusive) of the JSON string starting at `start` (a quote).
    let string_end = |start: usize| {
        let mut i = start + 1;
        while bytes[i] != b'"' {
            i += if bytes[i] == b'\\' { 2 } else { 1 };
        }
        i + 1
    };
    let expect = |at: &mut usize, byte: u8| {
        assert_eq!(bytes.get(*at), Some(&byte), "unexpected JSON at byte {at} of {line}");
        *at += 1;
    };
    let mut row = Vec::new();
    skip_space(&mut at);
    expect(&mut at, b'{');
    loop {
        skip_space(&mut at);
        if bytes[at] == b'}' {
            break;
        }
        let end = string_end(at);
        let name: String = serde_json::from_str(&line[at..end]).expect("a column name");
        at = end;
        skip_space(&mut at);
        expect(&mut at, b':');
        skip_space(&mut at);
        let value = if bytes[at] == b'"' {
            let end = string_end(at);
            let text: String = serde_json::from_str(&line[at..end]).expect("a string value");
            at = end;
            quoted(&text)
        } else {
            let start = at;
            while at < bytes.len() && !matches!(bytes[at], b',' | b'}') && !bytes[at].is_ascii_whitespace() {
                at += 1;
            }
            match &line[start..at] {
                "null" => String::new(),
                "true" | "false" => line[start..at].to_string(),
                number => number_text(number),
            }
        };
        row.push((name, value));
        skip_space(&mut at);
        if bytes[at] == b',' {
            at += 1;
        }
    }
    row
}

/// What a run wrote: the column names and the integrated rows, canonical and sorted.
struct Run {
    names: Vec<String>,
    rows: Vec<String>,
}

fn integrate(output: &str) -> Run {
    let mut names = Vec::new();
    let mut table: BTreeMap<String, i64> = BTreeMap::new();
    for line in output.lines().filter(|l| !l.trim().is_empty()) {
        let mut row = json_row(line);
        let op = if row.first().is_some_and(|(name, _)| name == "op") { Some(row.remove(0).1) } else { None };
        if names.is_empty() {
            names = row.iter().map(|(name, _)| name.clone()).collect();
        }
        let text = row.into_iter().map(|(_, value)| value).collect::<Vec<_>>().join(",");
        let count = table.entry(text).or_insert(0);
        match op.as_deref() {
            None | Some("\"+I\"") | Some("\"+U\"") => *count += 1,
            Some("\"-U\"") | Some("\"-D\"") => {
                assert!(*count > 0, "{op:?} of a row not in the table: {line}");
                *count -= 1;
            }
            Some(other) => panic!("unknown op {other}: {line}"),
        }
    }
    let rows = table.into_iter().flat_map(|(row, count)| std::iter::repeat_n(row, count as usize)).collect();
    Run { names, rows }
}

/// The tables a query reads: those whose name is a word of its text.
fn tables_of(sql: &str) -> Vec<&'static (&'static str, &'static str)> {
    let words: BTreeSet<String> =
        sql.split(|c: char| !c.is_ascii_alphanumeric() && c != '_').map(str::to_ascii_lowercase).collect();
    TABLES.iter().filter(|(name, _)| words.contains(*name)).collect()
}

#[derive(Clone, Copy, Debug)]
enum Input {
    Csv,
    Generator,
}

/// Runs `sql` over the CSV files in `data` or the generator, returns the integrated answer.
/// With `spill` no state is kept in memory that can spill (`state_memory_mib = 0`: a
/// join's rows go to disk but for each side's newest chunk, a group aggregate's groups
/// once a mini-batch passes without touching them).
fn run(scratch: &Scratch, query: &str, sql: &str, data: &Path, input: Input, threads: u32, spill: bool) -> Run {
    let sources = match input {
        Input::Generator => format!(
            "[[source]]\nname = \"nexmark\"\nconnector = \"nexmark\"\n[source.options]\nevents = {EVENTS}\nseed = {SEED}\n"
        ),
        Input::Csv => tables_of(sql)
            .into_iter()
            .map(|(name, schema)| {
                format!(
                    "[[source]]\nname = \"{name}\"\nconnector = \"file\"\nformat = \"csv\"\nschema = \"{schema}\"\n\
                     event_time = \"dateTime\"\n[source.options]\npath = {}\nheader = true\n\n",
                    serde_json::to_string(&data.join(format!("{name}.csv")).display().to_string()).expect("path")
                )
            })
            .collect(),
    };
    let out = format!("{query}-{input:?}-{threads}-{spill}.jsonl");
    let memory = if spill { "state_memory_mib = 0\n" } else { "" };
    // A JSON string is a TOML basic string (serde_json writes no escape TOML lacks).
    let pipeline = format!(
        "[pipeline]\nname = \"oracle-{query}\"\n{memory}\n{sources}\n[[view]]\nname = \"result\"\nsql = {}\n\n\
         [[sink]]\nname = \"out\"\nfrom = \"result\"\nconnector = \"file\"\nformat = \"json\"\n\
         [sink.options]\npath = \"{out}\"\n",
        serde_json::to_string(sql).expect("sql")
    );
    let file = format!("{query}-{input:?}-{threads}-{spill}.toml");
    scratch.write(&file, &pipeline);
    let output = scratch.sluice(&["run", &file, "--threads", &threads.to_string()]);
    assert!(output.status.success(), "{query} ({input:?}, {threads} threads) failed:\n{}", stderr(&output));
    integrate(&scratch.read(&out))
}

/// The canonical fields of a canonical row (quoted fields hold no unquoted comma).
fn fields(row: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut current = String::new();
    let mut in_quotes = false;
    for c in row.chars() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                current.push(c);
            }
            ',' if !in_quotes => fields.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    fields.push(current);
    fields
}

/// bid.csv's rows in canonical form (numbers for the first three columns).
fn bid_rows(data: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(data.join("bid.csv")).expect("bid.csv");
    text.lines()
        .skip(1)
        .map(|line| {
            // The CSV writer quotes only fields that need it; NEXMark's bids have none.
            assert!(!line.contains('"'), "a quoted field in bid.csv: {line}");
            line.split(',')
                .enumerate()
                .map(|(i, value)| if i < 3 { value.to_string() } else { quoted(value) })
                .collect()
        })
        .collect()
}

/// A few lines of what `a` has and `b` lacks (multiset difference), for messages.
fn missing(a: &[String], b: &[String]) -> Vec<String> {
    let mut counts: BTreeMap<&String, i64> = BTreeMap::new();
    for row in b {
        *counts.entry(row).or_default() += 1;
    }
    let mut out = Vec::new();
    for row in a {
        let count = counts.entry(row).or_default();
        if *count > 0 {
            *count -= 1;
        } else {
            out.push(row.clone());
        }
    }
    out
}

fn difference(label: &str, expected: &[String], actual: &[String]) -> String {
    let only_expected = missing(expected, actual);
    let only_actual = missing(actual, expected);
    let show = |rows: &[String]| rows.iter().take(5).map(|r| format!("\n    {r}")).collect::<String>();
    format!(
        "{label}: {} rows expected, {} got; {} only expected:{}\n  {} only got:{}",
        expected.len(),
        actual.len(),
        only_expected.len(),
        show(&only_expected),
        only_actual.len(),
        show(&only_actual)
    )
}

/// Compares `actual` with `expected` (exactly, or what a ROW_NUMBER query determines);
/// `None` when they agree, else the difference.
fn compare(query: &str, label: &str, expected: &[String], actual: &[String], bids: &[Vec<String>]) -> Option<String> {
    let Some(top_n) = TOP_N.iter().find(|t| t.query == query) else {
        return (expected != actual).then(|| difference(label, expected, actual));
    };
    let project = |rows: &[String]| {
        let mut projected: Vec<String> = rows
            .iter()
            .map(|row| {
                let fields = fields(row);
                top_n.determined.iter().map(|&i| fields[i].clone()).collect::<Vec<_>>().join(",")
            })
            .collect();
        projected.sort();
        projected
    };
    let (expected_keys, actual_keys) = (project(expected), project(actual));
    if expected_keys != actual_keys {
        return Some(difference(&format!("{label} (partition and sort-key columns)"), &expected_keys, &actual_keys));
    }
    let kept_bid = |fields: &[String]| -> Vec<Option<String>> {
        top_n.bid_columns.iter().map(|c| c.map(|i| fields[i].clone())).collect()
    };
    let input: BTreeSet<Vec<Option<String>>> =
        bids.iter().map(|bid| top_n.bid_columns.iter().zip(bid).map(|(c, v)| c.map(|_| v.clone())).collect()).collect();
    let invented: Vec<&String> = actual.iter().filter(|row| !input.contains(&kept_bid(&fields(row)))).take(5).collect();
    if !invented.is_empty() {
        return Some(format!("{label}: rows whose bid is not in bid.csv: {invented:?}"));
    }
    // Rows without a tie in the input are determined whole.
    let mut ties: BTreeMap<Vec<&String>, usize> = BTreeMap::new();
    for bid in bids {
        *ties.entry(top_n.tie_key.iter().map(|&c| &bid[c]).collect()).or_default() += 1;
    }
    let untied = |rows: &[String]| -> Vec<String> {
        rows.iter()
            .filter(|row| {
                let fields = fields(row);
                let key: Vec<String> = top_n
                    .tie_key
                    .iter()
                    .map(|&c| fields[top_n.bid_columns[c].expect("a key column")].clone())
                    .collect();
                ties.get(&key.iter().collect::<Vec<_>>()) == Some(&1)
            })
            .cloned()
            .collect()
    };
    let (expected_untied, actual_untied) = (untied(expected), untied(actual));
    if expected_untied != actual_untied {
        return Some(difference(&format!("{label} (rows without a tie)"), &expected_untied, &actual_untied));
    }
    None
}

fn compare_names(query: &str, flink: &[String], sluice: &[String]) -> Option<String> {
    let made_up = |name: &str| {
        name.starts_with("EXPR$") || (name.ends_with(|c: char| c.is_ascii_digit()) && !sluice.iter().any(|s| s == name))
    };
    let agree = flink.len() == sluice.len() && flink.iter().zip(sluice).all(|(f, s)| made_up(f) || f == s);
    (!agree).then(|| format!("{query}: columns {sluice:?}, Flink's {flink:?}"))
}

#[test]
fn nexmark_queries_match_flink() {
    let readme = std::fs::read_to_string(oracle_dir().join("README.md")).expect("the oracle's README");
    assert!(
        readme.contains(&format!("- events: {EVENTS}\n")) && readme.contains(&format!("- seed: {SEED}\n")),
        "the stored answers are of another input than {EVENTS} events, seed {SEED}:\n{readme}"
    );
    let scratch = Scratch::new();
    let data = scratch.path("data");
    std::fs::create_dir_all(&data).expect("data dir");
    for (table, _) in TABLES {
        let path = data.join(format!("{table}.csv"));
        let path = path.to_str().expect("a UTF-8 path");
        let output = scratch.sluice(&[
            "nexmark",
            "generate",
            "--events",
            &EVENTS.to_string(),
            "--seed",
            &SEED.to_string(),
            "--table",
            table,
            "--format",
            "csv",
            "--output",
            path,
        ]);
        assert!(output.status.success(), "generate {table}: {}", stderr(&output));
    }
    let bids = bid_rows(&data);

    let queries: Vec<String> = {
        let mut names: Vec<String> = std::fs::read_dir(oracle_dir())
            .expect("the oracle directory")
            .filter_map(|e| e.expect("entry").file_name().to_str()?.strip_suffix(".csv").map(str::to_string))
            .collect();
        names.sort_by_key(|q| q.trim_start_matches('q').parse::<u32>().unwrap_or(u32::MAX));
        names
    };
    assert!(queries.len() >= 18, "the stored answers are missing: {queries:?}");
    let mut failures = Vec::new();
    for query in &queries {
        let answer = stored_answer(query).expect("a stored answer");
        let output = scratch.sluice(&["nexmark", "sql", query]);
        assert!(output.status.success(), "nexmark sql {query}: {}", stderr(&output));
        let sql = stdout(&output);
        let known = KNOWN_DIFFERENT.iter().find(|(q, _)| q == query);
        let csv = run(&scratch, query, &sql, &data, Input::Csv, 1, false);
        if let Some(problem) = compare_names(query, &answer.names, &csv.names) {
            failures.push(problem);
        }
        let flink = compare(query, &format!("{query} csv 1 thread vs Flink"), &answer.rows, &csv.rows, &bids);
        match (known, flink) {
            (None, Some(problem)) => failures.push(problem),
            (Some((_, what)), None) => failures.push(format!(
                "{query} now matches Flink (it was known to differ: {what}): remove it from KNOWN_DIFFERENT"
            )),
            _ => {}
        }
        for (input, threads, spill) in
            [(Input::Csv, 2, false), (Input::Generator, 1, false), (Input::Generator, 2, true)]
        {
            let other = run(&scratch, query, &sql, &data, input, threads, spill);
            let spilled = if spill { ", state spilled" } else { "" };
            let label = format!("{query} {input:?} {threads} threads{spilled} vs csv 1 thread");
            if let Some(problem) = compare(query, &label, &csv.rows, &other.rows, &bids) {
                failures.push(problem);
            }
        }
    }
    assert!(failures.is_empty(), "NEXMark answers differ:\n{}", failures.join("\n"));
}
