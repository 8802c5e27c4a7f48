//! The admin API's live page in a real headless browser (Debian's chromium, driven by
//! chromedriver over the WebDriver HTTP protocol with a few plain requests): it loads,
//! its graph shows every node of the running pipeline's `/graph`, the numbers on it
//! move, its query box answers with rows of a materialized view, another site's page in
//! the same browser can neither pause nor stop the job, and a screenshot is a PNG (`SLUICE_PAGE_SCREENSHOT=PATH` keeps it: the one in
//! docs/ was made so). `scripts/test.sh` installs both; without them the test says so
//! and passes. Every wait is on an event: chromedriver's line, a render of the page.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use crate::admin::{DEADLINE, Running, json_body, request, wait_running};
use crate::harness::Scratch;

const PIPELINE: &str = r#"
[pipeline]
name = "hot-auctions"
threads = 2

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
rate = 2000

[[view]]
name = "per_auction"
sql = """
SELECT auction, COUNT(*) AS bids, MAX(price) AS top_price, window_start, window_end
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' SECOND))
GROUP BY auction, window_start, window_end
"""
materialized = true

[[sink]]
name = "all_bids"
from = "bid"
connector = "blackhole"

[[sink]]
name = "counts"
from = "per_auction"
connector = "blackhole"

[checkpoint]
interval = "300ms"
store = "file://./state"
"#;

/// Chromium's flags: headless, nothing fetched from the network, a fresh profile.
const FLAGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1500,900",
];

/// Waits for the page's next render, then returns each graph node's id and rows.
const NEXT_RENDER: &str = "const done = arguments[arguments.length - 1];
window.addEventListener('sluice:rendered', () => done(Array.from(document.querySelectorAll('g.node'))
  .map(n => [n.dataset.id, n.dataset.rows])), { once: true });";

/// Runs the query box's SQL and answers, once shown, the rows and the note above them.
const QUERY: &str = "const done = arguments[arguments.length - 1];
window.addEventListener('sluice:queried', e => done([e.detail, document.getElementById('query-note').textContent]),
  { once: true });
document.getElementById('query-sql').value = 'SELECT auction, bids FROM per_auction ORDER BY bids DESC LIMIT 5';
document.getElementById('query-run').click();";

/// From another origin, POSTs to the API at `arguments[0]` as a cross-site page can
/// (`no-cors`, a text body); answers how many got an answer (opaque to the page).
const CROSS_SITE: &str = "const done = arguments[arguments.length - 1];
const api = arguments[0];
const sent = ['/pause', '/checkpoint', '/query', '/stop'].map(path => fetch(api + path,
  { method: 'POST', mode: 'no-cors', body: JSON.stringify({ sql: 'SELECT 1' }) }));
Promise.allSettled(sent).then(all => done(all.filter(r => r.status === 'fulfilled').length));";

/// chromedriver, stopped when dropped.
struct Driver {
    child: Child,
    addr: SocketAddr,
}

impl Driver {
    /// Starts chromedriver on a free port: the port is in the line that says it started.
    fn start() -> Driver {
        let mut child = Command::new("chromedriver")
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let port = out.lines().map_while(Result::ok).find_map(|line| {
            line.split("started successfully on port ").nth(1).and_then(|rest| rest.trim_end_matches('.').parse().ok())
        });
        let driver = Driver { child, addr: SocketAddr::from(([127, 0, 0, 1], port.unwrap_or(0))) };
        // Dropping the driver stops chromedriver.
        assert!(port.is_some(), "chromedriver ended without saying its port");
        driver
    }

    /// One WebDriver command; its `value`.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let mut stream = TcpStream::connect(self.addr).expect("connect to chromedriver");
        stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).expect("send");
        // chromedriver may keep the connection open: read the head, then Content-Length bytes.
        let mut reader = BufReader::new(stream);
        let mut head = String::new();
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("chromedriver's answer");
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or_else(|e| panic!("{line}: {e}"));
            }
            head.push_str(&line);
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        let mut payload = vec![0; length];
        reader.read_exact(&mut payload).expect("chromedriver's answer");
        let answer: Value = serde_json::from_slice(&payload).unwrap_or_else(|e| panic!("{e}: {head}"));
        assert!(head.starts_with("HTTP/1.1 200"), "{method} {path}: {head}{answer}");
        answer["value"].clone()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Standard base64 (the screenshot), padding allowed.
fn base64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bytes = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut held) = (0u32, 0u32);
    for c in text.bytes().filter(|c| *c != b'=') {
        let value = ALPHABET.iter().position(|a| *a == c).unwrap_or_else(|| panic!("not base64: {c}"));
        bits = (bits << 6) | value as u32;
        held += 6;
        if held >= 8 {
            held -= 8;
            bytes.push((bits >> held) as u8);
        }
    }
    bytes
}

fn present(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

#[test]
fn the_page_shows_every_node_of_the_running_graph_with_moving_numbers() {
    if !present("chromium") || !present("chromedriver") {
        eprintln!("SKIPPED: chromium or chromedriver is not installed; scripts/test.sh installs them with apt-get");
        return;
    }
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", PIPELINE);
    let mut run = Running::start(&scratch, &["run", "pipeline.toml"]);
    let addr = run.admin_addr();
    wait_running(addr);
    let (code, graph) = request(addr, "GET", "/graph");
    assert_eq!(code, 200, "{graph}");
    let graph = json_body(&graph);
    let mut expected: Vec<String> =
        graph["nodes"].as_array().expect("nodes").iter().map(|n| n["id"].as_str().expect("id").to_string()).collect();
    expected.sort();

    let driver = Driver::start();
    let profile = scratch.path("profile");
    let mut args: Vec<String> = FLAGS.iter().map(|f| f.to_string()).collect();
    args.push(format!("--user-data-dir={}", profile.display()));
    let capabilities = json!({ "capabilities": { "alwaysMatch": {
        "browserName": "chrome",
        "goog:chromeOptions": { "binary": "/usr/bin/chromium", "args": args },
    }}});
    let session = driver.call("POST", "/session", Some(capabilities));
    let id = session["sessionId"].as_str().expect("a session").to_string();
    let timeout_ms = u64::try_from(DEADLINE.as_millis()).unwrap_or(u64::MAX);
    driver.call("POST", &format!("/session/{id}/timeouts"), Some(json!({ "script": timeout_ms })));
    driver.call("POST", &format!("/session/{id}/url"), Some(json!({ "url": format!("http://{addr}/") })));
    let render = || {
        driver.call("POST", &format!("/session/{id}/execute/async"), Some(json!({ "script": NEXT_RENDER, "args": [] })))
    };

    let first = render();
    let mut shown: Vec<String> =
        first.as_array().expect("nodes").iter().map(|n| n[0].as_str().expect("id").to_string()).collect();
    shown.sort();
    assert_eq!(shown, expected, "the page shows the graph's nodes");
    let rows = |nodes: &Value| {
        nodes.as_array().and_then(|n| n.iter().find(|n| n[0] == "source:nexmark")).map(|n| n[1].clone())
    };
    let before = rows(&first);
    // The page redraws every second; the source reads 2000 rows/s: a few renders at most.
    let moved = (0..30).any(|_| rows(&render()) != before);
    assert!(moved, "the source's rows did not move on the page: {before:?}");
    // The rate appears once the server has two samples.
    let rate_shown = (0..30).any(|_| {
        render();
        let text = driver.call(
            "POST",
            &format!("/session/{id}/execute/sync"),
            Some(json!({ "script": "return document.getElementById('dataflow').textContent", "args": [] })),
        );
        text.as_str().is_some_and(|t| t.contains("rows/s") && !t.contains("measuring"))
    });
    assert!(rate_shown, "no rate on the page");
    // The first windows close after a second of events: ask until the view has rows.
    let mut answers = Vec::new();
    let answered = (0..60).any(|_| {
        let answer =
            driver.call("POST", &format!("/session/{id}/execute/async"), Some(json!({ "script": QUERY, "args": [] })));
        let shown = answer[0].as_u64().unwrap_or(0);
        let note = answer[1].as_str().unwrap_or_default().to_string();
        answers.push(note.clone());
        shown > 0 && note.contains("at checkpoint")
    });
    assert!(answered, "the query box showed no rows: {answers:?}");

    let screenshot = driver.call("GET", &format!("/session/{id}/screenshot"), None);
    let png = base64(screenshot.as_str().expect("base64"));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "a PNG of the page: {} bytes", png.len());
    if let Some(path) = std::env::var_os("SLUICE_PAGE_SCREENSHOT") {
        std::fs::write(&path, &png).expect("write the screenshot");
    }
    // Another site's page in the same browser (the API's own page under another origin,
    // http://localhost:PORT, is one) sends what a cross-site form or fetch can: simple
    // POSTs with a text/plain body. The API refuses them all: the job neither pauses nor
    // stops.
    let elsewhere = format!("http://localhost:{}/", addr.port());
    driver.call("POST", &format!("/session/{id}/url"), Some(json!({ "url": elsewhere })));
    let sent = driver.call(
        "POST",
        &format!("/session/{id}/execute/async"),
        Some(json!({ "script": CROSS_SITE, "args": [format!("http://{addr}")] })),
    );
    assert_eq!(sent, json!(4), "every cross-site request reached the API");
    let (code, status) = request(addr, "GET", "/status");
    assert_eq!(code, 200, "{status}");
    assert_eq!(json_body(&status)["state"], "running", "a cross-site page paused or stopped the job");
    driver.call("DELETE", &format!("/session/{id}"), None);
    let (code, stop) = request(addr, "POST", "/stop");
    assert_eq!(code, 202, "{stop}");
    let (exit, text) = run.finish();
    assert_eq!(exit, Some(0), "{text}");
}
