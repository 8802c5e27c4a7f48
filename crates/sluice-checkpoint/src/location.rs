//! From a store URL to a configured object-store backend.
//!
//! Accepted forms:
//! - `file:///abs/path`, `file://./relative` (resolved against the caller's base directory,
//!   normally the directory of `pipeline.toml`), or a bare path: a local directory through
//!   `object_store`'s `LocalFileSystem` **with fsync enabled**, so a write is durable (file
//!   contents and every directory entry up to the first pre-existing ancestor) when it
//!   returns;
//! - `s3://bucket/prefix` (and `s3a://`): `AmazonS3`, configured from the usual `AWS_*`
//!   environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//!   `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, ...), then from explicit options, which win.
//!
//! Both kinds are addressed the same way afterwards: a backend plus a key prefix; every
//! name inside the store is relative to that prefix. Opening performs no I/O and creates
//! nothing. Every request is bounded: a per-request timeout and a bounded number of retries
//! with exponential backoff for transient errors (the constants below).

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreScheme, RetryConfig};
use sluice_types::SluiceError;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use url::Url;

/// The longest one HTTP request may take before it counts as failed (and may be retried).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest establishing a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a transient failure (5xx, throttling, a reset connection) is retried.
pub const RETRIES_MAX: usize = 4;
/// No retry starts later than this after the first attempt.
pub const RETRY_WINDOW: Duration = Duration::from_secs(45);
/// The first backoff; each next one doubles, up to [`BACKOFF_MAX`].
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// The longest single backoff.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

const URL_FIX: &str = "use file:///absolute/path, file://./relative/path, a plain path, or s3://bucket/prefix";

/// A backend and where inside it the store lives.
#[derive(Debug)]
pub(crate) struct Location {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// Prepended to every name inside the store.
    pub(crate) prefix: StorePath,
    /// The directory of a local store (for removing empty directories), `None` for S3.
    pub(crate) local_root: Option<PathBuf>,
    /// The resolved URL, shown in messages.
    pub(crate) url: String,
}

/// Resolves `url` (see the module doc); `options` are object-store configuration keys such
/// as `aws_endpoint`, applied after the environment.
pub(crate) fn resolve(url: &str, base_dir: &Path, options: &[(String, String)]) -> Result<Location, SluiceError> {
    let trimmed = url.trim();
    if trimmed.is_empty() {
        return Err(bad_url(url, "it is empty"));
    }
    if let Some(rest) = trimmed.strip_prefix("file://") {
        return local(&file_url_path(trimmed, rest, base_dir)?, url, options);
    }
    if !trimmed.contains("://") {
        return local(&base_dir.join(trimmed), url, options);
    }
    let parsed = Url::parse(trimmed).map_err(|error| bad_url(url, &error.to_string()))?;
    match ObjectStoreScheme::parse(&parsed) {
        Ok((ObjectStoreScheme::AmazonS3, _)) if parsed.scheme().starts_with("s3") => s3(trimmed, options),
        Ok((ObjectStoreScheme::Local, _)) => {
            let path = parsed.to_file_path().map_err(|()| bad_url(url, "it is not a local path"))?;
            local(&path, url, options)
        }
        Ok(_) | Err(_) => Err(bad_url(url, &format!("the scheme {:?} is not supported", parsed.scheme()))),
    }
}

/// The directory of `file://{rest}`: absolute, or relative to `base_dir` when it starts
/// with `.`; a host name is refused.
fn file_url_path(url: &str, rest: &str, base_dir: &Path) -> Result<PathBuf, SluiceError> {
    if rest.starts_with('/') {
        let parsed = Url::parse(url).map_err(|error| bad_url(url, &error.to_string()))?;
        return parsed.to_file_path().map_err(|()| bad_url(url, "it is not a local path"));
    }
    let relative = rest == "." || rest == ".." || rest.starts_with("./") || rest.starts_with("../");
    if relative {
        return Ok(base_dir.join(rest));
    }
    Err(bad_url(url, "a file URL takes an absolute path (file:///dir) or a relative one (file://./dir)"))
}

fn local(path: &Path, url: &str, options: &[(String, String)]) -> Result<Location, SluiceError> {
    if let Some((key, _)) = options.first() {
        return Err(bad_url(url, &format!("option {key:?} applies to object stores, not local directories")));
    }
    let absolute = std::path::absolute(path).map_err(|error| bad_url(url, &error.to_string()))?;
    let root = normalize(&absolute);
    if root.is_file() {
        return Err(bad_url(url, &format!("{} is a file, not a directory", root.display())));
    }
    let prefix = StorePath::from_absolute_path(&root).map_err(|error| bad_url(url, &error.to_string()))?;
    let shown = Url::from_file_path(&root).map_or_else(|()| format!("file://{}", root.display()), |u| u.to_string());
    let store = LocalFileSystem::new().with_fsync(true);
    Ok(Location { store: Arc::new(store), prefix, local_root: Some(root), url: shown })
}

/// Removes `.` and resolves `..` lexically (the directory may not exist yet).
fn normalize(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                normal.pop();
            }
            other => normal.push(other),
        }
    }
    normal
}

fn s3(url: &str, options: &[(String, String)]) -> Result<Location, SluiceError> {
    let timeouts = [(ClientConfigKey::Timeout, REQUEST_TIMEOUT), (ClientConfigKey::ConnectTimeout, CONNECT_TIMEOUT)];
    let mut builder = AmazonS3Builder::from_env();
    for (key, duration) in timeouts {
        builder = builder.with_config(AmazonS3ConfigKey::Client(key), format!("{}ms", duration.as_millis()));
    }
    for (key, value) in options {
        let parsed: AmazonS3ConfigKey = key.to_ascii_lowercase().parse().map_err(|_| {
            bad_url(url, &format!("{key:?} is not an S3 option"))
                .with_fix("use the names of the AWS_* variables in lower case, e.g. aws_endpoint")
        })?;
        builder = builder.with_config(parsed, value);
    }
    let retry = RetryConfig {
        backoff: BackoffConfig { init_backoff: BACKOFF_INITIAL, max_backoff: BACKOFF_MAX, base: 2.0 },
        max_retries: RETRIES_MAX,
        retry_timeout: RETRY_WINDOW,
    };
    let store = builder.with_url(url).with_retry(retry).build().map_err(|error| {
        SluiceError::user("checkpoint.url", format!("checkpoint store {url:?} cannot be opened: {error}")).with_fix(
            "set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION; for a local S3-compatible server \
             also AWS_ENDPOINT=http://host:port and AWS_ALLOW_HTTP=true",
        )
    })?;
    let parsed = Url::parse(url).map_err(|error| bad_url(url, &error.to_string()))?;
    let prefix = StorePath::from_url_path(parsed.path()).map_err(|error| bad_url(url, &error.to_string()))?;
    Ok(Location { store: Arc::new(store), prefix, local_root: None, url: url.to_string() })
}

fn bad_url(url: &str, problem: &str) -> SluiceError {
    SluiceError::user("checkpoint.url", format!("checkpoint store {url:?} is not usable: {problem}")).with_fix(URL_FIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `url` opened from `base` lives at `expected` (a local directory).
    fn check_local(url: &str, base: &str, expected: &str) {
        match resolve(url, Path::new(base), &[]) {
            Ok(location) => {
                assert_eq!(location.local_root.as_deref(), Some(Path::new(expected)), "{url}");
                assert_eq!(location.prefix.as_ref(), expected.trim_start_matches('/'), "{url}");
            }
            Err(error) => panic!("{url}: {error}"),
        }
    }

    #[test]
    fn local_urls_resolve_against_the_base_directory() {
        check_local("file:///var/state", "/base", "/var/state");
        check_local("file://./state", "/base/dir", "/base/dir/state");
        check_local("file://../state", "/base/dir", "/base/state");
        check_local("file://.", "/base/dir", "/base/dir");
        check_local("./a/../state", "/base", "/base/state");
        check_local("state", "/base", "/base/state");
        check_local("/abs/state/", "/base", "/abs/state");
        check_local(" file:///with%20space ", "/base", "/with space");
    }

    /// `url` is refused as a user error whose message contains `needle`.
    fn check_refused(url: &str, needle: &str) {
        match resolve(url, Path::new("/base"), &[]) {
            Ok(location) => panic!("{url}: accepted as {}", location.url),
            Err(error) => {
                assert_eq!((error.code, error.domain), ("checkpoint.url", sluice_types::Domain::User), "{url}");
                assert!(error.to_string().contains(needle), "{url}: {error}");
                assert!(error.fix.is_some(), "{url}: no fix");
            }
        }
    }

    #[test]
    fn bad_urls_are_user_errors_with_a_fix() {
        check_refused("", "empty");
        check_refused("ftp://host/dir", "scheme \"ftp\" is not supported");
        check_refused("gs://bucket/dir", "scheme \"gs\" is not supported");
        check_refused("memory://x", "not supported");
        check_refused("file://host/dir", "absolute path");
        check_refused("http://[bad", "checkpoint store");
    }

    #[test]
    fn a_file_in_place_of_the_directory_is_refused() {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        let url = file.path().display().to_string();
        check_refused(&url, "is a file");
    }

    #[test]
    fn unknown_s3_options_are_refused() {
        let options = [("no_such_option".to_string(), "1".to_string())];
        let error = resolve("s3://bucket/prefix", Path::new("/"), &options).err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains("no_such_option")));
    }

    #[test]
    fn s3_urls_carry_their_prefix() {
        let options = [
            ("aws_access_key_id".to_string(), "key".to_string()),
            ("aws_secret_access_key".to_string(), "secret".to_string()),
            ("aws_region".to_string(), "us-east-1".to_string()),
        ];
        let location = resolve("s3://bucket/some/prefix", Path::new("/"), &options).expect("opens without I/O");
        assert_eq!(location.prefix.as_ref(), "some/prefix");
        assert_eq!(location.local_root, None);
    }
}
