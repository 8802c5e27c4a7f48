//! Live progress on stderr: one line rewritten in place on a terminal, a plain log line
//! every ten seconds otherwise, nothing with `--quiet`.

use std::io::Write;
use std::time::Duration;

use sluice_engine::Metrics;

/// Between two plain (non-terminal) progress lines.
const PLAIN_INTERVAL: Duration = Duration::from_secs(10);

pub struct Progress {
    live: bool,
    quiet: bool,
    last: Option<(Duration, u64, u64, u64)>,
    last_plain: Duration,
    drawn: bool,
}

impl Progress {
    pub fn new(live: bool, quiet: bool) -> Progress {
        Progress { live, quiet, last: None, last_plain: Duration::ZERO, drawn: false }
    }

    pub fn update(&mut self, metrics: &Metrics, elapsed: Duration) {
        if self.quiet {
            return;
        }
        let rows_in = metrics.rows_in();
        let rows_out = metrics.rows_out();
        let backpressure = metrics.backpressure_ns();
        let (rate_in, rate_out, pressure) = match self.last {
            Some((at, last_in, last_out, last_pressure)) if elapsed > at => {
                let seconds = (elapsed - at).as_secs_f64();
                let threads = metrics.threads.len().max(1) as f64;
                (
                    (rows_in - last_in) as f64 / seconds,
                    (rows_out - last_out) as f64 / seconds,
                    (backpressure - last_pressure) as f64 / 1e9 / seconds / threads * 100.0,
                )
            }
            _ => (0.0, 0.0, 0.0),
        };
        self.last = Some((elapsed, rows_in, rows_out, backpressure));
        let watermark = metrics.watermark().map_or("-".to_string(), crate::report::format_timestamp);
        let line = format!(
            "{:>7.1}s  in {} ({}/s)  out {} ({}/s)  watermark {}  backpressure {:.0}%",
            elapsed.as_secs_f64(),
            human(rows_in as f64),
            human(rate_in),
            human(rows_out as f64),
            human(rate_out),
            watermark,
            pressure.min(100.0)
        );
        if self.live {
            eprint!("\r\x1b[2K{line}");
            let _ = std::io::stderr().flush();
            self.drawn = true;
        } else if elapsed >= self.last_plain + PLAIN_INTERVAL {
            self.last_plain = elapsed;
            eprintln!("sluice: progress {line}");
        }
    }

    /// Leaves the terminal on a fresh line.
    pub fn finish(&mut self) {
        if self.drawn {
            eprintln!();
        }
    }
}

/// 1234567 → "1.23M".
pub fn human(value: f64) -> String {
    match value {
        v if v >= 1e9 => format!("{:.2}G", v / 1e9),
        v if v >= 1e6 => format!("{:.2}M", v / 1e6),
        v if v >= 1e3 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn human_rounds_to_units() {
        assert_eq!(super::human(999.0), "999");
        assert_eq!(super::human(12_345.0), "12.3k");
        assert_eq!(super::human(3_456_789.0), "3.46M");
    }
}
