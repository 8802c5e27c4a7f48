#!/usr/bin/env python3
"""Times two commands against each other, alternated, as BENCHMARKS.md's paired figures.

    scripts/paired.py [-n PAIRS] 'NEW COMMAND' 'OLD COMMAND'

Runs each command once as a warm-up, then PAIRS times NEW then OLD. For every run it
takes the wall time from a monotonic clock and, from the kernel's accounting of the
finished process (wait4's rusage), its user + system CPU time and peak RSS. It prints
each figure's minimum, median and maximum per command, and the ratio NEW / OLD pair by
pair (minimum, median, maximum). Output of the commands is discarded; a command that
exits non-zero stops the run. The peak RSS counts from the fork, so it is never below
this script's own (about 15 MiB): compare it only for commands that use far more.
"""

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time


def run(command):
    started = time.monotonic()
    try:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as error:
        sys.exit(f"paired: cannot start {shlex.join(command)}: {error}")
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"paired: {shlex.join(command)} exited with {code}")
    return {"wall s": wall, "cpu s": usage.ru_utime + usage.ru_stime, "peak MiB": usage.ru_maxrss / 1024}


def spread(values):
    return f"{min(values):10.3f} {statistics.median(values):10.3f} {max(values):10.3f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--pairs", type=int, default=5, help="counted pairs (default 5)")
    parser.add_argument("new", help="the command measured, as one shell-quoted string")
    parser.add_argument("old", help="the command it is compared with")
    args = parser.parse_args()
    if args.pairs < 1:
        sys.exit("paired: --pairs must be at least 1")
    new, old = shlex.split(args.new), shlex.split(args.old)
    run(new)
    run(old)
    pairs = [(run(new), run(old)) for _ in range(args.pairs)]
    print(f"{args.pairs} pairs; figures: min median max")
    for figure in ("wall s", "cpu s", "peak MiB"):
        print(f"new {figure:9} {spread([a[figure] for a, _ in pairs])}")
        print(f"old {figure:9} {spread([b[figure] for _, b in pairs])}")
    for figure in ("wall s", "cpu s"):
        print(f"new/old {figure:5} {spread([a[figure] / b[figure] for a, b in pairs])}")


if __name__ == "__main__":
    main()
