//! A connector's option table, kept for the connector to validate.
//!
//! The configuration layer does not know connectors: it reads the keys every
//! `[[source]]` and `[[sink]]` has (name, connector, format, schema, …) and keeps the
//! rest, `[source.options]` / `[sink.options]`, as an [`Options`] value: the table as
//! written, with the text of the file, so that the connector named by `connector` (see
//! the connector registry above this crate) can read it with the same positioned,
//! fix-bearing errors as every other key. [`Options::read`] gives an [`OptionsReader`]
//! whose getters mirror the parser's own.
//!
//! A configuration built in code (a benchmark, a test) makes its options with
//! [`Options::new`] and [`Options::set`]; errors about them then carry no line.

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use toml_edit::{Item, Table, Value};

use crate::error::{ConfigError, Located, Position};
use crate::reader::{Ctx, Field, Section, TableRef};

/// A connector's options: the table as written, and where it was written.
#[derive(Debug, Clone)]
pub struct Options {
    /// The file name used in messages.
    file: Arc<str>,
    /// The whole text of the file (empty for options built in code).
    text: Arc<str>,
    /// The item the options belong to, e.g. `[[source]] "bids"`.
    label: String,
    /// The options' own header, e.g. `[source.options]`.
    header: String,
    /// The options' header, or the item's when the options are absent.
    position: Position,
    table: Table,
}

impl Options {
    /// Empty options of `kind` (`source` or `sink`) named `name`, built in code.
    pub fn new(kind: &str, name: &str) -> Options {
        Options {
            file: Arc::from("<built in code>"),
            text: Arc::from(""),
            label: format!("[[{kind}]] \"{name}\""),
            header: format!("[{kind}.options]"),
            position: Position::new(1, 1),
            table: Table::new(),
        }
    }

    pub(crate) fn from_section(file: &Arc<str>, text: &Arc<str>, header: String, section: &Section<'_>) -> Options {
        let table = match section.table {
            TableRef::Table(table) => table.clone(),
            TableRef::Inline(inline) => inline.clone().into_table(),
        };
        Options {
            file: Arc::clone(file),
            text: Arc::clone(text),
            label: section.label.clone(),
            header,
            position: section.position,
            table,
        }
    }

    /// Sets `key` to `value` (options built in code).
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> &mut Options {
        self.table.insert(key, Item::Value(value.into()));
        self
    }

    /// The builder form of [`Options::set`].
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Options {
        self.set(key, value);
        self
    }

    /// The keys present, in file order.
    pub fn keys(&self) -> Vec<&str> {
        self.table.iter().map(|(key, _)| key).collect()
    }

    /// The file these options were read from, as named in messages.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The item the options belong to, e.g. `[[source]] "bids"`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Where the options (or their item) start.
    pub fn position(&self) -> Position {
        self.position
    }

    /// A reader that validates keys one by one and collects every error.
    pub fn read(&self) -> OptionsReader<'_> {
        let section = Section {
            label: self.label.clone(),
            sub: Some(self.header.clone()),
            table: TableRef::Table(&self.table),
            position: self.position,
        };
        OptionsReader { ctx: Ctx::new(&self.text, &self.file), section }
    }

    /// An error about the item these options belong to, at `position` (a key of the item
    /// such as `format`), prefixed by the item's label.
    pub fn item_error(&self, position: Position, message: &str, fix: &str) -> ConfigError {
        let fix = (!fix.is_empty()).then(|| fix.to_owned());
        ConfigError::new(&self.file, Some(position), format!("{}: {message}", self.label), fix)
    }
}

/// Reads an [`Options`] table key by key; every problem becomes a [`ConfigError`] naming
/// the key, its position, the value found and the fix. [`OptionsReader::finish`] returns
/// them all.
#[derive(Debug)]
pub struct OptionsReader<'a> {
    ctx: Ctx<'a>,
    section: Section<'a>,
}

impl<'a> OptionsReader<'a> {
    /// `key` as a string accepted by `valid`; `expect` completes "`key` must be …".
    pub fn string(
        &mut self,
        key: &str,
        expect: &str,
        fix: &str,
        valid: impl FnOnce(&str) -> bool,
    ) -> Field<Located<String>> {
        self.ctx.string(&self.section, key, expect, fix, valid)
    }

    /// `key` as an integer in `range`.
    pub fn integer<T: TryFrom<i64>>(&mut self, key: &str, range: RangeInclusive<i64>, fix: &str) -> Field<T> {
        self.ctx.integer(&self.section, key, range, fix)
    }

    /// `key` as a finite number > 0.
    pub fn positive_number(&mut self, key: &str, fix: &str) -> Field<f64> {
        self.ctx.positive_number(&self.section, key, fix)
    }

    /// `key` as true or false.
    pub fn boolean(&mut self, key: &str, fix: &str) -> Field<bool> {
        self.ctx.boolean(&self.section, key, fix)
    }

    /// `key` as a duration such as `"30s"`; zero only with `allow_zero`.
    pub fn duration(&mut self, key: &str, allow_zero: bool, fix: &str) -> Field<Duration> {
        self.ctx.duration(&self.section, key, allow_zero, fix)
    }

    /// `key` as one of the strings of `choices`.
    pub fn choice<T: Copy>(&mut self, key: &str, choices: &[(&str, T)]) -> Field<T> {
        self.ctx.choice(&self.section, key, choices)
    }

    /// `key` as a value accepted by `convert`.
    pub fn value<T>(
        &mut self,
        key: &str,
        expect: &str,
        fix: &str,
        convert: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Field<T> {
        self.ctx.value(&self.section, key, expect, fix, convert)
    }

    /// `key` as a table (`[….key]` or an inline table) whose values are strings,
    /// integers or booleans, each kept as its text (`true`, `42`), in file order: client
    /// settings passed through to a library. `valid_key` says which of its keys are
    /// allowed; `expect_key` completes "… must be …" for the others.
    pub fn string_table(
        &mut self,
        key: &str,
        expect_key: &str,
        fix: &str,
        valid_key: impl Fn(&str) -> bool,
    ) -> Field<Vec<(String, String)>> {
        let Some(entry) = self.section.entry(&self.ctx, key) else {
            return Field::Absent;
        };
        let Some(table) = crate::reader::TableRef::of(entry.item) else {
            let found = self.ctx.describe(entry.item);
            let message = format!("`{key}` must be a table of settings, found {found}");
            self.ctx.error_in(&self.section, entry.position, &message, fix);
            return Field::Invalid;
        };
        let mut settings = Vec::new();
        let mut valid = true;
        for (name, value) in table.entries() {
            let text = match value {
                Some(Value::String(s)) => Some(s.value().clone()),
                Some(Value::Integer(i)) => Some(i.value().to_string()),
                Some(Value::Boolean(b)) => Some(b.value().to_string()),
                _ => None,
            };
            let message = match text {
                None => {
                    let found = value.map_or_else(|| "a table".to_owned(), |v| format!("a {}", v.type_name()));
                    format!("`{key}.{name}` must be a string, an integer or a boolean, found {found}")
                }
                Some(_) if !valid_key(name) => format!("`{key}.{name}` is not allowed: {expect_key}"),
                Some(text) => {
                    settings.push((name.to_owned(), text));
                    continue;
                }
            };
            valid = false;
            self.ctx.error_in(&self.section, entry.position, &message, fix);
        }
        if valid { Field::Present(settings, entry.position) } else { Field::Invalid }
    }

    /// The value of a required key; records "missing required key" when absent.
    pub fn required<T>(&mut self, key: &str, field: Field<T>, fix: &str) -> Option<T> {
        self.ctx.required(&self.section, key, field, fix)
    }

    /// Records an error if `key` is present: it does not apply here (`why`). Returns
    /// whether it was present.
    pub fn forbid(&mut self, key: &str, why: &str, fix: &str) -> bool {
        self.ctx.forbid(&self.section, key, why, fix)
    }

    /// Records an error for every key not in `known` (with a suggestion when one is close).
    pub fn check_keys(&mut self, known: &[&str]) {
        self.ctx.check_keys(&self.section, known, &[]);
    }

    /// Records an error at `key` (or at the options' header when absent).
    pub fn error(&mut self, key: &str, message: &str, fix: &str) {
        let position = self.section.entry(&self.ctx, key).map_or(self.section.position, |entry| entry.position);
        self.ctx.error_in(&self.section, position, message, fix);
    }

    /// Records an error that is already built (e.g. about an item-level key).
    pub fn push(&mut self, error: ConfigError) {
        self.ctx.errors.push(error);
    }

    /// Whether `key` is present.
    pub fn has(&self, key: &str) -> bool {
        self.section.entry(&self.ctx, key).is_some()
    }

    /// Every error recorded, in the order found; empty when all was well.
    pub fn finish(self) -> Result<(), Vec<ConfigError>> {
        if self.ctx.errors.is_empty() { Ok(()) } else { Err(self.ctx.errors) }
    }
}
