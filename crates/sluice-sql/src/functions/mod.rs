//! Flink SQL functions that DataFusion lacks under Flink's name, or types differently.
//!
//! - `MOD(a, b)`: the remainder of `a / b`, with the sign of `a` (Flink's and Java's `%`).
//! - `AVG(x)` (and `MEAN`) with Flink's result type: an integer argument gives its own
//!   type (`AVG` of `BIGINT` is `BIGINT`, the quotient truncated toward zero), a float
//!   `DOUBLE`, a decimal DataFusion's decimal. Sluice's aggregate operators compute it;
//!   DataFusion only plans it.
//! - Scalar functions NEXMark and Flink users call ([`scalar`]): `DATE_FORMAT(ts,
//!   pattern)` with Java `SimpleDateFormat` patterns ([`date_format`]; an unsupported
//!   letter is refused at planning), `SPLIT_INDEX(s, separator, index)`,
//!   `REGEXP_EXTRACT(s, regex[, group])` (Rust's `regex` syntax: no look-around or
//!   back-references), `IF(condition, then, else)`, `CONCAT` with Flink's NULL rule (NULL if
//!   any argument is), and `YEAR`, `MONTH`, `DAYOFMONTH`, `HOUR`, `MINUTE`, `SECOND` of a
//!   timestamp as BIGINT, and `EXTRACT(field FROM ts)` as BIGINT too ([`extract`];
//!   DataFusion's gives INT). DataFusion's own `LOWER`, `UPPER`, `CHAR_LENGTH` (INT),
//!   `INSTR` (INT, 0 when absent) and `CASE` already match Flink's meaning.
//! - `ROW_NUMBER()`, the one window function (for TopN: `ROW_NUMBER() OVER (PARTITION
//!   BY … ORDER BY …)` filtered by `<= N`), of type `BIGINT UNSIGNED`; Sluice's TopN
//!   operator computes it, DataFusion only plans it.

mod date_format;
mod extract;
mod scalar;
#[cfg(test)]
mod tests;

use std::sync::Arc;

pub(crate) use extract::FlinkExtractPlanner;

use arrow::compute::kernels::numeric::rem;
use arrow::datatypes::DataType;
use arrow::datatypes::{Field, FieldRef};
use datafusion_common::{Result, plan_err};
use datafusion_expr::function::{AccumulatorArgs, PartitionEvaluatorArgs, WindowUDFFieldArgs};
use datafusion_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Coercion, ColumnarValue, PartitionEvaluator, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, TypeSignatureClass, Volatility, WindowUDF, WindowUDFImpl,
};

/// `MOD(a, b)` over integers or floats.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Mod {
    signature: Signature,
}

impl ScalarUDFImpl for Mod {
    fn name(&self) -> &str {
        "mod"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(arg_types[0].clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        Ok(ColumnarValue::Array(rem(&arrays[0], &arrays[1])?))
    }
}

/// The functions this module adds, to register beside DataFusion's.
pub fn flink_functions() -> Vec<Arc<ScalarUDF>> {
    let signature = Signature::uniform(2, vec![DataType::Int64, DataType::Float64], Volatility::Immutable);
    let mut functions = vec![Arc::new(ScalarUDF::from(Mod { signature }))];
    functions.extend(scalar::all());
    functions.push(Arc::new(ScalarUDF::from(extract::FlinkDatePart::new())));
    functions
}

/// `AVG(x)` typed as Flink types it (see the module documentation).
#[derive(Debug, PartialEq, Eq, Hash)]
struct FlinkAvg {
    signature: Signature,
    aliases: Vec<String>,
}

impl AggregateUDFImpl for FlinkAvg {
    fn name(&self) -> &str {
        "avg"
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match &arg_types[0] {
            integer if integer.is_integer() => Ok(integer.clone()),
            DataType::Float16 | DataType::Float32 | DataType::Float64 => Ok(DataType::Float64),
            other => datafusion_functions_aggregate::average::avg_udaf().return_type(std::slice::from_ref(other)),
        }
    }

    fn accumulator(&self, _args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        plan_err!("AVG is computed by Sluice's aggregate operators, not by DataFusion")
    }
}

/// The aggregate functions this module adds, to register over DataFusion's.
pub fn flink_aggregates() -> Vec<Arc<AggregateUDF>> {
    let exact = |class| TypeSignature::Coercible(vec![Coercion::new_exact(class)]);
    let signature = Signature::one_of(
        vec![exact(TypeSignatureClass::Integer), exact(TypeSignatureClass::Float), exact(TypeSignatureClass::Decimal)],
        Volatility::Immutable,
    );
    vec![Arc::new(AggregateUDF::from(FlinkAvg { signature, aliases: vec!["mean".to_string()] }))]
}

/// `ROW_NUMBER()`, planned only (see the module documentation).
#[derive(Debug, PartialEq, Eq, Hash)]
struct RowNumber {
    signature: Signature,
}

impl WindowUDFImpl for RowNumber {
    fn name(&self) -> &str {
        "row_number"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn partition_evaluator(&self, _args: PartitionEvaluatorArgs) -> Result<Box<dyn PartitionEvaluator>> {
        plan_err!("ROW_NUMBER is computed by Sluice's TopN operator, not by DataFusion")
    }

    fn field(&self, field_args: WindowUDFFieldArgs) -> Result<FieldRef> {
        Ok(Arc::new(Field::new(field_args.name(), DataType::UInt64, false)))
    }
}

/// The window functions a query may name.
pub fn flink_window_functions() -> Vec<Arc<WindowUDF>> {
    let signature = Signature::nullary(Volatility::Immutable);
    vec![Arc::new(WindowUDF::from(RowNumber { signature }))]
}
