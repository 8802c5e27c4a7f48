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
//! --- report                lines the exit report must contain
//! ```

use std::path::Path;

use crate::harness::{Scratch, sorted_lines, stderr};

pub(crate) struct Case {
    pub files: Vec<(String, String)>,
    pub pipeline: String,
    pub expected: Vec<(String, String)>,
    pub report: Vec<String>,
}

pub(crate) fn parse(text: &str) -> Case {
    let mut case = Case { files: Vec::new(), pipeline: String::new(), expected: Vec::new(), report: Vec::new() };
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
        for line in &case.report {
            assert!(report.contains(line.as_str()), "{label}: the report lacks {line:?}:\n{report}");
        }
        // Nothing else was written: no stray file (a blackhole sink writes nowhere) and
        // nothing on standard output (no case has a stdout sink).
        let mut expected: Vec<&str> = case.files.iter().chain(&case.expected).map(|(name, _)| top(name)).collect();
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
