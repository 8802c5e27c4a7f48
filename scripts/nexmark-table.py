#!/usr/bin/env python3
"""Runs the NEXMark suite and prints BENCHMARKS.md's NEXMark table for this build.

Each query runs in its own process (`sluice nexmark bench` starts one per query), on one
and on two threads, `--runs` times each; a cell is the range over the runs. The heading
names the command, the machine (`lscpu`, memory), the commit (with `+dirty` when the
work tree differs from it) and the date, so the table can replace the one in
BENCHMARKS.md as it is. Run it on a quiet machine, with a release build:

    cargo build --release -p sluice-cli
    scripts/nexmark-table.py --sluice $CARGO_TARGET_DIR/release/sluice --runs 2 > table.md

`--events 20000` makes a quick check that the script works (its figures mean nothing).
"""
import argparse
import datetime
import json
import pathlib
import platform
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
QUERIES = "source,q0,q1,q2,q3,q4,q5,q7,q8,q9,q11,q15,q16,q17,q18,q19,q20,q21,q22,tumble"


def run(command):
    return subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout


def bench(sluice, events, threads, queries):
    """{query: (events/s per thread, peak RSS MB)} from one `nexmark bench` run (with
    --quiet it prints one JSON object per query)."""
    out = run([sluice, "--quiet", "nexmark", "bench", "--events", str(events), "--threads", str(threads),
               "--queries", queries])
    figures = {}
    for line in out.splitlines():
        row = json.loads(line)
        figures[row["query"]] = (row["events_per_second_per_thread"], row["peak_rss_mb"])
    return figures


def machine():
    model = "unknown CPU"
    try:
        for line in run(["lscpu"]).splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    memory = ""
    try:
        kib = int(next(l for l in open("/proc/meminfo") if l.startswith("MemTotal")).split()[1])
        memory = f", {kib / 1024 / 1024:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    cpus = run(["nproc", "--all"]).strip()
    return f"{cpus} CPUs, {model}{memory}, {platform.system()} {platform.release()}"


def commit():
    head = run(["git", "rev-parse", "--short", "HEAD"]).strip()
    dirty = run(["git", "status", "--porcelain", "--untracked-files=no"]).strip()
    return head + ("+dirty" if dirty else "")


def cell(values, scale, unit):
    low, high = min(values) / scale, max(values) / scale
    if unit == "M":
        return f"{low:.2f} M" if abs(high - low) < 0.005 else f"{low:.2f}–{high:.2f} M"
    return f"{low:.0f} MB" if round(low) == round(high) else f"{low:.0f}–{high:.0f} MB"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sluice", default="target/release/sluice")
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--queries", default=QUERIES)
    args = parser.parse_args()

    results = {1: [], 2: []}
    for _ in range(args.runs):
        for threads in (1, 2):
            results[threads].append(bench(args.sluice, args.events, threads, args.queries))

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    print(f"Build {commit()}, {date}, {machine()}; {args.runs} run(s) of each:\n")
    print("```sh")
    for threads in (1, 2):
        print(f"$S nexmark bench --events {args.events} --threads {threads} --queries {args.queries}")
    print("```\n")
    print("| query | 1 thread: events/s | peak RSS | 2 threads: events/s per thread | peak RSS |")
    print("|---|---:|---:|---:|---:|")
    for query in args.queries.split(","):
        cells = []
        for threads in (1, 2):
            runs = [r[query] for r in results[threads] if query in r]
            if not runs:
                cells += ["-", "-"]
                continue
            cells.append(cell([rate for rate, _ in runs], 1e6, "M"))
            cells.append(cell([rss for _, rss in runs], 1, "MB"))
        print(f"| {query} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
