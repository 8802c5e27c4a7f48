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

struct Case {
    files: Vec<(String, String)>,
    pipeline: String,
    expected: Vec<(String, String)>,
    report: Vec<String>,
}

fn parse(text: &str) -> Case {
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
fn output(scratch: &Scratch, name: &str) -> String {
    let path = scratch.path(name);
    if path.is_dir() {
        let mut parts: Vec<_> = std::fs::read_dir(&path).expect("read dir").map(|e| e.expect("entry").path()).collect();
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
        scratch.write("pipeline.toml", &case.pipeline);
        let run = scratch.sluice(&["run", "pipeline.toml", "--threads", threads]);
        let report = stderr(&run);
        let label = format!("{} with {threads} thread(s)", case_file.display());
        assert!(run.status.success(), "{label}: sluice failed:\n{report}");
        for (name, expected) in &case.expected {
            let mut got = sorted_lines(&output(&scratch, name));
            let mut want = sorted_lines(expected);
            // A CSV header is written once per part file: compare rows only.
            if name.ends_with(".csv") || name.ends_with('/') {
                got.dedup();
                want.dedup();
            }
            assert_eq!(got, want, "{label}: output {name} differs\nreport:\n{report}");
        }
        for line in &case.report {
            assert!(report.contains(line.as_str()), "{label}: the report lacks {line:?}:\n{report}");
        }
    }
}

#[test]
fn golden_cases() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .expect("golden dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "case"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 10, "the golden cases are missing");
    let failures: Vec<String> = cases
        .iter()
        .filter(|case| std::panic::catch_unwind(|| check(case)).is_err())
        .map(|case| case.display().to_string())
        .collect();
    assert!(failures.is_empty(), "failing golden cases (messages above): {failures:?}");
}
