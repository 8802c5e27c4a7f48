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
//!   `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, ...);
//! - `az://container/prefix` (and `azure://`, `abfs://`, `abfss://`, `adl://`, including
//!   `abfs[s]://container@account.dfs.core.windows.net/prefix`): `MicrosoftAzure`, configured
//!   from the `AZURE_*` variables (`AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`,
//!   `AZURE_STORAGE_SAS_KEY`, `AZURE_STORAGE_ENDPOINT`, `AZURE_STORAGE_USE_EMULATOR`, ...);
//! - `gs://bucket/prefix`: `GoogleCloudStorage`, configured from the `GOOGLE_*` variables
//!   (`GOOGLE_SERVICE_ACCOUNT`, `GOOGLE_SERVICE_ACCOUNT_KEY`, `GOOGLE_APPLICATION_CREDENTIALS`,
//!   `GOOGLE_BASE_URL`, ...).
//!
//! The three object stores are the crate's `cloud` feature (`cloud`: their HTTP clients,
//! TLS and credentials); a build without it refuses their URLs naming the feature.
//!
//! An object store is configured from its environment variables first, then from explicit
//! options (the same names in lower case, e.g. `aws_endpoint`, `azure_storage_endpoint`,
//! `google_service_account`), which win; an option the service does not know is refused.
//! Every kind is addressed the same way afterwards: a backend plus a key prefix; every
//! name inside the store is relative to that prefix. Opening performs no I/O and creates
//! nothing. Every request is bounded: a per-request timeout and a bounded number of retries
//! with exponential backoff for transient errors (the constants below).

#[cfg(feature = "cloud")]
mod cloud;

use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreScheme};
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

const URL_FIX: &str = "use file:///absolute/path, file://./relative/path, a plain path, s3://bucket/prefix, \
                       az://container/prefix or gs://bucket/prefix";

/// A backend and where inside it the store lives.
#[derive(Debug)]
pub(crate) struct Location {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// Prepended to every name inside the store.
    pub(crate) prefix: StorePath,
    /// The directory of a local store (for removing empty directories), `None` for an object
    /// store.
    pub(crate) local_root: Option<PathBuf>,
    /// The resolved URL, shown in messages.
    pub(crate) url: String,
}

/// Resolves `url` (see the module doc); `options` are object-store configuration keys such
/// as `aws_endpoint` or `azure_storage_endpoint`, applied after the environment.
pub(crate) fn resolve(url: &str, base_dir: &Path, options: &[(String, String)]) -> Result<Location, SluiceError> {
    let trimmed = url.trim();
    if trimmed.is_empty() {
        return Err(bad_url(url, "it is empty"));
    }
    if let Some(rest) = trimmed.strip_prefix("file://") {
        return local(&file_url_path(trimmed, rest, base_dir)?, url, options);
    }
    if !trimmed.contains("://") {
        // `s3:/bucket` or `gs:bucket` is a mistyped URL, not a directory named so (write
        // `./s3:x` for that).
        let scheme = trimmed.split_once(':').map(|(scheme, _)| scheme);
        if scheme.is_some_and(|s| s.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) && !s.contains('/')) {
            return Err(bad_url(url, "it has a scheme but not `://` (s3://bucket/prefix, file://./dir)"));
        }
        return local(&base_dir.join(trimmed), url, options);
    }
    let parsed = Url::parse(trimmed).map_err(|error| bad_url(url, &error.to_string()))?;
    // `https://` URLs of the services are refused: their path holds the bucket or the
    // container, not only the prefix.
    let store_scheme = !matches!(parsed.scheme(), "http" | "https");
    match ObjectStoreScheme::parse(&parsed) {
        Ok((scheme @ (ObjectStoreScheme::AmazonS3 | ObjectStoreScheme::MicrosoftAzure), _)) if store_scheme => {
            object_store(scheme, trimmed, options)
        }
        Ok((scheme @ ObjectStoreScheme::GoogleCloudStorage, _)) => object_store(scheme, trimmed, options),
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

/// Opens the object store of `scheme` (S3, Azure or GCS), or, in a build without the
/// `cloud` feature, says which feature to rebuild with.
fn object_store(scheme: ObjectStoreScheme, url: &str, options: &[(String, String)]) -> Result<Location, SluiceError> {
    #[cfg(feature = "cloud")]
    return cloud::open(scheme, url, options);
    #[cfg(not(feature = "cloud"))]
    {
        let _ = (scheme, options);
        Err(not_built(url))
    }
}

/// The refusal of an object store's `url` by a build without the `cloud` feature.
#[cfg(any(test, not(feature = "cloud")))]
fn not_built(url: &str) -> SluiceError {
    SluiceError::user(
        "checkpoint.url",
        format!(
            "checkpoint store {url:?} is an object store, and this build of sluice was compiled without the cargo \
             feature `cloud` (S3, Azure and GCS)"
        ),
    )
    .with_fix(
        "rebuild with `--features cloud` (`cargo build --release --features cloud`; `--features full` builds every \
         connector and store, as the release builds and the Docker image do), or use a local directory",
    )
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
        check_local("./s3:x", "/base", "/base/s3:x");
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
        check_refused("https://account.blob.core.windows.net/container/dir", "scheme \"https\" is not supported");
        check_refused("memory://x", "not supported");
        check_refused("file://host/dir", "absolute path");
        check_refused("http://[bad", "checkpoint store");
        check_refused("s3:/bucket/x", "a scheme but not `://`");
        check_refused("gs:bucket", "a scheme but not `://`");
    }

    #[test]
    fn a_file_in_place_of_the_directory_is_refused() {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        let url = file.path().display().to_string();
        check_refused(&url, "is a file");
    }

    /// A build without `cloud` refuses the object stores' URLs naming the feature (the
    /// message is checked in every build; the refusal itself only without the feature).
    #[test]
    fn object_store_urls_name_the_feature_in_a_build_without_it() {
        for url in ["s3://bucket/prefix", "az://container/prefix", "gs://bucket/prefix"] {
            let error = if cfg!(feature = "cloud") {
                not_built(url)
            } else {
                resolve(url, Path::new("/"), &[]).expect_err("refused")
            };
            assert_eq!((error.code, error.domain), ("checkpoint.url", sluice_types::Domain::User), "{url}");
            assert!(error.to_string().contains("cargo feature `cloud`"), "{url}: {error}");
            assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("--features cloud")), "{url}: {error}");
        }
    }

    /// Options that let each service open without the environment and without I/O.
    #[cfg(feature = "cloud")]
    fn credentials(url: &str) -> Vec<(String, String)> {
        let pairs: &[(&str, &str)] = match url.split_once("://").map_or("", |(scheme, _)| scheme) {
            "s3" | "s3a" => {
                &[("aws_access_key_id", "key"), ("aws_secret_access_key", "secret"), ("aws_region", "us-east-1")]
            }
            "gs" => &[(
                "google_service_account_key",
                r#"{"private_key": "", "private_key_id": "", "client_email": "", "disable_oauth": true}"#,
            )],
            _ => &[("azure_storage_account_name", "account"), ("azure_storage_account_key", "a2V5")],
        };
        pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
    }

    #[cfg(feature = "cloud")]
    #[test]
    fn unknown_object_store_options_are_refused_with_a_fix() {
        for (url, variables) in
            [("s3://bucket/prefix", "AWS_*"), ("az://container/prefix", "AZURE_*"), ("gs://bucket/prefix", "GOOGLE_*")]
        {
            let mut options = credentials(url);
            options.push(("no_such_option".to_string(), "1".to_string()));
            match resolve(url, Path::new("/"), &options) {
                Ok(location) => panic!("{url}: accepted as {}", location.url),
                Err(error) => {
                    assert_eq!(error.code, "checkpoint.url", "{url}");
                    assert!(error.to_string().contains("no_such_option"), "{url}: {error}");
                    assert!(error.fix.as_deref().is_some_and(|fix| fix.contains(variables)), "{url}: {error}");
                }
            }
        }
    }

    #[cfg(feature = "cloud")]
    #[test]
    fn object_store_urls_carry_their_prefix() {
        for url in [
            "s3://bucket/some/prefix",
            "s3a://bucket/some/prefix",
            "az://container/some/prefix",
            "azure://container/some/prefix",
            "abfs://container/some/prefix",
            "abfss://container@account.dfs.core.windows.net/some/prefix",
            "gs://bucket/some/prefix",
        ] {
            let location = resolve(url, Path::new("/"), &credentials(url)).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(location.prefix.as_ref(), "some/prefix", "{url}");
            assert_eq!(location.local_root, None, "{url}");
            assert_eq!(location.url, url);
        }
    }

    #[cfg(feature = "cloud")]
    #[test]
    fn an_azure_container_with_a_dot_cannot_be_opened() {
        let url = "az://not.a.container/prefix";
        let error = resolve(url, Path::new("/"), &credentials(url)).expect_err("refused");
        assert_eq!(error.code, "checkpoint.url");
        assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("AZURE_STORAGE_ACCOUNT_NAME")), "{error}");
    }
}
