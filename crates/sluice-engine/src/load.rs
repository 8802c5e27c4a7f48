//! From a pipeline file to a validated [`Pipeline`]: the configuration parsed, every
//! connector configured through the registry, and the SQL namespace checked.
//!
//! Every problem found is returned at once, in file order, each with its position and
//! fix: a syntax error stops parsing, but otherwise a user fixes the whole file in one
//! pass.

use std::path::{Path, PathBuf};

use sluice_config::{ConfigError, PipelineConfig, Position};
use sluice_connectors::{ConfiguredSink, ConfiguredSource, Registry};
use sluice_types::SluiceError;

use crate::error::EngineError;

/// The largest pipeline file read (a pipeline is a page of TOML, not a data file).
pub const PIPELINE_BYTES_MAX: u64 = 16 << 20;

/// Settings given on the command line that win over the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Driver threads per worker, over `[pipeline] threads`.
    pub threads: Option<u32>,
}

/// The engine: the connectors it knows, and the entry points that use them.
#[derive(Debug, Default)]
pub struct Engine {
    registry: Registry,
}

/// A validated pipeline: its configuration and its configured connectors.
pub struct Pipeline {
    pub config: PipelineConfig,
    /// The file as named by the caller, for messages (`pipeline.toml`).
    pub file: String,
    /// Where relative paths of the pipeline start: the file's directory.
    pub base_dir: PathBuf,
    pub(crate) sources: Vec<Box<dyn ConfiguredSource>>,
    pub(crate) sinks: Vec<Box<dyn ConfiguredSink>>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline").field("file", &self.file).field("config", &self.config).finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine with the given connectors.
    pub fn new(registry: Registry) -> Engine {
        Engine { registry }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Reads, parses and validates the pipeline file at `path`.
    pub fn load(&self, path: &Path, overrides: Overrides) -> Result<Pipeline, EngineError> {
        let text = read_pipeline_file(path)?;
        let base_dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        self.parse(&text, &path.display().to_string(), &base_dir, overrides)
    }

    /// Parses and validates pipeline text; `file` names it in messages, `base_dir` is
    /// where its relative paths start.
    pub fn parse(
        &self,
        text: &str,
        file: &str,
        base_dir: &Path,
        overrides: Overrides,
    ) -> Result<Pipeline, EngineError> {
        match sluice_config::parse_partial(text, file) {
            (Some(config), errors) => self.validate(config, errors, file, base_dir, overrides),
            (None, errors) if errors.is_empty() => {
                Err(EngineError::from(vec![ConfigError::new(file, None, "invalid pipeline file", None)]))
            }
            (None, errors) => Err(EngineError::from(errors)),
        }
    }

    /// Validates a configuration built in code (or parsed elsewhere).
    pub fn configure(
        &self,
        config: PipelineConfig,
        file: &str,
        base_dir: &Path,
        overrides: Overrides,
    ) -> Result<Pipeline, EngineError> {
        self.validate(config, Vec::new(), file, base_dir, overrides)
    }

    /// Configures every connector of `config`, adding its problems to `errors` (those the
    /// parser found), and checks the SQL namespace once all is well.
    fn validate(
        &self,
        mut config: PipelineConfig,
        mut errors: Vec<ConfigError>,
        file: &str,
        base_dir: &Path,
        overrides: Overrides,
    ) -> Result<Pipeline, EngineError> {
        if let Some(threads) = overrides.threads {
            config.pipeline.threads = threads;
        }
        let mut sources = Vec::new();
        for source in &config.sources {
            match self.registry.configure_source(source) {
                Ok(configured) => sources.push(configured),
                Err(found) => errors.extend(found),
            }
        }
        let mut sinks = Vec::new();
        for sink in &config.sinks {
            match self.registry.configure_sink(sink) {
                Ok(configured) => sinks.push(configured),
                Err(found) => errors.extend(found),
            }
        }
        if errors.is_empty() {
            errors.extend(namespace_problems(&config, &sources, file));
        }
        if !errors.is_empty() {
            errors.sort_by_key(|e| e.position);
            errors.dedup();
            return Err(EngineError::from(errors));
        }
        Ok(Pipeline { config, file: file.to_owned(), base_dir: base_dir.to_path_buf(), sources, sinks })
    }
}

impl Pipeline {
    /// The driver threads this pipeline runs on.
    pub fn threads(&self) -> u32 {
        self.config.pipeline.threads
    }

    /// Whether a sink writes to this process's standard output.
    pub fn writes_stdout(&self) -> bool {
        self.sinks.iter().any(|sink| sink.writes_stdout())
    }

    /// A problem located at `position` of this pipeline's file.
    pub(crate) fn problem(&self, position: Position, error: SluiceError) -> EngineError {
        EngineError::at(&self.file, Some(position), error)
    }
}

fn read_pipeline_file(path: &Path) -> Result<String, EngineError> {
    let unreadable = |reason: String| {
        EngineError::new(
            SluiceError::user("config.file", format!("cannot read pipeline file {}: {reason}", path.display()))
                .with_fix("check the path; `sluice run --help` shows usage"),
        )
    };
    let metadata = std::fs::metadata(path).map_err(|e| unreadable(e.to_string()))?;
    if metadata.is_dir() {
        return Err(unreadable("it is a directory".into()));
    }
    if metadata.len() > PIPELINE_BYTES_MAX {
        return Err(unreadable(format!(
            "it has {} bytes, more than a pipeline file may have ({PIPELINE_BYTES_MAX})",
            metadata.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| unreadable(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        unreadable(format!("it is not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to()))
    })?;
    Ok(text.strip_prefix('\u{feff}').map(str::to_owned).unwrap_or(text))
}

/// A table name claimed by a source (as a table it provides) or a view.
struct Claim<'c> {
    name: String,
    /// e.g. `[[source]] "nx"`.
    label: String,
    position: Position,
    /// Names a source's table that differs from the source's own name.
    provided_by: Option<&'c str>,
}

/// Tables provided under names other than their source's (nexmark's person, auction
/// and bid) must not collide with another source's table or a view. (Source and view
/// names among themselves are checked by the configuration parser.)
fn namespace_problems(config: &PipelineConfig, sources: &[Box<dyn ConfiguredSource>], file: &str) -> Vec<ConfigError> {
    let mut claims: Vec<Claim<'_>> = Vec::new();
    for (source, configured) in config.sources.iter().zip(sources) {
        let label = format!("[[source]] \"{}\"", source.name);
        for table in configured.tables() {
            let provided_by = (!table.eq_ignore_ascii_case(&source.name)).then_some(source.name.as_str());
            claims.push(Claim { name: table, label: label.clone(), position: source.position, provided_by });
        }
    }
    for view in &config.views {
        let label = format!("[[view]] \"{}\"", view.name);
        claims.push(Claim { name: view.name.clone(), label, position: view.position, provided_by: None });
    }
    let mut problems = Vec::new();
    for (index, later) in claims.iter().enumerate() {
        let Some(first) = claims[..index].iter().find(|c| c.name.eq_ignore_ascii_case(&later.name)) else { continue };
        if first.provided_by.is_none() && later.provided_by.is_none() {
            continue; // Reported by the parser as a duplicate name.
        }
        if first.label == later.label {
            continue;
        }
        let message = match (first.provided_by, later.provided_by) {
            (Some(source), _) => format!(
                "{}: name \"{}\" is a table of source \"{source}\" (line {})",
                later.label, later.name, first.position.line
            ),
            (None, Some(_)) => format!(
                "{}: its table \"{}\" is already the name of {} (line {})",
                later.label, later.name, first.label, first.position.line
            ),
            (None, None) => unreachable!("skipped above"),
        };
        let fix = "choose another name (or use a single source for these tables)".to_owned();
        problems.push(ConfigError::new(file, Some(later.position), message, Some(fix)));
    }
    dedupe_by_position(problems)
}

/// One problem per item: a second nexmark source collides three times.
fn dedupe_by_position(problems: Vec<ConfigError>) -> Vec<ConfigError> {
    let mut kept: Vec<ConfigError> = Vec::new();
    for problem in problems {
        if !kept.iter().any(|k| k.position == problem.position) {
            kept.push(problem);
        }
    }
    kept
}
