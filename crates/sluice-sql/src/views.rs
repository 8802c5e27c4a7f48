//! The order of views: a view reads the sources and the views defined above it.
//!
//! Views are planned in file order, so a view that reads a view defined below it (or
//! itself, or a cycle of views) would only get DataFusion's "table does not exist". The
//! caller declares every view up front ([`crate::SqlPlanner::declare_views`]) with a
//! location text; when a view reads a declared view that is not planned yet, the message
//! says which view reads which, where the other is, and whether moving it helps (it is
//! defined below) or not (the views form a cycle, which cannot be planned).
//!
//! Finding a cycle parses the declared views below (each once, only on this error path),
//! bounded by the number of declared views.

use std::collections::{BTreeMap, VecDeque};

use sluice_types::SluiceError;

use crate::{ast, tvf};

/// A view as the pipeline file declares it, before any view is planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewDeclaration {
    pub name: String,
    pub sql: String,
    /// Where the view is defined, for messages, e.g. `line 12`.
    pub location: String,
}

/// Every declared view, in file order.
#[derive(Debug, Default)]
pub(crate) struct DeclaredViews {
    views: Vec<ViewDeclaration>,
}

impl DeclaredViews {
    pub fn declare(&mut self, views: impl IntoIterator<Item = ViewDeclaration>) {
        self.views.extend(views);
    }

    fn get(&self, name: &str) -> Option<&ViewDeclaration> {
        self.views.iter().find(|view| view.name == name)
    }

    /// The error for view `reader` reading `read`, which is not planned yet; None when
    /// `read` is not a declared view, or one declared above `reader` (a view that failed
    /// to plan): DataFusion then names the unknown table.
    pub fn misordered(&self, reader: &str, read: &str) -> Option<SluiceError> {
        let position = |name: &str| self.views.iter().position(|view| view.name == name);
        if let (Some(reader_at), Some(read_at)) = (position(reader), position(read))
            && read_at < reader_at
        {
            return None;
        }
        let read_view = self.get(read)?;
        let at = |name: &str| self.get(name).map_or(String::new(), |view| format!(" ({})", view.location));
        if read == reader {
            return Some(
                SluiceError::user("sql.view_cycle", format!("view `{reader}`{} reads itself", at(reader)))
                    .with_fix("a cycle of views cannot be planned: read sources or the views defined above it"),
            );
        }
        if let Some(path) = self.path(read, reader) {
            let mut text = format!("views read each other in a cycle: `{reader}`{}", at(reader));
            for view in &path {
                text.push_str(&format!(" reads `{view}`{}, which", at(view)));
            }
            text.push_str(&format!(" reads `{reader}`"));
            return Some(SluiceError::user("sql.view_cycle", text).with_fix(
                "a cycle of views cannot be planned: change one of them so that each view reads only sources \
                 and views defined above it",
            ));
        }
        Some(
            SluiceError::user(
                "sql.view_order",
                format!(
                    "view `{reader}`{} reads view `{read}`, which is defined below it ({})",
                    at(reader),
                    read_view.location
                ),
            )
            .with_fix(format!(
                "move view `{read}` above view `{reader}`: a view reads only sources and views defined above it"
            )),
        )
    }

    /// The declared views from `from` to one that reads `to`, each reading the next
    /// (breadth first: a shortest chain); None when no chain reaches `to`.
    fn path(&self, from: &str, to: &str) -> Option<Vec<String>> {
        let mut came_from: BTreeMap<String, Option<String>> = BTreeMap::new();
        came_from.insert(from.to_string(), None);
        let mut queue = VecDeque::from([from.to_string()]);
        while let Some(view) = queue.pop_front() {
            let Some(declared) = self.get(&view) else { continue };
            for read in reads(&declared.sql) {
                if read == to {
                    let mut path = vec![view.clone()];
                    while let Some(Some(previous)) = came_from.get(path.last()?) {
                        path.push(previous.clone());
                    }
                    path.reverse();
                    return Some(path);
                }
                if self.get(&read).is_some() && !came_from.contains_key(&read) {
                    came_from.insert(read.clone(), Some(view.clone()));
                    queue.push_back(read);
                }
            }
        }
        None
    }
}

/// The tables and views a view's SQL reads (nothing when it does not parse).
pub(crate) fn reads(sql: &str) -> Vec<String> {
    let Ok((rewritten, calls)) = tvf::rewrite(sql, 0) else { return Vec::new() };
    let Ok(shape) = ast::shape(&rewritten) else { return Vec::new() };
    let mut reads: Vec<String> = calls.into_iter().map(|call| call.input).collect();
    reads.extend(shape.relations);
    reads.retain(|name| !shape.ctes.contains(name));
    reads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(views: &[(&str, &str)]) -> DeclaredViews {
        let mut declared = DeclaredViews::default();
        declared.declare(views.iter().enumerate().map(|(index, (name, sql))| ViewDeclaration {
            name: name.to_string(),
            sql: sql.to_string(),
            location: format!("line {}", 10 * (index + 1)),
        }));
        declared
    }

    fn check(views: &[(&str, &str)], reader: &str, read: &str, expected: &str) {
        let error = declared(views).misordered(reader, read).expect("an error");
        assert_eq!(error.to_string(), expected);
    }

    #[test]
    fn below_self_and_cycles_are_told_apart() {
        let views = [
            ("a", "SELECT * FROM b"),
            ("b", "SELECT * FROM TABLE(TUMBLE(TABLE c, DESCRIPTOR(ts), INTERVAL '1' SECOND))"),
            ("c", "WITH x AS (SELECT * FROM src) SELECT * FROM x WHERE k IN (SELECT k FROM a)"),
            ("d", "SELECT * FROM d"),
            ("e", "SELECT * FROM src"),
        ];
        check(
            &views,
            "a",
            "b",
            "views read each other in a cycle: `a` (line 10) reads `b` (line 20), which reads `c` (line 30), \
             which reads `a`\n  fix: a cycle of views cannot be planned: change one of them so that each view reads \
             only sources and views defined above it",
        );
        check(
            &views,
            "d",
            "d",
            "view `d` (line 40) reads itself\n  fix: a cycle of views cannot be planned: read sources or the views \
             defined above it",
        );
        check(
            &views,
            "a",
            "e",
            "view `a` (line 10) reads view `e`, which is defined below it (line 50)\n  fix: move view `e` above \
             view `a`: a view reads only sources and views defined above it",
        );
        assert!(declared(&views).misordered("a", "src").is_none(), "not a view: DataFusion's message");
        assert!(declared(&views).misordered("e", "a").is_none(), "above: it failed to plan, not misordered");
    }
}
