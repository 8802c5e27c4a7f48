//! The tables a query can name, as DataFusion's SQL planner sees them.
//!
//! Three kinds: a source's table, a view (planned earlier, in file order) and the
//! synthetic table of a window call (see [`crate::tvf`]). Functions are DataFusion's
//! default scalar and aggregate functions, and Flink's where they differ
//! ([`crate::functions`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_common::config::ConfigOptions;
use datafusion_common::{Result as DfResult, TableReference, plan_err};
use datafusion_expr::logical_plan::builder::LogicalTableSource;
use datafusion_expr::planner::{ContextProvider, ExprPlanner};
use datafusion_expr::{AggregateUDF, HigherOrderUDF, LogicalPlan, ScalarUDF, TableSource, WindowUDF};
use sluice_operators::row_errors::OnRowError;
use sluice_operators::window::WindowKind;

/// What a table name refers to.
#[derive(Clone)]
pub enum TableEntry {
    /// `on_error`: the source's policy for rows on which an expression fails;
    /// `changelog`: set for a changelog table (its rows carry row kinds, normalized by
    /// the primary key before anything reads them).
    Source {
        source: usize,
        table: usize,
        schema: SchemaRef,
        event_time: Option<String>,
        on_error: OnRowError,
        changelog: Option<sluice_runtime::SourceChangelog>,
    },
    View {
        plan: Arc<LogicalPlan>,
        schema: SchemaRef,
    },
    Window {
        input: String,
        time_column: String,
        kind: WindowKind,
        /// A SESSION's `PARTITION BY` columns.
        partition: Vec<String>,
        schema: SchemaRef,
    },
}

impl TableEntry {
    pub fn schema(&self) -> SchemaRef {
        match self {
            TableEntry::Source { schema, .. } | TableEntry::View { schema, .. } | TableEntry::Window { schema, .. } => {
                Arc::clone(schema)
            }
        }
    }
}

/// The catalog plus DataFusion's function registry.
pub struct Catalog {
    pub tables: BTreeMap<String, TableEntry>,
    options: ConfigOptions,
    scalars: BTreeMap<String, Arc<ScalarUDF>>,
    aggregates: BTreeMap<String, Arc<AggregateUDF>>,
    windows: BTreeMap<String, Arc<WindowUDF>>,
    planners: Vec<Arc<dyn ExprPlanner>>,
}

impl Catalog {
    pub fn new() -> Catalog {
        let mut options = ConfigOptions::new();
        options.sql_parser.enable_ident_normalization = false;
        options.sql_parser.parse_float_as_decimal = true;
        let mut scalars = BTreeMap::new();
        for function in
            datafusion_functions::all_default_functions().into_iter().chain(crate::functions::flink_functions())
        {
            for alias in function.aliases() {
                scalars.insert(alias.to_ascii_lowercase(), Arc::clone(&function));
            }
            scalars.insert(function.name().to_ascii_lowercase(), function);
        }
        let mut aggregates = BTreeMap::new();
        let functions = datafusion_functions_aggregate::all_default_aggregate_functions();
        for function in functions.into_iter().chain(crate::functions::flink_aggregates()) {
            for alias in function.aliases() {
                aggregates.insert(alias.to_ascii_lowercase(), Arc::clone(&function));
            }
            aggregates.insert(function.name().to_ascii_lowercase(), function);
        }
        let planners: Vec<Arc<dyn ExprPlanner>> = vec![
            Arc::new(datafusion_functions::core::planner::CoreFunctionPlanner::default()),
            Arc::new(crate::functions::FlinkExtractPlanner::default()),
            Arc::new(datafusion_functions::unicode::planner::UnicodeFunctionPlanner),
            Arc::new(datafusion_functions_aggregate::planner::AggregateFunctionPlanner),
        ];
        let windows =
            crate::functions::flink_window_functions().into_iter().map(|f| (f.name().to_string(), f)).collect();
        Catalog { tables: BTreeMap::new(), options, scalars, aggregates, windows, planners }
    }

    pub fn options(&self) -> &ConfigOptions {
        &self.options
    }

    /// The names a query may use, for "unknown table" messages (synthetic ones hidden).
    pub fn table_names(&self) -> Vec<&str> {
        self.tables.keys().filter(|name| !name.starts_with("__window_")).map(String::as_str).collect()
    }

    /// The schema of the window call's synthetic table: the input's plus the window columns.
    pub fn window_schema(input: &Schema) -> SchemaRef {
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.extend(WindowKind::output_fields());
        Arc::new(Schema::new(fields))
    }
}

impl Default for Catalog {
    fn default() -> Catalog {
        Catalog::new()
    }
}

impl ContextProvider for Catalog {
    fn get_table_source(&self, name: TableReference) -> DfResult<Arc<dyn TableSource>> {
        let table = name.table();
        match self.tables.get(table) {
            Some(entry) => Ok(Arc::new(LogicalTableSource::new(entry.schema()))),
            None => plan_err!("table `{table}` does not exist; the tables are: {}", self.table_names().join(", ")),
        }
    }

    fn get_expr_planners(&self) -> &[Arc<dyn ExprPlanner>] {
        &self.planners
    }

    fn get_function_meta(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        self.scalars.get(&name.to_ascii_lowercase()).cloned()
    }

    fn get_higher_order_meta(&self, _name: &str) -> Option<Arc<HigherOrderUDF>> {
        None
    }

    fn get_aggregate_meta(&self, name: &str) -> Option<Arc<AggregateUDF>> {
        self.aggregates.get(&name.to_ascii_lowercase()).cloned()
    }

    fn get_window_meta(&self, name: &str) -> Option<Arc<WindowUDF>> {
        self.windows.get(&name.to_ascii_lowercase()).cloned()
    }

    fn get_variable_type(&self, _variable_names: &[String]) -> Option<DataType> {
        None
    }

    fn options(&self) -> &ConfigOptions {
        &self.options
    }

    fn udf_names(&self) -> Vec<String> {
        self.scalars.keys().cloned().collect()
    }

    fn higher_order_function_names(&self) -> Vec<String> {
        Vec::new()
    }

    fn udaf_names(&self) -> Vec<String> {
        self.aggregates.keys().cloned().collect()
    }

    fn udwf_names(&self) -> Vec<String> {
        self.windows.keys().cloned().collect()
    }
}
