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
//! An object store is configured from its environment variables first, then from explicit
//! options (the same names in lower case, e.g. `aws_endpoint`, `azure_storage_endpoint`,
//! `google_service_account`), which win; an option the service does not know is refused.
//! Every kind is addressed the same way afterwards: a backend plus a key prefix; every
//! name inside the store is relative to that prefix. Opening performs no I/O and creates
//! nothing. Every request is bounded: a per-request timeout and a bounded number of retries
//! with exponential backoff for transient errors (the constants below).

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreScheme, RetryConfig};
use sluice_types::SluiceError;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;
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
        Ok((ObjectStoreScheme::AmazonS3, _)) if store_scheme => cloud::<AmazonS3Builder>(&S3, trimmed, options),
        Ok((ObjectStoreScheme::MicrosoftAzure, _)) if store_scheme => {
            cloud::<MicrosoftAzureBuilder>(&AZURE, trimmed, options)
        }
        Ok((ObjectStoreScheme::GoogleCloudStorage, _)) => cloud::<GoogleCloudStorageBuilder>(&GCS, trimmed, options),
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

/// What the messages say about one object-store service.
struct Service {
    name: &'static str,
    /// How to name an option (the fix for an unknown one).
    options_fix: &'static str,
    /// How to configure the service (the fix when it cannot be opened).
    open_fix: &'static str,
}

const S3: Service = Service {
    name: "S3",
    options_fix: "use the names of the AWS_* variables in lower case, e.g. aws_endpoint",
    open_fix: "set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION; for a local S3-compatible server \
               also AWS_ENDPOINT=http://host:port and AWS_ALLOW_HTTP=true",
};

const AZURE: Service = Service {
    name: "Azure",
    options_fix: "use the names of the AZURE_* variables in lower case, e.g. azure_storage_account_name",
    open_fix: "name the container in the URL (az://container/prefix, no dots) and set AZURE_STORAGE_ACCOUNT_NAME \
               with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_KEY; for a local emulator set \
               AZURE_STORAGE_USE_EMULATOR=true (and AZURITE_BLOB_STORAGE_URL if it is not at \
               http://127.0.0.1:10000), or AZURE_STORAGE_ENDPOINT=http://host:port/account with \
               AZURE_ALLOW_HTTP=true",
};

const GCS: Service = Service {
    name: "GCS",
    options_fix: "use the names of the GOOGLE_* variables in lower case, e.g. google_service_account",
    open_fix: "name the bucket in the URL (gs://bucket/prefix) and set GOOGLE_SERVICE_ACCOUNT to a service-account \
               JSON file (or GOOGLE_SERVICE_ACCOUNT_KEY to its contents, or GOOGLE_APPLICATION_CREDENTIALS)",
};

/// What the store needs of an `object_store` cloud builder; the builders share these
/// methods by name only, so the macro below implements this for each of them.
trait CloudBuilder: Sized {
    type Key: FromStr;
    fn from_env() -> Self;
    fn client_key(key: ClientConfigKey) -> Self::Key;
    fn config(self, key: Self::Key, value: String) -> Self;
    fn finish(self, url: &str, retry: RetryConfig) -> object_store::Result<Arc<dyn ObjectStore>>;
}

macro_rules! cloud_builder {
    ($builder:ty, $key:ident) => {
        impl CloudBuilder for $builder {
            type Key = $key;
            fn from_env() -> Self {
                <$builder>::from_env()
            }
            fn client_key(key: ClientConfigKey) -> $key {
                $key::Client(key)
            }
            fn config(self, key: $key, value: String) -> Self {
                self.with_config(key, value)
            }
            fn finish(self, url: &str, retry: RetryConfig) -> object_store::Result<Arc<dyn ObjectStore>> {
                Ok(Arc::new(self.with_url(url).with_retry(retry).build()?))
            }
        }
    };
}

cloud_builder!(AmazonS3Builder, AmazonS3ConfigKey);
cloud_builder!(MicrosoftAzureBuilder, AzureConfigKey);
cloud_builder!(GoogleCloudStorageBuilder, GoogleConfigKey);

/// An object store of `service`: the environment, then the bounds, then `options`.
fn cloud<B: CloudBuilder>(service: &Service, url: &str, options: &[(String, String)]) -> Result<Location, SluiceError> {
    let timeouts = [(ClientConfigKey::Timeout, REQUEST_TIMEOUT), (ClientConfigKey::ConnectTimeout, CONNECT_TIMEOUT)];
    let mut builder = B::from_env();
    for (key, duration) in timeouts {
        builder = builder.config(B::client_key(key), format!("{}ms", duration.as_millis()));
    }
    for (key, value) in options {
        let parsed: B::Key = key.to_ascii_lowercase().parse().map_err(|_| {
            bad_url(url, &format!("{key:?} is not a known {} option", service.name)).with_fix(service.options_fix)
        })?;
        builder = builder.config(parsed, value.clone());
    }
    let retry = RetryConfig {
        backoff: BackoffConfig { init_backoff: BACKOFF_INITIAL, max_backoff: BACKOFF_MAX, base: 2.0 },
        max_retries: RETRIES_MAX,
        retry_timeout: RETRY_WINDOW,
    };
    let store = builder.finish(url, retry).map_err(|error| {
        SluiceError::user("checkpoint.url", format!("checkpoint store {url:?} cannot be opened: {error}"))
            .with_fix(service.open_fix)
    })?;
    let parsed = Url::parse(url).map_err(|error| bad_url(url, &error.to_string()))?;
    let prefix = StorePath::from_url_path(parsed.path()).map_err(|error| bad_url(url, &error.to_string()))?;
    Ok(Location { store, prefix, local_root: None, url: url.to_string() })
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

    /// Options that let each service open without the environment and without I/O.
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

    #[test]
    fn an_azure_container_with_a_dot_cannot_be_opened() {
        let url = "az://not.a.container/prefix";
        let error = resolve(url, Path::new("/"), &credentials(url)).expect_err("refused");
        assert_eq!(error.code, "checkpoint.url");
        assert!(error.fix.as_deref().is_some_and(|fix| fix.contains("AZURE_STORAGE_ACCOUNT_NAME")), "{error}");
    }
}
