//! [`StreamHandle`]: one stream's URL and the plain operations on it (create, append, close,
//! delete, head, trim, compact), and [`Client::stream`], which makes one. Readers
//! ([`StreamHandle::read`]) and producers ([`StreamHandle::producer`]) build on a handle in
//! their own modules.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use oncelog_protocol::headers::{closed_flag, names};
use reqwest::header::{HeaderMap, CONTENT_TYPE};
use reqwest::{Method, Url};

use crate::client::Client;
use crate::error::{status_means_not_processed, Error};
use crate::http::{error_from_response, header_str, header_u64, next_offset, Op, Request};
use crate::offset::StreamOffset;
use crate::retry::Backoff;

/// A handle on one stream. Cheap to clone; nothing is sent until an operation is called.
#[derive(Clone)]
pub struct StreamHandle {
    /// Pool, headers and retry settings.
    client: Client,
    /// The stream's URL.
    url: Url,
    /// The stream's content type once known (from create or head): appends need it, and it
    /// decides JSON mode for readers and producers.
    content_type: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for StreamHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamHandle").field("url", &self.url.as_str()).finish_non_exhaustive()
    }
}

/// Options of [`StreamHandle::create`].
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// The stream's content type; the server's default (`application/octet-stream`) if `None`.
    pub content_type: Option<String>,
    /// `Stream-TTL`: expire after this many idle seconds.
    pub ttl_seconds: Option<u64>,
    /// `Stream-Expires-At`: expire at this RFC 3339 time.
    pub expires_at: Option<String>,
    /// Create the stream already closed (its body, if any, is all it will ever hold).
    pub closed: bool,
    /// `Stream-Retention-Max-Age` (an Oncelog extension): data older than this many seconds is
    /// dropped by the server's sweep. `None`: the server's default.
    pub retention_max_age_seconds: Option<Limit>,
    /// `Stream-Retention-Max-Bytes` (an Oncelog extension): keep at least this many of the
    /// newest bytes, drop whole appends before them. `None`: the server's default.
    pub retention_max_bytes: Option<Limit>,
    /// `Stream-Compaction: state` (an Oncelog extension): a JSON stream of State Protocol
    /// messages that [`StreamHandle::compact`] can shorten.
    pub state_compaction: bool,
    /// Initial content.
    pub body: Bytes,
    /// Extra headers for this request.
    pub headers: HeaderMap,
}

/// A retention limit asked for at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// No limit, whatever the server's default (`none`).
    Unlimited,
    /// This many seconds or bytes.
    At(u64),
}

impl Limit {
    fn header_value(&self) -> String {
        match self {
            Limit::Unlimited => "none".to_owned(),
            Limit::At(n) => n.to_string(),
        }
    }
}

/// What [`StreamHandle::trim`] left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trimmed {
    /// Where the stream can be read from now.
    pub earliest: StreamOffset,
    /// The stream's tail.
    pub next_offset: StreamOffset,
}

impl CreateOptions {
    /// Options for a stream of `content_type`.
    pub fn content_type(content_type: impl Into<String>) -> CreateOptions {
        CreateOptions { content_type: Some(content_type.into()), ..CreateOptions::default() }
    }
}

/// What [`StreamHandle::create`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// `true` for `201 Created`, `false` when an identical stream already existed (`200`).
    pub created: bool,
    /// The tail after any initial content.
    pub next_offset: StreamOffset,
    /// Whether the stream is closed.
    pub closed: bool,
}

/// Options of [`StreamHandle::delete_with`].
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `DELETE …?purge=true` (an Oncelog extension, docs/PROTOCOL-EXTENSIONS.md "Purge"): a
    /// stream that forks still read, live or already deleted (then it answers `410` and keeps
    /// its path reserved), is detached from its path, which is free at once for a new stream;
    /// the forks read on unchanged. Without forks it is a plain delete. A server without the
    /// extension may ignore the parameter and delete as usual, leaving the path reserved.
    pub purge: bool,
    /// Extra headers for this request (`If-Match: <offset>`: only if nobody wrote since).
    pub headers: HeaderMap,
}

/// Options of [`StreamHandle::append`].
#[derive(Debug, Clone, Default)]
pub struct AppendOptions {
    /// Content type of the body; the stream's own when `None` (learned with a `HEAD` if needed).
    pub content_type: Option<String>,
    /// `Stream-Seq`: an application sequence that must increase byte-wise.
    pub stream_seq: Option<String>,
    /// `If-Match`: append only if the stream's tail is this offset, else
    /// [`Error::PreconditionFailed`] and nothing is written (see [`StreamHandle::append_if`]).
    pub if_match: Option<StreamOffset>,
    /// `Stream-Expected-Offset` (the protocol's strict compare-and-append): append only if the
    /// stream's tail is exactly this offset, else [`Error::ExpectedOffsetConflict`] with the
    /// current tail and nothing written. Where `if_match` is Oncelog's extension (`412`), this
    /// is the upstream protocol's header (`409`), understood by every server that implements it.
    pub expected_offset: Option<StreamOffset>,
    /// `Idempotency-Key` (see [`crate::new_idempotency_key`]): a repeat of the append with the
    /// same key and body is answered from the first, never written twice, so an append with a
    /// key is retried after any transient failure. A key set here (or as an `Idempotency-Key`
    /// in `headers`) is sent as it is; without one, see `auto_idempotency_key`.
    pub idempotency_key: Option<String>,
    /// Whether this append, when it has no key of its own and no producer headers, is sent with
    /// an automatic `Idempotency-Key` (a random 128-bit key, the same on every attempt) and so
    /// retried after network errors and `5xx`. `None`: the client's setting
    /// ([`crate::ClientBuilder::auto_idempotency_key`], on by default). `Some(false)`: no key,
    /// and no retry once the server may have the data (the error surfaces, with
    /// [`Error::is_retry_safe`] `false`).
    pub auto_idempotency_key: Option<bool>,
    /// Extra headers for this request.
    pub headers: HeaderMap,
}

/// Producer headers: an append that carries them is deduplicated by its `(epoch, seq)`, and the
/// server refuses them together with an `Idempotency-Key`.
const PRODUCER_HEADERS: [&str; 3] = [names::PRODUCER_ID, names::PRODUCER_EPOCH, names::PRODUCER_SEQ];

/// What a plain append returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The stream's tail after the append.
    pub next_offset: StreamOffset,
    /// Whether the stream is now closed.
    pub closed: bool,
}

/// Stream metadata from `HEAD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// The stream's content type.
    pub content_type: String,
    /// The tail offset.
    pub next_offset: StreamOffset,
    /// Whether the stream is closed.
    pub closed: bool,
    /// `Stream-TTL`, if set.
    pub ttl_seconds: Option<u64>,
    /// `Stream-Expires-At`, if set.
    pub expires_at: Option<String>,
    /// `Stream-Earliest-Offset`: where reads can start (after trims and retention), when the
    /// server says.
    pub earliest_offset: Option<StreamOffset>,
    /// `Stream-Retention-Max-Age`, if the stream has one.
    pub retention_max_age_seconds: Option<u64>,
    /// `Stream-Retention-Max-Bytes`, if the stream has one.
    pub retention_max_bytes: Option<u64>,
    /// Whether it was created with `Stream-Compaction: state`.
    pub state_compaction: bool,
}

// Here rather than in client.rs, so that the client, which every stream operation uses, never
// names the handle built on it.
impl Client {
    /// A handle on the stream at `path` (relative to the base URL; a leading `/` is ignored).
    /// Nothing is sent until an operation is called.
    pub fn stream(&self, path: &str) -> StreamHandle {
        StreamHandle::new(self.clone(), self.stream_url(path))
    }

    fn stream_url(&self, path: &str) -> Url {
        let mut url = self.base_url().clone();
        if let Ok(mut segs) = url.path_segments_mut() {
            segs.pop_if_empty();
            for seg in path.trim_start_matches('/').split('/') {
                segs.push(seg);
            }
        }
        url
    }
}

impl StreamHandle {
    fn new(client: Client, url: Url) -> StreamHandle {
        StreamHandle { client, url, content_type: Arc::new(Mutex::new(None)) }
    }

    /// The stream's URL.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The client this handle uses.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Tells the handle the stream's content type, saving a `HEAD` before the first append.
    pub fn with_content_type(self, content_type: impl Into<String>) -> StreamHandle {
        self.set_content_type(content_type.into());
        self
    }

    /// The stream's content type, if known yet.
    pub fn known_content_type(&self) -> Option<String> {
        self.content_type.lock().map(|g| g.clone()).unwrap_or(None)
    }

    fn set_content_type(&self, ct: String) {
        if let Ok(mut g) = self.content_type.lock() {
            *g = Some(ct);
        }
    }

    /// The stream's content type, asking the server if it is not known yet.
    pub async fn content_type(&self) -> Result<String, Error> {
        match self.known_content_type() {
            Some(ct) => Ok(ct),
            None => Ok(self.head().await?.content_type),
        }
    }

    fn request(&self, method: Method, idempotent: bool) -> Request {
        Request::new(method, self.url.clone(), idempotent, Some(self.client.request_timeout()))
    }

    /// `PUT`: creates the stream, or confirms that an identical one exists (`created == false`).
    /// A stream with a different configuration is [`Error::ConfigMismatch`]. Retried like any
    /// idempotent request.
    pub async fn create(&self, opts: CreateOptions) -> Result<Created, Error> {
        let mut req = self.request(Method::PUT, true);
        if let Some(ct) = &opts.content_type {
            req.header("content-type", ct)?;
        }
        if let Some(ttl) = opts.ttl_seconds {
            req.header(names::STREAM_TTL, &ttl.to_string())?;
        }
        if let Some(at) = &opts.expires_at {
            req.header(names::STREAM_EXPIRES_AT, at)?;
        }
        if opts.closed {
            req.header(names::STREAM_CLOSED, "true")?;
        }
        if let Some(l) = opts.retention_max_age_seconds {
            req.header(names::STREAM_RETENTION_MAX_AGE, &l.header_value())?;
        }
        if let Some(l) = opts.retention_max_bytes {
            req.header(names::STREAM_RETENTION_MAX_BYTES, &l.header_value())?;
        }
        if opts.state_compaction {
            req.header(names::STREAM_COMPACTION, "state")?;
        }
        req.headers.extend(opts.headers);
        req.body = opts.body;
        let resp = self.client.send(&req, self.client.retry_policy()).await?;
        let status = resp.status().as_u16();
        if !matches!(status, 200 | 201) {
            return Err(error_from_response(resp, Op::Create, true).await);
        }
        let h = resp.headers();
        if let Some(ct) = header_str(h, CONTENT_TYPE.as_str()).map(str::to_owned).or(opts.content_type) {
            self.set_content_type(ct);
        }
        Ok(Created {
            created: status == 201,
            next_offset: next_offset(h)?,
            closed: closed_flag(header_str(h, names::STREAM_CLOSED)),
        })
    }

    /// `POST` without producer headers. By default it carries an automatic `Idempotency-Key`
    /// (a random 128-bit key, the same on every attempt), so it is retried after network errors,
    /// `5xx`, `408` and `429` (honouring `Retry-After`) under the client's retry policy, and a
    /// retry of an attempt the server had already stored is answered from it, never written
    /// twice. Other `4xx` (such as `422`, [`Error::IdempotencyKeyMismatch`]) are never retried.
    /// A key of the caller's own ([`AppendOptions::idempotency_key`]) is used instead of the
    /// automatic one.
    ///
    /// With [`AppendOptions::auto_idempotency_key`] `Some(false)` (or the client's
    /// [`crate::ClientBuilder::auto_idempotency_key`] `false`) the append is **not idempotent**:
    /// it is retried only when the request provably was not processed (connect failure, `429`,
    /// `503`), and any other failure's [`Error::is_retry_safe`] is `false`: the data may or may
    /// not be stored. The automatic key needs a server that honours `Idempotency-Key` (Oncelog;
    /// not every Durable Streams server does: one that ignores it may store a retried append
    /// twice). [`crate::Producer`]s deduplicate by sequence number instead and never carry a key.
    pub async fn append(&self, data: impl Into<Bytes>, opts: AppendOptions) -> Result<Appended, Error> {
        self.post(data.into(), opts, false).await
    }

    /// Appends `data` only if nobody wrote since the reader saw the tail `offset` (optimistic
    /// concurrency): the new tail, or [`Error::PreconditionFailed`] carrying the current tail,
    /// in which case nothing was written; read what changed, decide again, retry at the new
    /// tail. A conditional append can never land twice or anywhere but at `offset`. Like
    /// [`StreamHandle::append`] it carries an automatic `Idempotency-Key` unless the client
    /// turned that off, so a retry after a lost answer is recognised as the same append (the
    /// server answers it from the first, where a bare retry would get a `412` naming its own
    /// write); without the key it is not retried after an ambiguous failure.
    pub async fn append_if(&self, offset: &StreamOffset, data: impl Into<Bytes>) -> Result<StreamOffset, Error> {
        let opts = AppendOptions { if_match: Some(offset.clone()), ..AppendOptions::default() };
        Ok(self.post(data.into(), opts, false).await?.next_offset)
    }

    /// Appends `data` and closes the stream in one atomic step. Keyed and retried like
    /// [`StreamHandle::append`] (a repeat of a keyed append is answered from the first even after
    /// the stream closed).
    pub async fn append_and_close(&self, data: impl Into<Bytes>, opts: AppendOptions) -> Result<Appended, Error> {
        self.post(data.into(), opts, true).await
    }

    async fn post(&self, data: Bytes, opts: AppendOptions, close: bool) -> Result<Appended, Error> {
        if data.is_empty() {
            return Err(Error::invalid("an append needs a non-empty body (use close() to close without data)"));
        }
        let ct = match opts.content_type {
            Some(ct) => ct,
            None => self.content_type().await?,
        };
        // With a key the server answers a repeat from the first append: safe to retry. A key of
        // the caller's is kept; producer headers never get one (the server refuses the mix).
        let has = |name: &str| opts.headers.contains_key(name) || self.client.has_default_header(name);
        let caller_key = opts.idempotency_key.is_some() || has(names::IDEMPOTENCY_KEY);
        let producer = PRODUCER_HEADERS.iter().any(|h| has(h));
        let auto = opts.auto_idempotency_key.unwrap_or_else(|| self.client.auto_idempotency_key());
        let auto_key = (auto && !caller_key && !producer).then(crate::key::random_key);
        let idempotent = caller_key || auto_key.is_some();
        let mut req = self.request(Method::POST, idempotent);
        req.header("content-type", &ct)?;
        if let Some(seq) = &opts.stream_seq {
            req.header(names::STREAM_SEQ, seq)?;
        }
        if let Some(tail) = &opts.if_match {
            req.header(names::IF_MATCH, tail.as_str())?;
        }
        if let Some(tail) = &opts.expected_offset {
            req.header(names::STREAM_EXPECTED_OFFSET, tail.as_str())?;
        }
        if let Some(key) = opts.idempotency_key.as_ref().or(auto_key.as_ref()) {
            req.header(names::IDEMPOTENCY_KEY, key)?;
        }
        if close {
            req.header(names::STREAM_CLOSED, "true")?;
        }
        req.headers.extend(opts.headers);
        req.body = data;
        let op = Op::Append { stream_seq: opts.stream_seq.is_some() };
        let mut maybe_processed = false;
        let sent = self.client.send_noting(&req, self.client.retry_policy(), &mut maybe_processed).await;
        // An automatic key dies with this call: calling `append` again sends a new key. So its
        // final error is retry-safe only if no attempt can have been processed.
        let finish = |e: Error| {
            let unprocessed = match &e {
                Error::Transport { .. } => e.is_connect_failure(),
                Error::Status { status, .. } => status_means_not_processed(*status),
                _ => true,
            };
            if auto_key.is_some() && (maybe_processed || !unprocessed) {
                e.not_retry_safe()
            } else {
                e
            }
        };
        let resp = sent.map_err(finish)?;
        if !matches!(resp.status().as_u16(), 200 | 204) {
            return Err(finish(error_from_response(resp, op, idempotent).await));
        }
        let h = resp.headers();
        Ok(Appended { next_offset: next_offset(h)?, closed: closed_flag(header_str(h, names::STREAM_CLOSED)) })
    }

    /// Closes the stream without appending: readers reach EOF at the current tail. Idempotent
    /// (closing a closed stream succeeds), so it is retried freely. Returns the final offset.
    pub async fn close(&self) -> Result<StreamOffset, Error> {
        self.close_with_headers(HeaderMap::new()).await
    }

    /// [`StreamHandle::close`] with extra request headers.
    pub async fn close_with_headers(&self, headers: HeaderMap) -> Result<StreamOffset, Error> {
        let mut req = self.request(Method::POST, true);
        req.header(names::STREAM_CLOSED, "true")?;
        req.headers.extend(headers);
        let resp = self.client.send(&req, self.client.retry_policy()).await?;
        if !matches!(resp.status().as_u16(), 200 | 204) {
            return Err(error_from_response(resp, Op::Other, true).await);
        }
        next_offset(resp.headers())
    }

    /// Drops everything before `to` (`POST` with `Stream-Trim-To`, an Oncelog extension): reads
    /// from before it then fail with [`Error::Trimmed`]. Monotonic (a lower `to` changes
    /// nothing) and idempotent, so it is retried like any idempotent request. `to` must be an
    /// offset this server returned; beyond the tail (or inside a JSON message) is
    /// [`Error::BadRequest`].
    pub async fn trim(&self, to: &StreamOffset) -> Result<Trimmed, Error> {
        let mut req = self.request(Method::POST, true);
        req.header(names::STREAM_TRIM_TO, to.as_str())?;
        self.send_trim(req).await
    }

    /// Compacts a stream created with [`CreateOptions::state_compaction`] (`POST` with
    /// `Stream-Compact: true`, an Oncelog extension): the server writes a snapshot of the state
    /// its history materialises at the tail and drops the history; readers from the beginning
    /// then read the snapshot. Returns where the stream starts now. Retried like an idempotent
    /// request (a second compaction right after the first changes nothing).
    pub async fn compact(&self) -> Result<Trimmed, Error> {
        let mut req = self.request(Method::POST, true);
        req.header(names::STREAM_COMPACT, "true")?;
        self.send_trim(req).await
    }

    async fn send_trim(&self, req: Request) -> Result<Trimmed, Error> {
        let resp = self.client.send(&req, self.client.retry_policy()).await?;
        if !matches!(resp.status().as_u16(), 200 | 204) {
            return Err(error_from_response(resp, Op::Other, true).await);
        }
        let h = resp.headers();
        let earliest = header_str(h, names::STREAM_EARLIEST_OFFSET)
            .filter(|v| !v.is_empty())
            .map(StreamOffset::new)
            .ok_or_else(|| Error::InvalidResponse("trim answer has no Stream-Earliest-Offset header".into()))?;
        Ok(Trimmed { earliest, next_offset: next_offset(h)? })
    }

    /// `DELETE`: removes the stream and its data. Retried on transient failures; a `404` after
    /// an attempt whose outcome was lost counts as success (that attempt deleted it).
    pub async fn delete(&self) -> Result<(), Error> {
        self.delete_with(DeleteOptions::default()).await
    }

    /// [`StreamHandle::delete`] with extra request headers.
    pub async fn delete_with_headers(&self, headers: HeaderMap) -> Result<(), Error> {
        self.delete_with(DeleteOptions { headers, ..DeleteOptions::default() }).await
    }

    /// [`StreamHandle::delete`] with options: `purge` frees the path of a stream that forks
    /// still read (see [`DeleteOptions::purge`]). Retried the same way: a purge is idempotent
    /// too, and a `404` after a lost answer means that attempt freed the path.
    pub async fn delete_with(&self, opts: DeleteOptions) -> Result<(), Error> {
        let mut req = self.request(Method::DELETE, true);
        if opts.purge {
            req.url.query_pairs_mut().append_pair("purge", "true");
        }
        req.headers.extend(opts.headers);
        let mut backoff = Backoff::new(self.client.retry_policy().clone(), self.client.jitter());
        let mut maybe_applied = false;
        loop {
            let err = match self.client.send_once(&req).await {
                Ok(resp) => match resp.status().as_u16() {
                    200 | 202 | 204 => return Ok(()),
                    404 if maybe_applied => return Ok(()),
                    _ => error_from_response(resp, Op::Other, true).await,
                },
                Err(e) => e,
            };
            if !err.is_retry_safe() {
                return Err(err);
            }
            // A 5xx or a lost response may hide a delete that happened.
            maybe_applied = true;
            match backoff.next_delay(err.retry_after()) {
                Some(d) => tokio::time::sleep(d).await,
                None => return Err(err),
            }
        }
    }

    /// `HEAD`: content type, tail and closure.
    pub async fn head(&self) -> Result<StreamInfo, Error> {
        self.head_with_headers(HeaderMap::new()).await
    }

    /// [`StreamHandle::head`] with extra request headers.
    pub async fn head_with_headers(&self, headers: HeaderMap) -> Result<StreamInfo, Error> {
        let mut req = self.request(Method::HEAD, true);
        req.headers.extend(headers);
        let resp = self.client.send(&req, self.client.retry_policy()).await?;
        if resp.status().as_u16() != 200 {
            return Err(error_from_response(resp, Op::Other, true).await);
        }
        let h = resp.headers();
        let info = StreamInfo {
            content_type: header_str(h, CONTENT_TYPE.as_str())
                .unwrap_or(oncelog_protocol::content_type::DEFAULT)
                .to_owned(),
            next_offset: next_offset(h)?,
            closed: closed_flag(header_str(h, names::STREAM_CLOSED)),
            ttl_seconds: header_u64(h, names::STREAM_TTL),
            expires_at: header_str(h, names::STREAM_EXPIRES_AT).map(str::to_owned),
            earliest_offset: header_str(h, names::STREAM_EARLIEST_OFFSET)
                .filter(|v| !v.is_empty())
                .map(StreamOffset::new),
            retention_max_age_seconds: header_u64(h, names::STREAM_RETENTION_MAX_AGE),
            retention_max_bytes: header_u64(h, names::STREAM_RETENTION_MAX_BYTES),
            state_compaction: header_str(h, names::STREAM_COMPACTION).is_some_and(|v| v.eq_ignore_ascii_case("state")),
        };
        self.set_content_type(info.content_type.clone());
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_urls_join_and_escape() {
        let c = Client::new("http://127.0.0.1:1/v1/stream").expect("client");
        assert_eq!(c.stream("a/b").url().as_str(), "http://127.0.0.1:1/v1/stream/a/b");
        assert_eq!(c.stream("/x y").url().as_str(), "http://127.0.0.1:1/v1/stream/x%20y");
        let c = Client::new("http://127.0.0.1:1/").expect("client");
        assert_eq!(c.stream("/s").url().as_str(), "http://127.0.0.1:1/s");
    }
}
