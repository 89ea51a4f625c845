//! Oncelog's object-storage tier (issue 35; plan in docs/design/issue-35-plan.md).
//!
//! The log engine's bucket holds its log itself — ranges of segment files (whole frames) and
//! checkpoints — and a manifest naming a prefix of the frame sequence. An append and all its
//! effects are one record in one frame, so any prefix of frames is a state the engine was in:
//! a restored node's producer states and keys are exactly those of the data restored.
//!
//! - [`location`]: `--object-store` values (`s3://BUCKET/PREFIX`, `file:///DIR`).
//! - [`manifest`]: the manifest, its stored form (versioned JSON) and its invariants.
//! - [`keys`]: object names under a prefix.
//! - [`bucket`]: the prefix and its one writer: takeover with the next epoch, publish by
//!   creating the next manifest (a zombie of an older epoch finds the name taken: fenced),
//!   immutable objects checked by CRC32C.

pub mod bucket;
pub mod keys;
pub mod location;
pub mod manifest;

pub use bucket::{is_tigris_endpoint, Bucket, BucketError, Writer, KEEP_MANIFESTS, TIGRIS_CONSISTENT};
pub use location::{Location, LocationError};
pub use manifest::{
    CheckpointRef, Cut, LogPosition, Manifest, ManifestError, ObjectRef, SegmentRef, TableRef, Takeover,
};

/// For tests of this crate and of the engines over it (feature `test-support`): a fresh prefix
/// on the test S3 API server `scripts/test` starts (`scripts/s3`, its endpoint in
/// `ONCELOG_TEST_S3_ENDPOINT`).
#[cfg(feature = "test-support")]
pub mod fault_proxy;

#[cfg(feature = "test-support")]
pub mod test_support {
    use crate::{Bucket, Location};

    /// The test S3 API server's endpoint (`ONCELOG_TEST_S3_ENDPOINT`).
    pub fn s3_endpoint() -> String {
        std::env::var("ONCELOG_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
            panic!("this test needs ONCELOG_TEST_S3_ENDPOINT: ./scripts/test starts an S3 API server (scripts/s3) and sets it")
        })
    }

    /// The environment an `oncelog serve` child needs for the test server (AWS_* variables).
    pub fn s3_env() -> Vec<(&'static str, String)> {
        s3_env_via(&s3_endpoint())
    }

    /// [`s3_env`] with another endpoint (a [`crate::fault_proxy::FaultProxy`] in front of it).
    pub fn s3_env_via(endpoint: &str) -> Vec<(&'static str, String)> {
        let endpoint = endpoint.to_owned();
        vec![
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// A prefix of the test bucket no other test uses: `s3://oncelog-test/{name}-{pid}-{nanos}`.
    pub fn s3_location(name: &str) -> Location {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        Location::S3 { bucket: "oncelog-test".into(), prefix: format!("{name}-{}-{nanos}", std::process::id()) }
    }

    /// A fresh prefix of the test bucket, opened.
    pub fn s3_bucket(name: &str) -> Bucket {
        s3_bucket_via(&s3_endpoint(), name)
    }

    /// [`s3_bucket`] through another endpoint (a [`crate::fault_proxy::FaultProxy`] in front
    /// of the test server).
    pub fn s3_bucket_via(endpoint: &str, name: &str) -> Bucket {
        s3_bucket_with(endpoint, name, &[])
    }

    /// [`s3_bucket_via`] with `extra` overrides after the test server's (e.g.
    /// [`crate::TIGRIS_CONSISTENT`]).
    pub fn s3_bucket_with(endpoint: &str, name: &str, extra: &[(&str, &str)]) -> Bucket {
        let env = s3_env_via(endpoint);
        let overrides: Vec<(&str, &str)> = env
            .iter()
            .map(|(k, v)| {
                let key = match *k {
                    "AWS_ENDPOINT_URL" => "aws_endpoint",
                    "AWS_ALLOW_HTTP" => "aws_allow_http",
                    "AWS_ACCESS_KEY_ID" => "aws_access_key_id",
                    "AWS_SECRET_ACCESS_KEY" => "aws_secret_access_key",
                    _ => "aws_region",
                };
                (key, v.as_str())
            })
            .chain(extra.iter().copied())
            .collect();
        Bucket::open(&s3_location(name), &overrides).expect("open the test bucket")
    }
}
