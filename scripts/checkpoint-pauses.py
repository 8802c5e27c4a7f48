#!/usr/bin/env python3
"""Checkpoint pauses by state size, over several runs of a NEXMark state query.

Usage: scripts/checkpoint-pauses.py QUERY EVENTS INTERVAL RUNS [THREADS]
  e.g. scripts/checkpoint-pauses.py state 12000000 100ms 20

Runs `sluice nexmark query QUERY --checkpoint-interval INTERVAL` RUNS times (the binary
is $SLUICE, else $CARGO_TARGET_DIR/release/sluice, else target/release/sluice), takes
every published checkpoint's state size, pause and duration from the result line, and
prints the pause percentiles (nearest rank) per state-size bucket.
"""
import json
import math
import os
import subprocess
import sys


def binary():
    if os.environ.get("SLUICE"):
        return os.environ["SLUICE"]
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    return os.path.join(target, "release", "sluice")


def percentile(values, percent):
    ordered = sorted(values)
    return ordered[max(1, math.ceil(percent / 100 * len(ordered))) - 1]


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    query, events, interval, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    threads = sys.argv[5] if len(sys.argv) == 6 else "1"
    command = [binary(), "nexmark", "query", query, "--events", events, "--threads", threads,
               "--checkpoint-interval", interval]
    checkpoints, rates, peaks, steps = [], [], [], []
    for _ in range(runs):
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        line = [text for text in result.stdout.splitlines() if text.startswith("{")][-1]
        report = json.loads(line)
        rates.append(report["events_per_second"] / 1e6)
        peaks.append(report["peak_rss_mb"])
        steps.append(report["longest_step_ms"])
        # [epoch, MB of state, pause ms, checkpoint ms]; the last, taken at the end of
        # input, holds no window state.
        checkpoints += [entry[1:] for entry in report["checkpoints"]["history"] if entry[1] > 0]
    print(f"{query}, {events} events, interval {interval}, {threads} thread(s), {runs} runs")
    print("M events/s per run:", " ".join(f"{rate:.2f}" for rate in rates))
    print("peak RSS MB per run:", " ".join(f"{peak:.0f}" for peak in peaks))
    print("longest step ms per run:", " ".join(f"{step:.0f}" for step in steps))
    print(f"{'state MB':>12} {'n':>4} {'pause p50':>10} {'p99':>6} {'max':>6} {'checkpoint p50':>15} {'max':>7}")
    for low, high in [(0, 20), (20, 50), (50, 80), (80, 130), (130, 300), (300, 700), (700, 1500), (1500, 1e9)]:
        chosen = [c for c in checkpoints if low <= c[0] < high]
        if not chosen:
            continue
        pauses = [c[1] for c in chosen]
        durations = [c[2] for c in chosen]
        print(f"{f'{low}-{high:g}':>12} {len(chosen):>4} {percentile(pauses, 50):>10} {percentile(pauses, 99):>6} "
              f"{max(pauses):>6} {percentile(durations, 50):>15} {max(durations):>7}")


if __name__ == "__main__":
    main()
