#!/usr/bin/env python3
"""PostgreSQL CDC throughput: the `postgres-cdc` source into a blackhole, against the rate
the replication stream itself delivers (`pg_recvlogical`, the same pgoutput plugin and
publication, into /dev/null), over the same changes, alternated.

What it does
    1. Starts a throwaway cluster (the newest /usr/lib/postgresql/*/bin, `initdb` as the
       `postgres` user when run as root; `wal_level = logical`, `fsync = off`, on a free
       loopback port, in a temporary directory removed at the end).
    2. Creates pgbench's accounts table (`aid BIGINT PRIMARY KEY, bid INT, abalance INT,
       filler CHAR(84)`; REPLICA IDENTITY FULL, which the source requires of a table
       with a text column), a publication of it, and the slot `base` (pgoutput).
    3. Writes the changes the slot then holds: 100,000 rows in one transaction, then a
       pgbench run of TRANSACTIONS transactions per client of the script below (per
       transaction an update of a random account, an insert of a new one and a delete
       of the one inserted 1,000 transactions before): inserts, updates and deletes in
       equal numbers, three changes a transaction, as pgbench's own TPC-B-like load
       commits small transactions.
    4. For each round, runs both readers, in alternating order, each on its own copy of
       `base` (pg_copy_logical_replication_slot: the same start and the same WAL to
       decode), up to the WAL position after the load:
         pg_recvlogical --start --endpos END -P pgoutput -o proto_version=1
             -o publication_names=bench -f /dev/null
         sluice run (threads = 1, the `postgres-cdc` source with create_slot = false and
             bounded = true, a `blackhole` sink, no checkpoints)
       Each is timed as a whole process (wall time from a monotonic clock; CPU time from
       the kernel's accounting of the finished process), with the load average before it.
    5. Prints one line per run and a summary: the changes (inserts + updates + deletes,
       one each, from pg_stat_user_tables) per second of each, min / median / max, and
       Sluice's rate over pg_recvlogical's round by round.

How to run (from the repository root)
    cargo build --release -p sluice-cli --features postgres
    apt-get install -y postgresql    # the server, psql, pgbench and pg_recvlogical
    python3 scripts/cdc-bench.py --sluice $CARGO_TARGET_DIR/release/sluice --rounds 5

Sluice reads a delete's and an update's whole old row (REPLICA IDENTITY FULL): an
update becomes two rows, -U and +U, so its exit report counts more rows in than there
are changes; both readers' rates here are changes per second.
"""

import argparse
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

FILL_ROWS = 100_000
DELETE_LAG = 1_000
LOAD = f"""\\set aid random(1, {FILL_ROWS})
\\set delta random(-5000, 5000)
SELECT nextval('account_ids') AS id \\gset
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
INSERT INTO pgbench_accounts (aid, bid, abalance, filler) VALUES (:id, 1, :delta, 'new');
DELETE FROM pgbench_accounts WHERE aid = :id - {DELETE_LAG};
END;
"""
SCHEMA = f"""
CREATE TABLE pgbench_accounts (aid BIGINT PRIMARY KEY, bid INT NOT NULL, abalance INT NOT NULL, filler CHAR(84));
ALTER TABLE pgbench_accounts REPLICA IDENTITY FULL;
CREATE SEQUENCE account_ids START {FILL_ROWS + 1_000_000};
CREATE PUBLICATION bench FOR TABLE pgbench_accounts;
"""
# Apart: a slot is not created in a transaction that wrote (psql -c runs one).
BASE_SLOT = "SELECT pg_create_logical_replication_slot('base', 'pgoutput')"
FILL = f"INSERT INTO pgbench_accounts SELECT i, 1, 0, 'filled' FROM generate_series(1, {FILL_ROWS}) AS i;"


def server_binaries():
    found = sorted(
        (int(entry.name), entry / "bin")
        for entry in Path("/usr/lib/postgresql").iterdir()
        if entry.name.isdigit() and (entry / "bin" / "initdb").exists()
    )
    if not found:
        sys.exit("cdc-bench: no /usr/lib/postgresql/*/bin/initdb; apt-get install -y postgresql")
    return found[-1][1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A throwaway cluster in `root`, stopped by stop()."""

    def __init__(self, root: Path, slots: int):
        self.bin = server_binaries()
        self.root = root
        self.port = free_port()
        self.data = root / "data"
        self.as_root = os.geteuid() == 0
        if self.as_root:
            subprocess.run(["chown", "-R", "postgres:postgres", str(root)], check=True)
        self.owner([self.bin / "initdb", "-D", self.data, "-U", "sluice", "--auth=trust", "-E", "UTF8", "--no-sync"])
        settings = (
            f"-p {self.port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c wal_level=logical "
            f"-c max_replication_slots={slots} -c max_wal_senders={slots} -c max_wal_size=4GB"
        )
        self.owner([self.bin / "pg_ctl", "-D", self.data, "-w", "-l", root / "server.log", "-o", settings, "start"])

    def owner(self, command):
        command = [str(c) for c in command]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--"] + command
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=self.root)

    def connection(self):
        return ["-h", "127.0.0.1", "-p", str(self.port), "-U", "sluice", "-d", "postgres"]

    def psql(self, sql):
        command = [str(self.bin / "psql"), *self.connection(), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"cdc-bench: psql failed on {sql!r}:\n{done.stderr}")
        return done.stdout.strip()

    def url(self):
        return f"host=127.0.0.1 port={self.port} user=sluice dbname=postgres"

    def stop(self):
        self.owner([self.bin / "pg_ctl", "-D", self.data, "-m", "fast", "stop"])


def walsender_cpu():
    """pid -> CPU seconds of each walsender process now (from /proc)."""
    found = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"postgres: walsender"):
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            found[pid] = (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue
    return found


def timed(command, **kwargs):
    """(wall s, CPU s, stderr, load, the walsenders' CPU s) of `command`, which must
    succeed; the walsenders (the server's side of the stream) are sampled every 50 ms."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kwargs)
    stderr = []
    reader = threading.Thread(target=lambda: stderr.append(process.stderr.read()))
    reader.start()
    senders = {}
    while process.poll() is None:
        senders.update(walsender_cpu())
        time.sleep(0.05)
    reader.join()
    stderr = b"".join(stderr).decode(errors="replace")
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        sys.exit(f"cdc-bench: {' '.join(map(str, command))} failed:\n{stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, stderr, load, sum(senders.values())


def pipeline(url, slot):
    return f"""[pipeline]
name = "cdc-bench"
threads = 1

[[source]]
name = "bank"
connector = "postgres-cdc"
[source.options]
url = "{url}"
tables = ["pgbench_accounts"]
publication = "bench"
slot = "{slot}"
create_slot = false
bounded = true

[[sink]]
name = "out"
from = "pgbench_accounts"
connector = "blackhole"
"""


def spread(values):
    return f"{min(values):,.0f} / {statistics.median(values):,.0f} / {max(values):,.0f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sluice", default="target/release/sluice")
    parser.add_argument("--transactions", type=int, default=50_000, help="pgbench transactions per client")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="leave the cluster's directory (printed) in place")
    args = parser.parse_args()
    sluice = Path(args.sluice).resolve()
    if not os.access(sluice, os.X_OK):
        sys.exit(f"cdc-bench: no {sluice}: build it first (cargo build --release -p sluice-cli --features postgres)")
    root = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    cluster = None
    try:
        cluster = Cluster(root, slots=2 * args.rounds + 6)
        print(f"machine: {os.cpu_count()} cores; PostgreSQL {cluster.psql('SHOW server_version')}", flush=True)
        cluster.psql(SCHEMA)
        cluster.psql(BASE_SLOT)
        start = cluster.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'base'")
        cluster.psql(FILL)
        (root / "load.sql").write_text(LOAD)
        load_started = time.monotonic()
        pgbench = [
            str(cluster.bin / "pgbench"), *cluster.connection(), "-n", "-c", str(args.clients), "-j", "2",
            "-t", str(args.transactions), "-f", str(root / "load.sql"),
        ]  # fmt: skip
        out = subprocess.run(pgbench, check=True, capture_output=True, text=True).stdout
        tps = re.search(r"tps = ([\d.]+)", out)
        print(f"load: {args.clients} clients x {args.transactions} transactions in "
              f"{time.monotonic() - load_started:.1f} s ({tps.group(1) if tps else '?'} tps)", flush=True)
        end = cluster.psql("SELECT pg_current_wal_lsn()")
        time.sleep(1)  # the pgbench sessions' statistics reach pg_stat
        counts = cluster.psql(
            "SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables WHERE relname = 'pgbench_accounts'"
        )
        inserts, updates, deletes = (int(c) for c in counts.split("|"))
        changes = inserts + updates + deletes
        wal = int(cluster.psql(f"SELECT pg_wal_lsn_diff('{end}', '{start}')"))
        print(f"stream: {start} .. {end}, {wal / 1e6:.0f} MB of WAL; changes {changes:,} "
              f"({inserts:,} inserts, {updates:,} updates, {deletes:,} deletes)", flush=True)

        results = {"pg_recvlogical": [], "sluice": []}
        ratios = []
        for round_ in range(args.rounds + 1):  # round 0 warms the page cache and is not counted
            order = ["pg_recvlogical", "sluice"] if round_ % 2 == 0 else ["sluice", "pg_recvlogical"]
            this_round = {}
            for reader in order:
                slot = f"{'recv' if reader == 'pg_recvlogical' else 'sluice'}_{round_}"
                cluster.psql(f"SELECT pg_copy_logical_replication_slot('base', '{slot}')")
                if reader == "pg_recvlogical":
                    command = [
                        str(cluster.bin / "pg_recvlogical"), *cluster.connection(), "--slot", slot, "--start",
                        "--endpos", end, "--no-loop", "-P", "pgoutput", "-o", "proto_version=1",
                        "-o", "publication_names=bench", "-f", "/dev/null",
                    ]  # fmt: skip
                    wall, cpu, _, load, sender = timed(command)
                    note = ""
                else:
                    toml = root / "pipeline.toml"
                    toml.write_text(pipeline(cluster.url(), slot))
                    wall, cpu, stderr, load, sender = timed([str(sluice), "run", str(toml)], cwd=root)
                    rows = re.search(r"source bank: (\d+) rows in", stderr)
                    report = re.search(r"completed \(end of input\) in ([\d.]+)s", stderr)
                    note = f" rows_in={rows.group(1) if rows else '?'} report_s={report.group(1) if report else '?'}"
                cluster.psql(f"SELECT pg_drop_replication_slot('{slot}')")
                rate = changes / wall
                this_round[reader] = rate
                counted = "" if round_ else " (warm-up)"
                print(f"round {round_} {reader}: wall_s={wall:.3f} cpu_s={cpu:.3f} walsender_cpu_s={sender:.3f} changes_per_s={rate:,.0f} "
                      f"load={load:.2f}{note}{counted}", flush=True)
                if round_:
                    results[reader].append(rate)
            if round_:
                ratios.append(this_round["sluice"] / this_round["pg_recvlogical"])
        print(f"summary over {args.rounds} rounds, changes/s min / median / max:")
        for reader, rates in results.items():
            print(f"  {reader}: {spread(rates)}")
        print(f"  sluice / pg_recvlogical, by round: {min(ratios):.2f} / {statistics.median(ratios):.2f} / "
              f"{max(ratios):.2f}")
    finally:
        if cluster is not None:
            cluster.stop()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
