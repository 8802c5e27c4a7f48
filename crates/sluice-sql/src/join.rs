//! Regular joins: `a JOIN b ON a.k = b.k [AND residual]` (INNER, LEFT, RIGHT, FULL), and
//! `FROM a, b WHERE a.k = b.k …`.
//!
//! Each input is planned as a stream of its own; both are routed by the hash of their
//! join key columns (the same key encoding on both sides, so equal keys meet on one
//! thread), and the join operator (`sluice_operators::join`) keeps both sides' rows by
//! key and emits the change of the join's result for every batch, on either side. The
//! left input is the flow's trunk; the right one becomes a side input
//! ([`sluice_runtime::SideInput`]) entering the join's segment as port 1.
//!
//! Streaming meaning, as Flink's regular join: every row is kept (state grows with the
//! inputs); an INNER join of two append-only streams is append-only, any other join is
//! updating (an outer join emits a NULL-padded row and retracts it when a match comes;
//! retractions on either input retract what they joined). The output has no event time:
//! a join can emit rows older than the watermark, so its time columns are plain
//! timestamps (window functions over a join's output are refused, as in Flink).
//!
//! A condition (`ON`, or a `WHERE` directly above an inner join) that reads one input's
//! columns alone, and is not volatile, filters that input before the join instead of
//! being checked on joined pairs, unless the join preserves that input (an outer join
//! pads its rows that fail it): as in Flink, where the optimizer pushes it down. The
//! join's output is the same; the input's rows that fail it are never kept nor probed
//! (NEXMark q20 keeps only the auctions of category 10, not every auction). A row
//! whose condition fails to evaluate is then handled as the filter's `on_error` says.
//!
//! Interval and window joins: an INNER join of two append-only inputs whose rows can only
//! match within a bounded time frees its rows as the watermark passes ([`expiry`]):
//! - an **interval join** bounds the event times (tag [`Tag::EventTime`], or a window's
//!   end, [`Tag::WindowEnd`], whose rows come before the watermark passes it: NEXMark q7
//!   bounds bids by the end of the window whose highest price they match) of both
//!   inputs against each other with constant intervals, among its conditions (`ON` or a
//!   `WHERE` directly above the join):
//!   `l.t BETWEEN r.t - INTERVAL x AND r.t + INTERVAL y`, `l.t >= r.t - …`, `l.t < r.t +
//!   …` (`<`, `<=`, `>`, `>=`), either side first, either input's time in the middle. A
//!   bound `r.t <= l.t + a` means a left row can match no right row later than `l.t + a`:
//!   the left rows expire at `l.t + max(a, 0)` (never before their own time, so a row the
//!   watermark allows is never late); the other direction frees the right rows. One
//!   bound alone frees one side; the other side is kept as in a regular join;
//! - a **window join** has `window_start` and `window_end` of both inputs (tags
//!   [`Tag::WindowStart`]/[`Tag::WindowEnd`]: window table functions or window
//!   aggregates) among its equality keys: a window's rows on either side come before
//!   that side's watermark passes `window_end - 1`, so rows expire at `window_end - 1`.
//!
//! The conditions stay in the residual: they still decide every match. With an expiry,
//! a row arriving already expired is late (it could only match rows already freed):
//! counted in `view NAME: late rows` and dropped, where a regular join joins it. Outer
//! joins stay regular joins (Flink emits the padded row when an unmatched row expires;
//! Sluice does not yet), and so do joins over updating inputs (a retraction could come
//! after its row was freed). An interval join's output has no event time either, as any
//! join's. A window join's output keeps its inputs' window bounds (tags) as window bounds:
//! every joined row of a window is emitted when its later input row arrives, before the
//! join's watermark passes `window_end - 1` (a row arriving after is late), so a window
//! aggregate after the join sees a window's rows before the watermark closes it.
//!
//! Refused by name: joins without an equality between a column of each side (a cross
//! join), keys that are expressions rather than columns, keys of different types, SEMI
//! and ANTI joins (`IN`/`EXISTS` subqueries), a join whose right input is itself a join
//! (write the joins left-deep: `(a JOIN b) JOIN c`), and joins of SESSION windows before
//! their aggregate.

use std::sync::Arc;

use arrow::datatypes::{DataType, TimeUnit};
use datafusion_common::{Column, DFSchemaRef, NullEquality, ScalarValue};
use datafusion_expr::logical_plan::{Join, JoinType};
use datafusion_expr::utils::split_conjunction;
use datafusion_expr::{Between, BinaryExpr, Expr, Operator};
use sluice_operators::join::{Expiry, JoinKind, JoinOperator, JoinSpec, output_is_append_only};
use sluice_operators::ttl::Clock;
use sluice_runtime::{OperatorFactory, SideInput};
use sluice_types::{Changelog, SluiceError};

use crate::aggregate::exchange_line;
use crate::stream::{StreamPlanner, StreamState, Tag, display, physical, unaggregated_session, unsupported};

/// Plans `join`; `filter` is a WHERE predicate directly above an inner join, whose
/// conjuncts are join conditions too (`FROM a, b WHERE a.k = b.k`).
///
/// The steps: the join's kind, its equality keys and residual conditions, the conditions
/// pushed below it, its two inputs planned and routed by key, the operator's spec, its
/// line in `explain`, and the right input attached to the left as a side input.
pub(crate) fn plan_join(
    planner: &StreamPlanner<'_>,
    join: &Join,
    filter: Option<&Expr>,
) -> Result<StreamState, SluiceError> {
    let kind = join_kind(join, filter)?;
    let left_schema = Arc::clone(join.left.schema());
    let right_schema = Arc::clone(join.right.schema());
    let JoinKeys { left: left_keys, right: right_keys, names: key_names, mut residual } =
        join_keys(join, filter, &left_schema, &right_schema)?;
    let pushed = push_down(kind, &mut residual, &left_schema, &right_schema);
    let (mut left, mut right) = plan_inputs(planner, join, pushed)?;
    let output_schema: DFSchemaRef = Arc::clone(&join.schema);
    let expiry = if kind == JoinKind::Inner && !left.changelog.is_updating() && !right.changelog.is_updating() {
        expiry(&left, &right, (&left_keys, &right_keys), &residual)
    } else {
        Expiries::default()
    };
    let residual_text = residual.iter().map(display).collect::<Vec<_>>().join(" AND ");
    let residual = match residual.into_iter().reduce(Expr::and) {
        Some(predicate) => Some(physical(&predicate, &output_schema)?),
        None => None,
    };
    planner.hash_exchange(&mut left, left_keys.clone(), exchange_line(planner, &key_names.0));
    planner.hash_exchange(&mut right, right_keys.clone(), exchange_line(planner, &key_names.1));
    let append_only = output_is_append_only(kind, !left.changelog.is_updating(), !right.changelog.is_updating());
    let spec = JoinSpec {
        kind,
        left_schema: left.arrow_schema(),
        right_schema: right.arrow_schema(),
        output_schema: Arc::new(output_schema.as_arrow().clone()),
        left_keys,
        right_keys,
        residual,
        vnodes: planner.vnodes,
        expiry: expiry.sides,
        late_rows: format!("view {}: late rows", planner.view),
        append_only: [!left.changelog.is_updating(), !right.changelog.is_updating()],
        spill: planner.spill.clone(),
    };
    let pairs: Vec<String> = key_names.0.iter().zip(&key_names.1).map(|(l, r)| format!("{l} = {r}")).collect();
    // A state TTL drops an inner join's rows not written for a while; an outer join's
    // NULL padding depends on every row of the other side, so it keeps its rows.
    let ttl = planner.state_ttl().filter(|_| kind == JoinKind::Inner);
    let line = explain_line(planner, &spec, &pairs, &residual_text, &expiry, [&left_schema, &right_schema], ttl);
    let factory: OperatorFactory = Arc::new(move |context| {
        let join = JoinOperator::new(spec.clone(), context)?;
        Ok(Box::new(match ttl {
            Some(ttl) => join.with_ttl(ttl, Clock::system()),
            None => join,
        }))
    });
    let into = left.segments.len();
    left.sides.push(SideInput { source: right.source, table: right.table, segments: right.segments, into, port: 1 });
    left.operators.push((line, factory));
    left.state = Some(format!(
        "rows of both inputs by key ({}){}",
        pairs.join(", "),
        if expiry.expires() { ", each freed once the watermark passes its expiry" } else { "" }
    ));
    left.tags = vec![Tag::Plain; output_schema.fields().len()];
    // A window join's bounds stay window bounds (see the module documentation).
    let left_width = left_schema.fields().len();
    for &(l, r, tag) in &expiry.window_bounds {
        left.tags[l] = tag;
        left.tags[left_width + r] = tag;
    }
    left.schema = output_schema;
    left.windows_per_row = left.windows_per_row.max(right.windows_per_row);
    left.changelog = if append_only { Changelog::AppendOnly } else { Changelog::Updating { upsert_key: None } };
    left.changelog_sources.extend(right.changelog_sources);
    Ok(left)
}

/// The operator's kind for `join`'s type; SEMI and ANTI joins and `IS NOT DISTINCT FROM`
/// are refused.
fn join_kind(join: &Join, filter: Option<&Expr>) -> Result<JoinKind, SluiceError> {
    let kind = match join.join_type {
        JoinType::Inner => JoinKind::Inner,
        JoinType::Left => JoinKind::Left,
        JoinType::Right => JoinKind::Right,
        JoinType::Full => JoinKind::Full,
        other => {
            return Err(unsupported(
                &format!("a {other} join (from an IN or EXISTS subquery)"),
                "write it as a join: FROM a JOIN b ON a.k = b.k (with SELECT DISTINCT keys of b if b has duplicates)",
            ));
        }
    };
    if join.null_equality != NullEquality::NullEqualsNothing {
        return Err(unsupported("a join on IS NOT DISTINCT FROM", "join on `=`: NULL keys never match"));
    }
    if filter.is_some() {
        assert_eq!(kind, JoinKind::Inner, "a WHERE is a join condition only above an inner join");
    }
    Ok(kind)
}

/// A join's conditions sorted: the equalities between a column of each input, and the
/// rest.
struct JoinKeys {
    left: Vec<usize>,
    right: Vec<usize>,
    /// Each key column as `explain` shows it, left and right.
    names: (Vec<String>, Vec<String>),
    residual: Vec<Expr>,
}

/// Every condition of `join` (the `ON`/`USING` pairs, the join's filter, the WHERE
/// `filter` above it) as keys or residual; refuses keys of different types, and a join
/// without a key column on each side.
fn join_keys(
    join: &Join,
    filter: Option<&Expr>,
    left_schema: &DFSchemaRef,
    right_schema: &DFSchemaRef,
) -> Result<JoinKeys, SluiceError> {
    let mut conditions: Vec<Expr> = join.on.iter().map(|(l, r)| l.clone().eq(r.clone())).collect();
    for predicate in join.filter.iter().chain(filter) {
        conditions.extend(split_conjunction(predicate).into_iter().cloned());
    }
    let mut left_keys = Vec::new();
    let mut right_keys = Vec::new();
    let mut key_names = (Vec::new(), Vec::new());
    let mut residual = Vec::new();
    let mut expression_key = None;
    for condition in conditions {
        match equi_key(&condition, left_schema, right_schema) {
            Condition::Key(l, r) => {
                let (lf, rf) = (left_schema.field(l), right_schema.field(r));
                if lf.data_type() != rf.data_type() {
                    return Err(unsupported(
                        &format!(
                            "the join key `{}` whose sides have different types ({} and {})",
                            display(&condition),
                            lf.data_type(),
                            rf.data_type()
                        ),
                        "CAST one side to the other's type in a subquery or view, as a column, and join on it",
                    ));
                }
                left_keys.push(l);
                right_keys.push(r);
                key_names.0.push(display(&Expr::Column(Column::from(left_schema.qualified_field(l)))));
                key_names.1.push(display(&Expr::Column(Column::from(right_schema.qualified_field(r)))));
            }
            Condition::ExpressionKey => {
                expression_key.get_or_insert_with(|| display(&condition));
                residual.push(condition);
            }
            Condition::Other => residual.push(condition),
        }
    }
    if let (true, Some(key)) = (left_keys.is_empty(), expression_key) {
        return Err(unsupported(
            &format!("the join key `{key}`, an expression"),
            "compute the key as a column in a subquery or view (SELECT …, CAST(x AS BIGINT) AS k FROM t) and join on it",
        ));
    }
    if left_keys.is_empty() {
        return Err(unsupported(
            "a join without an equality between a column of each input (a cross join)",
            "join on equal keys: FROM a JOIN b ON a.k = b.k",
        ));
    }
    Ok(JoinKeys { left: left_keys, right: right_keys, names: key_names, residual })
}

/// Takes out of `residual` the conditions that filter one input before the join: per
/// input, those on its columns alone.
///
/// A condition on one input's columns alone filters that input before the join (as
/// Flink's optimizer pushes it down), unless that input is preserved (an outer join
/// pads its rows that fail it): a row failing it could join nothing, so it is neither
/// kept nor probed (NEXMark q20 keeps only the auctions of category 10).
fn push_down(
    kind: JoinKind,
    residual: &mut Vec<Expr>,
    left_schema: &DFSchemaRef,
    right_schema: &DFSchemaRef,
) -> [Vec<Expr>; 2] {
    let mut pushed: [Vec<Expr>; 2] = [Vec::new(), Vec::new()];
    residual.retain(|condition| match one_input(condition, left_schema, right_schema) {
        Some(side) if !preserves(kind, side) && !condition.is_volatile() => {
            pushed[side].push(condition.clone());
            false
        }
        _ => true,
    });
    pushed
}

/// Plans the join's two inputs, each filtered by its `pushed` conditions; refuses a right
/// input that is itself a join.
fn plan_inputs(
    planner: &StreamPlanner<'_>,
    join: &Join,
    pushed: [Vec<Expr>; 2],
) -> Result<(StreamState, StreamState), SluiceError> {
    let mut left = unaggregated_session(planner.plan(&join.left)?)?;
    let mut right = unaggregated_session(planner.plan(&join.right)?)?;
    for (input, conditions) in [&mut left, &mut right].into_iter().zip(pushed) {
        if let Some(predicate) = conditions.into_iter().reduce(Expr::and) {
            planner.push_filter(input, &predicate)?;
        }
    }
    if !right.sides.is_empty() {
        return Err(unsupported(
            "a join whose right input is itself a join",
            "write the joins left-deep: (a JOIN b ON …) JOIN c ON …, or join in a view and read the view on the left",
        ));
    }
    Ok((left, right))
}

/// The join's line in `explain`: its kind, keys and residual, then what bounds its
/// state: the expiry, the state TTL, the spilling sides.
fn explain_line(
    planner: &StreamPlanner<'_>,
    spec: &JoinSpec,
    pairs: &[String],
    residual_text: &str,
    expiry: &Expiries,
    schemas: [&DFSchemaRef; 2],
    ttl: Option<std::time::Duration>,
) -> String {
    let kind = spec.kind;
    let mut line = format!("join: {} ON {}", kind_name(kind), pairs.join(" AND "));
    if !residual_text.is_empty() {
        line.push_str(&format!(" AND {residual_text}"));
    }
    if expiry.expires() {
        line.push_str(&expiry_note(expiry, schemas));
    }
    match (planner.state_ttl(), ttl) {
        (Some(_), None) => line.push_str(" (outer join: no state TTL)"),
        _ => line.push_str(&crate::stream::ttl_note(ttl)),
    }
    // The sides whose rows spill beyond the budget (see `sluice_operators::join`): every
    // side without an expiry (an interval or window join's sides free their rows as the
    // watermark passes them, and keep them in memory).
    let spilling: Vec<&str> = (0..2)
        .filter(|&side| planner.spill.is_some() && spec.expiry[side].is_none())
        .map(|side| if side == 0 { "left" } else { "right" })
        .collect();
    if !spilling.is_empty() {
        line.push_str(&format!(" ({} rows spill to disk beyond state_memory_mib)", spilling.join(" and ")));
    }
    line
}

/// ` (interval join: …)` or ` (window join: …)`: until when each side's rows are kept.
fn expiry_note(expiry: &Expiries, schemas: [&DFSchemaRef; 2]) -> String {
    let shown: Vec<Option<String>> = expiry
        .sides
        .iter()
        .zip(schemas)
        .map(|(side, schema)| {
            let Expiry { column, offset_ms } = side.as_ref()?;
            let column = display(&Expr::Column(Column::from(schema.qualified_field(*column))));
            let sign = if *offset_ms < 0 { '-' } else { '+' };
            Some(format!("{column} {sign} {} ms", offset_ms.unsigned_abs()))
        })
        .collect();
    let what = if expiry.window { "window join" } else { "interval join" };
    let kept = match (&shown[0], &shown[1]) {
        (Some(l), Some(r)) => format!("state kept until the watermark passes {l} / {r}"),
        (Some(l), None) => format!("left rows kept until the watermark passes {l}; right rows kept (no bound)"),
        (None, Some(r)) => format!("right rows kept until the watermark passes {r}; left rows kept (no bound)"),
        (None, None) => unreachable!("a side expires"),
    };
    format!(" ({what}: {kept})")
}

/// When each side's rows expire, for an interval or a window join.
#[derive(Default)]
struct Expiries {
    sides: [Option<Expiry>; 2],
    /// A window join (its expiry from the window bounds).
    window: bool,
    /// A window join's key pairs of window bounds (left and right column), with their
    /// tag, kept in the output.
    window_bounds: Vec<(usize, usize, Tag)>,
}

impl Expiries {
    /// Whether the rows of either side expire.
    fn expires(&self) -> bool {
        self.sides.iter().any(Option::is_some)
    }
}

/// The expiry of each side of an inner join of append-only `left` and `right` (see the
/// module documentation): a window join's, else an interval join's.
fn expiry(left: &StreamState, right: &StreamState, keys: (&[usize], &[usize]), residual: &[Expr]) -> Expiries {
    let sides = [left, right];
    let is_time = |side: usize, column: usize| {
        matches!(sides[side].schema.field(column).data_type(), DataType::Timestamp(TimeUnit::Millisecond, _))
    };
    let bound_pair = |tag: Tag| {
        keys.0.iter().zip(keys.1).find(|&(&l, &r)| left.tags[l] == tag && right.tags[r] == tag).map(|(&l, &r)| (l, r))
    };
    if let (Some(start), Some(end)) = (bound_pair(Tag::WindowStart), bound_pair(Tag::WindowEnd))
        && is_time(0, end.0)
        && is_time(1, end.1)
    {
        return Expiries {
            sides: [Some(Expiry { column: end.0, offset_ms: -1 }), Some(Expiry { column: end.1, offset_ms: -1 })],
            window: true,
            window_bounds: vec![(start.0, start.1, Tag::WindowStart), (end.0, end.1, Tag::WindowEnd)],
        };
    }
    let mut expiries = Expiries::default();
    let time_column = |expr: &Expr| -> Option<(usize, usize)> {
        let Expr::Column(column) = expr else { return None };
        let found: Vec<(usize, usize)> = sides
            .iter()
            .enumerate()
            .filter_map(|(side, state)| state.schema.index_of_column(column).ok().map(|index| (side, index)))
            .collect();
        match found.as_slice() {
            [(side, index)] if bounds_like_event_time(sides[*side].tags[*index]) && is_time(*side, *index) => {
                Some((*side, *index))
            }
            _ => None,
        }
    };
    for condition in residual {
        for (side, column, offset_ms) in time_bounds(condition, &time_column) {
            let offset_ms = offset_ms.max(0);
            let kept = &mut expiries.sides[side];
            if kept.is_none_or(|kept| offset_ms < kept.offset_ms) {
                *kept = Some(Expiry { column, offset_ms });
            }
        }
    }
    expiries
}

/// Whether a column tagged `tag` may stand for an input's time in an interval join's
/// bounds: every row must arrive before the input's watermark reaches the column's
/// value ("no row at or below the watermark follows"). An event time does; so does a
/// window's end, whose rows (a window table function's, or a window aggregate's or
/// window join's output) all come before the watermark passes `window_end - 1` (the
/// window aggregates emit a window before they forward the watermark that closes it).
fn bounds_like_event_time(tag: Tag) -> bool {
    matches!(tag, Tag::EventTime | Tag::WindowEnd)
}

/// The bounds `condition` puts on the event times of both inputs, each as (side, column,
/// offset): side `side`'s rows can match only rows of the other side whose time is at
/// most `column + offset`. `time_column` finds an event-time column's (side, position).
fn time_bounds(condition: &Expr, time_column: &dyn Fn(&Expr) -> Option<(usize, usize)>) -> Vec<(usize, usize, i64)> {
    // `a <= b`: a's time is at most b's plus the difference of their offsets, which bounds
    // how much later than b's row a's may be.
    let at_most = |a: &Expr, b: &Expr| -> Option<(usize, usize, i64)> {
        let (a_side, _, a_offset) = time_term(a, time_column)?;
        let (b_side, b_column, b_offset) = time_term(b, time_column)?;
        (a_side != b_side).then_some(())?;
        Some((b_side, b_column, b_offset.checked_sub(a_offset)?))
    };
    let bounds = match condition {
        Expr::Between(Between { expr, negated: false, low, high }) => vec![at_most(low, expr), at_most(expr, high)],
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::Lt | Operator::LtEq, right }) => vec![at_most(left, right)],
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::Gt | Operator::GtEq, right }) => vec![at_most(right, left)],
        _ => Vec::new(),
    };
    bounds.into_iter().flatten().collect()
}

/// `expr` as an event-time column plus a constant: (side, column, offset in ms).
fn time_term(expr: &Expr, time_column: &dyn Fn(&Expr) -> Option<(usize, usize)>) -> Option<(usize, usize, i64)> {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::Plus, right }) => {
            if let Some((side, column, offset)) = time_term(left, time_column) {
                Some((side, column, offset.checked_add(interval_ms(right)?)?))
            } else {
                let (side, column, offset) = time_term(right, time_column)?;
                Some((side, column, offset.checked_add(interval_ms(left)?)?))
            }
        }
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::Minus, right }) => {
            let (side, column, offset) = time_term(left, time_column)?;
            Some((side, column, offset.checked_sub(interval_ms(right)?)?))
        }
        _ => time_column(expr).map(|(side, column)| (side, column, 0)),
    }
}

/// A constant interval of fixed length, in whole milliseconds (months and years have
/// none).
pub(crate) fn interval_ms(expr: &Expr) -> Option<i64> {
    const DAY_MS: i64 = 86_400_000;
    match expr {
        Expr::Literal(ScalarValue::IntervalMonthDayNano(Some(value)), _) => {
            if value.months != 0 || value.nanoseconds % 1_000_000 != 0 {
                return None;
            }
            i64::from(value.days).checked_mul(DAY_MS)?.checked_add(value.nanoseconds / 1_000_000)
        }
        Expr::Literal(ScalarValue::IntervalDayTime(Some(value)), _) => {
            i64::from(value.days).checked_mul(DAY_MS)?.checked_add(i64::from(value.milliseconds))
        }
        Expr::Literal(ScalarValue::DurationMillisecond(Some(ms)), _) => Some(*ms),
        Expr::Literal(ScalarValue::DurationSecond(Some(s)), _) => s.checked_mul(1000),
        _ => None,
    }
}

fn kind_name(kind: JoinKind) -> &'static str {
    match kind {
        JoinKind::Inner => "INNER",
        JoinKind::Left => "LEFT",
        JoinKind::Right => "RIGHT",
        JoinKind::Full => "FULL",
    }
}

/// Whether an outer join of `kind` keeps the unmatched rows of `side` (0: left, 1: right).
fn preserves(kind: JoinKind, side: usize) -> bool {
    match kind {
        JoinKind::Inner => false,
        JoinKind::Left => side == 0,
        JoinKind::Right => side == 1,
        JoinKind::Full => true,
    }
}

/// The input (0: left, 1: right) whose columns alone `condition` reads, if one does.
fn one_input(condition: &Expr, left: &DFSchemaRef, right: &DFSchemaRef) -> Option<usize> {
    let columns = condition.column_refs();
    let all_in = |schema: &DFSchemaRef| columns.iter().all(|c| schema.index_of_column(c).is_ok());
    let none_in = |schema: &DFSchemaRef| columns.iter().all(|c| schema.index_of_column(c).is_err());
    if columns.is_empty() {
        None
    } else if all_in(left) && none_in(right) {
        Some(0)
    } else if all_in(right) && none_in(left) {
        Some(1)
    } else {
        None
    }
}

/// What one condition of a join is.
enum Condition {
    /// `column = column`, one column of each input (their positions).
    Key(usize, usize),
    /// An equality across the inputs on something other than two columns.
    ExpressionKey,
    /// Anything else: a residual predicate.
    Other,
}

fn equi_key(condition: &Expr, left: &DFSchemaRef, right: &DFSchemaRef) -> Condition {
    let Expr::BinaryExpr(BinaryExpr { left: a, op: Operator::Eq, right: b }) = condition else {
        return Condition::Other;
    };
    let side = |expr: &Expr| -> (bool, bool) {
        let columns = expr.column_refs();
        let in_left = !columns.is_empty() && columns.iter().all(|c| left.index_of_column(c).is_ok());
        let in_right = !columns.is_empty() && columns.iter().all(|c| right.index_of_column(c).is_ok());
        (in_left, in_right)
    };
    let ((a_left, a_right), (b_left, b_right)) = (side(a), side(b));
    let (left_expr, right_expr) = if a_left && b_right && !a_right {
        (a, b)
    } else if b_left && a_right && !b_right {
        (b, a)
    } else {
        return Condition::Other;
    };
    match (left_expr.as_ref(), right_expr.as_ref()) {
        (Expr::Column(l), Expr::Column(r)) => match (left.index_of_column(l), right.index_of_column(r)) {
            (Ok(l), Ok(r)) => Condition::Key(l, r),
            _ => Condition::Other,
        },
        _ => Condition::ExpressionKey,
    }
}
