//! Generator throughput: events per second on one thread, for bids only and
//! for all three tables, at a typical batch size.
//!
//! Run with `cargo bench -p sluice-nexmark --bench generator`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_nexmark::{GeneratorConfig, LaneGenerator, Table, TableSet};

/// Events generated per benchmark iteration.
const EVENTS_PER_ITER: u64 = 1_000_000;
/// Events per batch.
const BATCH_EVENTS: usize = 8192;

fn generate(config: &GeneratorConfig, tables: TableSet) -> usize {
    let mut lane = LaneGenerator::new(config, 0, 1, tables);
    let mut rows = 0;
    while let Some(batch) = lane.next_batch(BATCH_EVENTS) {
        rows += batch.num_rows();
        black_box(&batch);
    }
    rows
}

fn bench_generator(c: &mut Criterion) {
    let config = GeneratorConfig { events: Some(EVENTS_PER_ITER), ..GeneratorConfig::default() };
    let mut group = c.benchmark_group("nexmark_generator");
    group.throughput(Throughput::Elements(EVENTS_PER_ITER));
    group.sample_size(10);
    let cases = [
        ("bids_only", TableSet::only(Table::Bid)),
        ("all_tables", TableSet::ALL),
        ("persons_only", TableSet::only(Table::Person)),
        ("auctions_only", TableSet::only(Table::Auction)),
    ];
    for (name, tables) in cases {
        group.bench_function(name, |b| b.iter(|| generate(&config, tables)));
    }
    group.finish();
}

criterion_group!(benches, bench_generator);
criterion_main!(benches);
