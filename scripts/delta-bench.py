#!/usr/bin/env python3
"""Delta sink throughput and commit latency: the same NEXMark bids written by Sluice's
`delta` sink, by its `file` sink (JSON lines), and by Python's `deltalake` package
(`write_deltalake`, delta-rs), alternated; then the commit latency of each epoch.

What it does
    1. Throughput, ROUNDS rounds after a warm-up round, the order rotating each round:
         delta   sluice run: the `nexmark` source (EVENTS events; bids are 46 of every
                 50) → `bid` → a `delta` sink, threads = 1, exactly-once checkpoints
                 every second into a local store
         file    the same pipeline into a `file` sink, format json, a directory
         python  write_deltalake(path, table) of the same rows, read beforehand (not
                 timed) into a pyarrow table from the Delta table of the warm-up round
       Sluice runs are timed as whole processes (start, planning and the final commit
       included; wall time from a monotonic clock, CPU time from the kernel's accounting
       of the finished process, all its threads). Python's time is write_deltalake's
       alone (CPU from getrusage of the process around it). MB/s are of the files
       written (Parquet data files, or JSON lines), the Delta log excluded.
    2. Commit latency: the delta pipeline again with the source held to RATE events/s for
       SECONDS seconds (a sink that keeps up, as a pipeline normally runs), and for the
       throughput runs (a sink that is the bottleneck). Per epoch, from the run's log
       (`--log-level info`, microsecond timestamps): the barrier's injection (the
       "checkpoint published" line's time less its `millis`, the checkpoint's duration
       from its barrier) to the "delta sink: committed epoch" line, which follows the
       commit's create-only write of `_delta_log/N.json`, so the epoch is visible then.

How to run (from the repository root)
    cargo build --release -p sluice-cli --features delta
    python3 -m pip install deltalake pyarrow
    python3 scripts/delta-bench.py --sluice $CARGO_TARGET_DIR/release/sluice --rounds 5

Everything is written under a temporary directory (--work), removed at the end.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Python's writer; argv: source table, target path. Prints one JSON line. It ends with
# os._exit(0): the binding (1.6) can abort in its interpreter-exit teardown.
PYTHON_WRITER = r"""
import json, os, resource, sys, time
from deltalake import DeltaTable, write_deltalake
table = DeltaTable(sys.argv[1]).to_pyarrow_table()
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
cpu_before, started = cpu(), time.monotonic()
write_deltalake(sys.argv[2], table)
wall, cpu_s = time.monotonic() - started, cpu() - cpu_before
print(json.dumps({"rows": table.num_rows, "wall_s": wall, "cpu_s": cpu_s, "arrow_bytes": table.nbytes}))
sys.stdout.flush()
os._exit(0)
"""


def pipeline(connector, events, rate=None):
    sink = (
        '[sink.options]\npath = "out/bids"\n'
        if connector == "delta"
        else 'format = "json"\n[sink.options]\npath = "out/bids/"\n'
    )
    rate_line = f"rate = {rate}\n" if rate else ""
    return f"""[pipeline]
name = "delta-bench"
threads = 1

[checkpoint]
interval = "1s"
store = "file://./state"
guarantee = "exactly-once"

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
events = {events}
{rate_line}
[[sink]]
name = "out"
from = "bid"
connector = "{connector}"
{sink}"""


def data_bytes(directory: Path):
    """Bytes of the files under `directory`, the Delta log excluded."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and "_delta_log" not in p.parts)


def timed(command, cwd):
    load = os.getloadavg()[0]
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = process.communicate()
    wall = time.monotonic() - started
    if process.returncode != 0:
        sys.exit(f"delta-bench: {' '.join(map(str, command))} failed:\n{stderr.decode(errors='replace')}")
    return wall, stdout.decode(), stderr.decode(errors="replace"), load


def run_sluice(sluice, work: Path, connector, events, rate=None):
    """One run in a fresh directory: (wall s, cpu s, rows, data bytes, log, load)."""
    run = work / f"run-{connector}"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    (run / "pipeline.toml").write_text(pipeline(connector, events, rate))
    before = os.times()
    wall, _, log, load = timed([str(sluice), "--log-level", "info", "run", "pipeline.toml"], run)
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    rows = re.search(r"sink out: (\d+) rows out", log)
    if not rows:
        sys.exit(f"delta-bench: no row count in the report:\n{log}")
    return wall, cpu, int(rows.group(1)), data_bytes(run / "out" / "bids"), log, load, run


def timestamp(line):
    text = line.split()[0].rstrip("Z")
    return datetime.datetime.fromisoformat(text[:26]).timestamp()


def commit_latencies(log, split=False):
    """Per epoch: seconds from its barrier to its Delta commit, from the run's log (with
    `split`: pairs, barrier to checkpoint published, and published to the commit)."""
    published_at, barriers, commits = {}, {}, {}
    for line in log.splitlines():
        published = re.search(r"checkpoint published epoch=(\d+) millis=(\d+)", line)
        if published:
            epoch = int(published.group(1))
            published_at[epoch] = timestamp(line)
            barriers[epoch] = published_at[epoch] - int(published.group(2)) / 1000
        committed = re.search(r"delta sink: committed epoch .*epoch=(\d+)", line)
        if committed:
            commits[int(committed.group(1))] = timestamp(line)
    epochs = [e for e in sorted(commits) if e in barriers]
    if split:
        return [(published_at[e] - barriers[e], commits[e] - published_at[e]) for e in epochs]
    return [commits[e] - barriers[e] for e in epochs]


def spread(values, fmt="{:,.0f}"):
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sluice", default="target/release/sluice")
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--rounds", type=int, default=5, help="throughput rounds (0: the latency run alone)")
    parser.add_argument("--rate", type=int, default=200_000, help="events/s of the latency run")
    parser.add_argument("--seconds", type=int, default=30, help="length of the latency run")
    parser.add_argument("--work", help="a directory for the outputs (default: a new temporary one)")
    args = parser.parse_args()
    sluice = Path(args.sluice).resolve()
    if not os.access(sluice, os.X_OK):
        sys.exit(f"delta-bench: no {sluice}: build it first (cargo build --release -p sluice-cli --features delta)")
    work = Path(args.work or tempfile.mkdtemp(prefix="delta-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        print(f"machine: {os.cpu_count()} cores; {args.events:,} events; work {work}", flush=True)
        results = {"delta": [], "file": [], "python": []}
        latencies = []
        kinds = ["delta", "file", "python"]
        for round_ in range(args.rounds + 1 if args.rounds else 0):  # round 0 is the warm-up, not counted
            order = kinds[round_ % 3 :] + kinds[: round_ % 3]
            for kind in order:
                if kind == "python":
                    if not (work / "input").exists():
                        continue  # the warm-up's delta run has not kept its table yet
                    target = work / "python-out"
                    shutil.rmtree(target, ignore_errors=True)
                    load = os.getloadavg()[0]
                    _, out, _, _ = timed([sys.executable, "-c", PYTHON_WRITER, str(work / "input"), str(target)], work)
                    figures = json.loads(out.strip().splitlines()[-1])
                    wall, cpu, rows = figures["wall_s"], figures["cpu_s"], figures["rows"]
                    size = data_bytes(target)
                    shutil.rmtree(target)
                    note = ""
                else:
                    wall, cpu, rows, size, log, load, run = run_sluice(sluice, work, kind, args.events)
                    note = ""
                    if kind == "delta":
                        found = commit_latencies(log)
                        commits = len(list((run / "out" / "bids" / "_delta_log").glob("*.json")))
                        note = f" commits={commits}"
                        if found:
                            note += f" commit_latency_ms={spread([x * 1000 for x in found], '{:.0f}')}"
                        if round_:
                            latencies.extend(found)
                        if not (work / "input").exists():
                            (run / "out" / "bids").rename(work / "input")
                    shutil.rmtree(run)
                counted = "" if round_ else " (warm-up)"
                print(f"round {round_} {kind}: rows={rows} wall_s={wall:.3f} cpu_s={cpu:.3f} "
                      f"rows_per_s={rows / wall:,.0f} rows_per_cpu_s={rows / cpu:,.0f} "
                      f"data_mb={size / 1e6:.0f} mb_per_s={size / 1e6 / wall:.1f} load={load:.2f}{note}{counted}",
                      flush=True)
                if round_:
                    results[kind].append((rows / wall, rows / cpu, size / 1e6 / wall))
        if args.rounds:
            print(f"summary over {args.rounds} rounds, min / median / max:")
        for kind, figures in results.items() if args.rounds else ():
            print(f"  {kind}: rows/s {spread([f[0] for f in figures])}; rows per CPU-second "
                  f"{spread([f[1] for f in figures])}; MB/s {spread([f[2] for f in figures], '{:.1f}')}")
        if latencies:
            print(f"  commit latency in the throughput runs, ms: {spread([x * 1000 for x in latencies], '{:.0f}')} "
                  f"over {len(latencies)} epochs")

        events = args.rate * args.seconds
        _, _, rows, _, log, load, run = run_sluice(sluice, work, "delta", events, rate=args.rate)
        parts = commit_latencies(log, split=True)
        shutil.rmtree(run)
        if parts:

            def summary(values):
                values = sorted(x * 1000 for x in values)
                p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
                return f"{values[0]:.0f} / {statistics.median(values):.0f} / {p90:.0f} / {values[-1]:.0f}"

            print(f"commit latency at {args.rate:,} events/s for {args.seconds} s ({rows:,} rows, load {load:.2f}): "
                  f"{len(parts)} epochs, ms min / median / p90 / max: barrier to commit "
                  f"{summary([a + b for a, b in parts])}; of which barrier to checkpoint published "
                  f"{summary([a for a, _ in parts])}, published to commit {summary([b for _, b in parts])}")
        else:
            print("commit latency: no epoch committed in the latency run")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
