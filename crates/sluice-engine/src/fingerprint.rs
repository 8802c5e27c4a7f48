//! The topology fingerprint: a hash of what checkpointed state depends on, so a restart
//! with a changed pipeline is refused instead of misreading state.
//!
//! It covers the sources (name, connector, watermark delay, every table's name,
//! event-time column and columns with their SQL types), the views (name and SQL text),
//! the sinks (name, input, connector, and `worker` where set) and the vnode count; not what may change across a
//! restart (threads, rates, paths, timeouts, batch sizes).
//!
//! # Canonical form, version 1 ([`FINGERPRINT_VERSION`])
//!
//! UTF-8 text, one line per item, each ending in `\n`; every name or text is written as
//! `<byte length>:<bytes>`, so no content can be mistaken for structure:
//!
//! ```text
//! sluice-topology 1
//! vnodes <n>
//! source <name> connector <connector> watermark_delay_ms <n>
//! table <name> event_time <column, or 0: for none>
//! column <name> <SQL type> <null|not null>
//! view <name> sql <text>
//! sink <name> from <table or view> connector <connector>[ worker <n>]
//! share flow <n> taps flow <n> segment <n>
//! ```
//!
//! in file order (each `table` line after its source, each `column` after its table;
//! a `share` line per flow that reads another flow's segment instead of computing it
//! again, in plan order: the sinks' flows in file order, then the materialized
//! tables', as `engine::share` plans them; none when no flow does).
//! SQL types are written as Flink names them ([`canonical_type`]), never from a
//! dependency's debug output. The fingerprint is XXH3-64 (seed 0) of that text, shown as
//! 16 lowercase hex digits.

use std::fmt::{self, Write};

use arrow::datatypes::{DataType, IntervalUnit, TimeUnit};
use sluice_config::PipelineConfig;
use sluice_runtime::Plan;
use sluice_types::SluiceError;

/// The canonical form this build fingerprints.
pub const FINGERPRINT_VERSION: u32 = 1;

/// A topology fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub u64);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The fingerprint of a compiled pipeline.
pub fn fingerprint(config: &PipelineConfig, plan: &Plan) -> Result<Fingerprint, SluiceError> {
    Ok(Fingerprint(sluice_types::key::hash(canonical_form(config, plan)?.as_bytes())))
}

/// `<byte length>:<bytes>`.
fn text(value: &str) -> String {
    format!("{}:{value}", value.len())
}

/// The canonical form of a compiled pipeline (see the module docs).
pub fn canonical_form(config: &PipelineConfig, plan: &Plan) -> Result<String, SluiceError> {
    let mut form = format!("sluice-topology {FINGERPRINT_VERSION}\nvnodes {}\n", config.pipeline.vnodes);
    for (source, factory) in config.sources.iter().zip(&plan.sources) {
        let delay = source.watermark_delay.as_millis();
        let _ = write!(
            form,
            "source {} connector {} watermark_delay_ms {delay}",
            text(&source.name),
            text(&source.connector.value)
        );
        // A materialized table adds flows (with their operators' state) after the sinks'
        // ones; written only when set, so pipelines without it keep their fingerprint.
        form.push_str(if source.materialized.is_some() { " materialized\n" } else { "\n" });
        for table in factory.tables() {
            let event_time = table.event_time.as_deref().unwrap_or("");
            let _ = writeln!(form, "table {} event_time {}", text(&table.name), text(event_time));
            for field in table.schema.fields() {
                let null = if field.is_nullable() { "null" } else { "not null" };
                let _ = writeln!(form, "column {} {} {null}", text(field.name()), canonical_type(field.data_type())?);
            }
        }
    }
    for view in &config.views {
        let _ = write!(form, "view {} sql {}", text(&view.name), text(&view.sql.value));
        form.push_str(if view.materialized.is_some() { " materialized\n" } else { "\n" });
    }
    for sink in &config.sinks {
        let _ = write!(
            form,
            "sink {} from {} connector {}",
            text(&sink.name),
            text(&sink.from),
            text(&sink.connector.value)
        );
        // Where a single-writer sink runs (its staged output lives there); written only
        // when set, so pipelines without it keep their fingerprint.
        if let Some(worker) = sink.worker {
            let _ = write!(form, " worker {worker}");
        }
        form.push('\n');
    }
    // Which flows share another's computation (`share`): their operators' ids differ
    // from the unshared plan's. Written only when a flow taps another, so pipelines whose
    // tables each have one reader keep their fingerprint.
    for (reader, flow) in plan.flows.iter().enumerate() {
        if let Some(tap) = &flow.tap {
            let _ = writeln!(form, "share flow {reader} taps flow {} segment {}", tap.flow, tap.segment);
        }
    }
    Ok(form)
}

fn precision(unit: &TimeUnit) -> u8 {
    match unit {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 3,
        TimeUnit::Microsecond => 6,
        TimeUnit::Nanosecond => 9,
    }
}

/// A column type as Flink's SQL names it (`BIGINT`, `TIMESTAMP(3)`, `DECIMAL(10, 2)`…).
pub fn canonical_type(data_type: &DataType) -> Result<String, SluiceError> {
    use DataType as T;
    Ok(match data_type {
        T::Null => "NULL".into(),
        T::Boolean => "BOOLEAN".into(),
        T::Int8 => "TINYINT".into(),
        T::Int16 => "SMALLINT".into(),
        T::Int32 => "INT".into(),
        T::Int64 => "BIGINT".into(),
        T::UInt8 => "TINYINT UNSIGNED".into(),
        T::UInt16 => "SMALLINT UNSIGNED".into(),
        T::UInt32 => "INT UNSIGNED".into(),
        T::UInt64 => "BIGINT UNSIGNED".into(),
        T::Float16 => "HALF".into(),
        T::Float32 => "FLOAT".into(),
        T::Float64 => "DOUBLE".into(),
        T::Decimal32(p, s) | T::Decimal64(p, s) => format!("DECIMAL({p}, {s})"),
        T::Decimal128(p, s) | T::Decimal256(p, s) => format!("DECIMAL({p}, {s})"),
        T::Utf8 | T::LargeUtf8 | T::Utf8View => "VARCHAR".into(),
        T::Binary | T::LargeBinary | T::BinaryView => "VARBINARY".into(),
        T::FixedSizeBinary(n) => format!("BINARY({n})"),
        T::Date32 | T::Date64 => "DATE".into(),
        T::Time32(unit) | T::Time64(unit) => format!("TIME({})", precision(unit)),
        T::Timestamp(unit, None) => format!("TIMESTAMP({})", precision(unit)),
        T::Timestamp(unit, Some(zone)) => format!("TIMESTAMP({}) WITH TIME ZONE {}", precision(unit), text(zone)),
        T::Duration(unit) => format!("INTERVAL({})", precision(unit)),
        T::Interval(IntervalUnit::YearMonth) => "INTERVAL YEAR TO MONTH".into(),
        T::Interval(IntervalUnit::DayTime) => "INTERVAL DAY TO SECOND(3)".into(),
        T::Interval(IntervalUnit::MonthDayNano) => "INTERVAL MONTH TO SECOND(9)".into(),
        T::List(field) | T::LargeList(field) | T::ListView(field) | T::LargeListView(field) => {
            format!("ARRAY<{}>", canonical_type(field.data_type())?)
        }
        T::FixedSizeList(field, n) => format!("ARRAY<{}>[{n}]", canonical_type(field.data_type())?),
        T::Struct(fields) => {
            let inner = fields
                .iter()
                .map(|f| Ok(format!("{} {}", text(f.name()), canonical_type(f.data_type())?)))
                .collect::<Result<Vec<_>, SluiceError>>()?;
            format!("ROW<{}>", inner.join(", "))
        }
        T::Map(field, _) => format!("MAP<{}>", canonical_type(field.data_type())?),
        T::Dictionary(_, value) => canonical_type(value)?,
        other => {
            return Err(SluiceError::internal(
                "fingerprint.type",
                format!("the column type {other} has no canonical name for the topology fingerprint"),
            ));
        }
    })
}

#[cfg(test)]
mod tests;
