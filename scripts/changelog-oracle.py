#!/usr/bin/env python3
"""Regenerates the changelog oracle: Apache Flink's answers over the Debezium fixture.

What it does
    Reads crates/sluice-cli/tests/changelog-oracle/orders.debezium.jsonl (one Debezium
    change event per line, what the Kafka test produces to its topic; Debezium's
    tombstones are left out of the file, Flink skips them) with Flink's filesystem
    connector and its `debezium-json` format (`debezium-json.ignore-parse-errors`: the
    fixture holds one bad envelope, which Sluice counts and skips too), with PRIMARY KEY
    (id) NOT ENFORCED, in streaming mode, and runs the queries of the Kafka test
    crates/sluice-cli/tests/cli/kafka/changelog.rs and of the file test
    crates/sluice-cli/tests/cli/changelog/debezium.rs (which reads the same events from a
    `debezium-json` file, as Flink does here). Each query's changelog (Flink's row
    kinds) is integrated to its final table and written to QUERY.csv in that directory:
    line 1 the column names, then one row per line, sorted; a string in double quotes, a
    number as its decimal text.

How to run (from the repository root)
    python3 -m pip install apache-flink       # PyFlink; needs a Java 17 runtime
    python3 scripts/changelog-oracle.py
"""

import collections
import os
import sys
from pathlib import Path

from pyflink.common import RowKind
from pyflink.table import EnvironmentSettings, TableEnvironment

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "crates" / "sluice-cli" / "tests" / "changelog-oracle"

QUERIES = {
    "totals": "SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY customer",
    "top": "SELECT customer, id, amount FROM (SELECT customer, id, amount, ROW_NUMBER() OVER "
    "(PARTITION BY customer ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 1",
}


def field(value):
    if isinstance(value, str):
        return '"' + value.replace('"', '""') + '"'
    return str(value)


def main():
    settings = EnvironmentSettings.in_streaming_mode()
    env = TableEnvironment.create(settings)
    env.get_config().set("parallelism.default", "1")
    env.execute_sql(
        f"""CREATE TABLE orders (
              id BIGINT NOT NULL, customer STRING, amount BIGINT,
              PRIMARY KEY (id) NOT ENFORCED
            ) WITH (
              'connector' = 'filesystem',
              'path' = '{DIR / "orders.debezium.jsonl"}',
              'format' = 'debezium-json',
              'debezium-json.ignore-parse-errors' = 'true'
            )"""
    )
    for name, sql in QUERIES.items():
        result = env.execute_sql(sql)
        columns = result.get_table_schema().get_field_names()
        table = collections.Counter()
        with result.collect() as rows:
            for row in rows:
                values = tuple(row)
                if row.get_row_kind() in (RowKind.INSERT, RowKind.UPDATE_AFTER):
                    table[values] += 1
                else:
                    table[values] -= 1
                    assert table[values] >= 0, f"{name}: a retraction of a row not there: {values}"
        lines = sorted(",".join(field(v) for v in values) for values, count in table.items() for _ in range(count))
        text = ",".join(columns) + "\n" + "".join(line + "\n" for line in lines)
        (DIR / f"{name}.csv").write_text(text)
        print(f"{name}: {len(lines)} rows", file=sys.stderr)


if __name__ == "__main__":
    main()
