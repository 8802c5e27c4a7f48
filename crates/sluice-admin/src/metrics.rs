//! `/metrics`: the job's live counters in the Prometheus text exposition format, version
//! 0.0.4 (`# HELP` and `# TYPE` once per metric, then its samples; label values escaped).
//!
//! Bounds: one sample per source, sink, lane, thread and named counter; made from
//! atomics read once per request.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use sluice_engine::{JobHandle, Metrics, Status};

/// The content type of the exposition format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A lane without a watermark yet (`sluice_runtime::metrics::NO_WATERMARK`, in
/// crates/sluice-runtime/src/metrics.rs).
const NO_WATERMARK: i64 = i64::MIN;

/// One metric family: its name, help, type and samples (labels, value).
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<(Vec<(&'static str, String)>, String)>,
}

/// The whole exposition for `job` in state `status`.
pub(crate) fn render(job: &JobHandle, status: &Status) -> String {
    let metrics = job.metrics();
    let mut families = vec![job_state(status), last_epoch(status)];
    families.extend(source_families(&metrics));
    families.extend(sink_families(&metrics));
    families.extend(link_families(&metrics));
    families.push(late_rows(&metrics));
    families.extend(thread_families(&metrics));
    families.extend(operator_families(&metrics));
    families.extend(queue_families(&metrics));
    families.extend(checkpoint_families(&metrics));
    families.push(named_counters(&metrics));
    families.push(Family {
        name: "sluice_query_leases",
        help: "Query leases held now, each keeping one committed checkpoint of the materialized tables.",
        kind: "gauge",
        samples: vec![(Vec::new(), job.query_leases().to_string())],
    });
    let (held, held_seconds) = job.sources_held();
    families.push(Family {
        name: "sluice_sources_held",
        help: "1 while the sources wait for a checkpoint's commit: the materialized tables' rows since the last \
               committed checkpoint are over half of state_memory_mib.",
        kind: "gauge",
        samples: vec![(Vec::new(), u8::from(held).to_string())],
    });
    families.push(Family {
        name: "sluice_sources_held_seconds_total",
        help: "Seconds the sources waited for a checkpoint's commit (see sluice_sources_held).",
        kind: "counter",
        samples: vec![(Vec::new(), format!("{held_seconds:.3}"))],
    });
    let executions = sluice_engine::query::Executions::shared().counts();
    families.push(Family {
        name: "sluice_queries_running",
        help: "Ad-hoc queries executing now in this process (one at a time), also after their client was answered \
               until their execution stopped.",
        kind: "gauge",
        samples: vec![(Vec::new(), executions.running.to_string())],
    });
    families.push(Family {
        name: "sluice_queries_waiting",
        help: "Ad-hoc queries waiting for their turn to execute.",
        kind: "gauge",
        samples: vec![(Vec::new(), executions.waiting.to_string())],
    });
    let mut text = String::new();
    for family in &families {
        write_family(&mut text, family);
    }
    text
}

fn job_state(status: &Status) -> Family {
    Family {
        name: "sluice_job_state",
        help: "1 for the job's current state (coordination, starting, running, stopping, completed, failed).",
        kind: "gauge",
        samples: vec![(vec![("state", status.state.name().to_string())], "1".into())],
    }
}

fn last_epoch(status: &Status) -> Family {
    Family {
        name: "sluice_last_committed_epoch",
        help: "The epoch of the last checkpoint committed by this run.",
        kind: "gauge",
        samples: status.last_committed_epoch.map(|epoch| (Vec::new(), epoch.to_string())).into_iter().collect(),
    }
}

fn source_families(metrics: &Metrics) -> Vec<Family> {
    let per_source = |read: fn(&sluice_engine::Metrics, usize) -> u64| {
        (0..metrics.sources.len())
            .map(|i| (vec![("source", metrics.sources[i].name.clone())], read(metrics, i).to_string()))
            .collect()
    };
    let mut watermarks = Vec::new();
    let mut lags = Vec::new();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    for source in &metrics.sources {
        if let Some(watermark) = source.watermark() {
            lags.push((
                vec![("source", source.name.clone())],
                format!("{:.3}", now.saturating_sub(watermark) as f64 / 1e3),
            ));
        }
        for (lane, watermark) in source.lane_watermarks.iter().enumerate() {
            let value = watermark.load(Ordering::Relaxed);
            if value != NO_WATERMARK {
                watermarks.push((vec![("source", source.name.clone()), ("lane", lane.to_string())], value.to_string()));
            }
        }
    }
    vec![
        Family {
            name: "sluice_source_rows_total",
            help: "Rows read from the source.",
            kind: "counter",
            samples: per_source(|m, i| m.sources[i].rows.load(Ordering::Relaxed)),
        },
        Family {
            name: "sluice_source_bytes_total",
            help: "Bytes of input the source read (a file's bytes, Kafka messages' keys and values; the generator reads none).",
            kind: "counter",
            samples: per_source(|m, i| m.sources[i].bytes.load(Ordering::Relaxed)),
        },
        Family {
            name: "sluice_source_bad_rows_total",
            help: "Rows of the source that could not be decoded (bad rows).",
            kind: "counter",
            samples: per_source(|m, i| m.sources[i].bad_rows.load(Ordering::Relaxed)),
        },
        Family {
            name: "sluice_lane_watermark_milliseconds",
            help: "The last watermark of each lane of the source, in milliseconds since the epoch (absent before the first).",
            kind: "gauge",
            samples: watermarks,
        },
        Family {
            name: "sluice_source_watermark_lag_seconds",
            help: "Wall-clock time now minus the source's watermark (its lowest lane's; absent until every lane has one).",
            kind: "gauge",
            samples: lags,
        },
    ]
}

fn sink_families(metrics: &Metrics) -> Vec<Family> {
    let per_sink = |read: fn(&sluice_engine::SinkMetrics) -> u64| {
        metrics.sinks.iter().map(|sink| (vec![("sink", sink.name.clone())], read(sink).to_string())).collect()
    };
    vec![
        Family {
            name: "sluice_sink_rows_total",
            help: "Rows written to the sink (an exactly-once sink's once their epoch committed).",
            kind: "counter",
            samples: per_sink(|sink| sink.rows.load(Ordering::Relaxed)),
        },
        Family {
            name: "sluice_sink_bytes_total",
            help: "Bytes the sink's writers encoded, as they encode them (an exactly-once sink's before their epoch commits; the blackhole encodes none).",
            kind: "counter",
            samples: per_sink(|sink| sink.bytes.load(Ordering::Relaxed)),
        },
    ]
}

/// The exchange links to the other workers of a cluster, one sample each per peer.
fn link_families(metrics: &Metrics) -> Vec<Family> {
    let links = metrics.links();
    let per_peer = |read: fn(&sluice_engine::PeerTraffic) -> u64| {
        links.iter().map(|link| (vec![("peer", link.peer.to_string())], read(link).to_string())).collect()
    };
    vec![
        Family {
            name: "sluice_exchange_bytes_sent_total",
            help: "Bytes this worker sent on its exchange link to the peer worker (frames of Arrow data, barriers, credits).",
            kind: "counter",
            samples: per_peer(|link| link.bytes_sent),
        },
        Family {
            name: "sluice_exchange_bytes_received_total",
            help: "Bytes this worker received on its exchange link from the peer worker.",
            kind: "counter",
            samples: per_peer(|link| link.bytes_received),
        },
        Family {
            name: "sluice_exchange_credit_stalls_total",
            help: "Times a channel to the peer worker had a message ready and no credit for it (the peer's consumer was behind).",
            kind: "counter",
            samples: per_peer(|link| link.credit_stalls),
        },
    ]
}

/// The named counters `view NAME: late rows` (see `sluice_operators`), one sample per
/// view that has dropped or could drop late rows.
fn late_rows(metrics: &Metrics) -> Family {
    Family {
        name: "sluice_late_rows_total",
        help: "Rows that arrived behind the watermark and were dropped, per view (window aggregates, OVER aggregates, interval and window joins).",
        kind: "counter",
        samples: metrics
            .counters()
            .into_iter()
            .filter_map(|(name, value)| {
                let view = name.strip_prefix("view ")?.strip_suffix(LATE_ROWS_SUFFIX)?;
                Some((vec![("view", view.to_string())], value.to_string()))
            })
            .collect(),
    }
}

/// How the operators name their late-row counters: `view NAME: late rows`.
const LATE_ROWS_SUFFIX: &str = ": late rows";

fn operator_families(metrics: &Metrics) -> Vec<Family> {
    let operators = metrics.operators();
    let per_operator = |read: fn(&sluice_engine::OperatorMetrics) -> u64| {
        operators
            .iter()
            .map(|operator| (vec![("operator", operator.name.clone())], read(operator).to_string()))
            .collect()
    };
    vec![
        Family {
            name: "sluice_operator_rows_in_total",
            help: "Rows of the data batches the operator was given, on every thread of this worker.",
            kind: "counter",
            samples: per_operator(|o| o.rows_in.load(Ordering::Relaxed)),
        },
        Family {
            name: "sluice_operator_rows_out_total",
            help: "Rows of the data batches the operator emitted, on every thread of this worker.",
            kind: "counter",
            samples: per_operator(|o| o.rows_out.load(Ordering::Relaxed)),
        },
        Family {
            name: "sluice_operator_bytes_in_total",
            help: "Bytes of the rows the operator was given (the Arrow buffers their columns occupy), on every thread of this worker.",
            kind: "counter",
            samples: per_operator(|o| o.bytes_in.load(Ordering::Relaxed)),
        },
        Family {
            name: "sluice_operator_bytes_out_total",
            help: "Bytes of the rows the operator emitted (the Arrow buffers their columns occupy), on every thread of this worker.",
            kind: "counter",
            samples: per_operator(|o| o.bytes_out.load(Ordering::Relaxed)),
        },
        Family {
            name: "sluice_operator_state_bytes",
            help: "Bytes of the operator's encoded state in the last published checkpoint that held state (known where checkpoints are published: alone, or on a cluster's leader for every worker).",
            kind: "gauge",
            samples: per_operator(|o| o.state_bytes.load(Ordering::Relaxed)),
        },
    ]
}

fn queue_families(metrics: &Metrics) -> Vec<Family> {
    let queues = metrics.queues();
    let label = |queue: &sluice_engine::QueueMetrics| {
        vec![("segment", queue.segment.clone()), ("thread", queue.thread.to_string())]
    };
    vec![
        Family {
            name: "sluice_exchange_queued_messages",
            help: "Messages waiting for the segment's instance on a thread, in its input channels from every sender (sampled every 16th time it polls them).",
            kind: "gauge",
            samples: queues.iter().map(|q| (label(q), q.queued.load(Ordering::Relaxed).to_string())).collect(),
        },
        Family {
            name: "sluice_exchange_backpressure_seconds_total",
            help: "Time driver threads of this worker waited while the exchange out of the segment was full (its receivers were behind), summed over the threads.",
            kind: "counter",
            samples: metrics
                .edges_blocked()
                .into_iter()
                .map(|(segment, ns)| (vec![("segment", segment)], seconds(ns)))
                .collect(),
        },
        Family {
            name: "sluice_exchange_queue_capacity_messages",
            help: "How many messages the instance's input channels from this worker's threads hold at most (channels from other workers are bounded by credit in bytes instead).",
            kind: "gauge",
            samples: queues.iter().map(|q| (label(q), q.capacity.to_string())).collect(),
        },
    ]
}

fn checkpoint_families(metrics: &Metrics) -> Vec<Family> {
    let checkpoints = &metrics.checkpoints;
    let published = checkpoints.published.load(Ordering::Relaxed);
    let last = |value: &std::sync::atomic::AtomicU64, scale: f64| {
        if published == 0 {
            Vec::new()
        } else {
            vec![(Vec::new(), format!("{}", value.load(Ordering::Relaxed) as f64 / scale))]
        }
    };
    vec![
        Family {
            name: "sluice_checkpoints_total",
            help: "Checkpoints this worker published, and those that failed.",
            kind: "counter",
            samples: vec![
                (vec![("outcome", "published".to_string())], published.to_string()),
                (vec![("outcome", "failed".to_string())], checkpoints.failed.load(Ordering::Relaxed).to_string()),
            ],
        },
        Family {
            name: "sluice_checkpoint_duration_seconds",
            help: "The last published checkpoint's time from its barrier to its manifest published.",
            kind: "gauge",
            samples: last(&checkpoints.last_duration_ms, 1e3),
        },
        Family {
            name: "sluice_checkpoint_pause_seconds",
            help: "The last published checkpoint's time from its barrier to the last thread's acknowledgement (alignment and state copies).",
            kind: "gauge",
            samples: last(&checkpoints.last_pause_ms, 1e3),
        },
        Family {
            name: "sluice_checkpoint_state_bytes",
            help: "Bytes of operator state in the last published checkpoint.",
            kind: "gauge",
            samples: last(&checkpoints.last_state_bytes, 1.0),
        },
    ]
}

fn thread_families(metrics: &Metrics) -> Vec<Family> {
    let label = |thread: u32| vec![("thread", thread.to_string())];
    let local = || metrics.local_threads().filter_map(|slot| Some((slot, metrics.threads.get(slot as usize)?)));
    vec![
        Family {
            name: "sluice_thread_backpressure_seconds_total",
            help: "Time the driver thread spent blocked on a full output queue (waits that ended); a cluster numbers every worker's threads in member order.",
            kind: "counter",
            samples: local().map(|(i, t)| (label(i), seconds(t.backpressure_ns.load(Ordering::Relaxed)))).collect(),
        },
        Family {
            name: "sluice_thread_blocked",
            help: "1 while the driver thread is blocked on a full output queue.",
            kind: "gauge",
            samples: local()
                .map(|(i, t)| (label(i), u8::from(t.blocked.load(Ordering::Relaxed)).to_string()))
                .collect(),
        },
    ]
}

fn named_counters(metrics: &Metrics) -> Family {
    Family {
        name: "sluice_counter_total",
        help: "The job's named counters, e.g. `view NAME: late rows`.",
        kind: "counter",
        samples: metrics
            .counters()
            .into_iter()
            .map(|(name, value)| (vec![("name", name)], value.to_string()))
            .collect(),
    }
}

fn seconds(nanoseconds: u64) -> String {
    format!("{:.9}", nanoseconds as f64 / 1e9)
}

fn write_family(text: &mut String, family: &Family) {
    // Writing to a String cannot fail.
    let _ = writeln!(text, "# HELP {} {}", family.name, escape_help(family.help));
    let _ = writeln!(text, "# TYPE {} {}", family.name, family.kind);
    for (labels, value) in &family.samples {
        let _ = writeln!(text, "{}{} {value}", family.name, render_labels(labels));
    }
}

fn render_labels(labels: &[(&'static str, String)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels.iter().map(|(name, value)| format!("{name}=\"{}\"", escape_label(value))).collect();
    format!("{{{}}}", pairs.join(","))
}

/// A label value: backslash, double quote and line feed escaped.
pub(crate) fn escape_label(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// A help text: backslash and line feed escaped.
fn escape_help(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        assert_eq!(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        assert_eq!(render_labels(&[("source", "x\"y".into()), ("lane", "0".into())]), "{source=\"x\\\"y\",lane=\"0\"}");
        assert_eq!(escape_help("a\\b\nc"), "a\\\\b\\nc");
    }
}
