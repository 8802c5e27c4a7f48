//! A connection's settings: `SET` and `SHOW`. Two are the query's limits, as `/query`'s
//! request fields are: `statement_timeout` (milliseconds, or with a unit: `5s`, `1min`;
//! 0 is the default) is `timeout_ms`, and `sluice.max_rows` is `max_rows`, each checked
//! by the query path's own bounds when a query runs. Clients' usual settings
//! (`application_name`, `extra_float_digits`, `DateStyle`…) are accepted and shown back;
//! the server's fixed ones (`server_version`, `server_encoding`, `TimeZone`…) are shown.
//!
//! Bounds: at most [`SETTINGS_MAX`] settings of at most [`SETTING_BYTES_MAX`] bytes each
//! per connection.

use std::collections::BTreeMap;
use std::sync::Mutex;

use sluice_engine::query::QueryLimits;
use sluice_types::SluiceError;

/// Settings a connection may hold.
pub(crate) const SETTINGS_MAX: usize = 64;
/// The longest setting's name and value together.
pub(crate) const SETTING_BYTES_MAX: usize = 1024;

/// A connection's settings (kept in its session extensions).
#[derive(Default)]
pub(crate) struct Settings {
    values: Mutex<BTreeMap<String, String>>,
}

/// The value of the server's fixed setting `name` (`current_setting`), if it is one.
pub(crate) fn fixed(name: &str) -> Option<String> {
    let name = name.to_lowercase();
    let name = if name == "transaction isolation level" { "transaction_isolation".to_string() } else { name };
    FIXED.iter().find(|(fixed, _)| *fixed == name).map(|(_, value)| value.to_string())
}

/// The server's fixed settings, as PostgreSQL shows them.
const FIXED: [(&str, &str); 9] = [
    ("server_version", crate::auth::SERVER_VERSION),
    ("server_version_num", "150000"),
    ("server_encoding", "UTF8"),
    ("client_encoding", "UTF8"),
    ("timezone", "UTC"),
    ("standard_conforming_strings", "on"),
    ("integer_datetimes", "on"),
    ("transaction_isolation", "repeatable read"),
    ("max_identifier_length", "63"),
];

impl Settings {
    /// Sets `name` to `value`; the query's limits are checked here already.
    pub(crate) fn set(&self, name: &str, value: &str) -> Result<(), SluiceError> {
        let name = name.to_lowercase();
        if name.len() + value.len() > SETTING_BYTES_MAX {
            return Err(SluiceError::user(
                "pgwire.setting",
                format!("the setting {name} is longer than {SETTING_BYTES_MAX} bytes"),
            )
            .with_fix("give a shorter value"));
        }
        let value = match name.as_str() {
            "statement_timeout" => milliseconds(value)?.to_string(),
            "sluice.max_rows" => {
                let rows = value.trim().parse::<u64>().map_err(|_| {
                    SluiceError::user("pgwire.setting", format!("sluice.max_rows = {value:?} is not a number of rows"))
                        .with_fix("SET sluice.max_rows = 100000")
                })?;
                QueryLimits::new(Some(rows), None)?;
                rows.to_string()
            }
            _ => value.to_string(),
        };
        let mut values = self.values.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !values.contains_key(&name) && values.len() >= SETTINGS_MAX {
            return Err(SluiceError::user(
                "pgwire.setting",
                format!("a connection holds at most {SETTINGS_MAX} settings"),
            )
            .with_fix("RESET ALL, or set fewer"));
        }
        values.insert(name, value);
        Ok(())
    }

    /// Forgets every setting (`RESET ALL`, `DISCARD ALL`).
    pub(crate) fn reset(&self) {
        self.values.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    }

    /// The value of `name`, as `SHOW` answers it.
    pub(crate) fn show(&self, name: &str) -> Result<String, SluiceError> {
        let name = name.to_lowercase();
        if let Some(value) = self.values.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&name) {
            return Ok(value.clone());
        }
        match name.as_str() {
            "statement_timeout" => return Ok("0".to_string()),
            "sluice.max_rows" => return Ok(sluice_engine::query::MAX_ROWS_DEFAULT.to_string()),
            "search_path" => return Ok("public".to_string()),
            _ => {}
        }
        fixed(&name).ok_or_else(|| {
            SluiceError::user("pgwire.setting", format!("unrecognized configuration parameter \"{name}\""))
                .with_fix("SHOW statement_timeout, sluice.max_rows, server_version, TimeZone…")
        })
    }

    /// The query's limits from `statement_timeout` and `sluice.max_rows`.
    pub(crate) fn limits(&self) -> Result<QueryLimits, SluiceError> {
        let values = self.values.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let timeout = values.get("statement_timeout").and_then(|v| v.parse::<u64>().ok()).filter(|ms| *ms > 0);
        let rows = values.get("sluice.max_rows").and_then(|v| v.parse::<u64>().ok());
        QueryLimits::new(rows, timeout)
    }
}

/// `statement_timeout`'s value in milliseconds: a number (ms) or with a unit.
fn milliseconds(value: &str) -> Result<u64, SluiceError> {
    let text = value.trim().trim_matches('\'').to_lowercase();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let factor = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "min" => 60_000,
        _ => 0,
    };
    let bad = || {
        SluiceError::user("pgwire.setting", format!("statement_timeout = {value:?} is not a duration"))
            .with_fix("SET statement_timeout = 5000 (milliseconds), '5s' or '1min'")
    };
    let number = number.parse::<u64>().map_err(|_| bad())?;
    if factor == 0 {
        return Err(bad());
    }
    let ms = number.saturating_mul(factor);
    if ms > 0 {
        QueryLimits::new(None, Some(ms))?;
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_and_max_rows_are_the_querys_limits() {
        let settings = Settings::default();
        assert_eq!(settings.limits().expect("defaults"), QueryLimits::default());
        settings.set("statement_timeout", "'2s'").expect("set");
        settings.set("sluice.max_rows", "7").expect("set");
        let limits = settings.limits().expect("limits");
        assert_eq!((limits.max_rows, limits.timeout.as_millis()), (7, 2000));
        assert_eq!(settings.show("STATEMENT_TIMEOUT").expect("shown"), "2000");
        assert_eq!(settings.set("sluice.max_rows", "0").expect_err("refused").code, "query.limits");
        assert_eq!(settings.set("statement_timeout", "1h").expect_err("refused").code, "pgwire.setting");
        assert_eq!(settings.show("server_version").expect("fixed"), "15.0");
        assert!(settings.show("no_such_thing").is_err());
    }
}
