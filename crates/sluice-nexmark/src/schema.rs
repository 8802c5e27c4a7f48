//! The three NEXMark tables and their Arrow schemas.
//!
//! Column names and types follow the widely used Flink NEXMark DDL
//! (`person`, `auction`, `bid`), case-sensitive, all columns non-nullable.
//! Timestamps are `Timestamp(Millisecond, None)` (event time in ms since the
//! Unix epoch, no time zone).
//!
//! [`TableSet`] selects which tables a generator materializes; events of the
//! other kinds are still counted (they occupy event numbers) but cost almost
//! nothing to skip.

use std::fmt;
use std::sync::{Arc, OnceLock};

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;

/// One of the three NEXMark event kinds / tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// New person registering (`person` table).
    Person,
    /// New auction opened (`auction` table).
    Auction,
    /// Bid on an auction (`bid` table).
    Bid,
}

impl Table {
    /// The table name: `"person"`, `"auction"` or `"bid"`.
    pub fn name(self) -> &'static str {
        match self {
            Table::Person => "person",
            Table::Auction => "auction",
            Table::Bid => "bid",
        }
    }

    /// All tables, in the order person, auction, bid.
    pub fn all() -> [Table; 3] {
        [Table::Person, Table::Auction, Table::Bid]
    }

    /// Looks a table up by its (lower-case) name.
    pub fn from_name(name: &str) -> Option<Table> {
        Table::all().into_iter().find(|t| t.name() == name)
    }

    fn index(self) -> usize {
        match self {
            Table::Person => 0,
            Table::Auction => 1,
            Table::Bid => 2,
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of tables (a tiny bit set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct TableSet {
    bits: u8,
}

impl TableSet {
    /// No table.
    pub const NONE: TableSet = TableSet { bits: 0 };
    /// All three tables.
    pub const ALL: TableSet = TableSet { bits: 0b111 };

    /// All three tables.
    pub fn all() -> TableSet {
        TableSet::ALL
    }

    /// Exactly one table.
    pub fn only(table: Table) -> TableSet {
        TableSet::NONE.with(table)
    }

    /// This set plus `table`.
    pub fn with(self, table: Table) -> TableSet {
        TableSet { bits: self.bits | (1 << table.index()) }
    }

    /// This set minus `table`.
    pub fn without(self, table: Table) -> TableSet {
        TableSet { bits: self.bits & !(1 << table.index()) }
    }

    /// Whether `table` is in the set.
    pub fn contains(self, table: Table) -> bool {
        self.bits & (1 << table.index()) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.bits == 0
    }

    /// The tables in the set, in the order person, auction, bid.
    pub fn iter(self) -> impl Iterator<Item = Table> {
        Table::all().into_iter().filter(move |t| self.contains(*t))
    }
}

impl From<Table> for TableSet {
    fn from(table: Table) -> Self {
        TableSet::only(table)
    }
}

impl FromIterator<Table> for TableSet {
    fn from_iter<I: IntoIterator<Item = Table>>(iter: I) -> Self {
        iter.into_iter().fold(TableSet::NONE, TableSet::with)
    }
}

fn timestamp_ms() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, None)
}

fn build_schema(table: Table) -> SchemaRef {
    let long = |name: &str| Field::new(name, DataType::Int64, false);
    let text = |name: &str| Field::new(name, DataType::Utf8, false);
    let time = |name: &str| Field::new(name, timestamp_ms(), false);
    let fields = match table {
        Table::Person => vec![
            long("id"),
            text("name"),
            text("emailAddress"),
            text("creditCard"),
            text("city"),
            text("state"),
            time("dateTime"),
            text("extra"),
        ],
        Table::Auction => vec![
            long("id"),
            text("itemName"),
            text("description"),
            long("initialBid"),
            long("reserve"),
            time("dateTime"),
            time("expires"),
            long("seller"),
            long("category"),
            text("extra"),
        ],
        Table::Bid => vec![
            long("auction"),
            long("bidder"),
            long("price"),
            text("channel"),
            text("url"),
            time("dateTime"),
            text("extra"),
        ],
    };
    Arc::new(Schema::new(fields))
}

/// The Arrow schema of `table`. The same `Arc` is returned on every call,
/// and every batch the generator produces carries it.
pub fn schema(table: Table) -> SchemaRef {
    static SCHEMAS: OnceLock<[SchemaRef; 3]> = OnceLock::new();
    let all = SCHEMAS.get_or_init(|| Table::all().map(build_schema));
    Arc::clone(&all[table.index()])
}

/// Assembles a batch of `table` from columns built by this crate. The
/// builders always produce columns of the schema's types, equal lengths and
/// no nulls, so a failure here is a bug in this crate.
pub(crate) fn make_batch(table: Table, columns: Vec<ArrayRef>) -> RecordBatch {
    match RecordBatch::try_new(schema(table), columns) {
        Ok(batch) => batch,
        Err(e) => panic!("internal error: invalid {table} batch: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in Table::all() {
            assert_eq!(Table::from_name(t.name()), Some(t));
            assert_eq!(t.to_string(), t.name());
        }
        assert_eq!(Table::from_name("Bid"), None);
    }

    #[test]
    fn table_set_operations() {
        let s = TableSet::only(Table::Bid).with(Table::Person);
        assert!(s.contains(Table::Bid) && s.contains(Table::Person));
        assert!(!s.contains(Table::Auction));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![Table::Person, Table::Bid]);
        assert_eq!(s.without(Table::Bid), TableSet::only(Table::Person));
        assert!(TableSet::NONE.is_empty());
        assert_eq!(Table::all().into_iter().collect::<TableSet>(), TableSet::ALL);
    }

    #[test]
    fn schemas_match_flink_ddl() {
        let names = |t| schema(t).fields().iter().map(|f| f.name().clone()).collect::<Vec<_>>();
        assert_eq!(
            names(Table::Person),
            ["id", "name", "emailAddress", "creditCard", "city", "state", "dateTime", "extra"]
        );
        assert_eq!(
            names(Table::Auction),
            [
                "id",
                "itemName",
                "description",
                "initialBid",
                "reserve",
                "dateTime",
                "expires",
                "seller",
                "category",
                "extra"
            ]
        );
        assert_eq!(names(Table::Bid), ["auction", "bidder", "price", "channel", "url", "dateTime", "extra"]);
        for t in Table::all() {
            let s = schema(t);
            assert!(s.fields().iter().all(|f| !f.is_nullable()));
            let dt = s.field_with_name("dateTime").map(|f| f.data_type().clone());
            assert_eq!(dt.ok(), Some(timestamp_ms()));
            assert!(Arc::ptr_eq(&s, &schema(t)));
        }
    }
}
