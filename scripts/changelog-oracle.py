#!/usr/bin/env python3
"""Regenerates the changelog oracle: Apache Flink's answers over the changelog fixtures.

What it does
    Reads crates/sluice-cli/tests/changelog-oracle/orders.debezium.jsonl (one Debezium
    change event per line, what the Kafka test produces to its topic; Debezium's
    tombstones are left out of the file, Flink skips them) with Flink's filesystem
    connector and its `debezium-json` format (`debezium-json.ignore-parse-errors`: the
    fixture holds one bad envelope, which Sluice counts and skips too), with PRIMARY KEY
    (id) NOT ENFORCED, in streaming mode.

    Reads customers.upsert.tsv there (one upsert-kafka message per line, `key<TAB>value`,
    an empty value a tombstone: what the Kafka test produces to its upsert topic) as
    Flink's `upsert-kafka` connector would, in two parts:
      - the bytes of each message are decoded here, with Python's `json`, as the
        connector's `json` key and value formats decode them with `key.fields = name`
        and `value.fields-include = EXCEPT_KEY`: the key columns from the key, the
        others from the value (a field it lacks is NULL); a value is an INSERT row (the
        row kind the `json` format gives it), a tombstone a DELETE row holding only the
        key. This part is not Flink's: the PyFlink install has no Kafka connector.
      - the rows, in the topic's order, become a table through Flink's
        `from_changelog_stream` with the PRIMARY KEY (name) and ChangelogMode.upsert(),
        the changelog mode the connector's source declares in upsert mode. Flink's
        planner then normalizes them as it normalizes an upsert-kafka table (its
        ChangelogNormalize by the key, checked in the plan below): a value upserts its
        key, a repeated equal value changes nothing, a tombstone deletes its key's row,
        and a tombstone of a key without a row is dropped. This part, and every query,
        is Flink's.

    Then runs the queries of the Kafka test crates/sluice-cli/tests/cli/kafka/changelog.rs
    (and, over the orders, of the file test crates/sluice-cli/tests/cli/changelog/debezium.rs,
    which reads the same events from a `debezium-json` file, as Flink does here). Each
    query's changelog (Flink's row kinds) is integrated to its final table and written to
    QUERY.csv in that directory: line 1 the column names, then one row per line, sorted;
    a string in double quotes, a number as its decimal text.

How to run (from the repository root)
    python3 -m pip install apache-flink       # PyFlink; needs a Java 17 runtime
    python3 scripts/changelog-oracle.py
"""

import collections
import json
import sys
from pathlib import Path

from pyflink.common import Row, RowKind, Types
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.table import ChangelogMode, DataTypes, EnvironmentSettings, Schema, StreamTableEnvironment

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "crates" / "sluice-cli" / "tests" / "changelog-oracle"

QUERIES = {
    "totals": "SELECT customer, SUM(amount) AS total, COUNT(*) AS n FROM orders GROUP BY customer",
    "top": "SELECT customer, id, amount FROM (SELECT customer, id, amount, ROW_NUMBER() OVER "
    "(PARTITION BY customer ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 1",
    "regions": "SELECT c.region, SUM(o.amount) AS total, COUNT(*) AS n FROM orders o JOIN customers c "
    "ON o.customer = c.name GROUP BY c.region",
    "live_customers": "SELECT name, region FROM customers",
}

# The upsert topic's table: its key, then the other columns.
CUSTOMER_KEY = "name"
CUSTOMER_VALUE = ["region"]


def field(value):
    if isinstance(value, str):
        return '"' + value.replace('"', '""') + '"'
    return str(value)


def customer_rows():
    """The upsert fixture's messages as the rows upsert-kafka's decoding gives them."""
    rows = []
    for number, line in enumerate((DIR / "customers.upsert.tsv").read_text().splitlines(), 1):
        key_text, value_text = line.split("\t")
        key = json.loads(key_text)
        assert isinstance(key, dict) and isinstance(key.get(CUSTOMER_KEY), str), f"line {number}: key {key_text}"
        if not value_text:
            rows.append(Row.of_kind(RowKind.DELETE, key[CUSTOMER_KEY], *[None for _ in CUSTOMER_VALUE]))
            continue
        value = json.loads(value_text)
        assert isinstance(value, dict), f"line {number}: value {value_text}"
        # Sluice takes a key column the value holds from the value, Flink (EXCEPT_KEY)
        # from the key: the fixture keeps them equal, so both read the same row.
        assert value.get(CUSTOMER_KEY, key[CUSTOMER_KEY]) == key[CUSTOMER_KEY], f"line {number}: key and value differ"
        columns = [value.get(column) for column in CUSTOMER_VALUE]
        assert all(c is None or isinstance(c, str) for c in columns), f"line {number}: {value_text}"
        rows.append(Row.of_kind(RowKind.INSERT, key[CUSTOMER_KEY], *columns))
    return rows


def register_customers(stream_env, env):
    names = [CUSTOMER_KEY, *CUSTOMER_VALUE]
    stream = stream_env.from_collection(
        customer_rows(), type_info=Types.ROW_NAMED(names, [Types.STRING() for _ in names])
    )
    schema = (
        Schema.new_builder()
        .column(CUSTOMER_KEY, DataTypes.STRING().not_null())
        .column("region", DataTypes.STRING())
        .primary_key(CUSTOMER_KEY)
        .build()
    )
    env.create_temporary_view("customers", env.from_changelog_stream(stream, schema, ChangelogMode.upsert()))
    # What makes this upsert-kafka's handling: the planner's normalization by the key.
    plan = env.explain_sql(QUERIES["live_customers"])
    assert f"ChangelogNormalize(key=[{CUSTOMER_KEY}])" in plan, plan


def main():
    stream_env = StreamExecutionEnvironment.get_execution_environment()
    stream_env.set_parallelism(1)
    env = StreamTableEnvironment.create(stream_env, EnvironmentSettings.in_streaming_mode())
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
    register_customers(stream_env, env)
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
