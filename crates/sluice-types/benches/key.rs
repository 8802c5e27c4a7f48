//! The key encoding and hash over one batch of 8192 rows: what the hash exchange and the
//! window aggregate pay per row (`cargo bench -p sluice-types --bench key`).

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use sluice_types::key::{KeyEncoder, KeyRows};

const ROWS: usize = 8192;

fn columns(kind: &str) -> Vec<ArrayRef> {
    let ints = |seed: i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values((0..ROWS as i64).map(|i| (i * 7919 + seed) % 100_003)))
    };
    match kind {
        "bigint" => vec![ints(1)],
        "bigint_bigint" => vec![ints(1), ints(2)],
        "varchar" => {
            let values: Vec<String> = (0..ROWS).map(|i| format!("key-{:06}", (i * 7919) % 100_003)).collect();
            vec![Arc::new(StringArray::from(values))]
        }
        other => panic!("unknown key kind {other}"),
    }
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("key_encode_and_hash");
    group.throughput(Throughput::Elements(ROWS as u64));
    for kind in ["bigint", "bigint_bigint", "varchar"] {
        let columns = columns(kind);
        let encoder = KeyEncoder::new(columns.iter().map(|c| c.data_type().clone()).collect()).expect("types");
        let mut rows = KeyRows::default();
        group.bench_with_input(BenchmarkId::from_parameter(kind), &columns, |b, columns| {
            b.iter(|| encoder.encode(columns, &mut rows).expect("encode"));
        });
    }
    group.finish();
}

criterion_group!(benches, encode);
criterion_main!(benches);
