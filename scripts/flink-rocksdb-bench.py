#!/usr/bin/env python3
"""Times one NEXMark query in Apache Flink with RocksDB and incremental checkpoints, and
in Sluice with the same checkpoint interval, over the same CSV files.

What it does
    1. Writes the three NEXMark tables of EVENTS events (seed 0) as CSV with
       `sluice nexmark generate`, once per event count (kept in --work).
    2. Runs the query in Flink, streaming mode, parallelism 1, into a `blackhole` table,
       with `state.backend.type: rocksdb`, `execution.checkpointing.incremental: true`,
       a checkpoint every INTERVAL into a local directory, watched while the job runs (every
       file that appears counted once, at its largest size). Flink's time is its job's
       (from submission to the end of the insert), without the JVM's start.
    3. Runs `sluice nexmark query QUERY --csv DIR --checkpoint-interval INTERVAL` on one
       thread, timed as a whole process.
    4. Prints one JSON line per engine: seconds, events/s, checkpoints completed, and the
       bytes written per checkpoint (Flink: the files that appeared under its checkpoint
       directory, divided by the checkpoint directories seen; Sluice: its report's written
       bytes and published checkpoints).

    With --heap, neither engine checkpoints and Flink keeps its state on its heap (its
    default `hashmap` backend): the comparison of issue 27's "ratio to Flink" table, the
    engines' speed with their state in memory.

    Flink's JVM stays up until this script exits, so a Sluice run after Flink's in the
    same invocation shares the CPU with it: run each engine in its own invocation
    (`--engines flink`, then `--engines sluice`) for a fair time.

How to run (from the repository root)
    cargo build --release -p sluice-cli
    pip install apache-flink        # with a Java 17 runtime on PATH or JAVA_HOME
    python3 scripts/flink-rocksdb-bench.py --sluice PATH --query q20 --events 1000000
    python3 scripts/flink-rocksdb-bench.py --sluice PATH --query q18 --heap

The SQL is the text `sluice nexmark sql QUERY` prints, a bare `dateTime` quoted for
Flink's parser; the tables and that fix are scripts/nexmark-oracle.py's.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

def _oracle():
    """scripts/nexmark-oracle.py, whose Flink table definitions and parser fix this uses."""
    path = Path(__file__).resolve().parent / "nexmark-oracle.py"
    spec = importlib.util.spec_from_file_location("nexmark_oracle", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ORACLE = _oracle()
TABLES = _ORACLE.TABLES
flink_text = _ORACLE.flink_text


def generate(sluice: Path, events: int, work: Path) -> Path:
    """The CSV tables of `events` events: with headers for Sluice, without for Flink."""
    out = work / f"nexmark-{events}"
    if (out / "bid.csv").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for table, columns in TABLES.items():
        path = out / f"{table}.csv"
        subprocess.run(
            [str(sluice), "nexmark", "generate", "--events", str(events), "--seed", "0",
             "--table", table, "--format", "csv", "--output", str(path)],
            check=True,
        )
        body = out / "flink" / table
        body.mkdir(parents=True, exist_ok=True)
        with open(path, encoding="utf-8") as source, open(body / "part.csv", "w", encoding="utf-8") as target:
            header = source.readline().strip()
            expected = ",".join(name for name, _ in columns)
            if header != expected:
                raise SystemExit(f"{path} starts with {header!r}, expected {expected!r}")
            for line in source:
                target.write(line)
    return out


class Watcher:
    """Every file and checkpoint directory that appears under a directory while Flink
    runs, with the largest size seen of each file (Flink deletes checkpoints it no longer
    needs, and discards them all when the job finishes)."""

    def __init__(self, path: Path):
        self.path, self.files, self.checkpoints = path, {}, set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def scan(self) -> None:
        for root, dirs, files in os.walk(self.path):
            self.checkpoints.update(d for d in dirs if d.startswith("chk-"))
            for name in files:
                try:
                    size = os.stat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    continue
                key = os.path.join(root, name)
                self.files[key] = max(size, self.files.get(key, 0))

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.scan()

    def stop(self) -> tuple[int, int]:
        self.done.set()
        self.thread.join()
        return len(self.checkpoints), sum(self.files.values())


def run_flink(sql: str, tables: Path, interval: str | None, checkpoints: Path) -> dict:
    """Flink's job time; with `interval` None, no checkpoints and its default heap state."""
    from pyflink.table import EnvironmentSettings, TableEnvironment, TableDescriptor, Schema

    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = t_env.get_config()
    settings = {"parallelism.default": "1"}
    if interval is not None:
        settings.update({
            "state.backend.type": "rocksdb",
            "execution.checkpointing.incremental": "true",
            "execution.checkpointing.interval": interval,
            "execution.checkpointing.dir": checkpoints.as_uri(),
            "execution.checkpointing.num-retained": "100000",
        })
    for key, value in settings.items():
        config.set(key, value)
    for table, columns in TABLES.items():
        schema = ", ".join(f"`{name}` {kind}" for name, kind in columns)
        options = f"'connector' = 'filesystem', 'path' = '{tables / 'flink' / table}', 'format' = 'csv'"
        # Flink's NEXMark tables' watermark: windows in streaming mode need a time attribute.
        watermark = "WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND"
        t_env.execute_sql(f"CREATE TABLE {table} ({schema}, {watermark}) WITH ({options})")
    result = t_env.sql_query(flink_text(sql))
    sink = TableDescriptor.for_connector("blackhole").schema(
        Schema.new_builder().from_row_data_type(result.get_schema().to_row_data_type()).build()
    ).build()
    watcher = Watcher(checkpoints)
    start = time.monotonic()
    result.execute_insert(sink).wait()
    seconds = time.monotonic() - start
    completed, written = watcher.stop()
    return {"seconds": seconds, "checkpoints": completed, "bytes_written": written}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sluice", type=Path, required=True, help="a release build of sluice")
    parser.add_argument("--query", default="q20")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--interval", default="1s")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "flink-rocksdb-bench")
    parser.add_argument("--engines", default="flink,sluice")
    parser.add_argument("--heap", action="store_true",
                        help="no checkpoints in either engine; Flink's state on its heap")
    args = parser.parse_args()
    interval = None if args.heap else args.interval
    engines = args.engines.split(",")
    tables = generate(args.sluice, args.events, args.work)
    sql = subprocess.run(
        [str(args.sluice), "nexmark", "sql", args.query], check=True, capture_output=True, text=True
    ).stdout.strip()

    if "flink" in engines:
        with tempfile.TemporaryDirectory(prefix="flink-chk-", dir=args.work) as checkpoints:
            flink = run_flink(sql, tables, interval, Path(checkpoints))
        flink["events_per_second"] = args.events / flink["seconds"]
        per = flink["bytes_written"] / max(flink["checkpoints"], 1)
        engine = "flink-heap" if args.heap else "flink-rocksdb-incremental"
        print(json.dumps({"engine": engine, "query": args.query, "events": args.events,
                          "interval": interval, **flink, "bytes_per_checkpoint": per}))

    if "sluice" in engines:
        command = [str(args.sluice), "nexmark", "query", args.query, "--events", str(args.events),
                   "--threads", "1", "--csv", str(tables)]
        if interval is not None:
            command += ["--checkpoint-interval", interval]
        start = time.monotonic()
        done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=args.work)
        seconds = time.monotonic() - start
        report = json.loads(done.stdout.strip().splitlines()[-1])
        checkpoints = report.get("checkpoints") or {}
        published, written = checkpoints.get("published", 0), checkpoints.get("written_bytes", 0)
        print(json.dumps({"engine": "sluice", "query": args.query, "events": args.events, "interval": interval,
                          "seconds": seconds, "events_per_second": args.events / seconds,
                          "checkpoints": published, "bytes_written": written,
                          "bytes_per_checkpoint": written / max(published, 1),
                          "peak_rss_mb": report.get("peak_rss_mb")}))


if __name__ == "__main__":
    main()
