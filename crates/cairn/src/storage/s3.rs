//! S3 checkpoint storage: `state.checkpoints.dir: s3://bucket/prefix`.
//!
//! The same layout and guarantees as the filesystem, over an S3-compatible object store
//! (crate `object_store`):
//! - a file is an object `<prefix>/<path>`; a "directory" is the set of objects under
//!   `<prefix>/<path>/` (it exists while one does);
//! - an S3 `PUT` replaces an object whole, so readers see the old object or the new one,
//!   never part of one: [`CheckpointStorage::write_atomic`] is a single `PUT`, and `_metadata`
//!   (written last) is never torn. S3 has read-after-write and list-after-write consistency,
//!   so a checkpoint exists exactly when its `_metadata` object does;
//! - a `PUT` returns only once the object is durably stored, so [`CheckpointStorage::write`]
//!   is durable when it returns;
//! - deleting a directory deletes every object under it (retention, aborted checkpoints,
//!   shared files nothing references).
//!
//! The checkpoint storage interface is synchronous (uploader threads, the coordinator); every
//! call here runs its request on a small private tokio runtime and waits for it. That works
//! from any thread, including one that belongs to another tokio runtime.
//!
//! Endpoint, region and credentials come from the `s3.*` configuration keys
//! ([`S3Settings`]), else from the usual `AWS_*` environment variables
//! (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, ...).

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, PutPayload, RetryConfig};

use super::{validate_dir_path, validate_path, CheckpointStorage, S3Settings, S3Url, StorageError};

/// Checkpoint storage in an S3 bucket below a key prefix (see the module docs).
pub struct S3Storage {
    url: S3Url,
    store: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for S3Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Storage").field("url", &self.url).finish()
    }
}

impl S3Storage {
    /// Connects to the bucket and checks that it can be listed, so that a wrong endpoint,
    /// bucket or credentials fail the job before it starts, naming the URL.
    pub fn open(url: &S3Url, settings: &S3Settings) -> Result<S3Storage, StorageError> {
        let unusable = |problem: String| StorageError::UnusableDirectory {
            path: url.to_string(),
            problem,
        };
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
        if let Some(endpoint) = &settings.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        let local_endpoint =
            settings.endpoint.is_some() || std::env::var_os("AWS_ENDPOINT_URL").is_some();
        builder = builder
            .with_virtual_hosted_style_request(!settings.path_style.unwrap_or(local_endpoint));
        if let Some(region) = &settings.region {
            builder = builder.with_region(region);
        } else if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            builder = builder.with_region("us-east-1");
        }
        if let Some(key) = &settings.access_key {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &settings.secret_key {
            builder = builder.with_secret_access_key(secret);
        }
        // Fail in seconds, not minutes, when the service is down; retry what S3 says is
        // worth retrying.
        let options = ClientOptions::new()
            .with_allow_http(true)
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(120));
        let retry = RetryConfig {
            max_retries: 4,
            retry_timeout: Duration::from_secs(60),
            ..RetryConfig::default()
        };
        let store = builder
            .with_client_options(options)
            .with_retry(retry)
            .build()
            .map_err(|e| unusable(format!("cannot be configured: {}", one_line(&e))))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cairn-s3")
            .enable_all()
            .build()
            .map_err(|e| unusable(format!("cannot start its I/O threads: {e}")))?;
        let storage = S3Storage {
            url: url.clone(),
            store: Arc::new(store),
            runtime,
        };
        let root = storage.key("");
        let store = storage.store.clone();
        storage
            .run(async move { store.list_with_delimiter(root.as_ref()).await })
            .map_err(|e| unusable(format!("cannot be listed: {}", one_line(&e))))?;
        Ok(storage)
    }

    /// The URL of the storage root.
    pub fn url(&self) -> &S3Url {
        &self.url
    }

    /// The object key of storage path `path` (`""`: the root; `None` if that is the bucket's
    /// root).
    fn key(&self, path: &str) -> Option<ObjectPath> {
        match (self.url.prefix.is_empty(), path.is_empty()) {
            (true, true) => None,
            (true, false) => Some(ObjectPath::from(path)),
            (false, true) => Some(ObjectPath::from(self.url.prefix.as_str())),
            (false, false) => Some(ObjectPath::from(format!("{}/{path}", self.url.prefix))),
        }
    }

    /// Runs a request on the private runtime and waits for it (from any thread).
    fn run<T: Send + 'static>(
        &self,
        request: impl Future<Output = object_store::Result<T>> + Send + 'static,
    ) -> object_store::Result<T> {
        let handle = self.runtime.spawn(request);
        match futures::executor::block_on(handle) {
            Ok(result) => result,
            Err(join) => Err(object_store::Error::Generic {
                store: "S3",
                source: Box::new(join),
            }),
        }
    }

    fn io_error(&self, op: &'static str, path: &str, e: object_store::Error) -> StorageError {
        if let object_store::Error::NotFound { .. } = e {
            return StorageError::NotFound {
                path: self.location(path),
            };
        }
        StorageError::Io {
            op,
            path: self.location(path),
            source: io::Error::other(one_line(&e)),
        }
    }

    /// Every object below directory `path` (recursively), with its size.
    fn objects_below(&self, path: &str) -> Result<Vec<(ObjectPath, u64)>, StorageError> {
        let prefix = self.key(path);
        let store = self.store.clone();
        self.run(async move {
            store
                .list(prefix.as_ref())
                .map_ok(|m| (m.location, m.size))
                .try_collect::<Vec<_>>()
                .await
        })
        .map_err(|e| self.io_error("list", path, e))
    }

    /// The size of the object at `path`, or None if there is none.
    fn object_size(&self, path: &str) -> Result<Option<u64>, StorageError> {
        let Some(key) = self.key(path) else {
            return Ok(None);
        };
        let store = self.store.clone();
        match self.run(async move { store.head(&key).await }) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.io_error("stat", path, e)),
        }
    }

    fn put(&self, op: &'static str, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        validate_path(path)?;
        let key = self.key(path).expect("a valid path is not the root");
        let payload = PutPayload::from(bytes.to_vec());
        let store = self.store.clone();
        self.run(async move { store.put(&key, payload).await.map(drop) })
            .map_err(|e| self.io_error(op, path, e))
    }
}

/// An error's message and its sources on one line.
fn one_line(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text.replace('\n', " ")
}

impl CheckpointStorage for S3Storage {
    fn write(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        self.put("write", path, bytes)
    }

    fn write_atomic(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        // One PUT: an object is replaced whole (see the module docs).
        self.put("write", path, bytes)
    }

    fn read(&self, path: &str) -> Result<Vec<u8>, StorageError> {
        validate_path(path)?;
        let key = self.key(path).expect("a valid path is not the root");
        let store = self.store.clone();
        self.run(async move { store.get(&key).await?.bytes().await })
            .map(|b| b.to_vec())
            .map_err(|e| self.io_error("read", path, e))
    }

    fn exists(&self, path: &str) -> Result<bool, StorageError> {
        validate_dir_path(path)?;
        if path.is_empty() || self.object_size(path)?.is_some() {
            return Ok(true);
        }
        let prefix = self.key(path);
        let store = self.store.clone();
        let first = self
            .run(async move { store.list(prefix.as_ref()).next().await.transpose() })
            .map_err(|e| self.io_error("list", path, e))?;
        Ok(first.is_some())
    }

    fn list(&self, path: &str) -> Result<Vec<String>, StorageError> {
        validate_dir_path(path)?;
        let prefix = self.key(path);
        let store = self.store.clone();
        let listed = self
            .run(async move { store.list_with_delimiter(prefix.as_ref()).await })
            .map_err(|e| self.io_error("list", path, e))?;
        let mut names: Vec<String> = listed
            .common_prefixes
            .iter()
            .chain(listed.objects.iter().map(|o| &o.location))
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn size(&self, path: &str) -> Result<u64, StorageError> {
        validate_dir_path(path)?;
        let own = if path.is_empty() {
            0
        } else {
            self.object_size(path)?.unwrap_or(0)
        };
        let below: u64 = self.objects_below(path)?.iter().map(|(_, s)| s).sum();
        Ok(own + below)
    }

    fn delete(&self, path: &str) -> Result<(), StorageError> {
        validate_path(path)?;
        let mut keys: Vec<ObjectPath> = self
            .objects_below(path)?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        keys.push(self.key(path).expect("a valid path is not the root"));
        let store = self.store.clone();
        self.run(async move {
            let stream = futures::stream::iter(keys.into_iter().map(Ok)).boxed();
            store
                .delete_stream(stream)
                .try_for_each(|_| async { Ok(()) })
                .await
                .or_else(|e| match e {
                    object_store::Error::NotFound { .. } => Ok(()),
                    e => Err(e),
                })
        })
        .map_err(|e| self.io_error("delete", path, e))
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), StorageError> {
        validate_path(from)?;
        validate_path(to)?;
        let (a, b) = (
            self.key(from).expect("a valid path is not the root"),
            self.key(to).expect("a valid path is not the root"),
        );
        let store = self.store.clone();
        self.run(async move { store.rename(&a, &b).await })
            .map_err(|e| self.io_error("rename", from, e))
    }

    fn location(&self, path: &str) -> String {
        match (self.url.prefix.is_empty(), path.is_empty()) {
            (_, true) => self.url.to_string(),
            _ => format!("{}/{path}", self.url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{exercise, rejects_invalid_paths};
    use super::*;

    /// The local S3 server the tests use (`scripts/service-s3` starts it), or another one.
    pub(crate) fn test_endpoint() -> String {
        std::env::var("CAIRN_TEST_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:55000".into())
    }

    pub(crate) fn test_settings() -> S3Settings {
        S3Settings {
            endpoint: Some(test_endpoint()),
            access_key: Some("cairn".into()),
            secret_key: Some("cairn".into()),
            ..S3Settings::default()
        }
    }

    /// A storage below a fresh prefix of the test bucket.
    fn fresh(name: &str) -> S3Storage {
        let url = S3Url {
            bucket: "cairn-test".into(),
            prefix: format!("unit/{name}-{:016x}", fastrand::u64(..)),
        };
        S3Storage::open(&url, &test_settings()).unwrap_or_else(|e| {
            panic!(
                "{e}\nthe S3 tests need a local S3 server at {} with bucket cairn-test: start it with scripts/service-s3",
                test_endpoint()
            )
        })
    }

    #[test]
    fn round_trip() {
        let s = fresh("round-trip");
        exercise(&s);
        assert!(s
            .location("job/chk-1/_metadata")
            .starts_with("s3://cairn-test/unit/"));
    }

    #[test]
    fn invalid_paths_are_rejected() {
        rejects_invalid_paths(&fresh("invalid"));
    }

    #[test]
    fn a_prefix_is_a_directory_not_a_string_prefix() {
        let s = fresh("segments");
        s.write("job/chk-10/a", b"x").unwrap();
        assert!(!s.exists("job/chk-1").unwrap());
        assert_eq!(s.size("job/chk-1").unwrap(), 0);
        s.delete("job/chk-1").unwrap();
        assert_eq!(s.read("job/chk-10/a").unwrap(), b"x");
        // Two storages on sibling prefixes do not see each other.
        let other = fresh("segments");
        assert_eq!(other.list("").unwrap(), Vec::<String>::new());
        s.delete("job").unwrap();
    }

    #[test]
    fn a_missing_bucket_or_a_dead_endpoint_is_a_clear_error() {
        let url = S3Url::parse("s3://no-such-bucket-cairn/x").unwrap();
        let err = S3Storage::open(&url, &test_settings())
            .unwrap_err()
            .to_string();
        assert!(err.contains("s3://no-such-bucket-cairn/x"), "{err}");
        let dead = S3Settings {
            endpoint: Some("http://127.0.0.1:9".into()),
            ..test_settings()
        };
        let url = S3Url::parse("s3://cairn-test/x").unwrap();
        let err = S3Storage::open(&url, &dead).unwrap_err().to_string();
        assert!(
            err.contains("s3://cairn-test/x") && !err.contains('\n'),
            "{err}"
        );
    }
}
