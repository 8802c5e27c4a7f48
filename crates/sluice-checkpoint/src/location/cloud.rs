//! The object stores of `s3://`, `az://` and `gs://` URLs (the crate's `cloud` feature):
//! each configured from its environment variables, then the bounds of
//! [`super::REQUEST_TIMEOUT`] and the retries, then the explicit options.

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::path::Path as StorePath;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreScheme, RetryConfig};
use sluice_types::SluiceError;
use std::str::FromStr;
use std::sync::Arc;
use url::Url;

use super::{
    BACKOFF_INITIAL, BACKOFF_MAX, CONNECT_TIMEOUT, Location, REQUEST_TIMEOUT, RETRIES_MAX, RETRY_WINDOW, bad_url,
};

/// Opens the object store of `scheme`: S3, Azure or GCS (`resolve` sends only these).
pub(super) fn open(
    scheme: ObjectStoreScheme,
    url: &str,
    options: &[(String, String)],
) -> Result<Location, SluiceError> {
    match scheme {
        ObjectStoreScheme::AmazonS3 => cloud::<AmazonS3Builder>(&S3, url, options),
        ObjectStoreScheme::MicrosoftAzure => cloud::<MicrosoftAzureBuilder>(&AZURE, url, options),
        ObjectStoreScheme::GoogleCloudStorage => cloud::<GoogleCloudStorageBuilder>(&GCS, url, options),
        other => Err(bad_url(url, &format!("{other:?} is not an object store"))),
    }
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
