//! `EXTRACT(field FROM ts)` (and `DATE_PART`) typed as Flink types it: `BIGINT` where
//! DataFusion's `date_part` gives `INT`. The values are DataFusion's; only the type widens.

use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion_common::{Result, ScalarValue};
use datafusion_expr::expr::ScalarFunction;
use datafusion_expr::planner::{ExprPlanner, PlannerResult};
use datafusion_expr::{ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature};

/// DataFusion's `date_part`, its `INT` results widened to `BIGINT`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct FlinkDatePart {
    inner: Arc<ScalarUDF>,
}

impl FlinkDatePart {
    pub(super) fn new() -> FlinkDatePart {
        FlinkDatePart { inner: datafusion_functions::datetime::date_part() }
    }

    /// DataFusion's return field for `args`.
    fn inner_field(&self, arg_fields: &[FieldRef], scalars: &[Option<&ScalarValue>]) -> Result<FieldRef> {
        self.inner.return_field_from_args(ReturnFieldArgs { arg_fields, scalar_arguments: scalars })
    }
}

fn widened(field: &FieldRef) -> FieldRef {
    match field.data_type() {
        DataType::Int32 => Arc::new(field.as_ref().clone().with_data_type(DataType::Int64)),
        _ => Arc::clone(field),
    }
}

impl ScalarUDFImpl for FlinkDatePart {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }
    fn signature(&self) -> &Signature {
        self.inner.signature()
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }
    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        let inner = self.inner.return_type(arg_types)?;
        Ok(if inner == DataType::Int32 { DataType::Int64 } else { inner })
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        Ok(widened(&self.inner_field(args.arg_fields, args.scalar_arguments)?))
    }
    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalars: Vec<Option<&ScalarValue>> = args
            .args
            .iter()
            .map(|value| match value {
                ColumnarValue::Scalar(scalar) => Some(scalar),
                ColumnarValue::Array(_) => None,
            })
            .collect();
        let inner_field = self.inner_field(&args.arg_fields, &scalars)?;
        let target = args.return_field.data_type().clone();
        args.return_field = inner_field;
        let value = self.inner.invoke_with_args(args)?;
        if value.data_type() == target { Ok(value) } else { value.cast_to(&target, None) }
    }
}

/// Plans `EXTRACT(field FROM ts)` onto [`FlinkDatePart`] (DataFusion's own planner calls
/// its `date_part` directly, whatever the registry holds).
#[derive(Debug)]
pub(crate) struct FlinkExtractPlanner {
    date_part: Arc<ScalarUDF>,
}

impl Default for FlinkExtractPlanner {
    fn default() -> FlinkExtractPlanner {
        FlinkExtractPlanner { date_part: Arc::new(ScalarUDF::from(FlinkDatePart::new())) }
    }
}

impl ExprPlanner for FlinkExtractPlanner {
    fn plan_extract(&self, args: Vec<Expr>) -> Result<PlannerResult<Vec<Expr>>> {
        Ok(PlannerResult::Planned(Expr::ScalarFunction(ScalarFunction::new_udf(Arc::clone(&self.date_part), args))))
    }
}
