"""Writes testdata/delta-rs-checkpoint/_delta_log: a table written and checkpointed by
delta-rs (Python's `deltalake`, 1.6.6 when it was made), for `log_start_tests.rs`.

Versions: 0 creates it (k VARCHAR partition, v BIGINT, ts timestamp_ntz), 1 and 2
append (1 with a txn), 3 deletes rows (remove and add actions), 4 sets a table property
(a new metaData), 5 appends with a txn; then a checkpoint of version 5; then 6 appends
with a newer txn. Only the log is kept (the sink's read of the log opens no data file).

    python3 crates/sluice-connectors/src/delta/testdata/make_delta_rs_checkpoint.py
"""
import datetime
import os
import shutil
import sys
import tempfile

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

here = os.path.dirname(os.path.abspath(__file__))
schema = pa.schema([("k", pa.string()), ("v", pa.int64()), ("ts", pa.timestamp("us"))])


def rows(start, count):
    keys = [None if i % 4 == 3 else "k%d" % (i % 3) for i in range(start, start + count)]
    values = list(range(start, start + count))
    times = [datetime.datetime(2026, 1, 1) + datetime.timedelta(seconds=i) for i in values]
    return pa.table({"k": keys, "v": values, "ts": times}, schema=schema)


def txn(version):
    return CommitProperties(app_transactions=[Transaction("sluice/p/out/0", version)])


with tempfile.TemporaryDirectory() as scratch:
    path = os.path.join(scratch, "table")
    write_deltalake(path, rows(0, 4), partition_by=["k"])
    write_deltalake(path, rows(4, 4), mode="append", commit_properties=txn(1))
    write_deltalake(path, rows(8, 4), mode="append")
    DeltaTable(path).delete("v = 5")
    DeltaTable(path).alter.set_table_properties({"delta.logRetentionDuration": "interval 30 days"})
    write_deltalake(path, rows(12, 4), mode="append", commit_properties=txn(2))
    DeltaTable(path).create_checkpoint()
    write_deltalake(path, rows(16, 4), mode="append", commit_properties=txn(3))
    target = os.path.join(here, "delta-rs-checkpoint", "_delta_log")
    shutil.rmtree(os.path.dirname(target), ignore_errors=True)
    shutil.copytree(os.path.join(path, "_delta_log"), target)
    print(sorted(os.listdir(target)))
sys.stdout.flush()
# The binding aborts in its interpreter-exit teardown after a successful run.
os._exit(0)
