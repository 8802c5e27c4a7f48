//! What kind of changes a stream carries: the planner knows it for every stream, sinks
//! choose how to write rows by it.

/// A stream's changelog mode.
///
/// An append-only stream only inserts (every weight positive). An updating stream may
/// also retract rows it sent before (negative weights); where every live row is
/// identified by some columns (a non-windowed aggregate's `GROUP BY` keys) those are its
/// *upsert key*, and a change of one row is sent as its retraction immediately followed
/// by its new version, which sinks write as Flink's `-U`/`+U` pair.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Changelog {
    AppendOnly,
    /// `upsert_key`: the columns identifying a live row, if known (an empty key: the
    /// stream holds at most one live row).
    Updating {
        upsert_key: Option<Vec<usize>>,
    },
}

impl Changelog {
    pub fn is_updating(&self) -> bool {
        matches!(self, Changelog::Updating { .. })
    }

    /// The upsert key's columns, when the stream is updating and has one.
    pub fn upsert_key(&self) -> Option<&[usize]> {
        match self {
            Changelog::AppendOnly => None,
            Changelog::Updating { upsert_key } => upsert_key.as_deref(),
        }
    }
}
