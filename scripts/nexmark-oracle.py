#!/usr/bin/env python3
"""Regenerates the NEXMark oracle: Apache Flink's own answers to NEXMark's queries.

What it does
    1. Writes the three NEXMark tables of a fixed input (EVENTS events, seed SEED) as CSV
       with `sluice nexmark generate` (deterministic: the test regenerates the same files,
       and the `nexmark` source with the same event count and seed gives the same events).
    2. Runs every NEXMark query Sluice has (q0-q5, q7-q9, q11, q15-q22) in Apache Flink, in
       batch mode (q11 in streaming mode: Flink's batch planner has no SESSION group window;
       a watermark a day behind makes no row late), over filesystem CSV tables with Flink's NEXMark column names and types
       (`dateTime` and `expires` as TIMESTAMP(3)). The SQL is the text that
       `sluice nexmark sql QUERY` prints, with one change where needed: a bare `dateTime`
       is put in backquotes (Flink's parser reserves DATETIME; Flink's own NEXMark texts
       quote it). The README lists the queries that needed it.
    3. Writes each query's final answer to crates/sluice-cli/tests/nexmark-oracle/QUERY.csv
       in the canonical form below, and that directory's README (input, Flink version).

    The test crates/sluice-cli/tests/cli/nexmark_oracle.rs compares Sluice's answers with
    these files; it needs neither Flink nor Java.

Canonical form (the test renders Sluice's rows the same way)
    - line 1: the column names as Flink names them, joined by commas;
    - then one line per row (duplicates kept), sorted by their UTF-8 bytes;
    - fields joined by commas: NULL is an empty field; a string or a timestamp is written
      in double quotes (a quote inside doubled); a timestamp as `YYYY-MM-DD HH:MM:SS.mmm`;
      a number (integer, DECIMAL or DOUBLE) as its exact decimal text, without an exponent,
      a sign for zero or trailing zeros after the point (DECIMAL 1120.470 -> 1120.47,
      12.000 -> 12). Numbers of any type compare equal when their values are equal, so
      Flink's DECIMAL(23, 3) and an engine's DOUBLE agree exactly when the double's
      shortest decimal text is the decimal's value.

How to run (from the repository root)
    cargo build -p sluice-cli
    python3 -m venv /tmp/pyflink && /tmp/pyflink/bin/pip install apache-flink
    /tmp/pyflink/bin/python scripts/nexmark-oracle.py [--sluice PATH] [--queries q3,q4]

    It needs PyFlink (`pip install apache-flink`, from PyPI) and a Java 17 runtime
    (`java` on PATH or JAVA_HOME). `--sluice` defaults to the debug build under
    CARGO_TARGET_DIR (or target/).
"""

import argparse
import datetime
import decimal
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

EVENTS = 20_000
SEED = 0

QUERIES = [
    "q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q9", "q11",
    "q15", "q16", "q17", "q18", "q19", "q20", "q21", "q22",
]

# Flink's NEXMark tables (nexmark-flink's DDL), column for column as Sluice's schema.
TABLES = {
    "person": [
        ("id", "BIGINT"), ("name", "VARCHAR"), ("emailAddress", "VARCHAR"),
        ("creditCard", "VARCHAR"), ("city", "VARCHAR"), ("state", "VARCHAR"),
        ("dateTime", "TIMESTAMP(3)"), ("extra", "VARCHAR"),
    ],
    "auction": [
        ("id", "BIGINT"), ("itemName", "VARCHAR"), ("description", "VARCHAR"),
        ("initialBid", "BIGINT"), ("reserve", "BIGINT"), ("dateTime", "TIMESTAMP(3)"),
        ("expires", "TIMESTAMP(3)"), ("seller", "BIGINT"), ("category", "BIGINT"),
        ("extra", "VARCHAR"),
    ],
    "bid": [
        ("auction", "BIGINT"), ("bidder", "BIGINT"), ("price", "BIGINT"),
        ("channel", "VARCHAR"), ("url", "VARCHAR"), ("dateTime", "TIMESTAMP(3)"),
        ("extra", "VARCHAR"),
    ],
}

# Queries Flink's batch mode cannot plan, run in streaming mode over the same bounded files
# (see the streaming tables' watermark below): the legacy SESSION group window of q11.
STREAMING = {"q11"}

ROOT = Path(__file__).resolve().parent.parent
ORACLE_DIR = ROOT / "crates" / "sluice-cli" / "tests" / "nexmark-oracle"


def number_text(value: decimal.Decimal) -> str:
    """The exact decimal text of a number: no exponent, no trailing zeros, no -0."""
    if value == 0:
        return "0"
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def field(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return number_text(value)
    if isinstance(value, float):
        # repr is the shortest text that reads back as the same double.
        return number_text(decimal.Decimal(repr(value)))
    if isinstance(value, datetime.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S") + ".%03d" % (value.microsecond // 1000)
    else:
        text = str(value)
    if "\n" in text or "\r" in text:
        sys.exit(f"a value holds a line break, which the canonical form cannot hold: {text!r}")
    return '"' + text.replace('"', '""') + '"'


def canonical(names, rows) -> str:
    lines = sorted((",".join(field(v) for v in row) for row in rows), key=lambda l: l.encode("utf-8"))
    return "\n".join([",".join(names)] + lines) + "\n"


def flink_text(sql: str) -> str:
    """`sql` with every bare `dateTime` identifier in backquotes: Flink's parser reserves
    DATETIME, and Flink's own NEXMark texts quote it; Sluice accepts both spellings. This
    is the only change made to Sluice's text, and the README lists the queries it touched."""
    return re.sub(r"(?<![`\w])dateTime(?![`\w])", "`dateTime`", sql)


def integrated(result):
    """The rows a result's changelog leaves in place (every +I/+U minus every -U/-D)."""
    from pyflink.common import RowKind

    counts = {}
    with result.collect() as rows:
        for row in rows:
            values = tuple(row)
            kind = row.get_row_kind()
            step = 1 if kind in (RowKind.INSERT, RowKind.UPDATE_AFTER) else -1
            counts[values] = counts.get(values, 0) + step
            if counts[values] < 0:
                sys.exit(f"a retraction of a row not in the result: {values}")
    return [values for values, count in counts.items() for _ in range(count)]


def default_sluice() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "debug" / "sluice"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sluice", type=Path, default=default_sluice(), help="the sluice binary")
    parser.add_argument("--queries", default=",".join(QUERIES), help="comma-separated queries to regenerate")
    args = parser.parse_args()
    queries = [q.strip() for q in args.queries.split(",") if q.strip()]
    unknown = [q for q in queries if q not in QUERIES]
    if unknown:
        sys.exit(f"unknown queries {unknown}; choose among {QUERIES}")
    if not args.sluice.exists():
        sys.exit(f"no sluice binary at {args.sluice}: run `cargo build -p sluice-cli` or pass --sluice")

    from pyflink.table import EnvironmentSettings, TableEnvironment
    from pyflink.version import __version__ as flink_version

    ORACLE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nexmark-oracle-") as work:
        work = Path(work)
        batch = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
        streaming = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
        for t_env in (batch, streaming):
            t_env.get_config().set("parallelism.default", "1")
        for table, columns in TABLES.items():
            with_header = work / f"{table}.csv"
            subprocess.run(
                [str(args.sluice), "nexmark", "generate", "--events", str(EVENTS), "--seed", str(SEED),
                 "--table", table, "--format", "csv", "--output", str(with_header)],
                check=True,
            )
            # Flink's CSV format has no header option: it reads a copy without line 1,
            # after checking that line 1 names the columns it declares.
            lines = with_header.read_text(encoding="utf-8").splitlines(keepends=True)
            expected_header = ",".join(name for name, _ in columns)
            if lines[0].strip() != expected_header:
                sys.exit(f"{table}.csv starts with {lines[0].strip()!r}, expected {expected_header!r}")
            body = work / table
            body.mkdir()
            (body / "part.csv").write_text("".join(lines[1:]), encoding="utf-8")
            schema = ", ".join(f"`{name}` {kind}" for name, kind in columns)
            options = f"'connector' = 'filesystem', 'path' = '{body}', 'format' = 'csv'"
            batch.execute_sql(f"CREATE TABLE {table} ({schema}) WITH ({options})")
            # In streaming mode a watermark a day behind the newest row: no row of the input
            # (a few seconds of event time) is late, and the end of the input fires every
            # window, so the answer is the batch answer.
            streaming.execute_sql(
                f"CREATE TABLE {table} ({schema}, WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '1' DAY) "
                f"WITH ({options})"
            )
        quoted = []
        for query in queries:
            sql = subprocess.run(
                [str(args.sluice), "nexmark", "sql", query], check=True, capture_output=True, text=True
            ).stdout.strip()
            if flink_text(sql) != sql:
                quoted.append(query)
            t_env = streaming if query in STREAMING else batch
            result = t_env.execute_sql(flink_text(sql))
            names = result.get_table_schema().get_field_names()
            rows = integrated(result)
            (ORACLE_DIR / f"{query}.csv").write_text(canonical(names, rows), encoding="utf-8")
            print(f"{query}: {len(rows)} rows", file=sys.stderr)

    (ORACLE_DIR / "README.md").write_text(
        f"""# NEXMark answers from Apache Flink

Each `qN.csv` is Apache Flink's answer (PyFlink {flink_version}, batch mode; q11 in
streaming mode, which alone has its SESSION window, with no row late) to NEXMark
query qN, as `sluice nexmark sql qN` prints it, over the events of
`sluice nexmark generate --events {EVENTS} --seed {SEED}` (the tables person, auction and
bid as CSV). Written by `scripts/nexmark-oracle.py`, which documents the canonical form
and how to run it; never edited by hand. The test `tests/cli/nexmark_oracle.rs`
regenerates the same input and compares Sluice's answers with these.

- events: {EVENTS}
- seed: {SEED}
- changed for Flink's parser: {", ".join(quoted) or "none"} (a bare `dateTime` written
  `` `dateTime` ``, as Flink's own texts write it: Flink reserves DATETIME)
""",
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
