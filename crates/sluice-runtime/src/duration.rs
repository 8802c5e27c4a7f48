//! Durations written back as a user writes them in `pipeline.toml` (`30s`, `1500ms`), for
//! the messages that name a setting (`shutdown_timeout = 30s`). Used by the controller and
//! the coordinator alike, so it belongs to neither.

use std::time::Duration;

/// `duration` in whole seconds when it has no fraction of a second, else in milliseconds.
pub(crate) fn humanize(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_seconds_in_seconds_and_the_rest_in_milliseconds() {
        assert_eq!(humanize(Duration::from_secs(30)), "30s");
        assert_eq!(humanize(Duration::from_millis(1500)), "1500ms");
        assert_eq!(humanize(Duration::from_millis(250)), "250ms");
        assert_eq!(humanize(Duration::ZERO), "0s");
    }
}
