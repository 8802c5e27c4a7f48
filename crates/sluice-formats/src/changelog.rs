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
use serde_json::value::RawValue;
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
///
/// A well-formed envelope is read in one pass that keeps its images as the text they
/// are ([`RawEnvelope`]): no tree is built, and the rows are the images' own bytes, so a
/// number keeps every digit it was written with, as the plain `json` format reads it.
/// Anything else (a bad envelope, a repeated field, an `op` written with escapes) takes
/// the general path, which builds the tree and says why.
pub fn debezium_json(value: &[u8]) -> Result<Vec<ChangeRow>, String> {
    if let Some(rows) = debezium_json_raw(value) {
        return Ok(rows);
    }
    debezium_json_tree(value)
}

/// A Debezium envelope's fields that make its rows, each the text of its value; every
/// other field is checked as JSON and skipped without being kept.
#[derive(serde::Deserialize)]
struct RawEnvelope<'a> {
    #[serde(borrow, default)]
    before: Option<&'a RawValue>,
    #[serde(borrow, default)]
    after: Option<&'a RawValue>,
    #[serde(borrow, default)]
    op: Option<&'a RawValue>,
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
}

/// The rows of a well-formed envelope, or None for the general path to decide (and to
/// give the reason when it is bad). Agrees with [`debezium_json_tree`] wherever it
/// answers (the property test `the_raw_path_agrees_with_the_tree`).
fn debezium_json_raw(value: &[u8]) -> Option<Vec<ChangeRow>> {
    let outer: RawEnvelope = serde_json::from_slice(value).ok()?;
    let envelope = match outer.payload {
        // As the tree path does: an object payload is the envelope, any other is ignored.
        Some(payload) if payload.get().starts_with('{') => serde_json::from_str(payload.get()).ok()?,
        _ => outer,
    };
    // An image is an object or null (`Option` reads null as None); anything else is bad.
    let image = |raw: Option<&RawValue>| -> Option<Option<Vec<u8>>> {
        match raw {
            None => Some(None),
            Some(raw) if raw.get().starts_with('{') => Some(Some(raw.get().as_bytes().to_vec())),
            Some(_) => None,
        }
    };
    let before = image(envelope.before)?;
    let after = image(envelope.after)?;
    let row = |kind, row| ChangeRow { kind, row };
    match envelope.op?.get() {
        r#""c""# | r#""r""# => Some(vec![row(RowKind::Insert, after?)]),
        r#""u""# => {
            let after = after?;
            Some(match before {
                Some(before) => vec![row(RowKind::UpdateBefore, before), row(RowKind::UpdateAfter, after)],
                None => vec![row(RowKind::UpdateAfter, after)],
            })
        }
        r#""d""# => Some(vec![row(RowKind::Delete, before?)]),
        _ => None,
    }
}

/// [`debezium_json`] through a `serde_json::Value` tree: every envelope, with the reason
/// for a bad one.
fn debezium_json_tree(value: &[u8]) -> Result<Vec<ChangeRow>, String> {
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
///
/// As for Debezium, a message whose key and value are objects with plain field names,
/// the value holding every field of the key, is read in one pass that keeps the value's
/// own text; any other takes the general path ([`upsert_json_tree`]).
pub fn upsert_json(key: Option<&[u8]>, value: Option<&[u8]>) -> Result<ChangeRow, String> {
    if let Some(row) = upsert_json_raw(key, value) {
        return Ok(row);
    }
    upsert_json_tree(key, value)
}

/// The field names of a JSON object, its values checked as JSON and skipped. A name
/// written with an escape is not borrowed and fails the read (the general path reads it).
struct FieldNames<'a>(Vec<&'a str>);

impl<'de> serde::Deserialize<'de> for FieldNames<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Names;
        impl<'de> serde::de::Visitor<'de> for Names {
            type Value = FieldNames<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = map.next_key::<&'de str>()? {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    names.push(name);
                }
                Ok(FieldNames(names))
            }
        }
        deserializer.deserialize_map(Names)
    }
}

/// The row of a plain upsert message, or None for the general path. Agrees with
/// [`upsert_json_tree`] wherever it answers (`the_raw_upsert_agrees_with_the_tree`).
fn upsert_json_raw(key: Option<&[u8]>, value: Option<&[u8]>) -> Option<ChangeRow> {
    let key = key?;
    let key_names: FieldNames = serde_json::from_slice(key).ok()?;
    let Some(value) = value else {
        return Some(ChangeRow { kind: RowKind::Delete, row: key.to_vec() });
    };
    let names: FieldNames = serde_json::from_slice(value).ok()?;
    // A field of the key that the value lacks is taken from the key: the tree's merge.
    if !key_names.0.iter().all(|name| names.0.contains(name)) {
        return None;
    }
    Some(ChangeRow { kind: RowKind::UpdateAfter, row: value.to_vec() })
}

/// [`upsert_json`] through `serde_json::Value` trees: every message, with the reason for
/// a bad one.
fn upsert_json_tree(key: Option<&[u8]>, value: Option<&[u8]>) -> Result<ChangeRow, String> {
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
    use proptest::strategy::Strategy;

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
    fn well_formed_envelopes_take_the_raw_path() {
        for value in [
            r#"{"before":null,"after":{"id":1,"v":"a"},"op":"c","source":{"db":"x","lsn":[1,2]},"ts_ms":1}"#,
            r#"{"after":{"id":1},"op":"r"}"#,
            r#"{"before":{"id":1},"after":{"id":1,"v":"b"},"op":"u"}"#,
            r#" { "before" : { "id" : 1 } ,
                "op" : "d" } "#,
            r#"{"schema":{"type":"struct","fields":[{"field":"before"}]},"payload":{"after":{"id":2},"op":"c"}}"#,
        ] {
            let raw = debezium_json_raw(value.as_bytes()).unwrap_or_else(|| panic!("{value}: not read raw"));
            let tree = debezium_json_tree(value.as_bytes()).expect("well formed");
            assert_eq!(rows_as_values(&raw), rows_as_values(&tree), "{value}");
        }
        // The image is its own text: every digit of a number is kept.
        let rows = debezium_json(br#"{"after":{"d":12345678901234567890.123456789},"op":"c"}"#).expect("well formed");
        assert_eq!(rows[0].row, br#"{"d":12345678901234567890.123456789}"#);
    }

    /// Each row's kind and its JSON value, for comparing the two paths.
    fn rows_as_values(rows: &[ChangeRow]) -> Vec<(RowKind, Value)> {
        rows.iter().map(|r| (r.kind, serde_json::from_slice(&r.row).expect("a row is JSON"))).collect()
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

    /// Values of a Debezium image field, good and bad.
    const IMAGES: [&str; 6] = ["null", "{\"id\":1}", "{ \"id\" : 2 , \"v\":\"a\\\"b\" }", "[1]", "2", "{\"n\":1e400}"];

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

        /// Where the raw path answers, it gives the tree's rows; a well-formed envelope is
        /// always answered by it.
        #[test]
        fn the_raw_path_agrees_with_the_tree(
            before in proptest::option::of(proptest::sample::select(IMAGES.to_vec())),
            after in proptest::option::of(proptest::sample::select(IMAGES.to_vec())),
            op in proptest::option::of(proptest::sample::select(vec![
                "\"c\"", "\"r\"", "\"u\"", "\"d\"", "\"t\"", "\"\\u0063\"", "5", "null",
            ])),
            payload in proptest::option::of(proptest::sample::select(vec![
                "null", "7", "{\"op\":\"c\",\"after\":{\"id\":3}}", "{\"before\":{\"id\":4},\"op\":\"d\"}",
                "{\"before\":{\"id\":4},\"after\":null,\"op\":\"u\"}",
            ])),
            source in proptest::option::of(proptest::sample::select(vec!["{\"x\":[1,{\"y\":null}]}", "1e400", "\"s\""])),
            repeated in proptest::option::of(proptest::sample::select(vec!["before", "after", "op", "payload"])),
            order in proptest::strategy::Just((0..6).collect::<Vec<usize>>()).prop_shuffle(),
            spaced in proptest::bool::ANY,
        ) {
            let gap = if spaced { " \n\t" } else { "" };
            let named = [("before", before), ("after", after), ("op", op), ("payload", payload), ("source", source)];
            let mut fields: Vec<(&str, &str)> = Vec::new();
            for index in order {
                match (named.get(index), repeated) {
                    (Some((name, Some(value))), _) => fields.push((name, value)),
                    (None, Some(name)) => fields.push((name, "null")),
                    _ => {}
                }
            }
            let body: Vec<String> =
                fields.iter().map(|(name, value)| format!("{gap}\"{name}\"{gap}:{gap}{value}{gap}")).collect();
            let event = format!("{gap}{{{}}}{gap}", body.join(","));
            let tree = debezium_json_tree(event.as_bytes());
            match (debezium_json_raw(event.as_bytes()), tree.as_ref()) {
                (Some(raw), Ok(tree)) => {
                    proptest::prop_assert_eq!(rows_as_values(&raw), rows_as_values(tree), "{}", event);
                }
                // A number past f64 is no value for the tree; the raw path leaves it to the
                // row decoder, which reads it by its column as the plain `json` format does.
                (Some(_), Err(reason)) => {
                    proptest::prop_assert!(event.contains("1e400"), "{}: raw rows, the tree says {}", event, reason);
                }
                (None, _) => {
                    let names: Vec<&str> = fields.iter().map(|(name, _)| *name).collect();
                    let repeated = (1..names.len()).any(|i| names[..i].contains(&names[i]));
                    // Without a repeated field, an escaped `op` or a number past f64, the
                    // raw path reads every envelope the tree reads.
                    let unusual = repeated || event.contains("\\u0063") || event.contains("1e400");
                    proptest::prop_assert!(tree.is_err() || unusual, "{}: the tree reads it, the raw path does not", event);
                }
            }
        }

        /// The same for upsert messages: where the raw path answers, the tree's row; a key
        /// the value holds whole is always answered by it.
        #[test]
        fn the_raw_upsert_agrees_with_the_tree(
            key in proptest::option::of(proptest::sample::select(vec![
                "{\"id\":1}", "{ \"id\" : 1 , \"k\":\"x\" }", "{}", "{\"i\\u0064\":1}", "[1]", "7", "x",
            ])),
            value in proptest::option::of(proptest::sample::select(vec![
                "{\"id\":1,\"v\":\"a\"}", "{\"v\":\"a\"}", "{ \"k\" : \"y\", \"id\":2, \"v\":[1,{}] }", "{}",
                "[1]", "null", "x", "{\"id\":1,\"v\":1e400}",
            ])),
        ) {
            let (key, value) = (key.map(str::as_bytes), value.map(str::as_bytes));
            let tree = upsert_json_tree(key, value);
            let shown = format!("{:?} {:?}", key.map(String::from_utf8_lossy), value.map(String::from_utf8_lossy));
            match (upsert_json_raw(key, value), tree.as_ref()) {
                (Some(raw), Ok(tree)) => {
                    proptest::prop_assert_eq!(
                        rows_as_values(std::slice::from_ref(&raw)),
                        rows_as_values(std::slice::from_ref(tree)),
                        "{}",
                        shown
                    );
                }
                (Some(_), Err(reason)) => {
                    proptest::prop_assert!(shown.contains("1e400"), "{}: raw row, the tree says {}", shown, reason);
                }
                (None, _) => {
                    // Left to the tree: a bad message, a name written with an escape, or a
                    // key field the value lacks, which the tree merges in.
                    let object = |bytes: Option<&[u8]>| match bytes.map(serde_json::from_slice::<Value>) {
                        Some(Ok(Value::Object(object))) => Some(object),
                        _ => None,
                    };
                    let merged = match (object(key), object(value)) {
                        (Some(key), Some(value)) => key.keys().any(|name| !value.contains_key(name)),
                        _ => false,
                    };
                    let left = tree.is_err() || shown.contains("\\u0064") || merged;
                    proptest::prop_assert!(left, "{}: the tree reads it, the raw path does not", shown);
                }
            }
        }
    }
}
