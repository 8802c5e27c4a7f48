#!/usr/bin/env python3
"""Prints RESULTS.md's tables from results.jsonl (one JSON object per run)."""
import json, sys, statistics
from collections import defaultdict

path = sys.argv[1] if len(sys.argv) > 1 else "results.jsonl"
runs = defaultdict(list)
for line in open(path):
    r = json.loads(line)
    runs[(r["workload"], r["engine"])].append(r)
ENGINES = ["own", "fjall", "slatedb"]

def agg(rs, k):
    v = [r[k] for r in rs if k in r]
    if not v:
        return "—"
    if len(v) == 1:
        return fmt(v[0])
    return f"{fmt(min(v))} / {fmt(statistics.median(v))}"

def fmt(x):
    if isinstance(x, str):
        return x
    if abs(x) >= 1e9:
        return f"{x/1e9:.2f} G"
    if abs(x) >= 1e6:
        return f"{x/1e6:.2f} M"
    if abs(x) >= 1e4:
        return f"{x/1e3:.0f} k"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.2f}"

def table(w, cols):
    print(f"\n### {w}\n")
    print("| engine | runs | " + " | ".join(c[0] for c in cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for e in ENGINES:
        rs = runs.get((w, e))
        if not rs:
            continue
        print(f"| {e} | {len(rs)} | " + " | ".join(agg(rs, c[1]) for c in cols) + " |")

common = [("peak RSS MiB", "peak_rss_mib"), ("disk bytes at end", "disk_bytes_end"),
          ("bytes written (wchar)", "wchar_bytes"), ("bytes written (block layer)", "write_bytes"),
          ("load avg", "loadavg1")]
table("w1", [("appends/s", "appends_per_s"), ("scans/s", "scans_per_s"), ("ops/s", "ops_per_s"),
             ("rows scanned", "scanned_rows"), ("run s", "run_s"), ("final checkpoint s", "final_checkpoint_s")] + common)
table("w4", [("open s", "open_s"), ("first row s", "first_row_s"), ("scan s", "scan_s"), ("rows", "rows"),
             ("bytes/s", "bytes_per_s"), ("read from disk", "read_bytes"), ("peak RSS MiB", "peak_rss_mib"), ("load avg", "loadavg1")])
table("w2", [("RMW/s", "ops_per_s"), ("miss fraction", "miss_fraction"), ("run s", "run_s"),
             ("final checkpoint s", "final_checkpoint_s")] + common)
table("w3", [("RMW/s", "rmw_per_s"), ("window closes/s", "window_closes_per_s"), ("ops/s", "ops_per_s"),
             ("run s", "run_s"), ("live keys at end", "live_keys_end"), ("wrong keys", "wrong_keys")] + common)
table("w5", [("build puts/s", "build_puts_per_s"), ("first checkpoint s", "cp0_s"),
             ("changed bytes/round", "changed_bytes_per_round"), ("written/changed median", "ratio_median"),
             ("max", "ratio_max"), ("checkpoint s median", "cp_s_median"), ("max s", "cp_s_max")] + common)

print("\n### w5 per round (bytes a checkpoint adds to the directory)\n")
for e in ENGINES:
    for r in runs.get(("w5", e), []):
        print(f"\n{e}: {r['keys']} keys, changed per round {r['changed_bytes_per_round']} bytes\n")
        print("| round | change s | checkpoint s | new files | new bytes | grown in place | removed | ratio | new bytes by dir |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        i = 1
        while f"r{i}_cp_s" in r:
            p = f"r{i}_"
            print(f"| {i} | {r[p+'change_s']:.2f} | {r[p+'cp_s']:.2f} | {r[p+'new_files']} | {r[p+'new_bytes']} | {r[p+'grown_bytes']} | {r[p+'removed_bytes']} | {r[p+'ratio']:.2f} | {r[p+'new_by_dir']} |")
            i += 1
        if "read_at_previous_checkpoint" in r:
            print(f"\nread at the previous checkpoint: {r['read_at_previous_checkpoint']}")

print("\n### engine state at the end of each run\n")
for (w, e), rs in sorted(runs.items()):
    for r in rs:
        print(f"- {w} {e}: {r.get('state', '')}")
