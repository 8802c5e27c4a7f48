//! `UNION ALL`: every input planned as a stream of its own, each routed to the thread it
//! is on (a forward exchange: no row moves between threads), into one segment whose first
//! operator passes the rows of every input port on (`sluice_operators::union`). The first
//! input is the flow's trunk; the others are side inputs.
//!
//! The inputs have the union's column types (DataFusion's analyzer casts them). A column keeps an
//! event-time (or window bound) meaning only if it has it in every input: the merged
//! watermark is the lowest of the inputs', so no input's rows are late by it. The union
//! of append-only streams is append-only; with an updating input it is updating (no
//! upsert key: two inputs may hold the same key).
//!
//! Refused by name: `UNION` (distinct), and a union whose inputs after the first join
//! tables (they would need sides of their own).

use std::sync::Arc;

use datafusion_common::DFSchemaRef;
use datafusion_expr::LogicalPlan;
use datafusion_expr::logical_plan::Union as UnionPlan;
use sluice_operators::partition::GatherPartitioner;
use sluice_operators::union::Union;
use sluice_runtime::{OperatorFactory, PartitionerFactory, SegmentOutput, SideInput};
use sluice_types::{Changelog, SluiceError};

use crate::stream::{StreamPlanner, StreamState, Tag, unaggregated_session, unsupported};

pub(crate) fn plan_union(planner: &StreamPlanner<'_>, union: &UnionPlan) -> Result<StreamState, SluiceError> {
    let schema: DFSchemaRef = Arc::clone(&union.schema);
    let mut inputs = Vec::with_capacity(union.inputs.len());
    for (index, input) in flatten(union).into_iter().enumerate() {
        let mut state = unaggregated_session(planner.plan(input)?)?;
        if index > 0 && !state.sides.is_empty() {
            return Err(unsupported(
                "a UNION ALL whose second or later input joins tables",
                "put the input that joins first in the UNION ALL, or union the other inputs in a view",
            ));
        }
        check_types(&state, &schema, index)?;
        let forward: PartitionerFactory = Arc::new(|context| Box::new(GatherPartitioner(context.thread)));
        state.cut(SegmentOutput::Exchange { partitioner: forward, description: "forward (same thread)".into() });
        inputs.push(state);
    }
    let count = inputs.len();
    let mut tags = inputs[0].tags.clone();
    for state in &inputs[1..] {
        for (tag, other) in tags.iter_mut().zip(&state.tags) {
            if tag != other {
                *tag = Tag::Plain;
            }
        }
    }
    let updating = inputs.iter().any(|state| state.changelog.is_updating());
    let windows_per_row = inputs.iter().map(|state| state.windows_per_row).max().unwrap_or(1);
    let mut rest = inputs.split_off(1);
    let mut trunk = inputs.pop().expect("a union has inputs");
    for state in &rest {
        trunk.changelog_sources.extend(state.changelog_sources.iter().cloned());
    }
    let into = trunk.segments.len();
    for (port, state) in rest.drain(..).enumerate() {
        trunk.sides.push(SideInput {
            source: state.source,
            table: state.table,
            segments: state.segments,
            into,
            port: port + 1,
        });
    }
    let output = Arc::new(schema.as_arrow().clone());
    let factory: OperatorFactory = Arc::new(move |_| Ok(Box::new(Union::new(Arc::clone(&output), count))));
    trunk.operators.push((format!("union all: {count} inputs"), factory));
    trunk.schema = schema;
    trunk.tags = tags;
    trunk.windows_per_row = windows_per_row;
    trunk.changelog = if updating { Changelog::Updating { upsert_key: None } } else { Changelog::AppendOnly };
    Ok(trunk)
}

/// The inputs of `union`, with the inputs of a union directly under it (`a UNION ALL b
/// UNION ALL c` is planned as a union of a union) taken in its place: one segment
/// merges them all.
fn flatten(union: &UnionPlan) -> Vec<&LogicalPlan> {
    let mut inputs = Vec::new();
    for input in &union.inputs {
        match input.as_ref() {
            LogicalPlan::Union(inner) if same_types(&inner.schema, &union.schema) => inputs.extend(flatten(inner)),
            other => inputs.push(other),
        }
    }
    inputs
}

fn same_types(a: &DFSchemaRef, b: &DFSchemaRef) -> bool {
    a.fields().len() == b.fields().len()
        && a.fields().iter().zip(b.fields().iter()).all(|(x, y)| x.data_type() == y.data_type())
}

/// Refuses an input whose column types differ from the union's (DataFusion's analyzer
/// casts the inputs to common types before the planner sees them; this is the check).
fn check_types(state: &StreamState, schema: &DFSchemaRef, input: usize) -> Result<(), SluiceError> {
    let ours = state.schema.as_arrow();
    for (index, field) in schema.fields().iter().enumerate() {
        let from = ours.field(index).data_type();
        if from != field.data_type() {
            return Err(unsupported(
                &format!(
                    "a UNION ALL whose input {} has column `{}` of type {from}, not {}",
                    input + 1,
                    ours.field(index).name(),
                    field.data_type()
                ),
                "CAST the column to one type in every input",
            ));
        }
    }
    Ok(())
}
