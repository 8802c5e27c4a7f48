//! Flink SQL functions that DataFusion lacks under Flink's name.
//!
//! - `MOD(a, b)`: the remainder of `a / b`, with the sign of `a` (Flink's and Java's `%`).

use std::sync::Arc;

use arrow::compute::kernels::numeric::rem;
use arrow::datatypes::DataType;
use datafusion_common::Result;
use datafusion_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

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
    vec![Arc::new(ScalarUDF::from(Mod { signature }))]
}
