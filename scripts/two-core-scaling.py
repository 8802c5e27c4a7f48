#!/usr/bin/env python3
"""How far two cores speed up NEXMark here: two threads of one process, and two workers.

    scripts/two-core-scaling.py [--rounds N] [--events E] [BINARY]

Each round runs, one after the other, into a blackhole: the tumbling count on 1 worker
x 1 thread, on 1 worker x 2 threads, and on 2 workers x 1 thread (a leader and a joiner
on loopback, as scripts/cluster-bench.sh does); then the bare input (`SELECT * FROM bid`,
no operator) on 1 and 2 threads. Every time is the exit report's "completed (end of
input) in" figure (from the start of the run, after a cluster's rendezvous). It prints
each round's times and, per comparison, the speed-ups' minimum, median and maximum,
each against the same round's one-thread run.

The bare input's speed-up is what the machine gives the generator alone; the two-thread
run's is what it gives the whole query with an in-process exchange; the two workers'
adds the exchange over TCP. Needs a release build (default target/release/sluice).
"""

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile

TUMBLE = (
    "SELECT auction, COUNT(*) AS n, window_start, window_end FROM TABLE(TUMBLE(TABLE bid, "
    "DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end"
)
SOURCE = "SELECT * FROM bid"
COMPLETED = re.compile(r"completed \(end of input\) in ([0-9.]+)s")


def pipeline(sql, threads, events):
    return f"""[pipeline]
name = "scaling"
threads = {threads}
[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
events = {events}
[[view]]
name = "q"
sql = "{sql}"
[[sink]]
name = "out"
from = "q"
connector = "blackhole"
"""


def seconds(output, what):
    found = COMPLETED.search(output)
    if not found:
        sys.exit(f"two-core-scaling: {what} printed no completion line:\n{output[-2000:]}")
    return float(found.group(1))


def solo(binary, directory, sql, threads, events):
    path = os.path.join(directory, f"solo-{threads}.toml")
    with open(path, "w") as f:
        f.write(pipeline(sql, threads, events))
    done = subprocess.run([binary, "run", path], capture_output=True, text=True, cwd=directory)
    return seconds(done.stdout + done.stderr, f"the {threads}-thread run")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster(binary, directory, sql, events):
    leader_dir, joiner_dir = os.path.join(directory, "leader"), os.path.join(directory, "joiner")
    for d in (leader_dir, joiner_dir):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "p.toml"), "w") as f:
            f.write(pipeline(sql, 1, events))
    address = f"127.0.0.1:{free_port()}"
    leader = subprocess.Popen(
        [binary, "run", "p.toml", "--workers", "2", "--control-bind", address],
        cwd=leader_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # The joiner retries until the leader listens.
    joined = subprocess.run(
        [binary, "run", "p.toml", "--join", address], cwd=joiner_dir, capture_output=True, text=True, timeout=600
    )
    led, _ = leader.communicate(timeout=600)
    seconds(joined.stdout + joined.stderr, "the joiner")
    return seconds(led, "the leader")


def spread(values):
    return f"{min(values):.2f}-{max(values):.2f}x, median {statistics.median(values):.2f}x"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--events", type=int, default=40_000_000)
    parser.add_argument("binary", nargs="?", default="target/release/sluice")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    if not os.access(binary, os.X_OK):
        sys.exit(f"two-core-scaling: no executable at {binary}: build it with cargo build --release -p sluice-cli")
    if args.rounds < 1 or args.events < 1:
        sys.exit("two-core-scaling: --rounds and --events must be at least 1")
    threads, workers, bare = [], [], []
    with tempfile.TemporaryDirectory(prefix="sluice-scaling-") as directory:
        for round in range(1, args.rounds + 1):
            t1 = solo(binary, directory, TUMBLE, 1, args.events)
            t2 = solo(binary, directory, TUMBLE, 2, args.events)
            w2 = cluster(binary, directory, TUMBLE, args.events)
            s1 = solo(binary, directory, SOURCE, 1, args.events)
            s2 = solo(binary, directory, SOURCE, 2, args.events)
            print(
                f"round {round}: tumbling count 1x1 {t1:.2f}s, 1x2 {t2:.2f}s, 2x1 {w2:.2f}s; "
                f"bare input 1x1 {s1:.2f}s, 1x2 {s2:.2f}s",
                flush=True,
            )
            threads.append(t1 / t2)
            workers.append(t1 / w2)
            bare.append(s1 / s2)
    print(f"bare input, two threads:      {spread(bare)}")
    print(f"tumbling count, two threads:  {spread(threads)}")
    print(f"tumbling count, two workers:  {spread(workers)}")


if __name__ == "__main__":
    main()
