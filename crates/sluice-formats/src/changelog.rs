//! Changelog envelopes: one message into the rows it changes, each with its
//! [`RowKind`], as JSON objects for the JSON [`crate::Decoder`] to read into columns.
//!
//! # `debezium-json` (Flink's format of that name)
//!
//! A Debezium change event is a JSON object `{"before": …, "after": …, "op": …, …}`, or,
//! with the converter's schemas enabled, `{"schema": …, "payload": {that object}}`; both
//! are read (a top-level `payload` object is the envelope). By `op`:
//!
//! | `op` | rows |
//! |---|---|
//! | `c` (create), `r` (snapshot read) | `+I after` |
//! | `u` (update) | `-U before`, `+U after`; only `+U after` when `before` is null (PostgreSQL's default `REPLICA IDENTITY`) |
//! | `d` (delete) | `-D before` (its key columns are enough) |
//!
//! Anything else is a bad envelope, with the reason: not a JSON object, no `op` or
//! another `op` (a truncate, `t`, cannot be applied row by row), a `before` or `after`
//! that is neither an object nor null, a `c`, `r` or `u` without `after`, a `d` without
//! `before` (Flink's advice: `REPLICA IDENTITY FULL`). A tombstone (no value), which
//! Debezium sends after a delete for log compaction, is skipped by the caller, as Flink
//! skips it.
//!
//! # `upsert` (Flink's `upsert-kafka` with JSON keys and values)
//!
//! The key is a JSON object of the primary key's columns; a value is the row (`+U`: the
//! key's new row; columns the value lacks, such as the key's when the producer left them
//! out, are taken from the key), no value (a tombstone) is `-D` of the key. A message
//! without a key, or whose key or value is not a JSON object, is a bad envelope.
//!
//! # The `op` column of a changelog file
//!
//! What the file sink writes for an updating stream (see [`crate::encode`]): [`op_kinds`]
//! reads `+I`, `-U`, `+U`, `-D`.

use arrow::array::{Array, Int8Array, StringArray};
use serde_json::{Map, Value};
use sluice_types::RowKind;

/// One row of a change: its kind and the row as a one-line JSON object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeRow {
    pub kind: RowKind,
    pub row: Vec<u8>,
}

/// The rows of one Debezium change event `value` (see the module doc), or why it is a
/// bad envelope.
pub fn debezium_json(value: &[u8]) -> Result<Vec<ChangeRow>, String> {
    let parsed: Value = serde_json::from_slice(value).map_err(|e| format!("a Debezium envelope is not JSON: {e}"))?;
    let Value::Object(mut envelope) = parsed else {
        return Err("a Debezium envelope is a JSON object".to_string());
    };
    if let Some(Value::Object(payload)) = envelope.remove("payload") {
        envelope = payload;
    }
    let op = match envelope.get("op") {
        Some(Value::String(op)) => op.clone(),
        Some(other) => return Err(format!("the envelope's \"op\" is {other}, not a string (c, r, u or d)")),
        None => return Err("the envelope has no \"op\" (a Debezium change has op c, r, u or d)".to_string()),
    };
    let before = image(&mut envelope, "before")?;
    let after = image(&mut envelope, "after")?;
    let row = |kind, image: Map<String, Value>| ChangeRow { kind, row: Value::Object(image).to_string().into_bytes() };
    let missing = |field: &str, fix: &str| format!("op \"{op}\" with a null or missing \"{field}\"{fix}");
    match op.as_str() {
        "c" | "r" => Ok(vec![row(RowKind::Insert, after.ok_or_else(|| missing("after", ""))?)]),
        "u" => {
            let after = after.ok_or_else(|| missing("after", ""))?;
            let mut rows = Vec::with_capacity(2);
            if let Some(before) = before {
                rows.push(row(RowKind::UpdateBefore, before));
            }
            rows.push(row(RowKind::UpdateAfter, after));
            Ok(rows)
        }
        "d" => {
            let fix = ": the delete names no row (for PostgreSQL, set the table's REPLICA IDENTITY to FULL or DEFAULT \
                       with a primary key)";
            Ok(vec![row(RowKind::Delete, before.ok_or_else(|| missing("before", fix))?)])
        }
        other => Err(format!("op \"{other}\" is not one of c, r, u, d (a truncate cannot be applied row by row)")),
    }
}

/// The row image `field` of `envelope`: an object, or None when null or absent.
fn image(envelope: &mut Map<String, Value>, field: &str) -> Result<Option<Map<String, Value>>, String> {
    match envelope.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(row)) => Ok(Some(row)),
        Some(other) => Err(format!("\"{field}\" is {}, not a row (a JSON object) or null", kind_of(&other))),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The row of one upsert message (see the module doc), or why it is a bad envelope.
pub fn upsert_json(key: Option<&[u8]>, value: Option<&[u8]>) -> Result<ChangeRow, String> {
    let key = key.ok_or("an upsert message has no key (the key holds the primary key)")?;
    let key = object(key, "key")?;
    let Some(value) = value else {
        return Ok(ChangeRow { kind: RowKind::Delete, row: Value::Object(key).to_string().into_bytes() });
    };
    let mut row = object(value, "value")?;
    for (name, value) in key {
        row.entry(name).or_insert(value);
    }
    Ok(ChangeRow { kind: RowKind::UpdateAfter, row: Value::Object(row).to_string().into_bytes() })
}

fn object(bytes: &[u8], what: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => Err(format!("the {what} is {}, not a JSON object", kind_of(&other))),
        Err(e) => Err(format!("the {what} is not JSON: {e}")),
    }
}

/// The row kinds of an `op` column (`+I`, `-U`, `+U`, `-D`); a row with any other op (or
/// none) is reported by index with the reason.
pub fn op_kinds(ops: &StringArray) -> (Int8Array, Vec<(usize, String)>) {
    let mut bad = Vec::new();
    let kinds = (0..ops.len()).map(|row| {
        let kind = ops.is_valid(row).then(|| RowKind::from_short(ops.value(row))).flatten();
        match kind {
            Some(kind) => kind as i8,
            None => {
                let found = if ops.is_valid(row) { format!("\"{}\"", ops.value(row)) } else { "NULL".to_string() };
                bad.push((row, format!("op {found} is not one of +I, -U, +U, -D")));
                RowKind::Insert as i8
            }
        }
    });
    (Int8Array::from_iter_values(kinds.collect::<Vec<_>>()), bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(result: Result<Vec<ChangeRow>, String>) -> Vec<String> {
        match result {
            Ok(rows) => {
                rows.iter().map(|r| format!("{} {}", r.kind.short(), String::from_utf8_lossy(&r.row))).collect()
            }
            Err(reason) => vec![format!("bad: {reason}")],
        }
    }

    fn check(value: &str, expected: &[&str]) {
        assert_eq!(rows(debezium_json(value.as_bytes())), expected, "{value}");
    }

    #[test]
    fn debezium_ops_give_flinks_row_kinds() {
        check(r#"{"before":null,"after":{"id":1,"v":"a"},"op":"c"}"#, &[r#"+I {"id":1,"v":"a"}"#]);
        check(r#"{"before":null,"after":{"id":1,"v":"a"},"op":"r"}"#, &[r#"+I {"id":1,"v":"a"}"#]);
        check(
            r#"{"before":{"id":1,"v":"a"},"after":{"id":1,"v":"b"},"op":"u"}"#,
            &[r#"-U {"id":1,"v":"a"}"#, r#"+U {"id":1,"v":"b"}"#],
        );
        check(r#"{"before":null,"after":{"id":1,"v":"b"},"op":"u"}"#, &[r#"+U {"id":1,"v":"b"}"#]);
        check(r#"{"before":{"id":1,"v":"b"},"after":null,"op":"d"}"#, &[r#"-D {"id":1,"v":"b"}"#]);
        // Schema-embedded: the payload is the envelope.
        check(
            r#"{"schema":{"type":"struct"},"payload":{"before":null,"after":{"id":2},"op":"c","ts_ms":1}}"#,
            &[r#"+I {"id":2}"#],
        );
    }

    #[test]
    fn a_bad_envelope_says_why() {
        for (value, reason) in [
            ("not json", "not JSON"),
            ("[1]", "is a JSON object"),
            (r#"{"after":{"id":1}}"#, "has no \"op\""),
            (r#"{"after":{"id":1},"op":5}"#, "not a string"),
            (r#"{"after":null,"op":"c"}"#, "op \"c\" with a null or missing \"after\""),
            (r#"{"before":null,"op":"d"}"#, "REPLICA IDENTITY"),
            (r#"{"op":"t"}"#, "truncate"),
            (r#"{"after":[1],"op":"c"}"#, "\"after\" is an array"),
        ] {
            let got = rows(debezium_json(value.as_bytes())).join("");
            assert!(got.starts_with("bad: ") && got.contains(reason), "{value}: {got}");
        }
    }

    #[test]
    fn upserts_are_the_keys_new_row_or_its_delete() {
        let row = |key: Option<&str>, value: Option<&str>| match upsert_json(
            key.map(str::as_bytes),
            value.map(str::as_bytes),
        ) {
            Ok(row) => format!("{} {}", row.kind.short(), String::from_utf8_lossy(&row.row)),
            Err(reason) => format!("bad: {reason}"),
        };
        assert_eq!(row(Some(r#"{"id":1}"#), Some(r#"{"id":1,"v":"a"}"#)), r#"+U {"id":1,"v":"a"}"#);
        assert_eq!(
            row(Some(r#"{"id":1}"#), Some(r#"{"v":"a"}"#)),
            r#"+U {"id":1,"v":"a"}"#,
            "key columns from the key"
        );
        assert_eq!(row(Some(r#"{"id":1}"#), None), r#"-D {"id":1}"#);
        assert!(row(None, Some("{}")).contains("has no key"));
        assert!(row(Some("7"), None).contains("the key is a number"));
        assert!(row(Some(r#"{"id":1}"#), Some("x")).contains("the value is not JSON"));
    }

    #[test]
    fn op_columns_read_flinks_short_kinds() {
        let ops = StringArray::from(vec![Some("+I"), Some("-U"), Some("+U"), Some("-D"), Some("+X"), None]);
        let (kinds, bad) = op_kinds(&ops);
        assert_eq!(&kinds.values()[..4], &[0, 1, 2, 3]);
        assert_eq!(bad.iter().map(|(row, _)| *row).collect::<Vec<_>>(), [4, 5]);
        assert!(bad[0].1.contains("\"+X\""));
    }

    proptest::proptest! {
        /// Any bytes: rows or a reason, never a panic (`properties::check_changelog_envelopes`).
        #[test]
        fn any_bytes_decode_or_say_why(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            crate::properties::check_changelog_envelopes(&bytes);
        }

        /// Envelopes built from JSON pieces reach past the parse: their kinds follow `op`.
        #[test]
        fn envelopes_of_json_pieces_keep_their_kinds(
            op in proptest::sample::select(vec!["c", "r", "u", "d", "t", ""]),
            before in proptest::sample::select(vec!["null", "{\"id\":1}", "[1]", "2"]),
            after in proptest::sample::select(vec!["null", "{\"id\":1,\"v\":\"x\\ny\"}", "\"s\""]),
            wrap in proptest::bool::ANY,
        ) {
            let event = format!("{{\"before\":{before},\"after\":{after},\"op\":\"{op}\"}}");
            let event = if wrap { format!("{{\"schema\":{{}},\"payload\":{event}}}") } else { event };
            crate::properties::check_changelog_envelopes(event.as_bytes());
        }
    }
}
