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

/// The kind of one row of a changelog *input* (Flink's `RowKind`, with its byte values):
/// what a source with a changelog format (`debezium-json`, `upsert`, a file sink's `op`
/// column) says a row is, before the source's normalization turns the rows into weights
/// (`sluice_operators::normalize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i8)]
pub enum RowKind {
    /// `+I`: a new row.
    Insert = 0,
    /// `-U`: the version of a row before an update.
    UpdateBefore = 1,
    /// `+U`: the version of a row after an update (an upsert when no `-U` precedes it).
    UpdateAfter = 2,
    /// `-D`: a row deleted (in an upsert stream, only its key columns are known).
    Delete = 3,
}

/// The name of the column after a changelog source's declared columns that holds each
/// row's [`RowKind`] as an `Int8`; no query sees it (the normalization drops it).
pub const ROW_KIND_COLUMN: &str = "__sluice_row_kind";

impl RowKind {
    /// The kind of byte `value`, if it is one.
    pub fn from_i8(value: i8) -> Option<RowKind> {
        Some(match value {
            0 => RowKind::Insert,
            1 => RowKind::UpdateBefore,
            2 => RowKind::UpdateAfter,
            3 => RowKind::Delete,
            _ => return None,
        })
    }

    /// Flink's short name: `+I`, `-U`, `+U`, `-D` (what the file sink's `op` column holds).
    pub fn short(self) -> &'static str {
        match self {
            RowKind::Insert => "+I",
            RowKind::UpdateBefore => "-U",
            RowKind::UpdateAfter => "+U",
            RowKind::Delete => "-D",
        }
    }

    /// The kind of a short name (`+I`, `-U`, `+U`, `-D`), if it is one.
    pub fn from_short(text: &str) -> Option<RowKind> {
        [RowKind::Insert, RowKind::UpdateBefore, RowKind::UpdateAfter, RowKind::Delete]
            .into_iter()
            .find(|kind| kind.short() == text)
    }

    /// Whether the row adds to the table (`+I`, `+U`) rather than takes from it.
    pub fn is_accumulate(self) -> bool {
        matches!(self, RowKind::Insert | RowKind::UpdateAfter)
    }
}

#[cfg(test)]
mod tests {
    use super::RowKind;

    #[test]
    fn row_kinds_keep_flinks_byte_values_and_short_names() {
        let kinds = [(0, "+I"), (1, "-U"), (2, "+U"), (3, "-D")];
        for (byte, short) in kinds {
            let kind = RowKind::from_i8(byte).expect("a kind");
            assert_eq!((kind as i8, kind.short()), (byte, short));
            assert_eq!(RowKind::from_short(short), Some(kind));
        }
        assert_eq!(RowKind::from_i8(4), None);
        assert_eq!(RowKind::from_short("+X"), None);
    }
}
