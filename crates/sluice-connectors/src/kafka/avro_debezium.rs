//! `format = "debezium-avro-confluent"` (Flink's format of that name): a Debezium change
//! event written in Avro with the Confluent framing, its writer schema from the registry.
//!
//! The writer schema is Debezium's envelope: a record with a string field `op` and the
//! fields `before` and `after`, each a union of `null` and the table's row record (the
//! row record is defined inline in one of them and named in the other). The row record
//! is resolved onto the declared columns as `avro-confluent` resolves a value record
//! (fields by name, promotions, defaults); the event gives rows as `debezium-json`'s
//! does (`sluice_formats::changelog`): `c`/`r` `+I after`, `u` `-U before` (when present)
//! and `+U after`, `d` `-D before`. A writer schema that is no such envelope makes every
//! message written with it bad, with the reason; so does any other `op`, a missing image,
//! or a value its column cannot take. A message is all or nothing.

use apache_avro::Schema as AvroSchema;
use apache_avro::types::Value;
use sluice_types::RowKind;

use super::{Cell, Column, convert, decimal_scale};

/// Where a Debezium envelope's parts are and how its row record maps onto the columns.
#[derive(Debug)]
pub(super) struct EnvelopePlan {
    op: usize,
    before: usize,
    after: usize,
    /// Per column: the index of its field in the row record; `None`: the default.
    fields: Vec<Option<usize>>,
    scales: Vec<Option<usize>>,
}

impl EnvelopePlan {
    /// The plan of the envelope `schema` (`what` names it in reasons), or why no message
    /// of it can make rows.
    pub(super) fn new(schema: &AvroSchema, columns: &[Column], what: &str) -> Result<EnvelopePlan, String> {
        let AvroSchema::Record(envelope) = schema else {
            return Err(format!("{what} is not a Debezium envelope (a record)"));
        };
        let field = |name: &str| {
            envelope.fields.iter().position(|f| f.name == name).ok_or_else(|| {
                format!(
                    "{what} is not a Debezium envelope: it has no field `{name}` (Debezium's have op, before, after)"
                )
            })
        };
        let (op, before, after) = (field("op")?, field("before")?, field("after")?);
        let row = [before, after]
            .iter()
            .find_map(|&at| match &envelope.fields[at].schema {
                AvroSchema::Union(union) => union.variants().iter().find_map(|v| match v {
                    AvroSchema::Record(record) => Some(record),
                    _ => None,
                }),
                AvroSchema::Record(record) => Some(record),
                _ => None,
            })
            .ok_or_else(|| format!("{what}: neither `before` nor `after` defines the row record"))?;
        let mut fields = Vec::with_capacity(columns.len());
        for column in columns {
            let found = row.fields.iter().position(|f| f.name == column.name);
            if found.is_none() && !column.nullable {
                return Err(format!(
                    "{what}'s row has no field `{}` and the NOT NULL column has no default",
                    column.name
                ));
            }
            fields.push(found);
        }
        let scales =
            fields.iter().map(|f| f.and_then(|at| row.fields.get(at)).and_then(|f| decimal_scale(&f.schema))).collect();
        Ok(EnvelopePlan { op, before, after, fields, scales })
    }

    /// The rows of one decoded envelope, each with its kind and cells, or why it has none.
    pub(super) fn rows(
        &self,
        value: Value,
        columns: &[Column],
        what: &str,
    ) -> Result<Vec<(RowKind, Vec<Cell<'static>>)>, String> {
        let Value::Record(mut fields) = value else { return Err(format!("the datum of {what} is not a record")) };
        let mut take =
            |at: usize| fields.get_mut(at).map(|(_, v)| std::mem::replace(v, Value::Null)).unwrap_or(Value::Null);
        let op = match take(self.op) {
            Value::String(op) => op,
            Value::Union(_, boxed) => match *boxed {
                Value::String(op) => op,
                other => return Err(format!("the envelope's op is {other:?}, not a string")),
            },
            other => return Err(format!("the envelope's op is {other:?}, not a string")),
        };
        let (before, after) = (image(take(self.before)), image(take(self.after)));
        let missing = |field: &str| format!("op \"{op}\" with a null \"{field}\"");
        let images = match op.as_str() {
            "c" | "r" => vec![(RowKind::Insert, after.ok_or_else(|| missing("after"))?)],
            "u" => {
                let after = after.ok_or_else(|| missing("after"))?;
                let mut rows = Vec::with_capacity(2);
                if let Some(before) = before {
                    rows.push((RowKind::UpdateBefore, before));
                }
                rows.push((RowKind::UpdateAfter, after));
                rows
            }
            "d" => vec![(RowKind::Delete, before.ok_or_else(|| missing("before"))?)],
            other => {
                return Err(format!(
                    "op \"{other}\" is not one of c, r, u, d (a truncate cannot be applied row by row)"
                ));
            }
        };
        images
            .into_iter()
            .map(|(kind, row)| {
                let Value::Record(mut row) = row else { return Err(format!("a row image of {what} is not a record")) };
                let mut cells = Vec::with_capacity(columns.len());
                for (c, column) in columns.iter().enumerate() {
                    let value = match self.fields[c] {
                        Some(at) => {
                            row.get_mut(at).map(|(_, v)| std::mem::replace(v, Value::Null)).unwrap_or(Value::Null)
                        }
                        None => Value::Null,
                    };
                    cells.push(convert(value, column, self.scales[c]).map_err(|reason| format!("{reason} ({what})"))?);
                }
                Ok((kind, cells))
            })
            .collect()
    }
}

/// A `before` or `after` value: its row, or None when null.
fn image(value: Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::Union(_, boxed) => image(*boxed),
        row => Some(row),
    }
}
