//! [`Client`]: connection pool, base URL, headers, timeouts, and the one place requests are sent
//! and retried (what a request is, and how an answer reads, is the `http` module's).

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};

use crate::error::{is_transient_status, status_means_not_processed, Error};
use crate::http::{retry_after, Request};
use crate::retry::{Backoff, Jitter, RetryPolicy, SystemJitter};

/// Called before every request (retries included) to add headers, for example a fresh
/// `Authorization` token. It must be quick: refresh tokens in the background and read the latest.
pub type HeaderProvider = Arc<dyn Fn(&mut HeaderMap) + Send + Sync>;

/// Called before every request (retries included) to add query parameters, for example a URL
/// signature.
pub type QueryProvider = Arc<dyn Fn(&mut Vec<(String, String)>) + Send + Sync>;

/// A Durable Streams client: a connection pool plus the settings every request shares. Cheap to
/// clone; clones share the pool.
#[derive(Clone)]
pub struct Client {
    /// Shared so that stream handles and producers can outlive the `Client` value they came from.
    inner: Arc<Inner>,
}

/// The shared part of a [`Client`].
struct Inner {
    /// The connection pool.
    http: reqwest::Client,
    /// Stream URLs are this URL plus the stream's path.
    base: Url,
    /// Sent on every request.
    default_headers: HeaderMap,
    /// Adds per-request headers (auth).
    header_provider: Option<HeaderProvider>,
    /// Adds per-request query parameters.
    query_provider: Option<QueryProvider>,
    /// How requests are retried unless an operation says otherwise.
    retry: RetryPolicy,
    /// Randomness for retry delays.
    jitter: Arc<dyn Jitter>,
    /// Total time allowed for one non-live request.
    request_timeout: Duration,
    /// Total time allowed for one long-poll request; longer than any server's wait.
    long_poll_timeout: Duration,
    /// Whether plain appends without a key of their own get an automatic `Idempotency-Key`.
    auto_idempotency_key: bool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("base", &self.inner.base.as_str()).finish_non_exhaustive()
    }
}

/// Settings for a [`Client`]; start from [`Client::builder`].
pub struct ClientBuilder {
    /// The streams root URL (see [`Client::builder`]).
    base: String,
    /// Headers for every request.
    default_headers: HeaderMap,
    /// Per-request headers.
    header_provider: Option<HeaderProvider>,
    /// Per-request query parameters.
    query_provider: Option<QueryProvider>,
    /// Default retry policy.
    retry: RetryPolicy,
    /// Randomness for retry delays (replaceable in tests).
    jitter: Arc<dyn Jitter>,
    /// TCP connect timeout.
    connect_timeout: Duration,
    /// Total time for a non-live request.
    request_timeout: Duration,
    /// Total time for a long-poll request.
    long_poll_timeout: Duration,
    /// How long an idle pooled connection is kept.
    pool_idle_timeout: Duration,
    /// Most idle connections kept per host.
    pool_max_idle_per_host: usize,
    /// Extra trusted root certificates (PEM), besides the system's: a private CA.
    ca_certs: Vec<Vec<u8>>,
    /// Automatic `Idempotency-Key` on plain appends.
    auto_idempotency_key: bool,
}

impl Client {
    /// Starts configuring a client. `base_url` is the streams root: a stream `a/b` lives at
    /// `{base_url}/a/b`. For an Oncelog server that is `http://HOST:PORT/v1/stream`.
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base: base_url.into(),
            default_headers: HeaderMap::new(),
            header_provider: None,
            query_provider: None,
            retry: RetryPolicy::default(),
            jitter: Arc::new(SystemJitter::default()),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            long_poll_timeout: Duration::from_secs(90),
            pool_idle_timeout: Duration::from_secs(90),
            pool_max_idle_per_host: 64,
            ca_certs: Vec::new(),
            auto_idempotency_key: true,
        }
    }

    /// A client with default settings.
    pub fn new(base_url: impl Into<String>) -> Result<Client, Error> {
        Client::builder(base_url).build()
    }

    /// The base URL.
    pub fn base_url(&self) -> &Url {
        &self.inner.base
    }

    /// The default retry policy.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retry
    }

    /// Whether plain appends get an automatic `Idempotency-Key` (see
    /// [`ClientBuilder::auto_idempotency_key`]).
    pub fn auto_idempotency_key(&self) -> bool {
        self.inner.auto_idempotency_key
    }

    /// Whether the headers sent on every request include `name`.
    pub(crate) fn has_default_header(&self, name: &str) -> bool {
        self.inner.default_headers.contains_key(name)
    }

    pub(crate) fn jitter(&self) -> Arc<dyn Jitter> {
        self.inner.jitter.clone()
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    pub(crate) fn long_poll_timeout(&self) -> Duration {
        self.inner.long_poll_timeout
    }

    /// Sends `req` once: no retry, no status mapping.
    pub(crate) async fn send_once(&self, req: &Request) -> Result<reqwest::Response, Error> {
        let mut url = req.url.clone();
        if let Some(provider) = &self.inner.query_provider {
            let mut extra = Vec::new();
            provider(&mut extra);
            if !extra.is_empty() {
                url.query_pairs_mut().extend_pairs(extra);
            }
        }
        let mut headers = self.inner.default_headers.clone();
        if let Some(provider) = &self.inner.header_provider {
            provider(&mut headers);
        }
        for (name, value) in &req.headers {
            headers.insert(name.clone(), value.clone());
        }
        let mut builder = self.inner.http.request(req.method.clone(), url).headers(headers);
        if let Some(t) = req.timeout {
            builder = builder.timeout(t);
        }
        if !req.body.is_empty() {
            builder = builder.body(req.body.clone());
        } else if req.method == Method::POST || req.method == Method::PUT {
            builder = builder.header(reqwest::header::CONTENT_LENGTH, "0");
        }
        builder.send().await.map_err(|e| Error::transport(e, req.idempotent))
    }

    /// Sends `req`, retrying under `policy` whatever is transient and safe to repeat: network
    /// errors (on idempotent requests, or when the request never left), `5xx`/`408`/`429` (on
    /// idempotent requests; `429`/`503` on any). Returns the final response whatever its status;
    /// [`crate::http::error_from_response`] maps failures.
    pub(crate) async fn send(&self, req: &Request, policy: &RetryPolicy) -> Result<reqwest::Response, Error> {
        self.send_noting(req, policy, &mut false).await
    }

    /// [`Client::send`] that also sets `maybe_processed` when an attempt it retried may have
    /// been processed by the server (anything but a connect failure, `429` or `503`): then a new
    /// request carrying the same data, unlike a repeat of `req`, could store it twice.
    pub(crate) async fn send_noting(
        &self,
        req: &Request,
        policy: &RetryPolicy,
        maybe_processed: &mut bool,
    ) -> Result<reqwest::Response, Error> {
        let mut backoff = Backoff::new(policy.clone(), self.jitter());
        loop {
            let (retry_after, err) = match self.send_once(req).await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let repeatable = req.idempotent || status_means_not_processed(status);
                    if !(is_transient_status(status) && repeatable) {
                        return Ok(resp);
                    }
                    let retry_after = retry_after(resp.headers());
                    match backoff.next_delay(retry_after) {
                        Some(delay) => {
                            *maybe_processed |= !status_means_not_processed(status);
                            tracing::debug!(status, attempt = backoff.attempts(), ?delay, url = %req.url, "retrying");
                            tokio::time::sleep(delay).await;
                            continue;
                        }
                        None => return Ok(resp),
                    }
                }
                Err(e) => (None, e),
            };
            if !err.is_retry_safe() {
                return Err(err);
            }
            *maybe_processed |= !err.is_connect_failure();
            match backoff.next_delay(retry_after) {
                Some(delay) => {
                    tracing::debug!(error = %err, attempt = backoff.attempts(), ?delay, url = %req.url, "retrying");
                    tokio::time::sleep(delay).await;
                }
                None => return Err(err),
            }
        }
    }
}

impl ClientBuilder {
    /// Adds a header sent on every request.
    pub fn default_header(mut self, name: &str, value: &str) -> Result<Self, Error> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| Error::invalid(format!("invalid header name {name:?}")))?;
        let value =
            HeaderValue::from_str(value).map_err(|_| Error::invalid(format!("invalid value for header {name}")))?;
        self.default_headers.insert(name, value);
        Ok(self)
    }

    /// Sets a function called before every request to add headers (auth tokens that change).
    pub fn header_provider(mut self, provider: impl Fn(&mut HeaderMap) + Send + Sync + 'static) -> Self {
        self.header_provider = Some(Arc::new(provider));
        self
    }

    /// Sets a function called before every request to add query parameters.
    pub fn query_provider(mut self, provider: impl Fn(&mut Vec<(String, String)>) + Send + Sync + 'static) -> Self {
        self.query_provider = Some(Arc::new(provider));
        self
    }

    /// The retry policy of stream operations and readers (producers have their own).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Replaces the randomness behind retry delays (for deterministic tests).
    pub fn jitter(mut self, jitter: Arc<dyn Jitter>) -> Self {
        self.jitter = jitter;
        self
    }

    /// TCP connect timeout (default 10 s).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Total time for one non-live request, body included (default 30 s).
    pub fn request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// Total time for one long-poll request (default 90 s). Keep it above the server's long-poll
    /// wait, or every idle poll ends in a client-side timeout and a retry.
    pub fn long_poll_timeout(mut self, t: Duration) -> Self {
        self.long_poll_timeout = t;
        self
    }

    /// How long idle pooled connections are kept (default 90 s).
    pub fn pool_idle_timeout(mut self, t: Duration) -> Self {
        self.pool_idle_timeout = t;
        self
    }

    /// Most idle pooled connections per host (default 64).
    pub fn pool_max_idle_per_host(mut self, n: usize) -> Self {
        self.pool_max_idle_per_host = n;
        self
    }

    /// Whether a plain append (no producer headers) that has no `Idempotency-Key` of its own is
    /// sent with an automatic one, a random 128-bit key kept for all its attempts, and so is
    /// retried after network errors and `5xx` like an idempotent request (default `true`).
    /// `false`: such appends carry no key and are retried only when the server provably did not
    /// process them, as before keys existed. [`crate::AppendOptions::auto_idempotency_key`]
    /// overrides this per append. The server must honour `Idempotency-Key` (Oncelog does; see
    /// docs/WRITE-MODES.md) for the retries to be safe: a server that ignores the header stores
    /// an append twice when it processed an attempt whose answer was lost.
    pub fn auto_idempotency_key(mut self, on: bool) -> Self {
        self.auto_idempotency_key = on;
        self
    }

    /// Also trusts the root certificate(s) in `pem` (a private CA), besides the system's roots.
    pub fn ca_cert_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_certs.push(pem.into());
        self
    }

    /// Builds the client; fails on a base URL that is not an absolute `http` or `https` URL, or
    /// on a CA certificate that cannot be read. Over `https` (rustls with the system's roots),
    /// HTTP/2 is used when the server offers it.
    pub fn build(self) -> Result<Client, Error> {
        let base = Url::parse(&self.base).map_err(|e| Error::invalid(format!("base URL {:?}: {e}", self.base)))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(Error::invalid(format!("base URL {:?} must be an absolute http or https URL", self.base)));
        }
        let mut http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .pool_idle_timeout(self.pool_idle_timeout)
            .pool_max_idle_per_host(self.pool_max_idle_per_host)
            .tcp_nodelay(true);
        for pem in &self.ca_certs {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| Error::invalid(format!("CA certificate: {e}")))?;
            if certs.is_empty() {
                return Err(Error::invalid("CA certificate: no certificate in the PEM data"));
            }
            for cert in certs {
                http = http.add_root_certificate(cert);
            }
        }
        let http = http.build().map_err(|e| Error::invalid(format!("HTTP client: {e}")))?;
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base,
                default_headers: self.default_headers,
                header_provider: self.header_provider,
                query_provider: self.query_provider,
                retry: self.retry,
                jitter: self.jitter,
                request_timeout: self.request_timeout,
                long_poll_timeout: self.long_poll_timeout,
                auto_idempotency_key: self.auto_idempotency_key,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_and_ca_certificates_are_checked() {
        assert!(Client::new("not a url").is_err());
        assert!(Client::new("mailto:x@y").is_err());
        assert!(Client::new("https://example.com/v1/stream").is_ok());
        let bad_ca = Client::builder("https://example.com/v1/stream").ca_cert_pem(b"nonsense".to_vec()).build();
        assert!(bad_ca.expect_err("no certificate").to_string().contains("CA certificate"));
    }
}
