//! What `validate` and `explain` answer, as data (the CLI prints it; an HTTP API can
//! serve it).

use std::fmt;

use sluice_runtime::{Plan, SegmentOutput};

use crate::compile::CompiledPipeline;
use crate::error::EngineError;
use crate::fingerprint::Fingerprint;
use crate::load::Pipeline;

/// A pipeline that passed every check `run` makes before it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validation {
    pub pipeline: String,
    pub sources: usize,
    pub views: usize,
    pub sinks: usize,
    pub fingerprint: Fingerprint,
}

impl fmt::Display for Validation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pipeline \"{}\" is valid: {} source(s), {} view(s), {} sink(s)",
            self.pipeline, self.sources, self.views, self.sinks
        )
    }
}

/// The dataflow of a compiled pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    pub pipeline: String,
    pub threads: u32,
    pub vnodes: u32,
    pub sources: Vec<SourceNode>,
    pub flows: Vec<FlowNode>,
}

/// A source and its lanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceNode {
    pub name: String,
    /// e.g. `nexmark(events=1000000, rate=unlimited, seed=0, blocks of 8192 events, lanes within 10000 ms)`.
    pub describe: String,
    pub tables: Vec<String>,
    pub lanes: u32,
    /// Threads its lanes run on.
    pub threads: u32,
}

/// From one table of one source to one sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowNode {
    pub sink: String,
    pub sink_describe: String,
    /// `source.table`.
    pub scan: String,
    pub segments: Vec<SegmentNode>,
    /// Further inputs (a join's other side), each entering a trunk segment.
    pub sides: Vec<SideNode>,
    /// Set when the flow reads another flow's segment (computed once for both) instead
    /// of `scan`: see `engine::share`.
    pub tap: Option<TapNode>,
}

/// A flow's trunk reading segment `segment` of flow `flow` (whose sink is `sink`)
/// through an exchange of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapNode {
    pub flow: usize,
    pub sink: String,
    pub segment: usize,
    /// e.g. `forward (same thread)`, `hash(every column) → 256 vnodes`.
    pub exchange: String,
}

/// Another input of a flow: a table through segments of its own into segment `into` of
/// the trunk, as its input port `port`. Its segments are numbered after the trunk's and
/// the sides' before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideNode {
    /// `source.table`.
    pub scan: String,
    pub segments: Vec<SegmentNode>,
    pub into: usize,
    pub port: usize,
}

/// Fused operators between two exchanges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentNode {
    pub parallelism: u32,
    /// One line per operator, e.g. `filter: auction % 123 = 0`.
    pub operators: Vec<String>,
    /// Keyed state held here, e.g. `windows by auction`.
    pub state: Option<String>,
    /// Where rows go next: an exchange (described) or the sink (None).
    pub exchange: Option<String>,
}

impl Pipeline {
    /// Everything `run` checks before it starts, and that sinks can write where they are
    /// told to (creating nothing).
    pub fn validate(&self) -> Result<Validation, EngineError> {
        for (sink, configured) in self.config.sinks.iter().zip(&self.sinks) {
            configured
                .check(&self.base_dir)
                .map_err(|e| self.problem(sink.position, e.context(format!("sink `{}`", sink.name))))?;
        }
        let compiled = self.compile(None)?;
        Ok(Validation {
            pipeline: self.config.pipeline.name.clone(),
            sources: self.config.sources.len(),
            views: self.config.views.len(),
            sinks: self.config.sinks.len(),
            fingerprint: compiled.fingerprint,
        })
    }

    /// The dataflow graph.
    pub fn explain(&self) -> Result<Explanation, EngineError> {
        Ok(explain(&self.compile(None)?))
    }
}

/// The dataflow graph of a compiled pipeline.
pub fn explain(compiled: &CompiledPipeline) -> Explanation {
    let threads = compiled.options.threads;
    let plan: &Plan = &compiled.plan;
    let sources = plan
        .sources
        .iter()
        .map(|source| SourceNode {
            name: source.name().to_string(),
            describe: source.describe(),
            tables: source.tables().iter().map(|t| t.name.clone()).collect(),
            lanes: source.lanes(),
            threads: threads.min(source.lanes().max(1)),
        })
        .collect();
    let flows = plan
        .flows
        .iter()
        .map(|flow| FlowNode {
            sink: flow.sink.name().to_string(),
            sink_describe: flow.sink.describe(),
            scan: scan(plan, flow.source, flow.table),
            segments: segment_nodes(&flow.segments, threads),
            sides: flow
                .sides
                .iter()
                .map(|side| SideNode {
                    scan: scan(plan, side.source, side.table),
                    segments: segment_nodes(&side.segments, threads),
                    into: side.into,
                    port: side.port,
                })
                .collect(),
            tap: flow.tap.as_ref().map(|tap| TapNode {
                flow: tap.flow,
                sink: plan.flows[tap.flow].sink.name().to_string(),
                segment: tap.segment,
                exchange: tap.description.clone(),
            }),
        })
        .collect();
    Explanation { pipeline: compiled.name.clone(), threads, vnodes: compiled.options.vnodes, sources, flows }
}

/// `source.table`.
fn scan(plan: &Plan, source: usize, table: usize) -> String {
    let source = &plan.sources[source];
    format!("{}.{}", source.name(), source.tables()[table].name)
}

fn segment_nodes(segments: &[sluice_runtime::Segment], threads: u32) -> Vec<SegmentNode> {
    segments
        .iter()
        .map(|segment| SegmentNode {
            parallelism: threads,
            operators: segment.operators.iter().map(|(line, _)| line.clone()).collect(),
            state: segment.state.clone(),
            exchange: match &segment.output {
                SegmentOutput::Exchange { description, .. } => Some(description.clone()),
                SegmentOutput::Sink => None,
            },
        })
        .collect()
}

fn write_segment(f: &mut fmt::Formatter<'_>, number: usize, segment: &SegmentNode, sink: &str) -> fmt::Result {
    writeln!(f, "  segment {number} (parallelism {}, operators fused)", segment.parallelism)?;
    for line in &segment.operators {
        writeln!(f, "    {line}")?;
    }
    if let Some(state) = &segment.state {
        writeln!(f, "    state: {state}, by vnode")?;
    }
    match &segment.exchange {
        Some(description) => writeln!(f, "  exchange: {description}"),
        None => writeln!(f, "  sink {sink}"),
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "pipeline \"{}\"", self.pipeline)?;
        writeln!(f, "threads: {}, vnodes: {}", self.threads, self.vnodes)?;
        for source in &self.sources {
            writeln!(
                f,
                "source {}: {} → tables [{}], {} lane(s) over {} thread(s)",
                source.name,
                source.describe,
                source.tables.join(", "),
                source.lanes,
                source.threads
            )?;
        }
        for (index, flow) in self.flows.iter().enumerate() {
            writeln!(f, "\nflow → sink {} ({})", flow.sink, flow.sink_describe)?;
            match &flow.tap {
                None => writeln!(f, "  scan {}", flow.scan)?,
                Some(tap) => {
                    writeln!(f, "  reads segment {} of the flow → sink {} (shared)", tap.segment, tap.sink)?;
                    writeln!(f, "  exchange: {}", tap.exchange)?;
                }
            }
            for (position, segment) in flow.segments.iter().enumerate() {
                for side in flow.sides.iter().filter(|side| side.into == position) {
                    writeln!(f, "  (input {} joins here from {})", side.port, side.scan)?;
                }
                write_segment(f, position, segment, &flow.sink)?;
                let readers = self.flows.iter().filter_map(|other| other.tap.as_ref().map(|tap| (other, tap)));
                for (reader, _) in readers.filter(|(_, tap)| tap.flow == index && tap.segment == position) {
                    writeln!(f, "  also read by: sink {}", reader.sink)?;
                }
            }
            let mut number = flow.segments.len();
            for side in &flow.sides {
                writeln!(f, "  input {} of segment {}:", side.port, side.into)?;
                writeln!(f, "  scan {}", side.scan)?;
                for segment in &side.segments {
                    write_segment(f, number, segment, &flow.sink)?;
                    number += 1;
                }
            }
        }
        Ok(())
    }
}
