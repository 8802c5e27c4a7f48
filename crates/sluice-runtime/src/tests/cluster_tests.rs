//! Two workers in one process, each running its part of one plan over real loopback
//! links: rows cross workers through the exchange, every row arrives once, at the slot
//! its partitioner chose, and both parts end cleanly.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::Arc;

use sluice_cluster::link::{Authenticator, LinkConfig, NetworkBuilder};
use sluice_types::vnode::SlotLayout;

use crate::plan::SinkParallelism;
use crate::{ClusterRun, Metrics, RunOutcome, stop_handle};

use super::support::{CollectSink, VecSource, options, plan};

#[test]
fn two_workers_exchange_rows_and_each_row_lands_once_on_its_slot() {
    // Four lanes over 2 workers x 2 threads: lane l runs on slot l.
    let lanes: Vec<Vec<Vec<i64>>> =
        (0..4).map(|lane| (0..25).map(|b| vec![lane * 1000 + b * 2, lane * 1000 + b * 2 + 1]).collect()).collect();
    let expected: Vec<i64> = lanes.iter().flatten().flatten().copied().collect();
    let sink = Arc::new(CollectSink::new(SinkParallelism::PerThread));
    let collected = Arc::clone(&sink.collected);
    let layout = SlotLayout::new(&[2, 2]);
    let listeners: Vec<TcpListener> = (0..2).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    let addresses: Vec<_> = listeners.iter().map(|l| l.local_addr().expect("address")).collect();
    let mut parts = Vec::new();
    for (worker, listener) in listeners.into_iter().enumerate() {
        let worker = worker as u32;
        let plan = plan(VecSource::new(lanes.clone()), sink.clone(), true);
        let layout = layout.clone();
        let peer = 1 - worker;
        let network = NetworkBuilder::new(worker, 7, [(peer, addresses[peer as usize])], LinkConfig::default());
        parts.push(std::thread::spawn(move || {
            let no_secret: Authenticator = Arc::new(|_, _| Ok(()));
            let connect = Box::new(move |builder: NetworkBuilder| builder.connect(&listener, no_secret));
            let cluster = ClusterRun { layout, worker, network, connect, peers: None };
            let options = options(4, 2);
            let metrics = Arc::new(Metrics::for_plan(&plan, options.threads));
            crate::run_part(&plan, &options, None, Some(cluster), stop_handle(), metrics, &mut |_| {})
        }));
    }
    for part in parts {
        let report = part.join().expect("a worker's part");
        assert_eq!(report.outcome, RunOutcome::Completed);
    }
    let written = collected.written.lock().expect("lock").clone();
    let mut by_value: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
    for (slot, value) in written {
        by_value.entry(value).or_default().push(slot);
    }
    assert_eq!(by_value.keys().copied().collect::<Vec<_>>(), {
        let mut e = expected.clone();
        e.sort();
        e
    });
    for (value, slots) in by_value {
        assert_eq!(slots, [value.rem_euclid(4) as u32], "value {value} lands once, on slot value % 4");
    }
}
