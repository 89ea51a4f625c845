//! `--object-store` values: where a node's bucket prefix is.
//!
//! - `s3://BUCKET/PREFIX`: any S3 API store; endpoint, region and credentials come from the
//!   standard AWS environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`), so AWS, R2, MinIO and GCS's
//!   S3 API all work the same way.
//! - `file:///DIR`: a local directory (tests, or a mounted network file system).
//!
//! The prefix is required for `s3://` (a bucket may hold several nodes' prefixes, and a prefix
//! is what one writer owns); it is normalised without leading or trailing slashes.

use std::path::PathBuf;

/// A parsed `--object-store` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    S3 { bucket: String, prefix: String },
    Dir(PathBuf),
}

/// Why an `--object-store` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocationError {
    #[error("an object store is s3://BUCKET/PREFIX or file:///DIR, not {0:?}")]
    Scheme(String),
    #[error("s3:// needs a bucket name (3 to 63 of a-z, 0-9, '.', '-'): {0:?}")]
    Bucket(String),
    #[error("s3://{0}/ needs a prefix: the part of the bucket this node owns, e.g. s3://{0}/oncelog")]
    NoPrefix(String),
    #[error("a prefix may not contain empty, '.' or '..' parts, or control characters: {0:?}")]
    Prefix(String),
    #[error("file:// needs an absolute directory, e.g. file:///var/lib/oncelog-bucket: {0:?}")]
    Dir(String),
}

impl std::str::FromStr for Location {
    type Err = LocationError;

    fn from_str(s: &str) -> Result<Location, LocationError> {
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let bucket_ok = (3..=63).contains(&bucket.len())
                && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
            if !bucket_ok {
                return Err(LocationError::Bucket(bucket.to_owned()));
            }
            let prefix = prefix.trim_matches('/');
            if prefix.is_empty() {
                return Err(LocationError::NoPrefix(bucket.to_owned()));
            }
            let part_ok = |p: &str| !p.is_empty() && p != "." && p != ".." && !p.chars().any(char::is_control);
            if !prefix.split('/').all(part_ok) {
                return Err(LocationError::Prefix(prefix.to_owned()));
            }
            return Ok(Location::S3 { bucket: bucket.to_owned(), prefix: prefix.to_owned() });
        }
        if let Some(dir) = s.strip_prefix("file://") {
            if !dir.starts_with('/') || dir.split('/').any(|p| p == "..") {
                return Err(LocationError::Dir(dir.to_owned()));
            }
            return Ok(Location::Dir(PathBuf::from(dir)));
        }
        Err(LocationError::Scheme(s.to_owned()))
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            Location::Dir(dir) => write!(f, "file://{}", dir.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Location, LocationError> {
        s.parse()
    }

    #[test]
    fn s3_and_file_locations_parse_and_print_back() {
        let s3 = parse("s3://my-bucket.1/nodes/a/").expect("s3");
        assert_eq!(s3, Location::S3 { bucket: "my-bucket.1".into(), prefix: "nodes/a".into() });
        assert_eq!(s3.to_string(), "s3://my-bucket.1/nodes/a");
        let dir = parse("file:///var/lib/b").expect("dir");
        assert_eq!(dir, Location::Dir("/var/lib/b".into()));
        assert_eq!(dir.to_string(), "file:///var/lib/b");
    }

    #[test]
    fn bad_locations_say_what_is_wrong() {
        assert!(matches!(parse("gs://b/p"), Err(LocationError::Scheme(_))));
        assert!(matches!(parse("/tmp/x"), Err(LocationError::Scheme(_))));
        assert!(matches!(parse("s3://B/p"), Err(LocationError::Bucket(_))));
        assert!(matches!(parse("s3://ab/p"), Err(LocationError::Bucket(_))));
        assert!(matches!(parse("s3://bucket"), Err(LocationError::NoPrefix(_))));
        assert!(matches!(parse("s3://bucket//"), Err(LocationError::NoPrefix(_))));
        assert!(matches!(parse("s3://bucket/a//b"), Err(LocationError::Prefix(_))));
        assert!(matches!(parse("s3://bucket/a/../b"), Err(LocationError::Prefix(_))));
        assert!(matches!(parse("file://relative/dir"), Err(LocationError::Dir(_))));
        assert!(matches!(parse("file:///a/../b"), Err(LocationError::Dir(_))));
    }
}
