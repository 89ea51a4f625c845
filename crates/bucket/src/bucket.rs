//! A bucket prefix and its one writer: takeover, publish, immutable objects
//! (docs/design/issue-35-plan.md, "The writer protocol").
//!
//! Every write is a *create* (`If-None-Match: *`, object_store's `PutMode::Create`), never an
//! overwrite: manifests are numbered and immutable, objects are named by the epoch that wrote
//! them. That one primitive gives both the fencing and the consistent cut:
//! - **Takeover** creates manifest `n + 1` (the newest is `n`) with the next epoch. The first
//!   manifest of every epoch is never deleted ([`Manifest::takeovers`]).
//! - **Publish** by the writer whose last manifest is `k` creates `k + 1`. Within an epoch only
//!   one process writes, so if `k + 1` exists and is of another epoch, a takeover came first:
//!   the writer is [`BucketError::Fenced`]. A zombie's `k + 1` is always a takeover manifest
//!   (its own epoch's successor), which is kept, so a zombie can never publish.
//! - A takeover reads the newest manifest before it creates its own, so a publish that
//!   succeeded before the takeover is in the takeover's cut: what the old writer acknowledged
//!   after publishing survives.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};

use crate::keys;
use crate::location::Location;
use crate::manifest::{encode_table, Cut, Manifest, ManifestError, ObjectRef, SegmentRef, TableRef, Takeover, FORMAT};

/// A cut's segment table starts once this many of its first segments are sealed and folded
/// (below it the manifest holds them all: small logs keep one readable object).
pub const TABLE_AT: usize = 16;

/// Segments sealed after the table was written stay in the manifest until there are this many;
/// then a new table holds them too. A table is rewritten about once per this many segments
/// (1 GiB of log at 64 MiB segments), or when a checkpoint drops some of its segments.
const TABLE_SLACK: usize = 16;

/// How often a takeover tries again when another node moved first, before it gives up.
const TAKEOVER_ATTEMPTS: usize = 64;

/// How often a writer looks for a takeover's claim ([`Bucket::claim`]) as it publishes: how
/// long a node taking the prefix over waits at most for a busy writer to yield (plus one
/// publish). At most one GET per this interval, and none while the writer is idle.
pub const CLAIM_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a takeover that lost the name it would create waits before it tries again: a
/// fraction of [`CLAIM_CHECK_EVERY`], so the tries span many of the writer's checks.
pub const TAKEOVER_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a writer keeps a manifest it published before deleting it (the newest two and
/// every takeover manifest are kept regardless). Why not at once: a manifest's name must not
/// come free while a node that listed the prefix before it existed may still create that
/// name. A listing is not a snapshot (a directory's listing misses entries created while it
/// runs); a takeover is checked after its create ([`Bucket::take_over_after`]), and that check
/// needs the manifests above a stale view to stay listed for longer than a takeover takes.
pub const KEEP_MANIFESTS: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a bucket operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    #[error("object store {location}: {source}")]
    Store { location: String, source: object_store::Error },
    /// An `http://` endpoint without `AWS_ALLOW_HTTP=true`: object_store's client would refuse
    /// every request with no more than "builder error", so it is refused at open, by name.
    #[error(
        "object store {location}: the endpoint {endpoint} is plain HTTP, which the S3 client refuses unless \
         AWS_ALLOW_HTTP=true is set (set it for an http:// endpoint, or use https://)"
    )]
    PlainHttp { location: String, endpoint: String },
    /// No credentials were configured and the last fallback, the instance metadata service,
    /// gave none: said so, rather than as the metadata address's own refusal.
    #[error("object store {location}: {why}")]
    NoCredentials { location: String, why: String, source: object_store::Error },
    #[error("fenced: writer epoch {by} took over this prefix (this writer is epoch {mine}); it writes nothing more")]
    Fenced { mine: u64, by: u64 },
    #[error(
        "yielded: node {node} is taking this prefix over as writer epoch {by} (this writer is epoch {mine}); \
         it writes nothing more"
    )]
    Yielded { mine: u64, by: u64, node: String },
    #[error("object {key} is not what was written (expected {expected_len} bytes with CRC32C {expected_crc:08x})")]
    Corrupt { key: String, expected_len: u64, expected_crc: u32 },
    #[error("object {key}, named by {named_by}, is missing")]
    Missing { key: String, named_by: String },
    #[error("object {key} already exists with other content")]
    Conflict { key: String },
    /// Every try to create the key met another create of it in flight (S3's `409
    /// ConditionalRequestConflict`): whether it exists is not known yet; the caller tries later.
    #[error(
        "object store {location}: creating {key} met another create of it in flight {tries} times running \
         (409 ConditionalRequestConflict)"
    )]
    CreateConflict { location: String, key: String, tries: usize },
    #[error("manifest {key}: {source}")]
    Manifest { key: String, source: ManifestError },
    #[error(
        "the takeover lost {tries} times running: {key}, of writer epoch {epoch} (node {node}), took the name \
         this node was about to create, and that writer did not yield to the claim of the next epoch"
    )]
    Contended { tries: usize, key: String, epoch: u64, node: String },
    #[error(
        "the newest manifest was deleted before it could be read, {tries} times running (last {key}): \
         a writer deletes its manifests faster than this node lists them"
    )]
    Vanishing { tries: usize, key: String },
    #[error(
        "manifests of this writer's own epoch {epoch} kept appearing where it publishes ({tries} tries, \
         last {key}, node {node}): another process writes as this epoch"
    )]
    TwoWriters { tries: usize, key: String, epoch: u64, node: String },
}

/// An `overrides` key of [`Bucket::open`] (Oncelog's, not object_store's): `true` (or `1`,
/// `on`, `yes`) sends `X-Tigris-Consistent: true` on every request whatever the endpoint, any
/// other value never; absent,
/// it is sent when the endpoint is Tigris's ([`is_tigris_endpoint`]).
pub const TIGRIS_CONSISTENT: &str = "oncelog_tigris_consistent";

/// The header that makes Tigris serve a request from the object's leader: strongly consistent
/// reads and listings, and conditional creates decided there, across regions. Without it a
/// global bucket is strongly consistent only within the region that wrote.
const TIGRIS_CONSISTENT_HEADER: &str = "x-tigris-consistent";

/// Whether `endpoint` (a URL) is Tigris's S3 API: the host `t3.storage.dev` or a name under it
/// (a bucket's virtual-hosted name), or a name under `tigris.dev` (`fly.storage.tigris.dev`,
/// Fly.io's). By host name only: Tigris reached through another name (a proxy) is not
/// recognised, and [`TIGRIS_CONSISTENT`] forces it.
pub fn is_tigris_endpoint(endpoint: &str) -> bool {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if host_port.starts_with('[') {
        return false; // an IPv6 address
    }
    let host = host_port.split(':').next().unwrap_or("").trim_end_matches('.').to_ascii_lowercase();
    let under = |domain: &str| host == domain || host.strip_suffix(domain).is_some_and(|h| h.ends_with('.'));
    under("t3.storage.dev") || under("tigris.dev")
}

/// The HTTP client settings the environment sets, read as `AmazonS3Builder::from_env` reads
/// them (every `AWS_*` variable whose lowercased name is one of object_store's keys), in its
/// order: what a replaced `ClientOptions` must carry over.
fn env_client_settings() -> Vec<(object_store::ClientConfigKey, String)> {
    client_settings_of(std::env::vars_os())
}

/// [`env_client_settings`] of the variables `vars`.
fn client_settings_of(
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Vec<(object_store::ClientConfigKey, String)> {
    use object_store::aws::AmazonS3ConfigKey;
    vars.filter_map(|(k, v)| {
        let (k, v) = (k.to_str()?, v.to_str()?);
        if !k.starts_with("AWS_") {
            return None;
        }
        match k.to_ascii_lowercase().parse() {
            Ok(AmazonS3ConfigKey::Client(c)) => Some((c, v.to_owned())),
            _ => None,
        }
    })
    .collect()
}

/// Where object_store asks for an instance role's credentials unless `AWS_METADATA_ENDPOINT`
/// says otherwise.
const DEFAULT_METADATA_ENDPOINT: &str = "http://169.254.169.254";

/// Whether object_store reads a flag's value as true.
fn truthy(v: &str) -> bool {
    matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "on" | "yes" | "y")
}

/// The configured endpoint, redacted, when it is plain HTTP and `AWS_ALLOW_HTTP` does not
/// allow that.
fn plain_http_endpoint(b: &object_store::aws::AmazonS3Builder) -> Option<String> {
    use object_store::aws::AmazonS3ConfigKey;
    use object_store::ClientConfigKey;
    let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint)?;
    let allowed =
        b.get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp)).is_some_and(|v| truthy(&v));
    let plain = endpoint.get(..7).is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"));
    (plain && !allowed).then(|| without_password(&endpoint))
}

/// `url` with the password of its user information replaced (an endpoint may carry one).
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((user, _)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or("");
            let host = &rest[user.len() + 1..];
            format!("{scheme}://{name}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// Whether a source of credentials other than the instance metadata service is configured:
/// the ones object_store's `AmazonS3Builder::build` tries before it, in its order (keys, a web
/// identity, an ECS task role, EKS Pod Identity), or unsigned requests (`AWS_SKIP_SIGNATURE`).
fn credentials_configured(b: &object_store::aws::AmazonS3Builder) -> bool {
    use object_store::aws::AmazonS3ConfigKey as K;
    let set = |k: K| b.get_config_value(&k).is_some();
    let env = |name: &str| std::env::var_os(name).is_some();
    let skip = b.get_config_value(&K::SkipSignature).is_some_and(|v| truthy(&v));
    set(K::AccessKeyId)
        || set(K::SecretAccessKey)
        // object_store reads these two from the environment itself, not from its configuration.
        || (env("AWS_WEB_IDENTITY_TOKEN_FILE") && env("AWS_ROLE_ARN"))
        || set(K::ContainerCredentialsRelativeUri)
        || (set(K::ContainerCredentialsFullUri) && set(K::ContainerAuthorizationTokenFile))
        || skip
}

/// The instance metadata service as object_store asks it, when nothing else was configured: a
/// failure is wrapped in [`NoCredentials`], found again by [`Bucket::store_err`].
#[derive(Debug)]
struct MetadataCredentials {
    inner: object_store::aws::AwsCredentialProvider,
    endpoint: String,
}

#[async_trait::async_trait]
impl object_store::CredentialProvider for MetadataCredentials {
    type Credential = object_store::aws::AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<Self::Credential>> {
        self.inner.get_credential().await.map_err(|source| object_store::Error::Generic {
            store: "S3",
            source: Box::new(NoCredentials { endpoint: self.endpoint.clone(), source }),
        })
    }
}

/// No credentials were configured, and the instance metadata service gave none either.
#[derive(Debug, thiserror::Error)]
#[error(
    "no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_WEB_IDENTITY_TOKEN_FILE \
     with AWS_ROLE_ARN, or AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, or run where an instance role is \
     served); the request to the instance metadata service at {endpoint} failed: {source}"
)]
struct NoCredentials {
    endpoint: String,
    source: object_store::Error,
}

/// The first `T` in `e`'s chain of sources (`e` included).
fn find<'a, T: std::error::Error + 'static>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a T> {
    let mut at = Some(e);
    while let Some(e) = at {
        if let Some(t) = e.downcast_ref::<T>() {
            return Some(t);
        }
        at = e.source();
    }
    None
}

/// A bucket prefix: a node's object store.
#[derive(Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// The prefix every key lives under (empty for a directory: the store is rooted there).
    prefix: String,
    location: Arc<str>,
    /// [`KEEP_MANIFESTS`] (tests shorten it).
    keep_manifests: std::time::Duration,
    /// What it was opened with ([`Bucket::reopened`]).
    opened: Arc<(Location, Vec<(String, String)>)>,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket").field("location", &self.location).finish()
    }
}

impl Bucket {
    /// Opens `location`; an `s3://` one is configured from the AWS environment variables, then
    /// `overrides` (object_store's `AmazonS3ConfigKey` names, e.g. `("aws_endpoint", url)`, and
    /// [`TIGRIS_CONSISTENT`]). A Tigris endpoint gets `X-Tigris-Consistent: true` on every
    /// request, the other client settings unchanged. Nothing is read or written yet.
    pub fn open(location: &Location, overrides: &[(&str, &str)]) -> Result<Bucket, BucketError> {
        let err = |source| BucketError::Store { location: location.to_string(), source };
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match location {
            Location::S3 { bucket, prefix } => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
                let mut b = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_conditional_put(S3ConditionalPut::ETagMatch)
                    .with_retry(object_store::RetryConfig {
                        max_retries: 3,
                        retry_timeout: std::time::Duration::from_secs(10),
                        ..Default::default()
                    });
                let mut tigris = None;
                let mut client = env_client_settings();
                for (k, v) in overrides {
                    if *k == TIGRIS_CONSISTENT {
                        tigris = Some(truthy(v));
                        continue;
                    }
                    let key: AmazonS3ConfigKey = k.parse().map_err(err)?;
                    if let AmazonS3ConfigKey::Client(c) = key {
                        client.push((c, (*v).to_owned()));
                    }
                    b = b.with_config(key, *v);
                }
                let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint);
                if tigris.unwrap_or_else(|| endpoint.as_deref().is_some_and(is_tigris_endpoint)) {
                    // Replaces the builder's client options: built again from the same
                    // settings, with the header added.
                    let mut options = object_store::ClientOptions::new();
                    for (k, v) in client {
                        options = options.with_config(k, v);
                    }
                    let mut headers = object_store::HeaderMap::new();
                    headers.insert(TIGRIS_CONSISTENT_HEADER, object_store::HeaderValue::from_static("true"));
                    b = b.with_client_options(options.with_default_headers(headers));
                }
                if let Some(endpoint) = plain_http_endpoint(&b) {
                    return Err(BucketError::PlainHttp { location: location.to_string(), endpoint });
                }
                let store = b.clone().build().map_err(err)?;
                let store = if credentials_configured(&b) {
                    store
                } else {
                    // object_store's last resort is the instance metadata service; its refusal
                    // is marked so that `store_err` can say what is missing instead.
                    let endpoint = b
                        .get_config_value(&AmazonS3ConfigKey::MetadataEndpoint)
                        .unwrap_or_else(|| DEFAULT_METADATA_ENDPOINT.to_owned());
                    let fallback = MetadataCredentials { inner: Arc::clone(store.credentials()), endpoint };
                    b.with_credentials(Arc::new(fallback)).build().map_err(err)?
                };
                (Arc::new(store), prefix.clone())
            }
            Location::Dir(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| err(object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(e) }))?;
                (Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(err)?), String::new())
            }
        };
        let opened =
            Arc::new((location.clone(), overrides.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()));
        Ok(Bucket { store, prefix, location: location.to_string().into(), keep_manifests: KEEP_MANIFESTS, opened })
    }

    /// The same prefix through a client of its own (its own connection pool). Why: an HTTP
    /// client's pooled connections are driven by tasks of the runtime that opened them, so a
    /// client shared by two runtimes stalls the one whose requests land on a connection of the
    /// other while that other is not running (the shipper's runtime sleeps between rounds).
    /// Each runtime that talks to the bucket takes its own.
    pub fn reopened(&self) -> Result<Bucket, BucketError> {
        let (location, overrides) = &*self.opened;
        let overrides: Vec<(&str, &str)> = overrides.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Ok(Bucket { keep_manifests: self.keep_manifests, ..Bucket::open(location, &overrides)? })
    }

    /// This bucket with its writers keeping published manifests for `keep` instead of
    /// [`KEEP_MANIFESTS`] (tests: zero deletes them at once).
    pub fn keep_manifests_for(mut self, keep: std::time::Duration) -> Bucket {
        self.keep_manifests = keep;
        self
    }

    /// The prefix's location, as `--object-store` names it (`s3://BUCKET/PREFIX`, `file:///DIR`).
    pub fn location(&self) -> &str {
        &self.location
    }

    fn path(&self, key: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    fn store_err(&self, source: object_store::Error) -> BucketError {
        let location = self.location.to_string();
        match find::<NoCredentials>(&source) {
            Some(none) => BucketError::NoCredentials { location, why: none.to_string(), source },
            None => BucketError::Store { location, source },
        }
    }

    /// Creates `key` with `bytes` unless it exists: `Ok(false)` when it did.
    ///
    /// S3 answers a conditional create `409 ConditionalRequestConflict` while another create of
    /// the same key is in flight (this writer's own earlier try whose answer was lost, or a
    /// rival's); object_store reports that as `AlreadyExists` too, but nothing is known to exist
    /// then (the other create may fail). So a 409 is tried again, a few times with a growing
    /// pause, and never taken for "exists".
    async fn create(&self, key: &str, bytes: Bytes) -> Result<bool, BucketError> {
        let mut pause = CONFLICT_PAUSE;
        for _ in 0..CONFLICT_TRIES {
            let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
            match self.store.put_opts(&self.path(key), PutPayload::from(bytes.clone()), opts).await {
                Ok(_) => return Ok(true),
                Err(object_store::Error::AlreadyExists { source, .. }) if is_create_conflict(source.as_ref()) => {
                    tracing::debug!(key, "a create of this key is in flight elsewhere (409); trying again");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err(object_store::Error::AlreadyExists { .. }) => return Ok(false),
                Err(e) => return Err(self.store_err(e)),
            }
        }
        Err(BucketError::CreateConflict {
            location: self.location.to_string(),
            key: key.to_owned(),
            tries: CONFLICT_TRIES,
        })
    }

    async fn get(&self, key: &str) -> Result<Bytes, BucketError> {
        let got = self.store.get(&self.path(key)).await.map_err(|e| self.store_err(e))?;
        got.bytes().await.map_err(|e| self.store_err(e))
    }

    async fn manifest(&self, n: u64) -> Result<Manifest, BucketError> {
        let key = keys::manifest(n);
        let mut m = Manifest::decode(&self.get(&key).await?)
            .map_err(|source| BucketError::Manifest { key: key.clone(), source })?;
        if let Some(t) = &m.table {
            let table = self.read(&t.object).await.map_err(|e| match e {
                BucketError::Store { source: object_store::Error::NotFound { .. }, .. } => {
                    BucketError::Missing { key: t.object.key.clone(), named_by: key.clone() }
                }
                e => e,
            })?;
            m = m.with_table(&table).map_err(|source| BucketError::Manifest { key: key.clone(), source })?;
        }
        if m.number != n {
            return Err(BucketError::Manifest {
                key,
                source: ManifestError::Inconsistent("its number is not its name's"),
            });
        }
        Ok(m)
    }

    /// The numbers of the manifests present, in increasing order.
    pub async fn manifest_numbers(&self) -> Result<Vec<u64>, BucketError> {
        let dir = self.path(keys::MANIFESTS);
        let listed: Vec<_> = self.store.list(Some(&dir)).try_collect().await.map_err(|e| self.store_err(e))?;
        let mut numbers: Vec<u64> =
            listed.iter().filter_map(|o| o.location.filename().and_then(keys::manifest_number)).collect();
        numbers.sort_unstable();
        Ok(numbers)
    }

    /// The prefix's state: its newest manifest (`None`: nothing was ever published here).
    ///
    /// A running writer deletes the manifest before its previous one as it publishes, so the
    /// newest listed may be gone by the time it is read (the writer published twice since the
    /// listing): then the listing is taken again.
    pub async fn newest(&self) -> Result<Option<Manifest>, BucketError> {
        let mut gone = 0;
        for _ in 0..TAKEOVER_ATTEMPTS {
            let Some(&n) = self.manifest_numbers().await?.last() else { return Ok(None) };
            match self.manifest(n).await {
                Err(BucketError::Store { source: object_store::Error::NotFound { .. }, .. }) => gone = n,
                got => return got.map(Some),
            }
        }
        Err(BucketError::Vanishing { tries: TAKEOVER_ATTEMPTS, key: keys::manifest(gone) })
    }

    /// Makes this process the prefix's one writer, with the next epoch: creates the manifest
    /// after the newest, carrying its cut. A writer of an older epoch that is still running is
    /// fenced from here on (its next publish fails).
    ///
    /// A busy writer (one publishing every few milliseconds, `--ack-mode bucket` under load)
    /// creates the name this takeover reads as next before the takeover's create arrives,
    /// every time. So after a lost try the takeover *claims* the next epoch ([`Bucket::claim`]),
    /// which the writer finds within [`CLAIM_CHECK_EVERY`] and yields to (it publishes nothing
    /// more), and tries again after [`TAKEOVER_PAUSE`]. The claim decides nothing: the fencing
    /// and the cut carried over are still the manifest create's alone, exactly as without it.
    pub async fn take_over(&self, node: &str, now_ms: i64) -> Result<Writer, BucketError> {
        let mut lost_to = None;
        for _ in 0..TAKEOVER_ATTEMPTS {
            let newest = self.newest().await?;
            if let Some(w) = self.take_over_after(newest.as_ref(), node, now_ms).await? {
                return Ok(w);
            }
            lost_to = self.lost_takeover(newest.as_ref(), node).await?;
        }
        Err(self.contended(lost_to).await)
    }

    /// After a takeover from `base` lost its name: claims the epoch after `base`'s, waits
    /// [`TAKEOVER_PAUSE`], and returns the newest manifest (what took the name) for the error
    /// of a takeover that gives up.
    pub async fn lost_takeover(&self, base: Option<&Manifest>, node: &str) -> Result<Option<Manifest>, BucketError> {
        self.claim(base, node).await?;
        tokio::time::sleep(TAKEOVER_PAUSE).await;
        self.newest().await
    }

    /// The error of a takeover that gave up, naming the manifest that took its name last.
    pub async fn contended(&self, lost_to: Option<Manifest>) -> BucketError {
        let (key, epoch, node) = match lost_to {
            Some(m) => (keys::manifest(m.number), m.epoch, m.node),
            None => ("(no manifest)".into(), 0, "(none)".into()),
        };
        BucketError::Contended { tries: TAKEOVER_ATTEMPTS, key, epoch, node }
    }

    /// Asks the writer of `base`'s epoch to yield: creates the claim of the next epoch
    /// ([`keys::claim`], holding `node`), which that writer looks for as it publishes
    /// ([`CLAIM_CHECK_EVERY`]). An existing claim (another takeover's, or this one's earlier
    /// try) does the same. Nothing to claim without a manifest (no writer yet).
    pub async fn claim(&self, base: Option<&Manifest>, node: &str) -> Result<(), BucketError> {
        let Some(m) = base else { return Ok(()) };
        let epoch = next_epoch(m)?;
        if self.create(&keys::claim(epoch), Bytes::from(node.to_owned())).await? {
            tracing::info!(location = %self.location, epoch, writer = %m.node, "the writer is busy: claimed the next epoch for this takeover");
        }
        Ok(())
    }

    /// The node that claimed writer epoch `epoch` for its takeover, if one did.
    pub async fn claimant(&self, epoch: u64) -> Result<Option<String>, BucketError> {
        match self.get(&keys::claim(epoch)).await {
            Ok(node) => Ok(Some(String::from_utf8_lossy(&node).into_owned())),
            Err(BucketError::Store { source: object_store::Error::NotFound { .. }, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Bucket::take_over`] as of `base`, the newest manifest when the caller read it (`None`:
    /// there was none): creates the manifest after it, carrying its cut. `Ok(None)` when another
    /// manifest took that name first: the bucket moved on, and a caller that made its state
    /// from `base` (a restore, a check of its data directory) does that again with the newer
    /// one. Why not just take the newest: the writer's cut is the state it goes on from, so it
    /// must be exactly the one its data directory was checked or restored against.
    ///
    /// A `base` read from a stale listing may name a manifest whose successor was created and
    /// deleted since (a writer deletes its old manifests): the create then succeeds under a
    /// freed name, below the newest, and would fence no one. So after the create the prefix is
    /// listed again: a manifest above the new one means `base` was stale, and the new manifest
    /// is deleted again (nothing names it: the running writer publishes above it) and `Ok(None)`
    /// is the answer.
    pub async fn take_over_after(
        &self,
        base: Option<&Manifest>,
        node: &str,
        now_ms: i64,
    ) -> Result<Option<Writer>, BucketError> {
        let (number, epoch, mut takeovers, cut) = match base {
            None => (1, 1, Vec::new(), Cut::default()),
            Some(m) => (next_number(m)?, next_epoch(m)?, m.takeovers.clone(), m.cut.clone()),
        };
        takeovers.push(Takeover { epoch, number });
        let table = base.and_then(|m| m.table.clone());
        let m = Manifest {
            format: FORMAT,
            number,
            epoch,
            takeovers,
            node: node.to_owned(),
            written_ms: now_ms,
            table,
            cut,
        };
        if !self.create(&keys::manifest(number), m.encode().into()).await? {
            return Ok(None);
        }
        if self.manifest_numbers().await?.last().is_some_and(|&n| n > number) {
            tracing::info!(location = %self.location, manifest = number, "a takeover from a stale listing: withdrawn");
            if let Err(e) = self.store.delete(&self.path(&keys::manifest(number))).await {
                tracing::warn!(location = %self.location, manifest = number, error = %e, "a withdrawn takeover manifest not deleted");
            }
            return Ok(None);
        }
        tracing::info!(location = %self.location, epoch, manifest = number, "took over the bucket prefix");
        self.tidy(&m, number).await;
        // This epoch's claim, if a lost try made one, has done its work (the writer it asked
        // to yield is fenced now); a takeover that wants this writer to yield claims the next.
        if epoch > 1 {
            self.delete(&keys::claim(epoch)).await;
        }
        Ok(Some(Writer {
            bucket: self.clone(),
            last: m,
            older: Default::default(),
            claim_checked: None,
            claim_check: None,
            yielded: None,
        }))
    }

    /// Deletes the manifests older than `newest`'s predecessor that are no takeover manifest,
    /// up to `upto` (exclusive). Best effort: a leftover is only clutter.
    async fn tidy(&self, newest: &Manifest, upto: u64) {
        let Ok(numbers) = self.manifest_numbers().await else { return };
        let kept: Vec<u64> = newest.takeovers.iter().map(|t| t.number).collect();
        for n in numbers.into_iter().filter(|n| *n + 1 < upto && !kept.contains(n)) {
            if let Err(e) = self.store.delete(&self.path(&keys::manifest(n))).await {
                tracing::debug!(location = %self.location, manifest = n, error = %e, "old manifest not deleted");
            }
        }
    }

    /// The log's objects present (every key under `epoch-*/`) with when each was stored, in
    /// milliseconds since the epoch.
    pub async fn objects(&self) -> Result<Vec<(String, i64)>, BucketError> {
        let root = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
        let listed: Vec<_> = self.store.list(root.as_ref()).try_collect().await.map_err(|e| self.store_err(e))?;
        let strip = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        Ok(listed
            .into_iter()
            .filter_map(|o| {
                let key = o.location.as_ref().strip_prefix(strip.as_str())?.to_owned();
                keys::is_log_object(&key).then(|| (key, o.last_modified.timestamp_millis()))
            })
            .collect())
    }

    /// Stores `bytes` as `key` outside any writer (tests: a stray object for the sweep).
    #[cfg(feature = "test-support")]
    pub async fn put_stray(&self, key: &str, bytes: Bytes) -> Result<(), BucketError> {
        self.create(key, bytes).await.map(|_| ())
    }

    /// Deletes object `key`; best effort (an object no manifest names is only clutter, and a
    /// sweep may take it later).
    pub async fn delete(&self, key: &str) {
        if let Err(e) = self.store.delete(&self.path(key)).await {
            tracing::debug!(location = %self.location, key, error = %e, "object not deleted");
        }
    }

    /// Bytes `range` of an object named by a manifest (a cold read: the object's CRC32C covers
    /// it whole, so a part is checked only for its length; the log's frames carry their own).
    pub async fn read_range(&self, object: &ObjectRef, range: std::ops::Range<u64>) -> Result<Bytes, BucketError> {
        let want = range.end.saturating_sub(range.start);
        let bytes = self.store.get_range(&self.path(&object.key), range).await.map_err(|e| self.store_err(e))?;
        if bytes.len() as u64 != want {
            return Err(BucketError::Corrupt {
                key: object.key.clone(),
                expected_len: object.len,
                expected_crc: object.crc32c,
            });
        }
        Ok(bytes)
    }

    /// Reads an object named by a manifest, checking its length and CRC32C.
    pub async fn read(&self, object: &ObjectRef) -> Result<Bytes, BucketError> {
        let bytes = self.get(&object.key).await?;
        if bytes.len() as u64 != object.len || crc32c::crc32c(&bytes) != object.crc32c {
            return Err(BucketError::Corrupt {
                key: object.key.clone(),
                expected_len: object.len,
                expected_crc: object.crc32c,
            });
        }
        Ok(bytes)
    }
}

/// The epoch of the takeover after `m`: refused when `m`'s is the last there is (a
/// hand-edited manifest; adding one would wrap it to 0 and fence no one).
fn next_epoch(m: &Manifest) -> Result<u64, BucketError> {
    m.epoch.checked_add(1).ok_or_else(|| BucketError::Manifest {
        key: keys::manifest(m.number),
        source: ManifestError::Inconsistent("its writer epoch is the largest there is: no takeover can follow it"),
    })
}

/// The number of the manifest after `m`: refused when `m`'s is the last there is.
fn next_number(m: &Manifest) -> Result<u64, BucketError> {
    m.number.checked_add(1).ok_or_else(|| BucketError::Manifest {
        key: keys::manifest(m.number),
        source: ManifestError::Inconsistent("its number is the largest there is: no manifest can follow it"),
    })
}

/// The prefix's one writer, of one epoch, as long as it is not fenced.
#[derive(Debug)]
pub struct Writer {
    bucket: Bucket,
    /// The last manifest this writer created (its takeover manifest at first).
    last: Manifest,
    /// This writer's published manifests before `last` that are no takeover manifest, oldest
    /// first, with when each was superseded: deleted once [`KEEP_MANIFESTS`] old, except the
    /// newest two.
    older: std::collections::VecDeque<(u64, std::time::Instant)>,
    /// When this writer last looked for a takeover's claim ([`CLAIM_CHECK_EVERY`]).
    claim_checked: Option<std::time::Instant>,
    /// That look, while under way: a task of its own, so that a slow GET holds up no publish
    /// (and with it no acknowledgement in `--ack-mode bucket`).
    claim_check: Option<tokio::task::JoinHandle<Result<Option<String>, BucketError>>>,
    /// The node whose claim this writer yielded to: it publishes nothing more.
    yielded: Option<String>,
}

impl Writer {
    pub fn epoch(&self) -> u64 {
        self.last.epoch
    }

    /// The last manifest this writer published (the cut the bucket holds).
    pub fn published(&self) -> &Manifest {
        &self.last
    }

    pub fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    /// Stores `bytes` as the immutable object `key` (created, never replaced). A key that
    /// exists already with the same bytes was this writer's own earlier attempt whose answer
    /// was lost: success. With other bytes it is [`BucketError::Conflict`] (a bug: a key names
    /// one content, see [`keys::range`]).
    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<ObjectRef, BucketError> {
        let object = ObjectRef { key: key.to_owned(), len: bytes.len() as u64, crc32c: crc32c::crc32c(&bytes) };
        if !self.bucket.create(key, bytes).await? {
            let stored = self.bucket.get(key).await?;
            if stored.len() as u64 != object.len || crc32c::crc32c(&stored) != object.crc32c {
                return Err(BucketError::Conflict { key: key.to_owned() });
            }
        }
        Ok(object)
    }

    /// Publishes `cut` as the prefix's state: creates the manifest after this writer's last.
    /// [`BucketError::Fenced`] when a takeover created it first. When the name holds this
    /// writer's own manifest, its create's answer was lost: with this cut it *is* this publish
    /// (done); with another (an earlier publish that failed on its lost answer) it is taken as
    /// published and `cut` goes into the next name.
    ///
    /// Returns the segment tables earlier manifests named and the published one does not: the
    /// caller deletes them once a restore reading an older manifest can no longer need them.
    pub async fn publish(&mut self, cut: Cut, now_ms: i64) -> Result<Vec<ObjectRef>, BucketError> {
        let check = |source| BucketError::Manifest { key: "(to publish)".into(), source };
        cut.check().map_err(check)?;
        self.check_claim()?;
        let table = self.table_for(&cut).await?;
        let mut tables: Vec<ObjectRef> = self.last.table.iter().map(|t| t.object.clone()).collect();
        // Built once (its cut is moved in, not copied per attempt); only its number changes.
        let mut m = Manifest {
            format: FORMAT,
            number: 0,
            epoch: self.last.epoch,
            takeovers: self.last.takeovers.clone(),
            node: self.last.node.clone(),
            written_ms: now_ms,
            table,
            cut,
        };
        let mut there_node = String::new();
        for _ in 0..TAKEOVER_ATTEMPTS {
            m.number = next_number(&self.last)?;
            if self.bucket.create(&keys::manifest(m.number), m.encode().into()).await? {
                self.superseded_by(m).await;
                return Ok(self.replaced(tables));
            }
            let there = self.bucket.manifest(m.number).await?;
            if there.epoch < self.last.epoch {
                // No takeover of this prefix's state makes an older epoch (a hand-edited or
                // copied manifest): not "fenced by" it, but stopped by it all the same.
                return Err(BucketError::Manifest {
                    key: keys::manifest(m.number),
                    source: ManifestError::Inconsistent("its writer epoch is older than the manifest's before it"),
                });
            }
            if there.epoch != self.last.epoch {
                return Err(BucketError::Fenced { mine: self.last.epoch, by: there.epoch });
            }
            let done = there.cut == m.cut;
            there_node.clone_from(&there.node);
            tables.extend(there.table.iter().map(|t| t.object.clone()));
            self.superseded_by(there).await;
            if done {
                return Ok(self.replaced(tables));
            }
        }
        Err(BucketError::TwoWriters {
            tries: TAKEOVER_ATTEMPTS,
            key: keys::manifest(m.number),
            epoch: self.last.epoch,
            node: there_node,
        })
    }

    /// [`BucketError::Yielded`] once a takeover claimed the next epoch (for good, once found).
    /// Looked for at most every [`CLAIM_CHECK_EVERY`], by a task that this waits for never: a
    /// look's answer counts from the first publish after it arrived. Why a writer yields
    /// although the takeover's create alone fences it: a writer publishing every few
    /// milliseconds takes each name the takeover reads as next before the takeover creates it,
    /// forever. A failed look is only tried again (the claim decides nothing; see
    /// [`Bucket::take_over`]).
    fn check_claim(&mut self) -> Result<(), BucketError> {
        use futures_util::FutureExt;
        let mine = self.last.epoch;
        let Some(by) = mine.checked_add(1) else { return Ok(()) };
        if let Some(look) = self.claim_check.take_if(|h| h.is_finished()) {
            match look.now_or_never() {
                Some(Ok(Ok(found))) => self.yielded = self.yielded.take().or(found),
                Some(Ok(Err(e))) => tracing::debug!(error = %e, "looking for a takeover's claim failed"),
                Some(Err(e)) => tracing::debug!(error = %e, "the look for a takeover's claim ended"),
                None => {}
            }
        }
        let due = self.claim_checked.is_none_or(|t| t.elapsed() >= CLAIM_CHECK_EVERY);
        if self.yielded.is_none() && self.claim_check.is_none() && due {
            self.claim_checked = Some(std::time::Instant::now());
            let bucket = self.bucket.clone();
            self.claim_check = Some(tokio::spawn(async move { bucket.claimant(by).await }));
        }
        match &self.yielded {
            Some(node) => Err(BucketError::Yielded { mine, by, node: node.clone() }),
            None => Ok(()),
        }
    }

    /// Of `tables`, those the last manifest does not name, once each.
    fn replaced(&self, mut tables: Vec<ObjectRef>) -> Vec<ObjectRef> {
        tables.retain(|t| self.last.table.as_ref().is_none_or(|now| now.object != *t));
        tables.dedup();
        tables
    }

    /// The segment table `cut` is published with: the last manifest's while its segments are
    /// still `cut`'s first and fewer than [`TABLE_SLACK`] sealed segments came after them, else
    /// a new one of every sealed, folded segment before the one the cut ends in (none below
    /// [`TABLE_AT`]).
    async fn table_for(&self, cut: &Cut) -> Result<Option<TableRef>, BucketError> {
        let stable = cut.segments.iter().take_while(|s| s.number < cut.end.segment && s.ranges.len() == 1).count();
        if let Some(t) = &self.last.table {
            let n = usize::try_from(t.segments).unwrap_or(usize::MAX);
            let kept = n <= stable && cut.segments.get(..n) == self.last.cut.segments.get(..n);
            if kept && stable - n < TABLE_SLACK {
                return Ok(Some(t.clone()));
            }
        }
        if stable < TABLE_AT {
            return Ok(None);
        }
        let segments: &[SegmentRef] = &cut.segments[..stable];
        let bytes = encode_table(segments);
        let (first, last) = (segments[0].number, segments[stable - 1].number);
        let key = keys::table(self.last.epoch, first, last, crc32c::crc32c(&bytes));
        let object = self.put(&key, bytes.into()).await?;
        metrics::counter!("oncelog_bucket_puts_total").increment(1);
        Ok(Some(TableRef { object, segments: stable as u64 }))
    }

    /// Makes `m` (this writer's, just created) the last, and deletes the manifests before the
    /// previous one once [`KEEP_MANIFESTS`] old (a reader takes the newest). Best effort: a
    /// leftover is only clutter, and the next takeover tidies it.
    async fn superseded_by(&mut self, m: Manifest) {
        let previous = std::mem::replace(&mut self.last, m);
        if previous.takeovers.last().is_none_or(|t| t.number != previous.number) {
            self.older.push_back((previous.number, std::time::Instant::now()));
        }
        while let Some(&(n, at)) = self.older.front() {
            if n + 1 >= self.last.number || at.elapsed() < self.bucket.keep_manifests {
                break;
            }
            self.older.pop_front();
            if let Err(e) = self.bucket.store.delete(&self.bucket.path(&keys::manifest(n))).await {
                tracing::debug!(manifest = n, error = %e, "old manifest not deleted");
            }
        }
    }
}

/// How many times a create that meets another create of its key in flight is tried, and the
/// first pause between tries (doubled each time: 25 ms to 400 ms, 775 ms in all).
const CONFLICT_TRIES: usize = 5;
const CONFLICT_PAUSE: std::time::Duration = std::time::Duration::from_millis(25);

/// Whether a conditional create's `AlreadyExists` is S3's `409 ConditionalRequestConflict` (a
/// create of the key in flight) rather than "the key exists". object_store gives both the same
/// variant; it makes the "exists" answers (`412`, `304`) out of an `object_store::Error` it keeps
/// as the source, and a `409` straight out of its HTTP client's error, whose type is private but
/// whose text names the status ("… status code: 409 Conflict: …").
fn is_create_conflict(source: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    source.downcast_ref::<object_store::Error>().is_none() && source.to_string().contains("status code: 409 ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_http_endpoint_is_refused_at_open_unless_allowed() {
        let at: Location = "s3://bucket/prefix".parse().expect("location");
        let endpoint = ("aws_endpoint", "http://user:pw@127.0.0.1:1/base");
        for allow in ["false", "no"] {
            match Bucket::open(&at, &[endpoint, ("aws_allow_http", allow)]) {
                Err(e @ BucketError::PlainHttp { .. }) => {
                    let text = e.to_string();
                    assert!(
                        text.contains("AWS_ALLOW_HTTP=true") && text.contains("http://user:***@127.0.0.1:1/base"),
                        "{text}"
                    );
                }
                other => panic!("{allow}: expected a refusal, got {other:?}"),
            }
        }
        // Allowed, or https: opened (nothing is sent yet).
        let keys = [("aws_access_key_id", "k"), ("aws_secret_access_key", "s")];
        Bucket::open(&at, &[endpoint, ("aws_allow_http", "true"), keys[0], keys[1]]).expect("allowed");
        Bucket::open(&at, &[("aws_endpoint", "https://s3.example"), ("aws_allow_http", "false"), keys[0], keys[1]])
            .expect("https");
    }

    #[test]
    fn tigris_endpoints_are_recognised_by_host() {
        for yes in [
            "https://t3.storage.dev",
            "https://t3.storage.dev/",
            "https://my-bucket.t3.storage.dev/key",
            "https://fly.storage.tigris.dev",
            "HTTPS://FLY.STORAGE.TIGRIS.DEV:443/",
            "https://user:pw@t3.storage.dev",
            "https://t3.storage.dev./",
            "t3.storage.dev",
        ] {
            assert!(is_tigris_endpoint(yes), "{yes}");
        }
        for no in [
            "https://s3.eu-west-1.amazonaws.com",
            "https://acct.r2.cloudflarestorage.com",
            "http://127.0.0.1:9000",
            "https://[::1]:9000",
            "https://tigris.dev.example.com",
            "https://nottigris.dev",
            "https://xt3.storage.dev",
            "https://storage.dev",
            "https://example.com/t3.storage.dev",
            "https://t3.storage.dev@evil.example",
            "",
        ] {
            assert!(!is_tigris_endpoint(no), "{no}");
        }
    }

    #[test]
    fn the_environments_client_settings_are_the_ones_carried_over() {
        use object_store::ClientConfigKey as C;
        let vars = [
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_REGION", "auto"),
            ("AWS_TIMEOUT", "90s"),
            ("AWS_PROXY_URL", "http://proxy:3128"),
            ("ONCELOG_TIMEOUT", "1s"),
            ("aws_connect_timeout", "1s"),
            ("AWS_NO_SUCH_SETTING", "x"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let got = client_settings_of(vars.into_iter());
        let want = [(C::AllowHttp, "true"), (C::Timeout, "90s"), (C::ProxyUrl, "http://proxy:3128")]
            .map(|(k, v)| (k, v.to_owned()));
        assert_eq!(got, want);
    }

    #[test]
    fn passwords_in_endpoints_are_redacted() {
        assert_eq!(without_password("http://u:pw@h:1/p@x"), "http://u:***@h:1/p@x");
        assert_eq!(without_password("http://h:1/p@x"), "http://h:1/p@x");
        assert_eq!(without_password("http://u@h"), "http://u@h");
    }
}
