//! Data-driven golden tests: each `tests/golden/*.case` file holds input files, a
//! pipeline, the expected sink output and, optionally, lines the exit report must contain.
//! Every case runs with 1 and with 2 threads; output lines are compared sorted (rows of
//! different windows and keys may interleave differently across threads).
//!
//! Case format (sections start with `--- `):
//! ```text
//! --- file input.jsonl      a file written to the scratch directory
//! --- pipeline              pipeline.toml
//! --- expect out.jsonl      the file the sink must produce (or a directory: all parts)
//! --- expect-table out.jsonl the table an updating sink's changelog (JSON lines with
//!                           an op column) integrates to: every +I/+U row added, every
//!                           -U/-D row removed (it must be there), rows without the op
//! --- report                lines the exit report must contain
//! ```
//!
//! An updating stream's changelog depends on how rows were batched and how lanes
//! interleaved (a group changed by two rows of one batch changes once); the table it
//! integrates to does not, so cases whose changelog is not determined compare tables.

use std::path::Path;

use crate::harness::{Scratch, sorted_lines, stderr};

pub(crate) struct Case {
    pub files: Vec<(String, String)>,
    pub pipeline: String,
    pub expected: Vec<(String, String)>,
    /// `expect-table` sections: (sink output, integrated rows).
    pub tables: Vec<(String, String)>,
    pub report: Vec<String>,
}

pub(crate) fn parse(text: &str) -> Case {
    let mut case = Case {
        files: Vec::new(),
        pipeline: String::new(),
        expected: Vec::new(),
        tables: Vec::new(),
        report: Vec::new(),
    };
    let mut section: Option<(String, String)> = None;
    let mut body = String::new();
    let flush = |section: Option<(String, String)>, body: &mut String, case: &mut Case| {
        let text = std::mem::take(body);
        match section {
            None => {}
            Some((kind, name)) => match kind.as_str() {
                "file" => case.files.push((name, text)),
                "pipeline" => case.pipeline = text,
                "expect" => case.expected.push((name, text)),
                "expect-table" => case.tables.push((name, text)),
                "report" => case.report.extend(text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string)),
                other => panic!("unknown section {other}"),
            },
        }
    };
    for line in text.lines() {
        if let Some(header) = line.strip_prefix("--- ") {
            flush(section.take(), &mut body, &mut case);
            let mut words = header.split_whitespace();
            let kind = words.next().unwrap_or_default().to_string();
            section = Some((kind, words.next().unwrap_or_default().to_string()));
        } else if section.is_some() {
            body.push_str(line);
            body.push('\n');
        }
    }
    flush(section, &mut body, &mut case);
    assert!(!case.pipeline.is_empty(), "a case needs a pipeline section");
    case
}

/// The sink output at `name`: a file, or every part of a directory.
pub(crate) fn output(scratch: &Scratch, name: &str) -> String {
    let path = scratch.path(name);
    if path.is_dir() {
        // Visible parts only: staging directories are hidden (their names start with a dot).
        let mut parts: Vec<_> = std::fs::read_dir(&path)
            .expect("read dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
            .collect();
        parts.sort();
        parts.iter().map(|p| std::fs::read_to_string(p).expect("read part")).collect()
    } else {
        scratch.read(name)
    }
}

fn check(case_file: &Path) {
    let case = parse(&std::fs::read_to_string(case_file).expect("read case"));
    for threads in ["1", "2"] {
        let scratch = Scratch::new();
        for (name, text) in &case.files {
            scratch.write(name, text);
        }
        scratch.write("pipeline.toml", &lanes(&case.pipeline, threads));
        let run = scratch.sluice(&["run", "pipeline.toml", "--threads", threads]);
        let report = stderr(&run);
        let label = format!("{} with {threads} thread(s)", case_file.display());
        assert!(run.status.success(), "{label}: sluice failed:\n{report}");
        for (name, expected) in &case.expected {
            let got = comparable(name, &output(&scratch, name));
            assert_eq!(got, comparable(name, expected), "{label}: output {name} differs\nreport:\n{report}");
        }
        for (name, expected) in &case.tables {
            let got = integrated(&output(&scratch, name));
            assert_eq!(
                got,
                sorted_lines(expected),
                "{label}: the changelog {name} integrates to another table\nreport:\n{report}"
            );
        }
        for line in &case.report {
            assert!(report.contains(line.as_str()), "{label}: the report lacks {line:?}:\n{report}");
        }
        // Nothing else was written: no stray file (a blackhole sink writes nowhere) and
        // nothing on standard output (no case has a stdout sink).
        let mut expected: Vec<&str> =
            case.files.iter().chain(&case.expected).chain(&case.tables).map(|(name, _)| top(name)).collect();
        expected.push("pipeline.toml");
        expected.sort_unstable();
        expected.dedup();
        assert_eq!(scratch.entries(), expected, "{label}: the files after the run");
        assert!(run.stdout.is_empty(), "{label}: unexpected output: {}", String::from_utf8_lossy(&run.stdout));
    }
}

/// The first component of a relative path: the entry it makes in the scratch directory.
fn top(name: &str) -> &str {
    name.split('/').next().unwrap_or(name)
}

/// The case's pipeline; with two threads its file sources are split into lanes of a few
/// dozen bytes, so the watermark merges across lanes (a case whose expectation needs
/// one lane, e.g. late rows in file order, says `split_bytes` itself).
pub(crate) fn lanes(pipeline: &str, threads: &str) -> String {
    if threads == "1" || pipeline.contains("split_bytes") {
        return pipeline.to_string();
    }
    pipeline.replace("[source.options]\n", "[source.options]\nsplit_bytes = 24\n")
}

/// Every golden case file, in name order.
pub(crate) fn case_files() -> Vec<std::path::PathBuf> {
    let dir = crate::harness::crate_dir().join("tests/golden");
    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .expect("golden dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "case"))
        .collect();
    cases.sort();
    cases
}

/// The table a changelog in JSON lines (`{"op":"+I",…}` per row, in order) integrates
/// to, sorted, each row without its op; panics on a retraction of a row not there.
pub(crate) fn integrated(changelog: &str) -> Vec<String> {
    let mut table: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
    for line in changelog.lines().filter(|l| !l.trim().is_empty()) {
        let (op, rest) = line
            .strip_prefix("{\"op\":\"")
            .and_then(|rest| rest.split_at_checked(2))
            .unwrap_or_else(|| panic!("not a changelog row: {line}"));
        let row = format!("{{{}", rest.strip_prefix("\",").unwrap_or_else(|| panic!("no op column: {line}")));
        let count = table.entry(row.clone()).or_insert(0);
        match op {
            "+I" | "+U" => *count += 1,
            "-U" | "-D" => {
                assert!(*count > 0, "{op} of a row not in the table: {line}");
                *count -= 1;
            }
            other => panic!("unknown op {other}: {line}"),
        }
    }
    let mut rows = Vec::new();
    for (row, count) in table {
        rows.extend(std::iter::repeat_n(row, count as usize));
    }
    rows
}

/// Sink output lines, sorted; a CSV header repeated per part file is kept once.
pub(crate) fn comparable(name: &str, text: &str) -> Vec<String> {
    let mut lines = sorted_lines(text);
    if name.ends_with(".csv") || name.ends_with('/') {
        lines.dedup();
    }
    lines
}

#[test]
fn golden_cases() {
    let cases = case_files();
    assert!(cases.len() >= 10, "the golden cases are missing");
    let failures: Vec<String> = cases
        .iter()
        .filter(|case| std::panic::catch_unwind(|| check(case)).is_err())
        .map(|case| case.display().to_string())
        .collect();
    assert!(failures.is_empty(), "failing golden cases (messages above): {failures:?}");
}
