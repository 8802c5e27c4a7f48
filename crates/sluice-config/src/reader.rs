//! A span-aware walk over the parsed TOML document.
//!
//! [`Ctx`] turns byte spans into line/column positions and collects errors; its typed
//! getters read one key of a [`Section`] and, when the value is missing, of the wrong
//! type or out of range, record an error naming the key, its position, the value
//! found and a fix.

use std::ops::{Range, RangeInclusive};
use std::time::Duration;

use toml_edit::{InlineTable, Item, Key, Table, Value};

use crate::error::{ConfigError, Located, Position};

/// The longest duration any setting or flag takes: ten years as the parser counts them
/// (`"10years"`, 365.25 days each). Every wait computes a deadline as now plus a
/// duration, which must stay representable; no real timeout or interval comes near this.
pub const MAX_DURATION: Duration = Duration::from_secs(3_652 * 24 * 60 * 60 + 12 * 60 * 60);

/// Parses a humantime duration (`"30s"`, `"1m"`, `"500ms"`, `"2h 30m"`) of at most
/// [`MAX_DURATION`]; the error says why not (clap prints it as a flag's error).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text.trim()).map_err(|error| format!("{text:?}: {error}"))?;
    if duration > MAX_DURATION {
        return Err(format!("{text:?} is longer than the longest duration taken, 10 years"));
    }
    Ok(duration)
}

/// A table written as `[header]` / `[[header]]` or inline as `{ ... }`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TableRef<'a> {
    Table(&'a Table),
    Inline(&'a InlineTable),
}

impl<'a> TableRef<'a> {
    /// The item as a table, if it is one.
    pub(crate) fn of(item: &'a Item) -> Option<Self> {
        match item {
            Item::Table(t) => Some(Self::Table(t)),
            Item::Value(Value::InlineTable(t)) => Some(Self::Inline(t)),
            _ => None,
        }
    }

    fn span(&self) -> Option<Range<usize>> {
        match self {
            Self::Table(t) => t.span(),
            Self::Inline(t) => t.span(),
        }
    }

    fn get(&self, key: &str) -> Option<(&'a Key, &'a Item)> {
        match self {
            Self::Table(t) => t.get_key_value(key),
            Self::Inline(t) => t.get_key_value(key),
        }
    }

    /// The entries, in file order, with their values (`None`: a table, not a value).
    pub(crate) fn entries(&self) -> Vec<(&'a str, Option<&'a Value>)> {
        match self {
            Self::Table(t) => t.iter().map(|(k, item)| (k, item.as_value())).collect(),
            Self::Inline(t) => t.iter().map(|(k, v)| (k, Some(v))).collect(),
        }
    }

    fn keys(&self) -> Vec<&'a str> {
        match self {
            Self::Table(t) => t.iter().map(|(k, _)| k).collect(),
            Self::Inline(t) => t.iter().map(|(k, _)| k).collect(),
        }
    }
}

/// A table being read, with the words that name it in messages.
#[derive(Debug, Clone)]
pub(crate) struct Section<'a> {
    /// The section or item, e.g. `[pipeline]` or `[[source]] "bids"`; for a nested
    /// table, the item it belongs to.
    pub(crate) label: String,
    /// A nested table's own header, e.g. `[source.options]`.
    pub(crate) sub: Option<String>,
    pub(crate) table: TableRef<'a>,
    /// The header (or the table's first position known); where "missing key" points.
    pub(crate) position: Position,
}

impl Section<'_> {
    /// The label of a table nested in this one: its own header at the top level,
    /// this item's label otherwise.
    pub(crate) fn nested_label(&self, header: &str) -> String {
        if self.label == TOP_LEVEL { header.to_owned() } else { self.label.clone() }
    }

    fn nested_sub(&self, header: &str) -> Option<String> {
        (self.label != TOP_LEVEL).then(|| header.to_owned())
    }
}

/// One key of a section, found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry<'a> {
    /// Position of the key.
    pub(crate) position: Position,
    pub(crate) item: &'a Item,
}

impl<'a> Section<'a> {
    pub(crate) fn entry(&self, ctx: &Ctx<'_>, key: &str) -> Option<Entry<'a>> {
        let (k, item) = self.table.get(key)?;
        if item.is_none() {
            return None;
        }
        let position = ctx.span_position(k.span()).or_else(|| ctx.span_position(item.span())).unwrap_or(self.position);
        Some(Entry { position, item })
    }
}

/// The outcome of reading an optional key.
#[derive(Debug, Clone)]
pub enum Field<T> {
    Absent,
    /// Present but wrong; the error is recorded.
    Invalid,
    /// Present and valid, with the position of its key.
    Present(T, Position),
}

impl<T> Field<T> {
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Field<U> {
        match self {
            Self::Absent => Field::Absent,
            Self::Invalid => Field::Invalid,
            Self::Present(v, p) => Field::Present(f(v), p),
        }
    }

    /// The value, or `default` when absent; `None` when invalid.
    pub fn or(self, default: T) -> Option<T> {
        self.or_else(|| default)
    }

    pub fn or_else(self, default: impl FnOnce() -> T) -> Option<T> {
        match self {
            Self::Absent => Some(default()),
            Self::Invalid => None,
            Self::Present(v, _) => Some(v),
        }
    }

    /// `Some(Some(v))` present, `Some(None)` absent, `None` invalid.
    pub fn optional(self) -> Option<Option<T>> {
        self.map(Some).or(None)
    }

    pub fn is_present(&self) -> bool {
        matches!(self, Self::Present(..))
    }
}

/// Reading state: the text, its line index and the errors found so far.
#[derive(Debug)]
pub(crate) struct Ctx<'t> {
    pub(crate) file: &'t str,
    text: &'t str,
    line_starts: Vec<usize>,
    pub(crate) errors: Vec<ConfigError>,
    /// Keys suggested for unknown keys, by section position: a missing key that was
    /// suggested is not reported again as missing.
    suggested: Vec<(Position, String)>,
}

impl<'t> Ctx<'t> {
    pub(crate) fn new(text: &'t str, file: &'t str) -> Self {
        let line_starts = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        Self { file, text, line_starts, errors: Vec::new(), suggested: Vec::new() }
    }

    /// The text being read.
    pub(crate) fn text(&self) -> &'t str {
        self.text
    }

    /// The 1-based line and column of a byte offset.
    pub(crate) fn position(&self, offset: usize) -> Position {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|&start| start <= offset);
        let start = self.line_starts.get(line.saturating_sub(1)).copied().unwrap_or(0);
        let column = self.text.get(start..offset).map_or(offset - start, |s| s.chars().count());
        Position::new(line.max(1), column + 1)
    }

    pub(crate) fn span_position(&self, span: Option<Range<usize>>) -> Option<Position> {
        span.map(|s| self.position(s.start))
    }

    /// Position of a table's header, falling back to `fallback`.
    pub(crate) fn table_position(&self, table: TableRef<'_>, fallback: Position) -> Position {
        self.span_position(table.span()).unwrap_or(fallback)
    }

    /// Position of the first character of a string value's content.
    fn content_position(&self, span: Option<Range<usize>>) -> Option<Position> {
        let span = span?;
        let raw = self.text.get(span.clone())?;
        let mut offset = span.start;
        if raw.starts_with("\"\"\"") || raw.starts_with("'''") {
            offset += 3;
            let rest = self.text.get(offset..)?;
            if rest.starts_with("\r\n") {
                offset += 2;
            } else if rest.starts_with('\n') {
                offset += 1;
            }
        } else {
            offset += 1;
        }
        Some(self.position(offset))
    }

    /// Records an error.
    pub(crate) fn error(&mut self, position: Option<Position>, message: String, fix: &str) {
        let fix = (!fix.is_empty()).then(|| fix.to_owned());
        self.errors.push(ConfigError::new(self.file, position, message, fix));
    }

    /// Records an error in a section, prefixed by the section's label.
    pub(crate) fn error_in(&mut self, sec: &Section<'_>, position: Position, message: &str, fix: &str) {
        self.error(Some(position), format!("{}: {message}", sec.label), fix);
    }

    /// How a value is shown in messages: its source text, shortened.
    pub(crate) fn describe(&self, item: &Item) -> String {
        let raw = match item {
            Item::Value(v) => v.span().and_then(|s| self.text.get(s)),
            _ => None,
        };
        match (raw, item) {
            (Some(raw), _) => shorten(raw),
            (None, Item::Value(v)) => format!("a {}", v.type_name()),
            (None, Item::Table(_)) => "a table".to_owned(),
            (None, Item::ArrayOfTables(_)) => "an array of tables".to_owned(),
            (None, Item::None) => "nothing".to_owned(),
        }
    }

    /// Reads `key` as a value accepted by `convert`; `expect` completes
    /// "`key` must be ..." when it is not.
    pub(crate) fn value<'a, T>(
        &mut self,
        sec: &Section<'a>,
        key: &str,
        expect: &str,
        fix: &str,
        convert: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Field<T> {
        let Some(entry) = sec.entry(self, key) else {
            return Field::Absent;
        };
        match entry.item.as_value().and_then(convert) {
            Some(v) => Field::Present(v, entry.position),
            None => {
                let found = self.describe(entry.item);
                let message = format!("`{key}` must be {expect}, found {found}");
                self.error_in(sec, entry.position, &message, fix);
                Field::Invalid
            }
        }
    }

    /// Reads `key` as an integer in `range`, converted to `T`.
    pub(crate) fn integer<T: TryFrom<i64>>(
        &mut self,
        sec: &Section<'_>,
        key: &str,
        range: RangeInclusive<i64>,
        fix: &str,
    ) -> Field<T> {
        let expect = if *range.end() == i64::MAX {
            format!("an integer >= {}", range.start())
        } else {
            format!("an integer in {}..={}", range.start(), range.end())
        };
        self.value(sec, key, &expect, fix, |v| {
            v.as_integer().filter(|n| range.contains(n)).and_then(|n| T::try_from(n).ok())
        })
    }

    /// Reads `key` as a finite number (integer or float) > 0.
    pub(crate) fn positive_number(&mut self, sec: &Section<'_>, key: &str, fix: &str) -> Field<f64> {
        self.value(sec, key, "a number > 0", fix, |v| {
            let n = v.as_float().or_else(|| v.as_integer().map(|n| n as f64))?;
            (n.is_finite() && n > 0.0).then_some(n)
        })
    }

    /// Reads `key` as a boolean.
    pub(crate) fn boolean(&mut self, sec: &Section<'_>, key: &str, fix: &str) -> Field<bool> {
        self.value(sec, key, "true or false", fix, Value::as_bool)
    }

    /// Reads `key` as a string accepted by `valid`, with its content position.
    pub(crate) fn string(
        &mut self,
        sec: &Section<'_>,
        key: &str,
        expect: &str,
        fix: &str,
        valid: impl FnOnce(&str) -> bool,
    ) -> Field<Located<String>> {
        let field =
            self.value(sec, key, expect, fix, |v| v.as_str().filter(|s| valid(s)).map(|s| (s.to_owned(), v.span())));
        match field {
            Field::Present((s, span), key_position) => {
                let position = self.content_position(span).unwrap_or(key_position);
                Field::Present(Located::new(s, position), key_position)
            }
            Field::Absent => Field::Absent,
            Field::Invalid => Field::Invalid,
        }
    }

    /// Reads `key` as a humantime duration (`"30s"`, `"1m"`, `"500ms"`), at most
    /// [`MAX_DURATION`].
    pub(crate) fn duration(&mut self, sec: &Section<'_>, key: &str, allow_zero: bool, fix: &str) -> Field<Duration> {
        let expect = if allow_zero {
            "a duration such as \"4s\", \"1m\" or \"500ms\" (at most 10 years)"
        } else {
            "a duration > 0 such as \"30s\", \"1m\" or \"500ms\" (at most 10 years)"
        };
        self.value(sec, key, expect, fix, |v| {
            let d = parse_duration(v.as_str()?).ok()?;
            (allow_zero || !d.is_zero()).then_some(d)
        })
    }

    /// Reads `key` as one of the strings in `options`.
    pub(crate) fn choice<T: Copy>(&mut self, sec: &Section<'_>, key: &str, options: &[(&str, T)]) -> Field<T> {
        let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
        let list = quoted_list(&names);
        let found = sec.entry(self, key).and_then(|e| e.item.as_str().map(str::to_owned));
        let fix = match found.as_deref().and_then(|s| suggest(s, &names)) {
            Some(close) => format!("did you mean {key} = \"{close}\"?"),
            None => format!("set {key} to one of {list}"),
        };
        let expect = format!("one of {list}");
        self.value(sec, key, &expect, &fix, |v| {
            let s = v.as_str()?;
            options.iter().find(|(name, _)| *name == s).map(|(_, t)| *t)
        })
    }

    /// Records a missing-key error (at the section header) when `field` is absent.
    pub(crate) fn required<T>(&mut self, sec: &Section<'_>, key: &str, field: Field<T>, fix: &str) -> Option<T> {
        match field {
            Field::Present(v, _) => Some(v),
            Field::Invalid => None,
            Field::Absent if self.was_suggested(sec, key) => None,
            Field::Absent => {
                let message = match &sec.sub {
                    Some(sub) => format!("missing required key `{key}` in {sub}"),
                    None => format!("missing required key `{key}`"),
                };
                self.error_in(sec, sec.position, &message, fix);
                None
            }
        }
    }

    /// Whether an unknown key of `sec` was taken for a misspelt `key`.
    pub(crate) fn was_suggested(&self, sec: &Section<'_>, key: &str) -> bool {
        self.suggested.iter().any(|(at, k)| *at == sec.position && k == key)
    }

    /// Records an error if `key` is present: it does not apply here (`why`).
    pub(crate) fn forbid(&mut self, sec: &Section<'_>, key: &str, why: &str, fix: &str) -> bool {
        match sec.entry(self, key) {
            Some(entry) => {
                let found = self.describe(entry.item);
                let message = format!("`{key}` is not allowed here ({why}), found {found}");
                self.error_in(sec, entry.position, &message, fix);
                true
            }
            None => false,
        }
    }

    /// Records an error for each key of `sec` not in `known`. `notes` give a fix for
    /// keys that are recognised but not supported.
    pub(crate) fn check_keys(&mut self, sec: &Section<'_>, known: &[&str], notes: &[(&str, &str)]) {
        for key in sec.table.keys() {
            if known.contains(&key) {
                continue;
            }
            let position = sec.entry(self, key).map_or(sec.position, |e| e.position);
            let place = match &sec.sub {
                _ if sec.label == TOP_LEVEL => "at the top level".to_owned(),
                Some(sub) => format!("in {sub} of {}", sec.label),
                None => format!("in {}", sec.label),
            };
            let message = if known.is_empty() {
                format!("unknown key `{key}` {place}; this connector takes no options")
            } else {
                format!("unknown key `{key}` {place}; known keys: {}", known.join(", "))
            };
            let close = suggest(key, known);
            if let Some(close) = close {
                self.suggested.push((sec.position, close.to_owned()));
            }
            let fix = match (notes.iter().find(|(k, _)| *k == key), close) {
                (Some((_, note)), _) => (*note).to_owned(),
                (None, Some(close)) => format!("did you mean `{close}`?"),
                (None, None) => format!("remove `{key}`"),
            };
            self.error(Some(position), message, &fix);
        }
    }

    /// The table at `key` of `sec`, whose header is `header` (e.g. `[pipeline]`,
    /// `[source.options]`), if present and a table; records an error if it is
    /// something else.
    pub(crate) fn subtable<'a>(
        &mut self,
        sec: &Section<'a>,
        key: &str,
        header: &str,
        fix: &str,
    ) -> Option<Section<'a>> {
        let entry = sec.entry(self, key)?;
        match TableRef::of(entry.item) {
            Some(table) => Some(Section {
                label: sec.nested_label(header),
                sub: sec.nested_sub(header),
                table,
                position: self.table_position(table, entry.position),
            }),
            None => {
                let found = self.describe(entry.item);
                let message = format!("`{key}` must be a table ({header}), found {found}");
                self.error_in(sec, entry.position, &message, fix);
                None
            }
        }
    }
}

/// The label of the document's root table.
pub(crate) const TOP_LEVEL: &str = "top level";

/// `"a", "b", "c"`.
pub(crate) fn quoted_list(names: &[&str]) -> String {
    names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ")
}

/// The closest candidate within edit distance 2, if any. A candidate of 4 characters
/// or fewer must be within distance 1 (`rate` is not a misspelt `name`).
pub fn suggest<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let word = word.to_ascii_lowercase();
    candidates
        .iter()
        .map(|c| (edit_distance(&word, &c.to_ascii_lowercase()), *c))
        .filter(|(d, c)| *d <= 2 && 2 * d < c.chars().count())
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Edit distance counting an insertion, a deletion, a substitution or a swap of two
/// adjacent characters as one edit (optimal string alignment), in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // d[i][j]: distance between a[..i] and b[..j].
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// A value's source text on one line, at most 60 characters.
fn shorten(raw: &str) -> String {
    let flat = raw.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= 60 {
        flat
    } else {
        let head: String = flat.chars().take(57).collect();
        format!("{head}...")
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_and_suggestions() {
        assert_eq!(edit_distance("rate", "rate"), 0);
        assert_eq!(edit_distance("rat", "rate"), 1);
        assert_eq!(edit_distance("evnets", "events"), 1);
        assert_eq!(edit_distance("form", "from"), 1);
        assert_eq!(edit_distance("fromat", "format"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(suggest("conector", &["name", "connector"]), Some("connector"));
        assert_eq!(suggest("Name", &["name", "connector"]), Some("name"));
        assert_eq!(suggest("checkpoint", &["pipeline", "source"]), None);
        assert_eq!(suggest("rate", &["name", "connector"]), None);
        assert_eq!(suggest("pth", &["path", "mode"]), Some("path"));
        assert_eq!(suggest("shutdown_timout", &["shutdown_timeout"]), Some("shutdown_timeout"));
    }

    #[test]
    fn positions_count_lines_and_characters() {
        let ctx = Ctx::new("ab\né = 1\n", "p.toml");
        assert_eq!(ctx.position(0), Position::new(1, 1));
        assert_eq!(ctx.position(3), Position::new(2, 1));
        // 'é' is two bytes: the '=' after "é " is the third character.
        assert_eq!(ctx.position(6), Position::new(2, 3));
        assert_eq!(ctx.position(100), Position::new(3, 1));
    }

    #[test]
    fn identifiers_and_shortening() {
        assert!(is_identifier("_a1"));
        assert!(!is_identifier("1a"));
        assert!(!is_identifier("a-b"));
        assert!(!is_identifier(""));
        assert_eq!(shorten("\"\"\"\nSELECT\n  1\"\"\""), "\"\"\" SELECT 1\"\"\"");
        assert_eq!(shorten(&"x".repeat(70)).len(), 60);
    }
}
