"""Writes testdata/delta-rs-v2-checkpoint/_delta_log: a table of delta-rs (Python's
`deltalake`, 1.6.6 when it was made) with the `v2Checkpoint` table feature and a V2 log
checkpoint, for `log_start_tests.rs`: the sink must never read that checkpoint, and must
refuse the table naming the feature.

Versions: 0 creates it (k VARCHAR, v BIGINT; the columns of the tests' sink), 1 adds
the `v2Checkpoint` feature (protocol reader 3 / writer 7), 2 appends with a txn; then a
checkpoint of version 2, which delta-rs names as a classic one
(`{v:020}.checkpoint.parquet`) and makes a V2 one by its `checkpointMetadata` row; then 3
appends. Only the log is kept.

    python3 crates/sluice-connectors/src/delta/testdata/make_delta_rs_v2_checkpoint.py
"""
import os
import shutil
import sys
import tempfile

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, TableFeatures, Transaction, write_deltalake

here = os.path.dirname(os.path.abspath(__file__))
schema = pa.schema([("auction", pa.int64()), ("region", pa.string())])


def rows(start):
    return pa.table({"auction": [start, start + 1], "region": ["eu", None]}, schema=schema)


with tempfile.TemporaryDirectory() as scratch:
    path = os.path.join(scratch, "table")
    write_deltalake(path, rows(0), partition_by=["region"])
    DeltaTable(path).alter.add_feature(TableFeatures.V2Checkpoint, allow_protocol_versions_increase=True)
    commit = CommitProperties(app_transactions=[Transaction("sluice/p/out/0", 1)])
    write_deltalake(path, rows(2), mode="append", commit_properties=commit)
    DeltaTable(path).create_checkpoint()
    write_deltalake(path, rows(4), mode="append")
    target = os.path.join(here, "delta-rs-v2-checkpoint", "_delta_log")
    shutil.rmtree(os.path.dirname(target), ignore_errors=True)
    shutil.copytree(os.path.join(path, "_delta_log"), target)
    print(sorted(os.listdir(target)))
sys.stdout.flush()
# The binding aborts in its interpreter-exit teardown after a successful run.
os._exit(0)
