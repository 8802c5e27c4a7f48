//! Sub-plan reuse: a table or view read by several sinks (a materialized table counts
//! as one) is computed once, and its state kept once, with its output fanned out to
//! every reader, as Flink's sub-plan reuse does.
//!
//! Every reader is first planned on its own (`compile`, `materialize::add_flows`): a
//! flow per sink, each a plan of the table it reads. Readers of the same table are
//! plans of the same logical plan by the same planner, so they are equal up to where
//! their ends differ: a sink with one writer gathers its rows to one slot, a
//! materialized table routes them by the whole row's hash, a sink with a writer per
//! thread writes where they are. [`share_readers`] then cuts each later reader at the
//! last segment it has in common with the first reader of its table and makes it read
//! that segment's output through a [`Tap`] instead:
//!
//! - Common segments: equal operators (their `explain` lines), state and (but for the
//!   last) output, and the same side inputs entering them. Only readers of one table
//!   are compared, never two views whose plans happen to read alike: a view's name is
//!   part of its operators' counters and time-to-live, which the lines do not show.
//! - The tap routes the shared segment's output as the reader's own segment did (its
//!   exchange's partitioner), or, where the reader's segment wrote its sink, to the same
//!   thread (`forward`); the reader keeps only its segments after the cut, and its side
//!   inputs entering them.
//! - The cut is at the last common segment that holds state (or that a side holding state
//!   enters): what follows it in common is stateless and cheap (a projection, or the empty
//!   segment after a gather to the same single writer), and cutting there keeps the cut,
//!   hence the fingerprint and the operator ids, the same whatever the thread count (a
//!   gather is planned only on several threads), so a restore on another thread count
//!   finds the same plan. A prefix without state is not shared: a scan or a filter is
//!   cheaper computed again than sent through an exchange, and sources are shared anyway.
//!   So a pipeline whose tables each have one reader, or whose readers share no state,
//!   plans exactly as before: same segments, same operator ids, same fingerprint.
//!
//! The tapped flow keeps its segments' numbers, so its operators' ids (their state in
//! checkpoints) do not change; a tapping flow's segments are numbered from its cut. The
//! fingerprint names each tap (`fingerprint`), so a checkpoint of the unshared plan is
//! refused by a shared one, with the fingerprints in the message, and not misread.

use std::sync::Arc;

use sluice_operators::partition::GatherPartitioner;
use sluice_runtime::{Flow, OperatorContext, Partitioner, PartitionerFactory, Segment, SegmentOutput, Tap};

/// The exchange a tap uses where the reader wrote its sink on each thread.
pub(crate) const FORWARD: &str = "forward (same thread)";

/// Makes every later reader of a table (`reads[f]`: the table or view flow `f` reads)
/// tap the first reader's flow at the last segment holding state that both plans have
/// in common (see the module docs).
pub(crate) fn share_readers(flows: &mut [Flow], reads: &[String]) {
    assert_eq!(flows.len(), reads.len(), "one table read per flow");
    for reader in 1..flows.len() {
        let Some(first) = (0..reader).find(|&f| reads[f] == reads[reader] && flows[f].tap.is_none()) else {
            continue;
        };
        let Some(common) = common_prefix(&flows[first], &flows[reader]) else { continue };
        let Some(cut) = (0..=common).rev().find(|&segment| holds_state(&flows[first], segment)) else { continue };
        tap(&mut flows[reader], first, cut);
    }
}

/// The last trunk segment of the prefix `a` and `b` have in common (see the module
/// docs), if any.
fn common_prefix(a: &Flow, b: &Flow) -> Option<usize> {
    if (a.source, a.table) != (b.source, b.table) || a.tap.is_some() || b.tap.is_some() {
        return None;
    }
    let mut cut = None;
    for (index, (x, y)) in a.segments.iter().zip(&b.segments).enumerate() {
        if !same_work(x, y) || !same_sides(a, b, index) {
            break;
        }
        cut = Some(index);
        if output_line(x) != output_line(y) {
            break;
        }
    }
    cut
}

/// Whether two segments run the same operators with the same state.
fn same_work(a: &Segment, b: &Segment) -> bool {
    a.state == b.state && a.operators.iter().map(|(line, _)| line).eq(b.operators.iter().map(|(line, _)| line))
}

/// What a segment's output is, for comparing: the exchange's description, or None for the sink.
fn output_line(segment: &Segment) -> Option<&str> {
    match &segment.output {
        SegmentOutput::Exchange { description, .. } => Some(description),
        SegmentOutput::Sink => None,
    }
}

/// Whether the same side inputs enter trunk segment `into` of `a` and `b`.
fn same_sides(a: &Flow, b: &Flow, into: usize) -> bool {
    let x: Vec<_> = a.sides.iter().filter(|side| side.into == into).collect();
    let y: Vec<_> = b.sides.iter().filter(|side| side.into == into).collect();
    x.len() == y.len()
        && x.iter().zip(&y).all(|(x, y)| {
            (x.source, x.table, x.port) == (y.source, y.table, y.port)
                && x.segments.len() == y.segments.len()
                && x.segments.iter().zip(&y.segments).all(|(s, t)| same_work(s, t) && output_line(s) == output_line(t))
        })
}

/// Whether trunk segment `segment` of `flow`, or a side entering it, holds state.
fn holds_state(flow: &Flow, segment: usize) -> bool {
    let sides = flow.sides.iter().filter(|side| side.into == segment).flat_map(|side| &side.segments);
    std::iter::once(&flow.segments[segment]).chain(sides).any(|segment| segment.state.is_some())
}

/// Cuts `reader` after trunk segment `cut` and makes it read segment `cut` of flow `first`.
fn tap(reader: &mut Flow, first: usize, cut: usize) {
    let (partitioner, description, rest) = match &reader.segments[cut].output {
        SegmentOutput::Exchange { partitioner, description } => {
            (Arc::clone(partitioner), description.clone(), reader.segments[cut + 1..].to_vec())
        }
        SegmentOutput::Sink => {
            let sink = Segment { operators: Vec::new(), state: None, output: SegmentOutput::Sink };
            (forward(), FORWARD.to_string(), vec![sink])
        }
    };
    reader.segments = rest;
    reader.sides.retain(|side| side.into > cut);
    for side in &mut reader.sides {
        side.into -= cut + 1;
    }
    reader.tap = Some(Tap { flow: first, segment: cut, partitioner, description });
}

/// Each thread's rows to the same thread (the planner's union uses the same exchange).
fn forward() -> PartitionerFactory {
    Arc::new(|context: &OperatorContext| Box::new(GatherPartitioner(context.thread)) as Box<dyn Partitioner>)
}

#[cfg(test)]
mod tests;
