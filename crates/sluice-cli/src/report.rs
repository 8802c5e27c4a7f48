//! The exit report: outcome, rows in and out per source and sink, bad and late rows, the
//! final watermark of every source lane.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use sluice_engine::{RunOutcome, RunReport};
use sluice_types::TimestampMs;

/// `2026-01-01 00:00:10.000` (UTC).
pub fn format_timestamp(ms: TimestampMs) -> String {
    let seconds = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = seconds.div_euclid(86_400);
    let second_of_day = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{millis:03}",
        second_of_day / 3600,
        second_of_day % 3600 / 60,
        second_of_day % 60
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (Howard Hinnant's method).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

pub fn render(pipeline: &str, report: &RunReport) -> String {
    let mut text = String::new();
    let seconds = report.elapsed.as_secs_f64();
    match &report.outcome {
        RunOutcome::Completed => {
            let how = if report.stopped { "stopped and drained" } else { "completed (end of input)" };
            let _ = writeln!(text, "sluice: pipeline \"{pipeline}\" {how} in {seconds:.2}s");
        }
        RunOutcome::Failed { component, error } => {
            let _ =
                writeln!(text, "sluice: pipeline \"{pipeline}\" FAILED after {seconds:.2}s in {component}: {error}");
        }
    }
    let metrics = &report.metrics;
    let watermarks = report.lane_watermarks();
    for (source, (_, lanes)) in metrics.sources.iter().zip(&watermarks) {
        let marks: Vec<String> = lanes
            .iter()
            .enumerate()
            .map(|(lane, mark)| format!("{lane}: {}", mark.map_or("none".to_string(), format_timestamp)))
            .collect();
        let bytes = source.bytes.load(Ordering::Relaxed);
        let _ = writeln!(
            text,
            "  source {}: {} rows in, {} bad rows; final watermark per lane: {}{}",
            source.name,
            source.rows.load(Ordering::Relaxed),
            source.bad_rows.load(Ordering::Relaxed),
            marks.join(", "),
            if bytes > 0 { format!("; {bytes} bytes read") } else { String::new() }
        );
    }
    for sink in &metrics.sinks {
        let bytes = sink.bytes.load(Ordering::Relaxed);
        let written = if bytes > 0 { format!(", {bytes} bytes") } else { String::new() };
        let _ = writeln!(text, "  sink {}: {} rows out{written}", sink.name, sink.rows.load(Ordering::Relaxed));
    }
    let blocked: Vec<String> = metrics
        .threads
        .iter()
        .enumerate()
        .map(|(thread, t)| format!("thread {thread} {:.2} s", t.backpressure_ns.load(Ordering::Relaxed) as f64 / 1e9))
        .collect();
    let _ = writeln!(text, "  backpressure (time blocked on full output queues): {}", blocked.join(", "));
    if let Some(stats) = report.checkpoints.as_ref().filter(|stats| stats.followed) {
        let _ = writeln!(
            text,
            "  checkpoints: {} committed as the leader published them (last epoch {}), {} failed; longest pause {} ms \
             (the leader's report has their sizes and durations)",
            stats.published, stats.last_epoch, stats.failed, stats.max_pause_ms,
        );
    } else if let Some(stats) = &report.checkpoints {
        let _ = writeln!(
            text,
            "  checkpoints: {} published (last epoch {}, largest {} bytes of state, {} bytes written in all), {} failed; longest pause {} ms, longest checkpoint {} ms",
            stats.published,
            stats.last_epoch,
            stats.max_state_bytes,
            stats.written_bytes,
            stats.failed,
            stats.max_pause_ms,
            stats.max_duration_ms
        );
        if let Some((epoch, operators)) = &stats.state_by_operator {
            for (operator, bytes) in operators {
                let _ = writeln!(text, "  state at checkpoint {epoch}: {operator}: {bytes} bytes");
            }
        }
    }
    for (name, value) in metrics.counters() {
        let _ = writeln!(text, "  {name}: {value}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::format_timestamp;

    #[test]
    fn timestamps_format_in_utc() {
        assert_eq!(format_timestamp(0), "1970-01-01 00:00:00.000");
        assert_eq!(format_timestamp(1_767_225_610_123), "2026-01-01 00:00:10.123");
        assert_eq!(format_timestamp(-1), "1969-12-31 23:59:59.999");
        assert_eq!(format_timestamp(951_782_400_000), "2000-02-29 00:00:00.000");
    }
}
