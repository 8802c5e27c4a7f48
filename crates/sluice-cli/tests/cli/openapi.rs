//! Schemathesis (a property-based API tester, from PyPI) against a running pipeline's
//! admin API: it reads `/openapi.json`, generates requests for every operation, and
//! checks each answer against the document (no server error, the status code, content
//! type, headers and body schema as described, a request without the token refused).
//! `scripts/test.sh` installs it; without it the test says so and passes.
//!
//! `POST /query` answers a well-formed request for SQL that cannot run (an unknown table,
//! bad syntax: nothing a schema can say) with 400, which the configuration allows.
//!
//! Left out: `/status/stream` (it stays open while the job runs) and `POST /stop` (it
//! ends the run under the tester); `admin.rs` and the crate's own tests cover both.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::admin::{PIPELINE, Running, request_with};
use crate::harness::Scratch;

/// A schema-valid query may still name a table that does not exist, or not parse: most
/// generated SQL is refused with 400, which is neither a failure nor worth a warning.
///
/// Every warning but `missing_auth` fails the run. That one says an operation answered
/// only 401: it failed a loaded run once for `POST /checkpoint` (no parameters), likely
/// because the time budget ended before the fuzzing asked it with the token, leaving
/// only the coverage phase's requests without it. The token's check is schemathesis' own
/// `ignored_auth` check here, and `admin.rs` tests both answers.
const CONFIG: &str = r#"
warnings = ["missing_test_data", "validation_mismatch", "missing_deserializer", "unused_openapi_auth", "unsupported_regex", "method_not_allowed", "unmatched_filter", "unresolvable_reference", "low_valid_rate", "rate_limited"]

[[operations]]
include-path = "/query"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "409", "503", "504"]
warnings = false
"#;

/// The tester's own budget for its run, and the most the test waits for it.
const BUDGET_SECONDS: u32 = 30;
const WAIT: Duration = Duration::from_secs(240);

#[test]
fn schemathesis_finds_no_server_error_and_no_answer_outside_the_document() {
    if let Err(error) = Command::new("schemathesis").arg("--version").output() {
        eprintln!("SKIPPED: schemathesis is not installed ({error}); scripts/test.sh installs it with pip");
        return;
    }
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", PIPELINE);
    scratch.write("token", "fuzz-token\n");
    scratch.write("schemathesis.toml", CONFIG);
    let mut run = Running::start(&scratch, &["run", "pipeline.toml", "--admin-token-file", "token"]);
    let addr = run.admin_addr();
    let mut tester = Command::new("schemathesis")
        // It keeps a cache in its working directory: the scratch one, not the repository.
        .current_dir(scratch.dir.path())
        .args([
            "--config-file",
            "schemathesis.toml",
            "run",
            &format!("http://{addr}/openapi.json"),
            "--header",
            "Authorization: Bearer fuzz-token",
        ])
        .args(["--checks", "all", "--max-examples", "20", "--workers", "1", "--request-timeout", "20"])
        .args(["--max-time", &BUDGET_SECONDS.to_string(), "--no-color"])
        .args(["--exclude-path", "/status/stream", "--exclude-path", "/stop"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start schemathesis");
    let mut out = tester.stdout.take().expect("stdout");
    let mut err = tester.stderr.take().expect("stderr");
    let (done, ended) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        let _ = err.read_to_string(&mut text);
        let _ = done.send(text);
    });
    // Its output closes when it exits.
    let Ok(report) = ended.recv_timeout(WAIT) else {
        let _ = tester.kill();
        panic!("schemathesis ran past {WAIT:?}");
    };
    let status = tester.wait().expect("wait for schemathesis");
    assert!(status.success(), "schemathesis found failures ({status}):\n{report}");
    assert!(report.contains("No issues found"), "{report}");
    let (code, answer) = request_with(addr, "POST", "/stop", Some("fuzz-token"));
    assert_eq!(code, 202, "{answer}");
    let (exit, text) = run.finish();
    assert_eq!(exit, Some(0), "the run ends cleanly after the fuzzing:\n{text}");
}
