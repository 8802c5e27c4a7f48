//! Flink's scalar functions that DataFusion lacks, or has under the same name with
//! another meaning; each with Flink's result type and NULL rule (see the parent module).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, StringArray, StringBuilder};
use arrow::compute::kernels::zip::zip;
use arrow::compute::{cast, prep_null_mask_filter};
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type, TimeUnit, TimestampMillisecondType};
use chrono::{DateTime, Datelike, NaiveDateTime, Timelike};
use datafusion_common::{Result, ScalarValue, exec_err, plan_err};
use datafusion_expr::type_coercion::binary::type_union_resolution;
use datafusion_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use super::date_format::{self, Piece};

const TIMESTAMP: DataType = DataType::Timestamp(TimeUnit::Millisecond, None);

/// The arguments as arrays of the row count (scalars repeated).
fn arrays(args: &ScalarFunctionArgs) -> Result<Vec<ArrayRef>> {
    args.args.iter().map(|value| value.to_array(args.number_rows)).collect()
}

/// The `index`-th argument's literal text, when it is one.
fn literal_text<'a>(args: &ReturnFieldArgs<'a>, index: usize) -> Option<&'a str> {
    match args.scalar_arguments.get(index).copied().flatten() {
        Some(
            ScalarValue::Utf8(Some(text)) | ScalarValue::LargeUtf8(Some(text)) | ScalarValue::Utf8View(Some(text)),
        ) => Some(text.as_str()),
        _ => None,
    }
}

fn text_field(name: &str) -> FieldRef {
    Arc::new(Field::new(name, DataType::Utf8, true))
}

/// `DATE_FORMAT(timestamp, pattern)`: STRING.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct DateFormat {
    pub signature: Signature,
}

impl ScalarUDFImpl for DateFormat {
    fn name(&self) -> &str {
        "date_format"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [_, _] => Ok(vec![TIMESTAMP, DataType::Utf8]),
            _ => plan_err!("DATE_FORMAT takes a timestamp and a pattern, e.g. DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm')"),
        }
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        if let Some(pattern) = literal_text(&args, 1)
            && let Err(message) = date_format::compile(pattern)
        {
            return plan_err!("DATE_FORMAT: {message}");
        }
        Ok(text_field(self.name()))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = arrays(&args)?;
        let times = cast(&arrays[0], &TIMESTAMP)?;
        let times = times.as_primitive::<TimestampMillisecondType>();
        let patterns = arrays[1].as_string::<i32>();
        // The pattern, its pieces and their granularity.
        let mut compiled: Option<(String, Vec<Piece>, i64)> = None;
        // `text` is the formatted time of this span (the time divided by the granularity).
        let mut text = String::new();
        let mut span: Option<i64> = None;
        let mut out = StringBuilder::with_capacity(times.len(), times.len() * 16);
        for row in 0..times.len() {
            if times.is_null(row) || patterns.is_null(row) {
                out.append_null();
                continue;
            }
            let pattern = patterns.value(row);
            if compiled.as_ref().is_none_or(|(seen, _, _)| seen != pattern) {
                match date_format::compile(pattern) {
                    Ok(pieces) => {
                        let granularity = date_format::granularity_ms(&pieces);
                        compiled = Some((pattern.to_string(), pieces, granularity));
                        span = None;
                    }
                    Err(message) => return exec_err!("DATE_FORMAT: {message}"),
                }
            }
            let (_, pieces, granularity) = compiled.as_ref().expect("compiled above");
            let ms = times.value(row);
            if span != Some(ms.div_euclid(*granularity)) {
                let Some(time) = naive(ms) else {
                    return exec_err!("DATE_FORMAT: the timestamp {ms} ms is outside the supported range");
                };
                text.clear();
                date_format::format(pieces, &time, &mut text);
                span = Some(ms.div_euclid(*granularity));
            }
            out.append_value(&text);
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}

fn naive(ms: i64) -> Option<NaiveDateTime> {
    DateTime::from_timestamp_millis(ms).map(|time| time.naive_utc())
}

/// `SPLIT_INDEX(text, separator, index)`: the `index`-th (from 0) piece of `text` split at
/// every `separator` (empty pieces kept); NULL if any argument is NULL, the index is
/// negative or past the last piece, or the text is empty. An empty separator splits at
/// each whitespace character.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct SplitIndex {
    pub signature: Signature,
}

pub(crate) fn split_index<'a>(text: &'a str, separator: &str, index: i64) -> Option<&'a str> {
    let index = usize::try_from(index).ok()?;
    if text.is_empty() {
        return None;
    }
    if separator.is_empty() { text.split(char::is_whitespace).nth(index) } else { text.split(separator).nth(index) }
}

impl ScalarUDFImpl for SplitIndex {
    fn name(&self) -> &str {
        "split_index"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [_, _, _] => Ok(vec![DataType::Utf8, DataType::Utf8, DataType::Int64]),
            _ => plan_err!("SPLIT_INDEX takes a string, a separator and an index, e.g. SPLIT_INDEX(s, ',', 0)"),
        }
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = arrays(&args)?;
        let (texts, separators) = (arrays[0].as_string::<i32>(), arrays[1].as_string::<i32>());
        let indexes = arrays[2].as_primitive::<Int64Type>();
        let out: StringArray = (0..texts.len())
            .map(|row| {
                if texts.is_null(row) || separators.is_null(row) || indexes.is_null(row) {
                    return None;
                }
                split_index(texts.value(row), separators.value(row), indexes.value(row))
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// `REGEXP_EXTRACT(text, regex[, group])`: the text of capture group `group` (0: the whole
/// match; the default) in the first match; NULL if any argument is NULL, nothing matches,
/// the group does not exist or took no part in the match.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct RegexpExtract {
    pub signature: Signature,
}

impl ScalarUDFImpl for RegexpExtract {
    fn name(&self) -> &str {
        "regexp_extract"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types.len() {
            2 => Ok(vec![DataType::Utf8, DataType::Utf8]),
            3 => Ok(vec![DataType::Utf8, DataType::Utf8, DataType::Int64]),
            _ => plan_err!("REGEXP_EXTRACT takes a string, a regular expression and optionally a group number"),
        }
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        if let Some(pattern) = literal_text(&args, 1)
            && let Err(error) = regex::Regex::new(pattern)
        {
            return plan_err!("REGEXP_EXTRACT: the regular expression '{pattern}' is invalid: {error}");
        }
        Ok(text_field(self.name()))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = arrays(&args)?;
        let (texts, patterns) = (arrays[0].as_string::<i32>(), arrays[1].as_string::<i32>());
        let groups = arrays.get(2).map(|array| array.as_primitive::<Int64Type>());
        let mut compiled: Option<(String, Option<regex::Regex>)> = None;
        let mut out = Vec::with_capacity(texts.len());
        for row in 0..texts.len() {
            let group = groups.map_or(Some(0), |groups| groups.is_valid(row).then(|| groups.value(row)));
            let (Some(group), true, true) = (group, texts.is_valid(row), patterns.is_valid(row)) else {
                out.push(None);
                continue;
            };
            let pattern = patterns.value(row);
            if compiled.as_ref().is_none_or(|(seen, _)| seen != pattern) {
                // An invalid expression gives NULL at run time, as in Flink.
                compiled = Some((pattern.to_string(), regex::Regex::new(pattern).ok()));
            }
            let regex = compiled.as_ref().and_then(|(_, regex)| regex.as_ref());
            let extracted = regex.and_then(|regex| regex_group(regex, texts.value(row), group));
            out.push(extracted.map(str::to_string));
        }
        Ok(ColumnarValue::Array(Arc::new(StringArray::from(out))))
    }
}

pub(crate) fn regex_group<'a>(regex: &regex::Regex, text: &'a str, group: i64) -> Option<&'a str> {
    let group = usize::try_from(group).ok()?;
    regex.captures(text)?.get(group).map(|found| found.as_str())
}

/// `IF(condition, then, else)`: `then` where the condition is true, `else` where it is
/// false or NULL; typed as the two branches' common type.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct If {
    pub signature: Signature,
}

impl ScalarUDFImpl for If {
    fn name(&self) -> &str {
        "if"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let [_, then, otherwise] = arg_types else {
            return plan_err!("IF takes a condition and two values: IF(condition, then, else)");
        };
        let Some(common) = type_union_resolution(&[then.clone(), otherwise.clone()]) else {
            return plan_err!("IF: the branches' types {then} and {otherwise} have no common type");
        };
        Ok(vec![DataType::Boolean, common.clone(), common])
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(arg_types[1].clone())
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = arrays(&args)?;
        let condition: &BooleanArray = arrays[0].as_boolean();
        let mask = if condition.null_count() > 0 { prep_null_mask_filter(condition) } else { condition.clone() };
        Ok(ColumnarValue::Array(zip(&mask, &arrays[1], &arrays[2])?))
    }
}

/// `CONCAT(a, b, …)`: the strings joined; NULL if any of them is NULL (Flink's rule;
/// DataFusion's `concat` skips NULLs instead).
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct Concat {
    pub signature: Signature,
}

impl ScalarUDFImpl for Concat {
    fn name(&self) -> &str {
        "concat"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        Ok(vec![DataType::Utf8; arg_types.len()])
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = arrays(&args)?;
        let strings: Vec<&StringArray> = arrays.iter().map(|array| array.as_string::<i32>()).collect();
        let mut text = String::new();
        let out: StringArray = (0..args.number_rows)
            .map(|row| {
                text.clear();
                for column in &strings {
                    if column.is_null(row) {
                        return None;
                    }
                    text.push_str(column.value(row));
                }
                Some(text.clone())
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// `YEAR`, `MONTH`, `DAYOFMONTH`, `HOUR`, `MINUTE`, `SECOND` of a timestamp: BIGINT, as
/// Flink's (each the same as `EXTRACT(field FROM ts)` in Flink).
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct TimeField {
    pub name: &'static str,
    pub signature: Signature,
}

impl TimeField {
    pub(crate) fn of(&self, time: &NaiveDateTime) -> i64 {
        i64::from(match self.name {
            "year" => return i64::from(time.year()),
            "month" => time.month(),
            "dayofmonth" => time.day(),
            "hour" => time.hour(),
            "minute" => time.minute(),
            "second" => time.second(),
            other => unreachable!("no time field {other}"),
        })
    }
}

impl ScalarUDFImpl for TimeField {
    fn name(&self) -> &str {
        self.name
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [_] => Ok(vec![TIMESTAMP]),
            _ => plan_err!("{}(ts) takes one timestamp", self.name.to_uppercase()),
        }
    }
    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = arrays(&args)?;
        let times = cast(&arrays[0], &TIMESTAMP)?;
        let times = times.as_primitive::<TimestampMillisecondType>();
        let mut out = Vec::with_capacity(times.len());
        for row in 0..times.len() {
            if times.is_null(row) {
                out.push(None);
                continue;
            }
            let Some(time) = naive(times.value(row)) else {
                return exec_err!(
                    "{}: the timestamp {} ms is outside the supported range",
                    self.name,
                    times.value(row)
                );
            };
            out.push(Some(self.of(&time)));
        }
        Ok(ColumnarValue::Array(Arc::new(Int64Array::from(out))))
    }
}

/// The functions of this module, to register over DataFusion's.
pub(super) fn all() -> Vec<Arc<ScalarUDF>> {
    let user = || Signature::user_defined(Volatility::Immutable);
    let mut functions = vec![
        Arc::new(ScalarUDF::from(DateFormat { signature: user() })),
        Arc::new(ScalarUDF::from(SplitIndex { signature: user() })),
        Arc::new(ScalarUDF::from(RegexpExtract { signature: user() })),
        Arc::new(ScalarUDF::from(If { signature: user() })),
        Arc::new(ScalarUDF::from(Concat { signature: user() })),
    ];
    for name in ["year", "month", "dayofmonth", "hour", "minute", "second"] {
        functions.push(Arc::new(ScalarUDF::from(TimeField { name, signature: user() })));
    }
    functions
}
