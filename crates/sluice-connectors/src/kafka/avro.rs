//! Avro message values: `format = "avro"` (one Avro binary datum per message, written
//! with the schema derived from the declared columns) and `format = "avro-confluent"`
//! (the Confluent wire format: magic byte 0, a 4-byte big-endian schema id, the datum
//! written with that schema, fetched from the registry by [`Registry`]).
//!
//! # The derived schema
//!
//! As Flink derives it: a record named `record` (namespace
//! `org.apache.flink.avro.generated`) of the value columns (every declared column but
//! the metadata ones), in order; a nullable column is the union `["null", T]` with
//! default `null`, a `NOT NULL` one is `T` without default. BIGINT is `long`; INT,
//! SMALLINT and TINYINT `int`; BOOLEAN `boolean`; DOUBLE `double`; FLOAT/REAL `float`;
//! VARCHAR `string`; TIMESTAMP(3) a `long` of logical type `timestamp-millis`,
//! TIMESTAMP(6) `timestamp-micros`; DECIMAL(p, s) `bytes` of logical type `decimal`;
//! DATE an `int` of logical type `date`. Any other column type is refused.
//!
//! # Resolution
//!
//! The datum is decoded with its writer schema (the derived one for `avro`, the
//! registry's for `avro-confluent`), then mapped onto the columns as Avro's schema
//! resolution does: each column takes the writer field of its name (fields the columns
//! do not name are skipped); a column the writer lacks takes its default (`null` for a
//! nullable column; a `NOT NULL` column has none, so each message of that writer schema
//! is bad, as Flink's resolving decoder fails it); values are promoted as Avro allows
//! (`int` to `long`, `float`, `double`; `long` to `float`, `double`; `float` to
//! `double`; `bytes` to `string`), a union's branch is its value. Anything else is a bad
//! message naming the column: a `long` for an INT column (Avro never narrows), an `int`
//! outside SMALLINT's or TINYINT's range, a `null` for a `NOT NULL` column, a decimal
//! of another scale or beyond the column's precision, a timestamp of another unit.
//!
//! A flat writer record (fields of primitives or unions of them, as the derived schema
//! is) is read straight from its bytes by `avro_direct.rs`; any other by the Avro
//! crate's general decoder, through a reader that notes a read past the datum's end
//! (that decoder takes some truncated values for `null`). Both yield the same values.
//!
//! A message is bad, never fatal, when it is not one datum of its writer schema
//! (truncated, bytes left over after it, a string that is not UTF-8), when its framing
//! is not Confluent's (no magic byte 0, shorter than 5 bytes), or when the registry does
//! not know its schema id. Only a registry that does not answer (after bounded retries)
//! stops the run, with the URL and the fix.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apache_avro::Schema as AvroSchema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use arrow::array::{
    ArrayRef, BooleanBuilder, Date32Builder, Decimal128Builder, Float32Builder, Float64Builder, Int8Builder,
    Int16Builder, Int32Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder, TimestampMillisecondBuilder,
};
use arrow::datatypes::{DataType, Schema, TimeUnit};
use sluice_types::SluiceError;

use super::avro_direct::{Direct, Failure, MAX_ALLOCATION_BYTES, Slot};

#[path = "avro_debezium.rs"]
mod debezium;

/// The most writer schemas kept by id (the cache is emptied when full).
pub const SCHEMA_CACHE_MAX: usize = 1024;
/// The longest one registry request may take, connecting included.
pub const REGISTRY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a registry request is tried before the run stops.
pub const REGISTRY_ATTEMPTS: u32 = 3;
/// The pause after a failed registry request, doubled after each.
const REGISTRY_BACKOFF: Duration = Duration::from_millis(200);
/// The largest registry answer read.
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// The Confluent framing: the magic byte and the schema id before the datum.
const CONFLUENT_HEADER: usize = 5;

/// The name and namespace of the derived record, as Flink's.
const RECORD_NAME: &str = "record";
const RECORD_NAMESPACE: &str = "org.apache.flink.avro.generated";

/// How a column reads an Avro value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Long,
    Int,
    SmallInt,
    TinyInt,
    Boolean,
    Double,
    Float,
    String,
    TimestampMillis,
    TimestampMicros,
    Decimal { precision: u8, scale: i8 },
    Date,
}

impl Kind {
    fn of(data_type: &DataType) -> Option<Kind> {
        Some(match data_type {
            DataType::Int64 => Kind::Long,
            DataType::Int32 => Kind::Int,
            DataType::Int16 => Kind::SmallInt,
            DataType::Int8 => Kind::TinyInt,
            DataType::Boolean => Kind::Boolean,
            DataType::Float64 => Kind::Double,
            DataType::Float32 => Kind::Float,
            DataType::Utf8 => Kind::String,
            DataType::Timestamp(TimeUnit::Millisecond, None) => Kind::TimestampMillis,
            DataType::Timestamp(TimeUnit::Microsecond, None) => Kind::TimestampMicros,
            DataType::Decimal128(precision, scale) if *scale >= 0 => {
                Kind::Decimal { precision: *precision, scale: *scale }
            }
            DataType::Date32 => Kind::Date,
            _ => return None,
        })
    }

    /// The Avro type of the derived schema, as JSON.
    fn avro_type(self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Kind::Long => json!("long"),
            Kind::Int | Kind::SmallInt | Kind::TinyInt => json!("int"),
            Kind::Boolean => json!("boolean"),
            Kind::Double => json!("double"),
            Kind::Float => json!("float"),
            Kind::String => json!("string"),
            Kind::TimestampMillis => json!({"type": "long", "logicalType": "timestamp-millis"}),
            Kind::TimestampMicros => json!({"type": "long", "logicalType": "timestamp-micros"}),
            Kind::Decimal { precision, scale } => {
                json!({"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale})
            }
            Kind::Date => json!({"type": "int", "logicalType": "date"}),
        }
    }

    fn sql(self) -> String {
        match self {
            Kind::Long => "BIGINT".to_owned(),
            Kind::Int => "INT".to_owned(),
            Kind::SmallInt => "SMALLINT".to_owned(),
            Kind::TinyInt => "TINYINT".to_owned(),
            Kind::Boolean => "BOOLEAN".to_owned(),
            Kind::Double => "DOUBLE".to_owned(),
            Kind::Float => "FLOAT".to_owned(),
            Kind::String => "VARCHAR".to_owned(),
            Kind::TimestampMillis => "TIMESTAMP(3)".to_owned(),
            Kind::TimestampMicros => "TIMESTAMP(6)".to_owned(),
            Kind::Decimal { precision, scale } => format!("DECIMAL({precision}, {scale})"),
            Kind::Date => "DATE".to_owned(),
        }
    }
}

/// One value column.
#[derive(Debug, Clone)]
struct Column {
    name: String,
    kind: Kind,
    nullable: bool,
}

/// The Avro record schema Flink derives from `value_schema` (see the module docs), as
/// JSON; refuses a column whose type or name Avro cannot carry.
pub fn derived_schema_json(value_schema: &Schema) -> Result<String, SluiceError> {
    let columns = columns_of(value_schema)?;
    Ok(schema_json(&columns))
}

fn columns_of(value_schema: &Schema) -> Result<Vec<Column>, SluiceError> {
    let mut columns = Vec::with_capacity(value_schema.fields().len());
    for field in value_schema.fields() {
        let name = field.name();
        let Some(kind) = Kind::of(field.data_type()) else {
            return Err(SluiceError::user(
                "source.avro_type",
                format!("column `{name}` is {}, which the Avro formats do not read", field.data_type()),
            )
            .with_fix(
                "declare it as BIGINT, INT, SMALLINT, TINYINT, BOOLEAN, DOUBLE, FLOAT, VARCHAR, TIMESTAMP(3), \
                 TIMESTAMP(6), DECIMAL(p, s) or DATE, or read the value with format = \"json\"",
            ));
        };
        let mut chars = name.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(SluiceError::user(
                "source.avro_name",
                format!("column `{name}` is not a valid Avro field name ([A-Za-z_][A-Za-z0-9_]*)"),
            )
            .with_fix("rename the column to the field name the producer's schema uses"));
        }
        columns.push(Column { name: name.clone(), kind, nullable: field.is_nullable() });
    }
    Ok(columns)
}

fn schema_json(columns: &[Column]) -> String {
    use serde_json::json;
    let fields: Vec<serde_json::Value> = columns
        .iter()
        .map(|c| match c.nullable {
            true => json!({"name": c.name, "type": ["null", c.kind.avro_type()], "default": null}),
            false => json!({"name": c.name, "type": c.kind.avro_type()}),
        })
        .collect();
    json!({"type": "record", "name": RECORD_NAME, "namespace": RECORD_NAMESPACE, "fields": fields}).to_string()
}

/// A writer schema and where each column finds its field in it.
#[derive(Debug)]
struct WriterPlan {
    schema: AvroSchema,
    /// Per column: the index of its field in the writer record; `None`: the default.
    fields: Vec<Option<usize>>,
    /// Per column: the writer field's decimal scale, if it is a decimal.
    scales: Vec<Option<usize>>,
    /// Why no message of this writer schema can make a row, if none can.
    unusable: Option<String>,
    /// "the derived schema" or "schema id N", for reasons.
    what: String,
    /// The direct decoder, when the writer record is flat.
    direct: Option<Direct>,
    /// A Debezium envelope's plan (`debezium-avro-confluent`).
    envelope: Option<debezium::EnvelopePlan>,
}

impl WriterPlan {
    fn new(schema: AvroSchema, columns: &[Column], what: &str) -> WriterPlan {
        let AvroSchema::Record(record) = &schema else {
            let unusable = Some(format!("{what} is not a record"));
            let (fields, scales, what) = (Vec::new(), Vec::new(), what.to_owned());
            return WriterPlan { schema, fields, scales, unusable, what, direct: None, envelope: None };
        };
        let mut fields = Vec::with_capacity(columns.len());
        let mut unusable = None;
        if recursive(&schema, &mut Vec::new()) {
            // A datum of a recursive type nests as deep as its bytes say: unbounded.
            unusable = Some(format!("{what} is recursive, which the Avro formats do not read"));
        }
        for column in columns {
            let found = record.fields.iter().position(|f| f.name == column.name);
            if found.is_none() && !column.nullable && unusable.is_none() {
                unusable =
                    Some(format!("{what} has no field `{}` and the NOT NULL column has no default", column.name));
            }
            fields.push(found);
        }
        let scales = fields
            .iter()
            .map(|f| f.and_then(|at| record.fields.get(at)).and_then(|f| decimal_scale(&f.schema)))
            .collect();
        let direct = Direct::new(&schema, &fields);
        WriterPlan { schema, fields, scales, unusable, what: what.to_owned(), direct, envelope: None }
    }

    /// The plan of a Debezium envelope `schema` (see `avro_debezium.rs`).
    fn envelope(schema: AvroSchema, columns: &[Column], what: &str) -> WriterPlan {
        let (envelope, mut unusable) = match debezium::EnvelopePlan::new(&schema, columns, what) {
            Ok(plan) => (Some(plan), None),
            Err(reason) => (None, Some(reason)),
        };
        if recursive(&schema, &mut Vec::new()) {
            unusable = Some(format!("{what} is recursive, which the Avro formats do not read"));
        }
        let (fields, scales, what) = (Vec::new(), Vec::new(), what.to_owned());
        WriterPlan { schema, fields, scales, unusable, what, direct: None, envelope }
    }
}

/// What the registry said about one schema id.
#[derive(Debug, Clone)]
pub enum Lookup {
    Found(Arc<AvroSchema>),
    /// Not registered, or not a schema this crate parses: each message naming it is bad.
    Unknown(String),
}

/// A schema registry reached over plain HTTP/1.1, its answers cached by id.
#[derive(Debug)]
pub struct Registry {
    url: String,
    host: String,
    port: u16,
    /// The URL's path, without a trailing `/`.
    base_path: String,
    cache: Mutex<HashMap<u32, Lookup>>,
    timeout: Duration,
}

impl Registry {
    /// A registry at `url` (`http://host[:port][/path]`); refuses any other URL.
    pub fn new(url: &str) -> Result<Registry, String> {
        if url.starts_with("https://") {
            return Err("https is not supported: the registry is reached over plain http".to_owned());
        }
        let Some(rest) = url.strip_prefix("http://") else {
            return Err("the URL must start with http://".to_owned());
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], rest[at..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.contains('@') || authority.is_empty() {
            return Err("the URL must name a host (no user information)".to_owned());
        }
        let (host, port) = match authority.strip_prefix('[') {
            Some(bracketed) => {
                let (host, rest) = bracketed.split_once(']').ok_or("an IPv6 host without its `]`")?;
                (host, rest.strip_prefix(':'))
            }
            None => match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            },
        };
        let port = match port {
            Some(port) => port.parse::<u16>().map_err(|_| format!("`{port}` is not a port number"))?,
            None => 80,
        };
        if host.is_empty() {
            return Err("the URL must name a host".to_owned());
        }
        Ok(Registry {
            url: url.trim_end_matches('/').to_owned(),
            host: host.to_owned(),
            port,
            base_path: path.to_owned(),
            cache: Mutex::new(HashMap::new()),
            timeout: REGISTRY_TIMEOUT,
        })
    }

    /// The same registry with another per-request timeout (tests).
    pub fn with_timeout(mut self, timeout: Duration) -> Registry {
        self.timeout = timeout;
        self
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The writer schema of `id`: cached, or asked for (bounded retries); an error only
    /// when the registry does not answer.
    pub fn schema(&self, id: u32) -> Result<Lookup, SluiceError> {
        if let Some(found) = self.cache.lock().ok().and_then(|c| c.get(&id).cloned()) {
            return Ok(found);
        }
        let lookup = self.fetch(id)?;
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= SCHEMA_CACHE_MAX {
                cache.clear();
            }
            cache.insert(id, lookup.clone());
        }
        Ok(lookup)
    }

    fn fetch(&self, id: u32) -> Result<Lookup, SluiceError> {
        let path = format!("{}/schemas/ids/{id}", self.base_path);
        let mut last = String::new();
        let mut pause = REGISTRY_BACKOFF;
        for attempt in 1..=REGISTRY_ATTEMPTS {
            match self.get(&path) {
                Ok((200, body)) => return Ok(parse_answer(id, &body)),
                Ok((404, _)) => return Ok(Lookup::Unknown(format!("the registry has no schema id {id}"))),
                Ok((status, body)) if (400..500).contains(&status) => {
                    let body = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                    return Err(SluiceError::external(
                        "source.avro_registry",
                        format!("the schema registry {} answered {status} for schema id {id}: {body}", self.url),
                    )
                    .with_fix("check `schema_registry` (the registry's base URL) and that it allows reading schemas"));
                }
                Ok((status, _)) => last = format!("status {status}"),
                Err(error) => last = error,
            }
            if attempt < REGISTRY_ATTEMPTS {
                std::thread::sleep(pause);
                pause *= 2;
            }
        }
        Err(SluiceError::external(
            "source.avro_registry",
            format!(
                "the schema registry {} did not answer for schema id {id} ({REGISTRY_ATTEMPTS} attempts of at most \
                 {} ms each; last: {last})",
                self.url,
                self.timeout.as_millis()
            ),
        )
        .with_fix("check `schema_registry` (http://host:port of a running registry) and that the network reaches it"))
    }

    /// One `GET path` with `Connection: close`: the status and the body, within the
    /// timeout and [`MAX_RESPONSE_BYTES`].
    fn get(&self, path: &str) -> Result<(u16, Vec<u8>), String> {
        let deadline = Instant::now() + self.timeout;
        let addresses = (self.host.as_str(), self.port).to_socket_addrs().map_err(|e| format!("resolving: {e}"))?;
        let mut stream = None;
        let mut last = "no address".to_owned();
        for address in addresses {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(&address, left) {
                Ok(connected) => {
                    stream = Some(connected);
                    break;
                }
                Err(error) => last = format!("connecting to {address}: {error}"),
            }
        }
        let mut stream = stream.ok_or(last)?;
        let host = match self.host.contains(':') {
            true => format!("[{}]:{}", self.host, self.port),
            false => format!("{}:{}", self.host, self.port),
        };
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/vnd.schemaregistry.v1+json, \
             application/json\r\nConnection: close\r\n\r\n"
        );
        let left = |deadline: Instant| {
            let left = deadline.saturating_duration_since(Instant::now());
            (!left.is_zero()).then_some(left).ok_or_else(|| "timed out".to_owned())
        };
        stream.set_write_timeout(Some(left(deadline)?)).map_err(|e| e.to_string())?;
        stream.write_all(request.as_bytes()).map_err(|e| format!("sending the request: {e}"))?;
        let mut response = Vec::new();
        let mut buffer = [0u8; 8192];
        loop {
            stream.set_read_timeout(Some(left(deadline)?)).map_err(|e| e.to_string())?;
            let read = stream.read(&mut buffer).map_err(|e| format!("reading the answer: {e}"))?;
            if read == 0 {
                break;
            }
            response.extend_from_slice(&buffer[..read]);
            if response.len() > MAX_RESPONSE_BYTES {
                return Err(format!("the answer is larger than {MAX_RESPONSE_BYTES} bytes"));
            }
        }
        parse_response(&response)
    }
}

/// The status and body of an HTTP/1.x response read to its end.
fn parse_response(response: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = memchr::memmem::find(response, b"\r\n\r\n").ok_or("the answer has no complete header")?;
    let head = std::str::from_utf8(&response[..end]).map_err(|_| "the answer's header is not text")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = (status_line.strip_prefix("HTTP/1."))
        .and_then(|s| s.get(2..5))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP/1 answer: `{}`", status_line.chars().take(60).collect::<String>()))?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "transfer-encoding" && value.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        } else if name == "content-length" {
            length = value.parse::<usize>().ok();
        }
    }
    let body = &response[end + 4..];
    let body = match (chunked, length) {
        (true, _) => dechunk(body)?,
        (false, Some(length)) => body.get(..length).ok_or("the answer is shorter than its Content-Length")?.to_vec(),
        (false, None) => body.to_vec(),
    };
    Ok((status, body))
}

/// The body of a chunked transfer encoding.
fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = memchr::memmem::find(body, b"\r\n").ok_or("a chunk without its size line")?;
        let size = std::str::from_utf8(&body[..line_end]).ok().and_then(|line| {
            let hex = line.split(';').next().unwrap_or_default().trim();
            usize::from_str_radix(hex, 16).ok()
        });
        let size = size.ok_or("a chunk size that is not hexadecimal")?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = body.get(..size).ok_or("a chunk shorter than its size")?;
        out.extend_from_slice(chunk);
        body = body.get(size + 2..).ok_or("a chunk without its line break")?;
    }
}

/// `{"schema": "<schema JSON>"}` into a schema.
fn parse_answer(id: u32, body: &[u8]) -> Lookup {
    let text = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("schema").and_then(|s| s.as_str()).map(str::to_owned));
    let Some(text) = text else {
        return Lookup::Unknown(format!("the registry's answer for schema id {id} holds no `schema` string"));
    };
    match AvroSchema::parse_str(&text) {
        Ok(schema) => Lookup::Found(Arc::new(schema)),
        Err(error) => Lookup::Unknown(format!("schema id {id} is not an Avro schema this reader parses: {error}")),
    }
}

/// One value converted for its column (a string either owned or still in its datum).
#[derive(Debug)]
enum Cell<'d> {
    Null,
    I64(i64),
    I32(i32),
    I16(i16),
    I8(i8),
    Bool(bool),
    F64(f64),
    F32(f32),
    Text(String),
    Str(&'d str),
    I128(i128),
}

/// The Arrow builder of one column.
enum Builder {
    Long(Int64Builder),
    Int(Int32Builder),
    SmallInt(Int16Builder),
    TinyInt(Int8Builder),
    Boolean(BooleanBuilder),
    Double(Float64Builder),
    Float(Float32Builder),
    String(StringBuilder),
    TimestampMillis(TimestampMillisecondBuilder),
    TimestampMicros(TimestampMicrosecondBuilder),
    Decimal(Decimal128Builder, u8, i8),
    Date(Date32Builder),
}

impl Builder {
    fn new(kind: Kind, capacity: usize) -> Builder {
        match kind {
            Kind::Long => Builder::Long(Int64Builder::with_capacity(capacity)),
            Kind::Int => Builder::Int(Int32Builder::with_capacity(capacity)),
            Kind::SmallInt => Builder::SmallInt(Int16Builder::with_capacity(capacity)),
            Kind::TinyInt => Builder::TinyInt(Int8Builder::with_capacity(capacity)),
            Kind::Boolean => Builder::Boolean(BooleanBuilder::with_capacity(capacity)),
            Kind::Double => Builder::Double(Float64Builder::with_capacity(capacity)),
            Kind::Float => Builder::Float(Float32Builder::with_capacity(capacity)),
            Kind::String => Builder::String(StringBuilder::with_capacity(capacity, capacity * 16)),
            Kind::TimestampMillis => Builder::TimestampMillis(TimestampMillisecondBuilder::with_capacity(capacity)),
            Kind::TimestampMicros => Builder::TimestampMicros(TimestampMicrosecondBuilder::with_capacity(capacity)),
            Kind::Decimal { precision, scale } => {
                Builder::Decimal(Decimal128Builder::with_capacity(capacity), precision, scale)
            }
            Kind::Date => Builder::Date(Date32Builder::with_capacity(capacity)),
        }
    }

    /// Appends `cell`, which [`convert`] made for this column's kind.
    fn append(&mut self, cell: Cell<'_>) {
        match (self, cell) {
            (Builder::Long(b), Cell::I64(v)) => b.append_value(v),
            (Builder::Int(b), Cell::I32(v)) => b.append_value(v),
            (Builder::SmallInt(b), Cell::I16(v)) => b.append_value(v),
            (Builder::TinyInt(b), Cell::I8(v)) => b.append_value(v),
            (Builder::Boolean(b), Cell::Bool(v)) => b.append_value(v),
            (Builder::Double(b), Cell::F64(v)) => b.append_value(v),
            (Builder::Float(b), Cell::F32(v)) => b.append_value(v),
            (Builder::String(b), Cell::Text(v)) => b.append_value(v),
            (Builder::String(b), Cell::Str(v)) => b.append_value(v),
            (Builder::TimestampMillis(b), Cell::I64(v)) => b.append_value(v),
            (Builder::TimestampMicros(b), Cell::I64(v)) => b.append_value(v),
            (Builder::Decimal(b, _, _), Cell::I128(v)) => b.append_value(v),
            (Builder::Date(b), Cell::I32(v)) => b.append_value(v),
            (builder, Cell::Null) => builder.append_null(),
            (_, cell) => unreachable!("convert made {cell:?} for another column kind"),
        }
    }

    fn append_null(&mut self) {
        match self {
            Builder::Long(b) => b.append_null(),
            Builder::Int(b) => b.append_null(),
            Builder::SmallInt(b) => b.append_null(),
            Builder::TinyInt(b) => b.append_null(),
            Builder::Boolean(b) => b.append_null(),
            Builder::Double(b) => b.append_null(),
            Builder::Float(b) => b.append_null(),
            Builder::String(b) => b.append_null(),
            Builder::TimestampMillis(b) => b.append_null(),
            Builder::TimestampMicros(b) => b.append_null(),
            Builder::Decimal(b, _, _) => b.append_null(),
            Builder::Date(b) => b.append_null(),
        }
    }

    fn finish(&mut self) -> Result<ArrayRef, SluiceError> {
        Ok(match self {
            Builder::Long(b) => Arc::new(b.finish()),
            Builder::Int(b) => Arc::new(b.finish()),
            Builder::SmallInt(b) => Arc::new(b.finish()),
            Builder::TinyInt(b) => Arc::new(b.finish()),
            Builder::Boolean(b) => Arc::new(b.finish()),
            Builder::Double(b) => Arc::new(b.finish()),
            Builder::Float(b) => Arc::new(b.finish()),
            Builder::String(b) => Arc::new(b.finish()),
            Builder::TimestampMillis(b) => Arc::new(b.finish()),
            Builder::TimestampMicros(b) => Arc::new(b.finish()),
            Builder::Decimal(b, precision, scale) => Arc::new(
                b.finish()
                    .with_precision_and_scale(*precision, *scale)
                    .map_err(|e| SluiceError::internal("source.avro", format!("decimal column: {e}")))?,
            ),
            Builder::Date(b) => Arc::new(b.finish()),
        })
    }
}

/// The name of an Avro value's type, for reasons.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Boolean(_) => "boolean",
        Value::Int(_) => "int",
        Value::Long(_) => "long",
        Value::Float(_) => "float",
        Value::Double(_) => "double",
        Value::Bytes(_) => "bytes",
        Value::String(_) => "string",
        Value::Fixed(..) => "fixed",
        Value::Enum(..) => "enum",
        Value::Union(..) => "union",
        Value::Array(_) => "array",
        Value::Map(_) => "map",
        Value::Record(_) => "record",
        Value::Date(_) => "date",
        Value::Decimal(_) | Value::BigDecimal(_) => "decimal",
        Value::TimeMillis(_) => "time-millis",
        Value::TimeMicros(_) => "time-micros",
        Value::TimestampMillis(_) => "timestamp-millis",
        Value::TimestampMicros(_) => "timestamp-micros",
        Value::TimestampNanos(_) => "timestamp-nanos",
        Value::LocalTimestampMillis(_) => "local-timestamp-millis",
        Value::LocalTimestampMicros(_) => "local-timestamp-micros",
        Value::LocalTimestampNanos(_) => "local-timestamp-nanos",
        Value::Duration(_) => "duration",
        Value::Uuid(_) => "uuid",
    }
}

/// `value` for `column`, per the resolution rules of the module docs.
fn convert(value: Value, column: &Column, scale: Option<usize>) -> Result<Cell<'static>, String> {
    let value = match value {
        Value::Union(_, inner) => *inner,
        value => value,
    };
    let mismatch = |value: &Value| {
        format!(
            "field `{}` is {}, which column {} {} does not read",
            column.name,
            type_name(value),
            column.name,
            column.kind.sql()
        )
    };
    let range = |v: i32| format!("field `{}`: int {v} does not fit {}", column.name, column.kind.sql());
    Ok(match (column.kind, value) {
        (_, Value::Null) if column.nullable => Cell::Null,
        (_, Value::Null) => {
            return Err(format!("field `{}` is null, and column {} is NOT NULL", column.name, column.name));
        }
        (Kind::Long, Value::Long(v)) => Cell::I64(v),
        (Kind::Long, Value::Int(v)) => Cell::I64(i64::from(v)),
        (Kind::Int, Value::Int(v)) => Cell::I32(v),
        (Kind::SmallInt, Value::Int(v)) => Cell::I16(i16::try_from(v).map_err(|_| range(v))?),
        (Kind::TinyInt, Value::Int(v)) => Cell::I8(i8::try_from(v).map_err(|_| range(v))?),
        (Kind::Boolean, Value::Boolean(v)) => Cell::Bool(v),
        (Kind::Double, Value::Double(v)) => Cell::F64(v),
        (Kind::Double, Value::Float(v)) => Cell::F64(f64::from(v)),
        (Kind::Double, Value::Long(v)) => Cell::F64(v as f64),
        (Kind::Double, Value::Int(v)) => Cell::F64(f64::from(v)),
        (Kind::Float, Value::Float(v)) => Cell::F32(v),
        (Kind::Float, Value::Long(v)) => Cell::F32(v as f32),
        (Kind::Float, Value::Int(v)) => Cell::F32(v as f32),
        (Kind::String, Value::String(v)) => Cell::Text(v),
        (Kind::String, Value::Bytes(v)) => {
            Cell::Text(String::from_utf8(v).map_err(|_| format!("field `{}`: the bytes are not UTF-8", column.name))?)
        }
        (Kind::TimestampMillis, Value::TimestampMillis(v) | Value::LocalTimestampMillis(v) | Value::Long(v)) => {
            Cell::I64(v)
        }
        (Kind::TimestampMicros, Value::TimestampMicros(v) | Value::LocalTimestampMicros(v) | Value::Long(v)) => {
            Cell::I64(v)
        }
        (Kind::Date, Value::Date(v) | Value::Int(v)) => Cell::I32(v),
        (Kind::Decimal { precision, scale: column_scale }, Value::Decimal(decimal)) => {
            if scale != Some(column_scale as usize) {
                let found = scale.map(|s| s.to_string()).unwrap_or_else(|| "unknown".to_owned());
                return Err(format!(
                    "field `{}` is a decimal of scale {found}, column {} is {}",
                    column.name,
                    column.name,
                    column.kind.sql()
                ));
            }
            let bytes = <Vec<u8>>::try_from(&decimal).map_err(|e| format!("field `{}`: {e}", column.name))?;
            let unscaled = decimal_i128(&bytes)
                .filter(|v| v.unsigned_abs() < 10u128.pow(u32::from(precision)))
                .ok_or_else(|| format!("field `{}`: the decimal does not fit {}", column.name, column.kind.sql()))?;
            Cell::I128(unscaled)
        }
        (_, value) => return Err(mismatch(&value)),
    })
}

/// Big-endian two's complement bytes as an i128, if they fit.
fn decimal_i128(bytes: &[u8]) -> Option<i128> {
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    let fill = if negative { 0xFF } else { 0 };
    let (extra, tail) = bytes.split_at(bytes.len().saturating_sub(16));
    if extra.iter().any(|b| *b != fill) {
        return None;
    }
    let mut full = [fill; 16];
    full[16 - tail.len()..].copy_from_slice(tail);
    let value = i128::from_be_bytes(full);
    // A sign change between the dropped bytes and the kept ones is an overflow.
    (extra.is_empty() || (value < 0) == negative).then_some(value)
}

/// Whether `schema` refers to a record it is inside of (a type that nests without
/// bound); `path` holds the names of the records around it.
fn recursive<'s>(schema: &'s AvroSchema, path: &mut Vec<&'s apache_avro::schema::Name>) -> bool {
    match schema {
        AvroSchema::Ref { name } => path.contains(&name),
        AvroSchema::Record(record) => {
            path.push(&record.name);
            let found = record.fields.iter().any(|f| recursive(&f.schema, path));
            path.pop();
            found
        }
        AvroSchema::Array(array) => recursive(&array.items, path),
        AvroSchema::Map(map) => recursive(&map.types, path),
        AvroSchema::Union(union) => union.variants().iter().any(|v| recursive(v, path)),
        _ => false,
    }
}

/// The scale of a writer field's decimal schema (also inside a union).
fn decimal_scale(schema: &AvroSchema) -> Option<usize> {
    match schema {
        AvroSchema::Decimal(decimal) => Some(decimal.scale),
        AvroSchema::Union(union) => union.variants().iter().find_map(decimal_scale),
        _ => None,
    }
}

/// The bytes of one datum, noting whether the decoder asked for more than they hold:
/// the decoder reads some truncated values (a string, a union's branch) as `null`, so a
/// datum is whole only if no read went past its end.
struct Datum<'a> {
    rest: &'a [u8],
    past_end: bool,
}

impl Read for Datum<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        if buffer.len() > self.rest.len() {
            self.past_end = true;
        }
        let n = buffer.len().min(self.rest.len());
        buffer[..n].copy_from_slice(&self.rest[..n]);
        self.rest = &self.rest[n..];
        Ok(n)
    }
}

/// Whether message values carry the Confluent framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// The datum alone, written with the derived schema.
    Plain,
    /// Magic byte 0, the schema id, the datum written with that schema.
    Confluent,
}

/// The value columns of the good values, their indexes, and the bad ones with the
/// reason.
#[derive(Debug)]
pub struct Decoded {
    pub columns: Vec<ArrayRef>,
    /// The message of each row, in order (a Debezium update's twice).
    pub good: Vec<usize>,
    /// Debezium envelopes: each row's `RowKind` (empty otherwise).
    pub kinds: Vec<i8>,
    pub bad: Vec<(usize, String)>,
}

/// A value's writer plan and datum, or why it has none.
type Framed<'b> = Result<(Arc<WriterPlan>, &'b [u8]), String>;

/// Decodes Avro message values into the value columns' arrays.
pub struct AvroDecoder {
    columns: Vec<Column>,
    framing: Framing,
    /// Plain: the derived schema as the writer's.
    derived: Arc<WriterPlan>,
    registry: Option<Arc<Registry>>,
    /// Confluent: plans by schema id, or why the id names no usable schema.
    plans: HashMap<u32, Result<Arc<WriterPlan>, String>>,
    /// Tests: read every datum with the general decoder.
    general_only: bool,
    /// Values are Debezium envelopes (`debezium-avro-confluent`).
    envelope: bool,
}

impl AvroDecoder {
    /// A decoder for `value_schema`'s columns; refuses a column Avro cannot carry.
    pub fn new(value_schema: &Schema, framing: Framing) -> Result<AvroDecoder, SluiceError> {
        apache_avro::util::max_allocation_bytes(MAX_ALLOCATION_BYTES);
        let columns = columns_of(value_schema)?;
        let json = schema_json(&columns);
        let schema = AvroSchema::parse_str(&json).map_err(|e| {
            SluiceError::internal("source.avro", format!("the derived schema {json} does not parse: {e}"))
        })?;
        let derived = WriterPlan::new(schema, &columns, "the derived schema");
        Ok(AvroDecoder {
            columns,
            framing,
            derived: Arc::new(derived),
            registry: None,
            plans: HashMap::new(),
            general_only: false,
            envelope: false,
        })
    }

    /// A decoder of Debezium envelopes in the Confluent framing whose rows are
    /// `value_schema`'s columns (`debezium-avro-confluent`).
    pub fn debezium(value_schema: &Schema) -> Result<AvroDecoder, SluiceError> {
        let mut decoder = AvroDecoder::new(value_schema, Framing::Confluent)?;
        decoder.envelope = true;
        Ok(decoder)
    }

    /// Reads every datum with the general decoder (tests compare the two).
    #[cfg(test)]
    pub(crate) fn set_general_only(&mut self) {
        self.general_only = true;
    }

    /// The registry `avro-confluent` fetches writer schemas from.
    pub fn set_registry(&mut self, registry: Arc<Registry>) {
        self.registry = Some(registry);
    }

    /// Decodes `values` (by message index); returns the value columns of the good ones,
    /// their indexes, and the bad ones with the reason. Fails only when the registry
    /// does not answer.
    pub fn decode<'a>(
        &mut self,
        values: impl ExactSizeIterator<Item = (usize, &'a [u8])>,
    ) -> Result<Decoded, SluiceError> {
        let mut builders: Vec<Builder> = self.columns.iter().map(|c| Builder::new(c.kind, values.len())).collect();
        let mut good = Vec::with_capacity(values.len());
        let mut kinds = Vec::new();
        let mut bad = Vec::new();
        // First each value's writer schema (asking the registry for new ids), then the
        // datums, one datum reader per run of values of one writer schema.
        let mut framed = Vec::with_capacity(values.len());
        for (index, bytes) in values {
            match self.frame(bytes)? {
                Ok((plan, datum)) => framed.push((index, plan, datum)),
                Err(reason) => bad.push((index, reason)),
            }
        }
        let mut cells: Vec<Cell<'_>> = Vec::with_capacity(self.columns.len());
        let mut slots: Vec<Slot<'_>> = Vec::with_capacity(self.columns.len());
        let mut current: Option<(&WriterPlan, GenericDatumReader<'_>)> = None;
        for (index, plan, datum) in &framed {
            let plan: &WriterPlan = plan;
            if let Some(direct) = plan.direct.as_ref().filter(|_| !self.general_only) {
                cells.clear();
                match self.decode_direct(plan, direct, datum, &mut slots, &mut cells) {
                    Ok(()) => {
                        for (builder, cell) in builders.iter_mut().zip(cells.drain(..)) {
                            builder.append(cell);
                        }
                        good.push(*index);
                    }
                    Err(reason) => bad.push((*index, reason)),
                }
                continue;
            }
            if !current.as_ref().is_some_and(|(p, _)| std::ptr::eq(*p, plan)) {
                match GenericDatumReader::builder(&plan.schema).build() {
                    Ok(reader) => current = Some((plan, reader)),
                    Err(error) => {
                        current = None;
                        bad.push((*index, format!("{}: {error}", plan.what)));
                        continue;
                    }
                }
            }
            let (_, reader) = current.as_ref().expect("set above");
            if let Some(envelope) = &plan.envelope {
                match self.decode_envelope(plan, envelope, reader, datum) {
                    Ok(rows) => {
                        for (kind, row) in rows {
                            for (builder, cell) in builders.iter_mut().zip(row) {
                                builder.append(cell);
                            }
                            good.push(*index);
                            kinds.push(kind as i8);
                        }
                    }
                    Err(reason) => bad.push((*index, reason)),
                }
                continue;
            }
            cells.clear();
            match self.decode_one(plan, reader, datum, &mut cells) {
                Ok(()) => {
                    for (builder, cell) in builders.iter_mut().zip(cells.drain(..)) {
                        builder.append(cell);
                    }
                    good.push(*index);
                }
                Err(reason) => bad.push((*index, reason)),
            }
        }
        let columns = builders.iter_mut().map(Builder::finish).collect::<Result<Vec<_>, _>>()?;
        Ok(Decoded { columns, good, kinds, bad })
    }

    /// The writer plan and the datum of one value, or why it has none.
    fn frame<'b>(&mut self, bytes: &'b [u8]) -> Result<Framed<'b>, SluiceError> {
        if self.framing == Framing::Plain {
            return Ok(Ok((Arc::clone(&self.derived), bytes)));
        }
        if bytes.len() < CONFLUENT_HEADER {
            return Ok(Err(format!(
                "the value has {} bytes, fewer than the Confluent header's 5 (magic byte 0, schema id)",
                bytes.len()
            )));
        }
        if bytes[0] != 0 {
            return Ok(Err(format!("the value starts with byte {}, not the Confluent magic byte 0", bytes[0])));
        }
        let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        Ok(self.plan(id)?.map(|plan| (plan, &bytes[CONFLUENT_HEADER..])))
    }

    /// One datum of a flat writer record into `cells`, read by the direct decoder.
    fn decode_direct<'d>(
        &self,
        plan: &WriterPlan,
        direct: &Direct,
        datum: &'d [u8],
        slots: &mut Vec<Slot<'d>>,
        cells: &mut Vec<Cell<'d>>,
    ) -> Result<(), String> {
        let what = &plan.what;
        if let Some(unusable) = &plan.unusable {
            return Err(unusable.clone());
        }
        slots.clear();
        slots.resize_with(self.columns.len(), || Slot::Value(Value::Null));
        direct.read(datum, slots).map_err(|failure| match failure {
            Failure::Truncated => format!("the datum of {what} is truncated"),
            Failure::Trailing(left) => format!("{left} bytes after the datum of {what}"),
            Failure::Bad(reason) => format!("not a datum of {what}: {reason}"),
        })?;
        for (c, column) in self.columns.iter().enumerate() {
            let value = match std::mem::replace(&mut slots[c], Slot::Value(Value::Null)) {
                Slot::Text(text) if column.kind == Kind::String => {
                    cells.push(Cell::Str(text));
                    continue;
                }
                Slot::Text(text) => Value::String(text.to_owned()),
                Slot::Value(value) => value,
            };
            let cell = convert(value, column, plan.scales[c]).map_err(|reason| format!("{reason} ({what})"))?;
            cells.push(cell);
        }
        Ok(())
    }

    /// One Debezium envelope's rows, or why it makes none.
    fn decode_envelope(
        &self,
        plan: &WriterPlan,
        envelope: &debezium::EnvelopePlan,
        reader: &GenericDatumReader<'_>,
        datum: &[u8],
    ) -> Result<Vec<(sluice_types::RowKind, Vec<Cell<'static>>)>, String> {
        let what = &plan.what;
        if let Some(unusable) = &plan.unusable {
            return Err(unusable.clone());
        }
        let mut input = Datum { rest: datum, past_end: false };
        let value = reader.read_value(&mut input);
        if input.past_end {
            return Err(format!("the datum of {what} is truncated"));
        }
        let value = value.map_err(|error| format!("not a datum of {what}: {error}"))?;
        if !input.rest.is_empty() {
            return Err(format!("{} bytes after the datum of {what}", input.rest.len()));
        }
        envelope.rows(value, &self.columns, what)
    }

    /// One datum into `cells`, or why it makes no row.
    fn decode_one(
        &self,
        plan: &WriterPlan,
        reader: &GenericDatumReader<'_>,
        datum: &[u8],
        cells: &mut Vec<Cell<'_>>,
    ) -> Result<(), String> {
        let what = &plan.what;
        if let Some(unusable) = &plan.unusable {
            return Err(unusable.clone());
        }
        let mut input = Datum { rest: datum, past_end: false };
        let value = reader.read_value(&mut input);
        if input.past_end {
            return Err(format!("the datum of {what} is truncated"));
        }
        let value = value.map_err(|error| format!("not a datum of {what}: {error}"))?;
        if !input.rest.is_empty() {
            return Err(format!("{} bytes after the datum of {what}", input.rest.len()));
        }
        let Value::Record(mut fields) = value else {
            return Err(format!("the datum of {what} is not a record"));
        };
        for (c, column) in self.columns.iter().enumerate() {
            let value = match plan.fields[c] {
                Some(at) => fields.get_mut(at).map(|(_, v)| std::mem::replace(v, Value::Null)).unwrap_or(Value::Null),
                None => Value::Null,
            };
            let cell = convert(value, column, plan.scales[c]).map_err(|reason| format!("{reason} ({what})"))?;
            cells.push(cell);
        }
        Ok(())
    }

    /// The plan of writer schema `id`, fetched once.
    fn plan(&mut self, id: u32) -> Result<Result<Arc<WriterPlan>, String>, SluiceError> {
        if let Some(plan) = self.plans.get(&id) {
            return Ok(plan.clone());
        }
        let registry = self
            .registry
            .as_ref()
            .ok_or_else(|| SluiceError::internal("source.avro", "avro-confluent decoding without a registry"))?;
        let plan = match registry.schema(id)? {
            Lookup::Found(schema) => {
                let what = format!("schema id {id}");
                let schema = AvroSchema::clone(&schema);
                let plan = match self.envelope {
                    true => WriterPlan::envelope(schema, &self.columns, &what),
                    false => WriterPlan::new(schema, &self.columns, &what),
                };
                Ok(Arc::new(plan))
            }
            Lookup::Unknown(reason) => Err(reason),
        };
        if self.plans.len() >= SCHEMA_CACHE_MAX {
            self.plans.clear();
        }
        self.plans.insert(id, plan.clone());
        Ok(plan)
    }
}
