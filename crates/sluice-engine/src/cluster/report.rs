//! A worker's counters, sent to the leader in its `Finished` report so that the leader's
//! exit report covers the whole cluster. An encoding the project owns (every field little
//! endian; pinned by the golden vector below):
//!
//! | bytes | field |
//! |---|---|
//! | 1 | version, [`REPORT_VERSION`] |
//! | 4 | source count; per source: rows u64, bytes read u64, bad rows u64, lane count u32, one watermark i64 per lane (`i64::MIN`: none) |
//! | 4 | sink count; per sink: rows out u64, bytes encoded u64 |
//! | 4 | thread count; per thread: slot u32, backpressure ns u64, longest step µs u64 |
//! | 4 | counter count; per counter: name length u32, the name (UTF-8), value u64 |
//!
//! Decoding checks every length against what is left and the shape against this
//! worker's own plan (the same pipeline on every worker); a report that does not fit is
//! an error, never a panic.

use std::ops::Range;
use std::sync::atomic::Ordering;

use sluice_runtime::Metrics;
use sluice_types::SluiceError;

/// The report encoding's version.
/// Version 2 added each source's bytes read and each sink's bytes encoded.
pub const REPORT_VERSION: u8 = 2;

/// Encodes the counters of `metrics` that this worker's slots (`local`) own.
pub fn encode(metrics: &Metrics, local: Range<u32>) -> Vec<u8> {
    let mut out = vec![REPORT_VERSION];
    out.extend_from_slice(&(metrics.sources.len() as u32).to_le_bytes());
    for source in &metrics.sources {
        out.extend_from_slice(&source.rows.load(Ordering::Relaxed).to_le_bytes());
        out.extend_from_slice(&source.bytes.load(Ordering::Relaxed).to_le_bytes());
        out.extend_from_slice(&source.bad_rows.load(Ordering::Relaxed).to_le_bytes());
        out.extend_from_slice(&(source.lane_watermarks.len() as u32).to_le_bytes());
        for watermark in &source.lane_watermarks {
            out.extend_from_slice(&watermark.load(Ordering::Relaxed).to_le_bytes());
        }
    }
    out.extend_from_slice(&(metrics.sinks.len() as u32).to_le_bytes());
    for sink in &metrics.sinks {
        out.extend_from_slice(&sink.rows.load(Ordering::Relaxed).to_le_bytes());
        out.extend_from_slice(&sink.bytes.load(Ordering::Relaxed).to_le_bytes());
    }
    let threads: Vec<u32> = local.filter(|slot| (*slot as usize) < metrics.threads.len()).collect();
    out.extend_from_slice(&(threads.len() as u32).to_le_bytes());
    for slot in threads {
        let thread = &metrics.threads[slot as usize];
        out.extend_from_slice(&slot.to_le_bytes());
        out.extend_from_slice(&thread.backpressure_ns.load(Ordering::Relaxed).to_le_bytes());
        out.extend_from_slice(&thread.longest_step_us.load(Ordering::Relaxed).to_le_bytes());
    }
    let counters = metrics.counters();
    out.extend_from_slice(&(counters.len() as u32).to_le_bytes());
    for (name, value) in counters {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&value.to_le_bytes());
    }
    out
}

/// Adds a worker's report to `metrics` (the leader's): rows and counters add up, each
/// lane's watermark is the worker's where it ran the lane, each slot's figures are its
/// worker's.
pub fn merge(metrics: &Metrics, bytes: &[u8], worker: u32) -> Result<(), SluiceError> {
    let mut reader = Reader { bytes, at: 0, worker };
    let version = reader.u8()?;
    if version != REPORT_VERSION {
        return Err(reader.bad(format!("version {version}, this build reads {REPORT_VERSION}")));
    }
    reader.expect_count(metrics.sources.len(), "sources")?;
    for source in &metrics.sources {
        source.rows.fetch_add(reader.u64()?, Ordering::Relaxed);
        source.bytes.fetch_add(reader.u64()?, Ordering::Relaxed);
        source.bad_rows.fetch_add(reader.u64()?, Ordering::Relaxed);
        reader.expect_count(source.lane_watermarks.len(), "lanes")?;
        for lane in &source.lane_watermarks {
            lane.fetch_max(reader.i64()?, Ordering::Relaxed);
        }
    }
    reader.expect_count(metrics.sinks.len(), "sinks")?;
    for sink in &metrics.sinks {
        sink.rows.fetch_add(reader.u64()?, Ordering::Relaxed);
        sink.bytes.fetch_add(reader.u64()?, Ordering::Relaxed);
    }
    for _ in 0..reader.u32()? {
        let slot = reader.u32()? as usize;
        let (backpressure_ns, longest_step_us) = (reader.u64()?, reader.u64()?);
        let thread = metrics.threads.get(slot).ok_or_else(|| reader.bad(format!("slot {slot} is not in the plan")))?;
        thread.backpressure_ns.fetch_add(backpressure_ns, Ordering::Relaxed);
        thread.longest_step_us.fetch_max(longest_step_us, Ordering::Relaxed);
    }
    for _ in 0..reader.u32()? {
        let length = reader.u32()? as usize;
        let name = reader.take(length)?.to_vec();
        let name = String::from_utf8(name).map_err(|_| reader.bad("a counter name that is not UTF-8".into()))?;
        let value = reader.u64()?;
        metrics.counter(&name).fetch_add(value, Ordering::Relaxed);
    }
    if reader.at != bytes.len() {
        return Err(reader.bad(format!("{} bytes after its end", bytes.len() - reader.at)));
    }
    Ok(())
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    worker: u32,
}

impl Reader<'_> {
    fn bad(&self, what: String) -> SluiceError {
        SluiceError::internal("cluster.report", format!("worker {}'s report cannot be read: {what}", self.worker))
            .with_fix("every worker must run the same sluice build and pipeline")
    }

    fn take(&mut self, length: usize) -> Result<&[u8], SluiceError> {
        let end = self.at.checked_add(length).filter(|end| *end <= self.bytes.len());
        let end = end
            .ok_or_else(|| self.bad(format!("it ends at byte {} of {} wanted", self.bytes.len(), self.at + length)))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, SluiceError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, SluiceError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, SluiceError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn i64(&mut self) -> Result<i64, SluiceError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn expect_count(&mut self, expected: usize, what: &str) -> Result<(), SluiceError> {
        let count = self.u32()? as usize;
        if count != expected {
            return Err(self.bad(format!("{count} {what} where this worker's plan has {expected}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use sluice_runtime::metrics::{SinkMetrics, SourceMetrics};

    use super::*;

    fn metrics() -> Metrics {
        let sources = vec![SourceMetrics::new("events", 2)];
        let sinks = vec![SinkMetrics::new("out")];
        Metrics::new(sources, sinks, 2)
    }

    #[test]
    fn golden_report_and_its_merge() {
        let worker = metrics();
        worker.sources[0].rows.store(5, Ordering::Relaxed);
        worker.sources[0].bad_rows.store(1, Ordering::Relaxed);
        worker.sources[0].bytes.store(400, Ordering::Relaxed);
        worker.sinks[0].bytes.store(90, Ordering::Relaxed);
        worker.sources[0].lane_watermarks[1].store(1000, Ordering::Relaxed);
        worker.sinks[0].rows.store(3, Ordering::Relaxed);
        worker.threads[1].backpressure_ns.store(7, Ordering::Relaxed);
        worker.counter("late").store(2, Ordering::Relaxed);
        let bytes = encode(&worker, 1..2);
        #[rustfmt::skip]
        let expected: Vec<u8> = [
            &[2u8][..],
            &1u32.to_le_bytes(), &5u64.to_le_bytes(), &400u64.to_le_bytes(), &1u64.to_le_bytes(), &2u32.to_le_bytes(),
            &i64::MIN.to_le_bytes(), &1000i64.to_le_bytes(),
            &1u32.to_le_bytes(), &3u64.to_le_bytes(), &90u64.to_le_bytes(),
            &1u32.to_le_bytes(), &1u32.to_le_bytes(), &7u64.to_le_bytes(), &0u64.to_le_bytes(),
            &1u32.to_le_bytes(), &4u32.to_le_bytes(), b"late", &2u64.to_le_bytes(),
        ].concat();
        assert_eq!(bytes, expected);

        let leader = metrics();
        leader.sources[0].rows.store(10, Ordering::Relaxed);
        leader.sources[0].lane_watermarks[0].store(900, Ordering::Relaxed);
        merge(&leader, &bytes, 1).expect("merge");
        assert_eq!(leader.sources[0].rows.load(Ordering::Relaxed), 15);
        assert_eq!(leader.sources[0].bad_rows.load(Ordering::Relaxed), 1);
        let marks: Vec<i64> = leader.sources[0].lane_watermarks.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        assert_eq!(marks, [900, 1000]);
        assert_eq!(leader.sinks[0].rows.load(Ordering::Relaxed), 3);
        assert_eq!(leader.sources[0].bytes.load(Ordering::Relaxed), 400);
        assert_eq!(leader.sinks[0].bytes.load(Ordering::Relaxed), 90);
        assert_eq!(leader.threads[1].backpressure_ns.load(Ordering::Relaxed), 7);
        assert_eq!(leader.counters(), [("late".to_string(), 2)]);
    }

    #[test]
    fn a_report_that_does_not_fit_is_an_error() {
        let bytes = encode(&metrics(), 0..2);
        for cut in 0..bytes.len() {
            assert!(merge(&metrics(), &bytes[..cut], 1).is_err(), "cut at {cut}");
        }
        let mut other = bytes.clone();
        other[0] = 9;
        assert!(merge(&metrics(), &other, 1).unwrap_err().message.contains("version 9"));
        let mut longer = bytes;
        longer.push(0);
        assert!(merge(&metrics(), &longer, 1).unwrap_err().message.contains("after its end"));
    }
}
