//! state-engines: candidate storage engines for Sluice's keyed state, measured on the
//! operators' access patterns (issue 27, item 7). One workload per process run.
//!
//!   state-engines <own|fjall|slatedb> <w1|w2|w3|w4|w5> [--dir D] [--budget-mib 256] [--seed 42]
//!                 [workload flags, see `usage()`]
//!
//! Prints one `RESULT {json}` line (also appended to --out, default results.jsonl).

mod engines;
mod own;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use engines::{DirTracker, Engine};

const VNODES: u64 = 256;

fn usage() -> ! {
    eprintln!(
        "usage: state-engines <own|fjall|slatedb> <w1|w2|w3|w4|w5> [flags]
common:  --dir DIR (default /tmp/state-engines/<engine>-<workload>; w4 reads <engine>-w1)
         --budget-mib 256  --seed 42  --out results.jsonl  --keep (keep the directory)
w1:      --appends 10000000 --auctions 1000000 --scans 600000 --row-bytes 120
w2:      --ops 20000000 --keys 5000000 --zipf 0.9 --value-bytes 64
w3:      --windows 10000 --groups 1000 --updates 3 --value-bytes 32
w4:      --vnodes 128 (after w1 with --keep)
w5:      --state-mib 2048 --value-bytes 100 --rounds 5 --change 0.01
own:     --own-compaction tiered|full"
    );
    std::process::exit(2)
}

// ------------------------------------------------------------------ small utilities

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
    fn f64(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Approximate Zipf(s) rank in [0, n): inverse CDF of the continuous x^-s on [1, n+1).
    fn zipf(&mut self, n: u64, s: f64) -> u64 {
        let u = self.f64();
        let a = 1.0 - s;
        let top = ((n + 1) as f64).powf(a) - 1.0;
        let x = (1.0 + u * top).powf(1.0 / a);
        ((x as u64).saturating_sub(1)).min(n - 1)
    }
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Key hash → vnode, as Sluice's `partition` does (here: a 64-bit mix of the key).
fn vnode_of(k: u64) -> u16 {
    (mix(k ^ 0x5EED) % VNODES) as u16
}

/// A row-like value: a few integer fields, then text from a small vocabulary (real rows
/// compress somewhat; pure random bytes would not).
fn fill_row(buf: &mut Vec<u8>, len: usize, a: u64, b: u64) {
    const WORDS: [&[u8]; 8] = [b"auction ", b"bidder ", b"price ", b"channel-", b"http://x.y/", b"2026-", b"url ", b"extra "];
    buf.clear();
    buf.extend_from_slice(&a.to_be_bytes());
    buf.extend_from_slice(&b.to_be_bytes());
    buf.extend_from_slice(&mix(a ^ b).to_le_bytes());
    let mut h = mix(b);
    while buf.len() < len {
        buf.extend_from_slice(WORDS[(h & 7) as usize]);
        h = h.rotate_right(3) ^ mix(h);
    }
    buf.truncate(len);
}

fn proc_status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for l in s.lines() {
        if let Some(rest) = l.strip_prefix(field) {
            let kb: u64 = rest.trim_start_matches(':').trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            return kb * 1024;
        }
    }
    0
}

fn proc_io() -> BTreeMap<String, u64> {
    let s = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    s.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.trim().parse().unwrap_or(0)))
        .collect()
}

/// A flat JSON object, built by hand.
#[derive(Default)]
struct Report(Vec<(String, String)>);
impl Report {
    fn num(&mut self, k: &str, v: impl Into<f64>) {
        let v: f64 = v.into();
        let s = if v.fract() == 0.0 && v.abs() < 1e15 { format!("{}", v as i64) } else { format!("{v:.3}") };
        self.0.push((k.into(), s));
    }
    fn str(&mut self, k: &str, v: &str) {
        self.0.push((k.into(), format!("{:?}", v)));
    }
    fn json(&self) -> String {
        let body: Vec<String> = self.0.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
        format!("{{{}}}", body.join(","))
    }
}

struct Args {
    engine: String,
    workload: String,
    flags: BTreeMap<String, String>,
}
impl Args {
    fn get<T: std::str::FromStr>(&self, k: &str, d: T) -> T {
        self.flags.get(k).map(|v| v.parse().unwrap_or_else(|_| panic!("bad --{k}"))).unwrap_or(d)
    }
    fn has(&self, k: &str) -> bool {
        self.flags.contains_key(k)
    }
}

fn parse_args() -> Args {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 2 {
        usage()
    }
    let mut flags = BTreeMap::new();
    let mut i = 2;
    while i < a.len() {
        let k = a[i].strip_prefix("--").unwrap_or_else(|| usage()).to_string();
        if k == "keep" {
            flags.insert(k, "1".into());
            i += 1;
        } else {
            let v = a.get(i + 1).cloned().unwrap_or_else(|| usage());
            flags.insert(k, v);
            i += 2;
        }
    }
    Args { engine: a[0].clone(), workload: a[1].clone(), flags }
}

fn open_engine(args: &Args, dir: &Path, bloom_prefix: Option<usize>) -> Box<dyn Engine> {
    let budget: u64 = args.get("budget-mib", 256);
    match args.engine.as_str() {
        "own" => Box::new(engines::open_own(
            dir,
            budget as usize,
            bloom_prefix,
            args.get::<String>("own-compaction", "tiered".into()) == "tiered",
        )),
        "fjall" => Box::new(engines::open_fjall(dir, budget)),
        "slatedb" => Box::new(engines::open_slate(dir, budget)),
        _ => usage(),
    }
}

fn main() {
    let args = parse_args();
    let default_dir = |w: &str| PathBuf::from(format!("/tmp/state-engines/{}-{}", args.engine, w));
    let dir: PathBuf = args.flags.get("dir").map(PathBuf::from).unwrap_or_else(|| {
        if args.workload == "w4" { default_dir("w1") } else { default_dir(&args.workload) }
    });
    if args.workload != "w4" {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
    }
    let mut rep = Report::default();
    rep.str("engine", &args.engine);
    rep.str("workload", &args.workload);
    rep.num("budget_mib", args.get::<u64>("budget-mib", 256) as f64);
    let io0 = proc_io();
    let t0 = Instant::now();
    match args.workload.as_str() {
        "w1" => w1(&args, &dir, &mut rep),
        "w2" => w2(&args, &dir, &mut rep),
        "w3" => w3(&args, &dir, &mut rep),
        "w4" => w4(&args, &dir, &mut rep),
        "w5" => w5(&args, &dir, &mut rep),
        "check" => check(&args, &dir, &mut rep),
        "w0" => w0(&args, &dir, &mut rep),
        _ => usage(),
    }
    let io1 = proc_io();
    rep.num("wall_s", t0.elapsed().as_secs_f64());
    rep.num("peak_rss_mib", proc_status("VmHWM") as f64 / 1048576.0);
    rep.num("disk_bytes_end", engines::dir_bytes(&dir) as f64);
    let d = |k: &str| io1.get(k).copied().unwrap_or(0).saturating_sub(io0.get(k).copied().unwrap_or(0)) as f64;
    rep.num("wchar_bytes", d("wchar"));
    rep.num("write_bytes", d("write_bytes"));
    rep.num("read_bytes", d("read_bytes"));
    rep.num("loadavg1", std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split(' ').next().and_then(|x| x.parse::<f64>().ok())).unwrap_or(0.0));
    let line = rep.json();
    println!("RESULT {line}");
    let out = args.get::<String>("out", "results.jsonl".into());
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(out).unwrap();
    writeln!(f, "{line}").unwrap();
    if args.workload != "w1" && !args.has("keep") {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// ------------------------------------------------------------------ W1: join append

fn w1(args: &Args, dir: &Path, rep: &mut Report) {
    let appends: u64 = args.get("appends", 10_000_000);
    let auctions: u64 = args.get("auctions", 1_000_000);
    let scans: u64 = args.get("scans", 600_000);
    let row_bytes: usize = args.get("row-bytes", 120);
    let mut rng = Rng(args.get("seed", 42));
    // Prefix bloom on (vnode, join key): the scan prefix.
    let mut e = open_engine(args, dir, Some(10));
    rep.str("delete_prefix", e.delete_prefix_kind());
    let pick = |rng: &mut Rng, i: u64| -> u64 {
        // Auctions open over time; 80% of bids go to the newest 10% of the open ones.
        let n = (auctions * (i + 1) / appends).max(1000.min(auctions));
        if rng.f64() < 0.8 { n - 1 - rng.below((n / 10).max(1)) } else { rng.below(n) }
    };
    let mut key = Vec::with_capacity(18);
    let mut row = Vec::with_capacity(row_bytes);
    let (mut scan_ns, mut scanned_rows, mut done_scans) = (0u128, 0u64, 0u64);
    let t = Instant::now();
    for i in 0..appends {
        let a = pick(&mut rng, i);
        key.clear();
        key.extend_from_slice(&vnode_of(a).to_be_bytes());
        key.extend_from_slice(&a.to_be_bytes());
        key.extend_from_slice(&i.to_be_bytes());
        fill_row(&mut row, row_bytes, a, i);
        e.put(&key, &row);
        // Interleave scans evenly.
        while done_scans < scans && done_scans * appends < (i + 1) * scans {
            let a = pick(&mut rng, i);
            let mut p = Vec::with_capacity(10);
            p.extend_from_slice(&vnode_of(a).to_be_bytes());
            p.extend_from_slice(&a.to_be_bytes());
            let ts = Instant::now();
            scanned_rows += e.scan_prefix(&p, &mut |_, v| {
                std::hint::black_box(v);
            }) as u64;
            scan_ns += ts.elapsed().as_nanos();
            done_scans += 1;
        }
    }
    let total = t.elapsed().as_secs_f64();
    let scan_s = scan_ns as f64 / 1e9;
    rep.num("appends", appends as f64);
    rep.num("scans", done_scans as f64);
    rep.num("scanned_rows", scanned_rows as f64);
    rep.num("appends_per_s", appends as f64 / (total - scan_s));
    rep.num("scans_per_s", done_scans as f64 / scan_s);
    rep.num("ops_per_s", (appends + done_scans) as f64 / total);
    rep.num("run_s", total);
    let tc = Instant::now();
    let c = e.checkpoint();
    rep.num("final_checkpoint_s", tc.elapsed().as_secs_f64());
    rep.str("state", &format!("{} | {}", e.describe(), c));
    e.close();
}

// ------------------------------------------------------------------ W4: restore scan

fn w4(args: &Args, dir: &Path, rep: &mut Report) {
    let vnodes: u16 = args.get("vnodes", 128);
    assert!(dir.exists(), "run w1 with --keep first ({} missing)", dir.display());
    let t = Instant::now();
    let mut e = open_engine(args, dir, Some(10));
    let open_s = t.elapsed().as_secs_f64();
    let (mut rows, mut bytes) = (0u64, 0u64);
    let ts = Instant::now();
    let mut first_row_s = None;
    for v in 0..vnodes {
        rows += e.scan_prefix(&v.to_be_bytes(), &mut |k, val| {
            if first_row_s.is_none() {
                first_row_s = Some(t.elapsed().as_secs_f64());
            }
            bytes += (k.len() + val.len()) as u64;
        }) as u64;
    }
    let scan_s = ts.elapsed().as_secs_f64();
    rep.num("open_s", open_s);
    rep.num("first_row_s", first_row_s.unwrap_or(0.0));
    rep.num("scan_s", scan_s);
    rep.num("rows", rows as f64);
    rep.num("bytes", bytes as f64);
    rep.num("bytes_per_s", bytes as f64 / scan_s);
    rep.num("rows_per_s", rows as f64 / scan_s);
    rep.str("state", &e.describe());
    e.close();
}

// ------------------------------------------------------------------ W2: running aggregate

fn w2_key(id: u64, key: &mut Vec<u8>) {
    key.clear();
    key.extend_from_slice(&vnode_of(id).to_be_bytes());
    key.extend_from_slice(&id.to_be_bytes());
    key.extend_from_slice(&mix(id).to_be_bytes()[..6]);
}

fn w2(args: &Args, dir: &Path, rep: &mut Report) {
    let ops: u64 = args.get("ops", 20_000_000);
    let keys: u64 = args.get("keys", 5_000_000);
    let s: f64 = args.get("zipf", 0.9);
    let vb: usize = args.get("value-bytes", 64);
    let mut rng = Rng(args.get("seed", 42));
    let mut e = open_engine(args, dir, None);
    let p_new = keys as f64 / ops as f64;
    let (mut created, mut misses) = (0u64, 0u64);
    let mut key = Vec::with_capacity(16);
    let mut val = vec![0u8; vb];
    let t = Instant::now();
    for _ in 0..ops {
        let id = if created == 0 || (created < keys && rng.f64() < p_new) {
            created += 1;
            created - 1
        } else {
            rng.zipf(created, s)
        };
        w2_key(id, &mut key);
        match e.get(&key) {
            Some(v) => {
                val.copy_from_slice(&v);
                let c = u64::from_le_bytes(val[..8].try_into().unwrap()) + 1;
                val[..8].copy_from_slice(&c.to_le_bytes());
                val[8..16].copy_from_slice(&mix(c ^ id).to_le_bytes());
            }
            None => {
                misses += 1;
                val.fill(0);
                val[..8].copy_from_slice(&1u64.to_le_bytes());
                val[16..24].copy_from_slice(&id.to_le_bytes());
            }
        }
        e.put(&key, &val);
    }
    let total = t.elapsed().as_secs_f64();
    rep.num("rmw_ops", ops as f64);
    rep.num("distinct_keys", created as f64);
    rep.num("miss_fraction", misses as f64 / ops as f64);
    rep.num("ops_per_s", ops as f64 / total);
    rep.num("run_s", total);
    // Sanity: the hottest key's count.
    w2_key(0, &mut key);
    let c0 = e.get(&key).map(|v| u64::from_le_bytes(v[..8].try_into().unwrap())).unwrap_or(0);
    rep.num("hottest_key_count", c0 as f64);
    let tc = Instant::now();
    e.checkpoint();
    rep.num("final_checkpoint_s", tc.elapsed().as_secs_f64());
    rep.str("state", &e.describe());
    e.close();
}

// ------------------------------------------------------------------ W3: window aggregate

fn w3(args: &Args, dir: &Path, rep: &mut Report) {
    let windows: u64 = args.get("windows", 10_000);
    let groups: u64 = args.get("groups", 1_000);
    let updates: u64 = args.get("updates", 3);
    let vb: usize = args.get("value-bytes", 32);
    let mut rng = Rng(args.get("seed", 42));
    // Prefix bloom on (vnode, window_end): the scan / delete prefix.
    let mut e = open_engine(args, dir, Some(10));
    rep.str("delete_prefix", e.delete_prefix_kind());
    let mut key = Vec::with_capacity(18);
    let mut val = vec![0u8; vb];
    let (mut rmw, mut scans, mut emitted, mut bad) = (0u64, 0u64, 0u64, 0u64);
    let (mut rmw_ns, mut close_ns) = (0u128, 0u128);
    let t = Instant::now();
    for w in 0..windows {
        let end = (w + 1) * 1000;
        // Window w's rows; 10% arrive late for window w-1, which is still open.
        let ts = Instant::now();
        for _ in 0..groups * updates {
            let g = rng.below(groups);
            let we = if w > 0 && rng.below(10) == 0 { end - 1000 } else { end };
            key.clear();
            key.extend_from_slice(&vnode_of(g).to_be_bytes());
            key.extend_from_slice(&we.to_be_bytes());
            key.extend_from_slice(&g.to_be_bytes());
            match e.get(&key) {
                Some(v) => {
                    val.copy_from_slice(&v);
                    let c = u64::from_le_bytes(val[..8].try_into().unwrap()) + 1;
                    val[..8].copy_from_slice(&c.to_le_bytes());
                }
                None => {
                    val.fill(0);
                    val[..8].copy_from_slice(&1u64.to_le_bytes());
                }
            }
            e.put(&key, &val);
            rmw += 1;
        }
        rmw_ns += ts.elapsed().as_nanos();
        // Close window w-1: scan each vnode's keys in order, emit, delete.
        if w > 0 {
            let tc = Instant::now();
            let closing = end - 1000;
            for v in 0..VNODES as u16 {
                let mut p = Vec::with_capacity(10);
                p.extend_from_slice(&v.to_be_bytes());
                p.extend_from_slice(&closing.to_be_bytes());
                emitted += e.scan_prefix(&p, &mut |k, _| {
                    if k[2..10] != closing.to_be_bytes() {
                        bad += 1;
                    }
                }) as u64;
                e.delete_prefix(&p);
                scans += 1;
            }
            close_ns += tc.elapsed().as_nanos();
        }
    }
    let total = t.elapsed().as_secs_f64();
    // Check: only the last window's keys remain.
    let mut live = 0u64;
    let last_end = windows * 1000;
    for v in 0..VNODES as u16 {
        e.scan_prefix(&v.to_be_bytes(), &mut |k, _| {
            live += 1;
            if k[2..10] != last_end.to_be_bytes() {
                bad += 1;
            }
        });
    }
    rep.num("windows", windows as f64);
    rep.num("rmw_ops", rmw as f64);
    rep.num("close_scans", scans as f64);
    rep.num("emitted_rows", emitted as f64);
    rep.num("rmw_per_s", rmw as f64 / (rmw_ns as f64 / 1e9));
    rep.num("window_closes_per_s", (windows.saturating_sub(1)) as f64 / (close_ns as f64 / 1e9));
    rep.num("ops_per_s", (rmw + 2 * scans) as f64 / total);
    rep.num("run_s", total);
    rep.num("live_keys_end", live as f64);
    rep.num("wrong_keys", bad as f64);
    let tc = Instant::now();
    e.checkpoint();
    rep.num("final_checkpoint_s", tc.elapsed().as_secs_f64());
    rep.str("state", &e.describe());
    e.close();
}

// ------------------------------------------------------------------ W5: incremental checkpoint

fn w5(args: &Args, dir: &Path, rep: &mut Report) {
    let state_mib: u64 = args.get("state-mib", 2048);
    let vb: usize = args.get("value-bytes", 100);
    let rounds: u64 = args.get("rounds", 5);
    let change: f64 = args.get("change", 0.01);
    let mut rng = Rng(args.get("seed", 42));
    let kv = 16 + vb as u64;
    let keys = (state_mib << 20) / kv;
    let mut e = open_engine(args, dir, None);
    let mut key = Vec::with_capacity(16);
    let mut val = Vec::with_capacity(vb);
    let t = Instant::now();
    for id in 0..keys {
        w2_key(id, &mut key);
        fill_row(&mut val, vb, id, 0);
        e.put(&key, &val);
    }
    let build_s = t.elapsed().as_secs_f64();
    rep.num("keys", keys as f64);
    rep.num("build_s", build_s);
    rep.num("build_puts_per_s", keys as f64 / build_s);
    let mut tracker = DirTracker::new(dir);
    let tc = Instant::now();
    let c0 = e.checkpoint();
    let d0 = tracker.delta();
    rep.num("cp0_s", tc.elapsed().as_secs_f64());
    rep.num("cp0_new_bytes", d0.new_bytes as f64);
    rep.num("cp0_total_bytes", d0.total_bytes as f64);
    rep.str("cp0", &c0);
    let n = ((keys as f64) * change) as u64;
    let changed_bytes = n * kv;
    rep.num("changed_keys_per_round", n as f64);
    rep.num("changed_bytes_per_round", changed_bytes as f64);
    let mut ratios = Vec::new();
    let mut cp_secs = Vec::new();
    let mut probe: Option<(Vec<u8>, Option<Vec<u8>>)> = None;
    for r in 1..=rounds {
        let tr = Instant::now();
        for j in 0..n {
            let id = rng.below(keys);
            w2_key(id, &mut key);
            if r == rounds && j == 0 {
                probe = Some((key.clone(), e.get(&key)));
            }
            fill_row(&mut val, vb, id, r);
            e.put(&key, &val);
        }
        let change_s = tr.elapsed().as_secs_f64();
        let tc = Instant::now();
        let c = e.checkpoint();
        let cs = tc.elapsed().as_secs_f64();
        let d = tracker.delta();
        let written = d.new_bytes + d.changed_bytes;
        let ratio = written as f64 / changed_bytes as f64;
        ratios.push(ratio);
        cp_secs.push(cs);
        let p = format!("r{r}_");
        rep.num(&(p.clone() + "change_s"), change_s);
        rep.num(&(p.clone() + "cp_s"), cs);
        rep.num(&(p.clone() + "new_files"), d.new_files as f64);
        rep.num(&(p.clone() + "new_bytes"), d.new_bytes as f64);
        rep.num(&(p.clone() + "grown_files"), d.changed_files as f64);
        rep.num(&(p.clone() + "grown_bytes"), d.changed_bytes as f64);
        rep.num(&(p.clone() + "removed_bytes"), d.removed_bytes as f64);
        rep.num(&(p.clone() + "total_bytes"), d.total_bytes as f64);
        rep.num(&(p.clone() + "ratio"), ratio);
        rep.str(&(p.clone() + "new_by_dir"), &format!("{:?}", d.new_by_dir));
        rep.str(&(p + "cp"), &c);
        eprintln!("round {r}: change {change_s:.2}s checkpoint {cs:.2}s new {} grown {} ratio {ratio:.2} | {c}", d.new_bytes, d.changed_bytes);
    }
    let mut sorted = ratios.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    rep.num("ratio_median", sorted[sorted.len() / 2]);
    rep.num("ratio_max", *sorted.last().unwrap());
    rep.num("ratio_mean", ratios.iter().sum::<f64>() / ratios.len() as f64);
    let mut cs = cp_secs.clone();
    cs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    rep.num("cp_s_median", cs[cs.len() / 2]);
    rep.num("cp_s_max", *cs.last().unwrap());
    rep.str("state", &e.describe());
    // Can an earlier checkpoint be read (restore at a checkpoint, read-only copy)? Read a key
    // the last round changed, at the checkpoint before the last round.
    if let Some((k, before)) = probe {
        let ta = Instant::now();
        let r = match e.read_at_previous_checkpoint(&k) {
            Ok(v) if v == before => format!("ok: old value read at the previous checkpoint in {:.3}s", ta.elapsed().as_secs_f64()),
            Ok(v) => format!("WRONG value at previous checkpoint (got {} bytes)", v.map_or(0, |v| v.len())),
            Err(why) => format!("unsupported: {why}"),
        };
        rep.str("read_at_previous_checkpoint", &r);
    }
    e.close();
}

// ------------------------------------------------------------------ check: against a model

/// Random puts, deletes, prefix deletes, gets, prefix scans and checkpoints against a
/// BTreeMap model. Use a small --budget-mib (1) so that the own engine flushes and compacts.
fn check(args: &Args, dir: &Path, rep: &mut Report) {
    let ops: u64 = args.get("ops", 300_000);
    let mut rng = Rng(args.get("seed", 42));
    let mut e = open_engine(args, dir, args.flags.get("bloom-prefix").map(|v| v.parse().unwrap()));
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut mism = 0u64;
    let key = |rng: &mut Rng| -> Vec<u8> {
        let mut k = Vec::new();
        k.extend_from_slice(&(rng.below(4) as u16).to_be_bytes());
        k.extend_from_slice(&rng.below(50).to_be_bytes());
        k.extend_from_slice(&rng.below(200).to_be_bytes());
        k
    };
    for i in 0..ops {
        let op = rng.below(100);
        let k = key(&mut rng);
        if op < 55 {
            let v = format!("v{i}-{}", "x".repeat(rng.below(100) as usize)).into_bytes();
            e.put(&k, &v);
            model.insert(k, v);
        } else if op < 65 {
            e.delete(&k);
            model.remove(&k);
        } else if op < 67 {
            let p = &k[..if rng.below(20) == 0 { 2 } else { 10 }];
            e.delete_prefix(p);
            model.retain(|mk, _| !mk.starts_with(p));
        } else if op < 92 {
            if e.get(&k) != model.get(&k).cloned() {
                mism += 1;
            }
        } else if op < 99 {
            let p = &k[..if rng.below(3) == 0 { 2 } else { 10 }];
            let mut got = Vec::new();
            e.scan_prefix(p, &mut |k, v| got.push((k.to_vec(), v.to_vec())));
            let want: Vec<_> = model.range(p.to_vec()..).take_while(|(mk, _)| mk.starts_with(p)).map(|(a, b)| (a.clone(), b.clone())).collect();
            if got != want {
                mism += 1;
            }
        } else {
            e.checkpoint();
        }
    }
    rep.num("ops", ops as f64);
    rep.num("mismatches", mism as f64);
    rep.num("model_keys", model.len() as f64);
    rep.str("state", &e.describe());
    eprintln!("mismatches: {mism}");
    e.close();
}

// ------------------------------------------------------------------ w0: slatedb call paths

/// slatedb only: where does a put's time go? The same N puts (W1's keys and rows) through
/// (a) `block_on` per put from sync code, as the trait does; (b) one async task awaiting each
/// put; (c) `WriteBatch`es of 100 puts from one async task.
fn w0(args: &Args, dir: &Path, rep: &mut Report) {
    assert_eq!(args.engine, "slatedb", "w0 is for slatedb");
    let n: u64 = args.get("puts", 1_000_000);
    let budget: u64 = args.get("budget-mib", 256);
    let kv = |i: u64| -> (Vec<u8>, Vec<u8>) {
        let a = mix(i) % 100_000;
        let mut k = Vec::with_capacity(18);
        k.extend_from_slice(&vnode_of(a).to_be_bytes());
        k.extend_from_slice(&a.to_be_bytes());
        k.extend_from_slice(&i.to_be_bytes());
        let mut v = Vec::new();
        fill_row(&mut v, 120, a, i);
        (k, v)
    };
    for mode in ["block_on_per_put", "async_await_each", "async_batch_100"] {
        let sub = dir.join(mode);
        let e = engines::open_slate(&sub, budget);
        let t = Instant::now();
        match mode {
            "block_on_per_put" => {
                for i in 0..n {
                    let (k, v) = kv(i);
                    e.rt.block_on(e.db.put(&k, &v)).unwrap();
                }
            }
            "async_await_each" => e.rt.block_on(async {
                for i in 0..n {
                    let (k, v) = kv(i);
                    e.db.put(&k, &v).await.unwrap();
                }
            }),
            _ => e.rt.block_on(async {
                let mut b = slatedb::WriteBatch::new();
                for i in 0..n {
                    let (k, v) = kv(i);
                    b.put(&k, &v);
                    if i % 100 == 99 {
                        e.db.write(std::mem::take(&mut b)).await.unwrap();
                    }
                }
                if n % 100 != 0 {
                    e.db.write(b).await.unwrap();
                }
            }),
        }
        let s = t.elapsed().as_secs_f64();
        rep.num(&format!("{mode}_puts_per_s"), n as f64 / s);
        e.rt.block_on(e.db.close()).unwrap();
        eprintln!("{mode}: {:.0} puts/s", n as f64 / s);
    }
}
