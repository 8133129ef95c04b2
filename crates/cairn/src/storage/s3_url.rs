//! Where S3 checkpoint storage is and how to reach it (`state.checkpoints.dir: s3://...` and
//! the `s3.*` keys): configuration, compiled with or without the `s3` feature, which
//! `S3Storage` needs.

use serde::{Deserialize, Serialize};

use super::validate_path;

/// An `s3://bucket/prefix` location.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct S3Url {
    /// The bucket.
    pub bucket: String,
    /// The key prefix below which the storage root lies, without leading or trailing `/`
    /// (empty: the bucket's root).
    pub prefix: String,
}

impl S3Url {
    /// Parses `s3://bucket` or `s3://bucket/some/prefix` (also `s3a://`, as Flink accepts).
    pub fn parse(s: &str) -> Result<S3Url, String> {
        let s = s.trim();
        let rest = ["s3://", "s3a://", "s3p://"]
            .iter()
            .find_map(|scheme| {
                (s.len() >= scheme.len() && s[..scheme.len()].eq_ignore_ascii_case(scheme))
                    .then(|| &s[scheme.len()..])
            })
            .ok_or("not an s3:// URL")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err("the URL names no bucket".into());
        }
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() && validate_path(prefix).is_err() {
            return Err(format!(
                "the key prefix {prefix:?} has an empty, '.' or '..' component"
            ));
        }
        Ok(S3Url {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// How to reach the S3 service: the `s3.*` keys (Flink's names); unset ones fall back to
/// the `AWS_*` environment variables.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct S3Settings {
    /// `s3.endpoint`: e.g. `http://127.0.0.1:9000` for a local server (plain http allowed).
    pub endpoint: Option<String>,
    /// `s3.region` (default `us-east-1`).
    pub region: Option<String>,
    /// `s3.access-key`.
    pub access_key: Option<String>,
    /// `s3.secret-key`.
    pub secret_key: Option<String>,
    /// `s3.path.style.access`: address buckets as `endpoint/bucket` instead of
    /// `bucket.endpoint` (default: true when an endpoint is set, as local servers need).
    pub path_style: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_bucket_and_prefix() {
        let u = S3Url::parse("s3://bucket/a/b/").unwrap();
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("bucket", "a/b"));
        assert_eq!(u.to_string(), "s3://bucket/a/b");
        let u = S3Url::parse("S3A://bucket").unwrap();
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("bucket", ""));
        assert_eq!(u.to_string(), "s3://bucket");
        for bad in [
            "s3://",
            "s3:///x",
            "s3://b/a//c",
            "s3://b/../c",
            "file:///x",
            "/tmp",
        ] {
            assert!(S3Url::parse(bad).is_err(), "{bad}");
        }
    }
}
