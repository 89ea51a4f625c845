//! Subscriptions (protocol sections 6 and 7) and Oncelog's transactional commit.
//!
//! [`Subscriptions`] manages them; a pull-wake worker gets a [`Claim`] ([`Subscriptions::claim`],
//! or [`Subscriptions::wait_for_claim`], which waits on the wake stream), reads its streams from
//! the acknowledged offsets, and finishes with [`Claim::ack`] or, to write results exactly once,
//! [`Claim::commit`]: output appends and input acks in one atomic step that a zombie (a worker
//! whose lease passed to another) cannot make. Outputs carry producer headers by the convention
//! `sub:{id}` / epoch = generation / seq from 0 per wake, so a retried commit is a duplicate and
//! even a plain append by a zombie is fenced by the epoch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::client::Client;
use crate::error::Error;
use crate::http::Request;
use crate::offset::StreamOffset;

/// How a subscription announces work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriptionKind {
    /// Signed `POST`s to `url`.
    Webhook { url: String },
    /// Wake events appended to the JSON stream `wake_stream`; workers claim.
    PullWake { wake_stream: String },
}

/// A subscription's configuration (`PUT`); an idempotent re-create must repeat it exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionConfig {
    pub kind: SubscriptionKind,
    /// `*` one path segment, `**` any number.
    pub pattern: Option<String>,
    /// Streams linked by name.
    pub streams: Vec<String>,
    /// `None`: the server's default (30 s).
    pub lease_ttl: Option<Duration>,
    pub description: Option<String>,
    /// Path prefixes commits may write under (required for commits when the server checks
    /// access; its creator needs `append` under each).
    pub outputs: Vec<String>,
}

impl SubscriptionConfig {
    pub fn pull_wake(wake_stream: impl Into<String>) -> Self {
        SubscriptionConfig {
            kind: SubscriptionKind::PullWake { wake_stream: wake_stream.into() },
            pattern: None,
            streams: Vec::new(),
            lease_ttl: None,
            description: None,
            outputs: Vec::new(),
        }
    }

    pub fn webhook(url: impl Into<String>) -> Self {
        SubscriptionConfig { kind: SubscriptionKind::Webhook { url: url.into() }, ..Self::pull_wake("") }
    }

    pub fn pattern(mut self, pattern: impl Into<String>) -> Self {
        self.pattern = Some(pattern.into());
        self
    }

    pub fn stream(mut self, path: impl Into<String>) -> Self {
        self.streams.push(path.into());
        self
    }

    /// Lets commits write under `prefix`.
    pub fn output(mut self, prefix: impl Into<String>) -> Self {
        self.outputs.push(prefix.into());
        self
    }

    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = Some(ttl);
        self
    }

    fn to_json(&self) -> Value {
        let mut v = json!({ "pattern": self.pattern, "streams": self.streams, "description": self.description, "outputs": self.outputs });
        if let Some(m) = v.as_object_mut() {
            match &self.kind {
                SubscriptionKind::Webhook { url } => {
                    m.insert("type".into(), json!("webhook"));
                    m.insert("webhook".into(), json!({ "url": url }));
                }
                SubscriptionKind::PullWake { wake_stream } => {
                    m.insert("type".into(), json!("pull-wake"));
                    m.insert("wake_stream".into(), json!(wake_stream));
                }
            }
            if let Some(t) = self.lease_ttl {
                m.insert("lease_ttl_ms".into(), json!(t.as_millis() as u64));
            }
        }
        v
    }
}

/// One linked stream, as the server reports it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LinkInfo {
    pub path: String,
    /// `explicit` or `glob`.
    pub link_type: String,
    /// Processed up to here.
    pub acked_offset: StreamOffset,
    pub tail_offset: StreamOffset,
    pub has_pending: bool,
}

/// A subscription as `GET` shows it (the whole answer is in `raw`).
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionInfo {
    pub id: String,
    /// `webhook` or `pull-wake`.
    pub kind: String,
    pub generation: u64,
    /// `active`, or `failed` while a webhook retry is scheduled.
    pub status: String,
    pub streams: Vec<LinkInfo>,
    pub raw: Value,
}

impl SubscriptionInfo {
    fn parse(raw: Value) -> Result<Self, Error> {
        let s = |k: &str| raw.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        let streams = serde_json::from_value(raw.get("streams").cloned().unwrap_or(Value::Array(Vec::new())))?;
        Ok(SubscriptionInfo {
            id: s("id"),
            kind: s("type"),
            status: s("status"),
            generation: raw.get("generation").and_then(Value::as_u64).unwrap_or(0),
            streams,
            raw,
        })
    }

    /// The link of `path`, if any.
    pub fn link(&self, path: &str) -> Option<&LinkInfo> {
        self.streams.iter().find(|l| l.path == path)
    }
}

/// The subscription API of one server.
#[derive(Clone)]
pub struct Subscriptions {
    client: Client,
}

/// Why a claim found nothing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoClaim {
    /// Another worker holds the current wake.
    Claimed { holder: String },
    /// No linked stream has unprocessed data.
    NoPendingWork,
}

impl Client {
    /// The subscription API of this client's server.
    pub fn subscriptions(&self) -> Subscriptions {
        Subscriptions { client: self.clone() }
    }
}

/// A subscription error answer (`{"error": {"code", ...}}`) as an [`Error`]. An answer in
/// another shape (the access check's plain-text `401`/`403`, a proxy's page) keeps its first line
/// as the message and is named by its status, so the reason is never dropped.
async fn sub_error(resp: reqwest::Response) -> Error {
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let e = &body["error"];
    let text =
        || String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).lines().next().unwrap_or("").trim().to_owned();
    let code = match e["code"].as_str() {
        Some(c) => c.to_owned(),
        None => match status {
            401 => "UNAUTHORIZED",
            403 => "FORBIDDEN",
            404 => "NOT_FOUND",
            _ => "UNKNOWN",
        }
        .to_owned(),
    };
    Error::Subscription {
        status,
        code,
        message: e["message"].as_str().map_or_else(text, str::to_owned),
        holder: e["current_holder"].as_str().map(str::to_owned),
    }
}

impl Subscriptions {
    fn url(&self, segments: &[&str]) -> reqwest::Url {
        let mut url = self.client.base_url().clone();
        if let Ok(mut segs) = url.path_segments_mut() {
            segs.pop_if_empty().push("__ds");
            for s in segments {
                segs.push(s);
            }
        }
        url
    }

    async fn call(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<Value>,
        token: Option<&str>,
        idempotent: bool,
    ) -> Result<reqwest::Response, Error> {
        let mut req = Request::new(method, self.url(segments), idempotent, Some(self.client.request_timeout()));
        if let Some(b) = body {
            req.header("content-type", "application/json")?;
            req.body = Bytes::from(b.to_string());
        }
        if let Some(t) = token {
            req.header("authorization", &format!("Bearer {t}"))?;
        }
        let resp = self.client.send(&req, self.client.retry_policy()).await?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(sub_error(resp).await)
        }
    }

    async fn json(resp: reqwest::Response) -> Result<Value, Error> {
        let bytes = resp.bytes().await.map_err(|e| Error::transport(e, true))?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// Creates the subscription, or confirms it exists with this configuration; `true` when
    /// created.
    pub async fn put(&self, id: &str, config: &SubscriptionConfig) -> Result<(bool, SubscriptionInfo), Error> {
        let resp = self.call(Method::PUT, &["subscriptions", id], Some(config.to_json()), None, true).await?;
        let created = resp.status().as_u16() == 201;
        Ok((created, SubscriptionInfo::parse(Self::json(resp).await?)?))
    }

    pub async fn get(&self, id: &str) -> Result<SubscriptionInfo, Error> {
        SubscriptionInfo::parse(
            Self::json(self.call(Method::GET, &["subscriptions", id], None, None, true).await?).await?,
        )
    }

    pub async fn delete(&self, id: &str) -> Result<(), Error> {
        self.call(Method::DELETE, &["subscriptions", id], None, None, true).await.map(drop)
    }

    /// Every subscription's id, type, pattern and generation (an Oncelog extension).
    pub async fn list(&self) -> Result<Vec<Value>, Error> {
        let v = Self::json(self.call(Method::GET, &["subscriptions"], None, None, true).await?).await?;
        Ok(v["subscriptions"].as_array().cloned().unwrap_or_default())
    }

    /// Links more streams by name (at their current tails).
    pub async fn add_streams(&self, id: &str, paths: &[&str]) -> Result<(), Error> {
        self.call(Method::POST, &["subscriptions", id, "streams"], Some(json!({ "streams": paths })), None, true)
            .await
            .map(drop)
    }

    pub async fn remove_stream(&self, id: &str, path: &str) -> Result<(), Error> {
        self.call(Method::DELETE, &["subscriptions", id, "streams", path], None, None, true).await.map(drop)
    }

    /// Claims the current wake of a pull-wake subscription for `worker`.
    pub async fn claim(&self, id: &str, worker: &str) -> Result<Result<Claim, NoClaim>, Error> {
        // Safe to repeat: the holder claiming again gets the same wake back.
        match self
            .call(Method::POST, &["subscriptions", id, "claim"], Some(json!({ "worker": worker })), None, true)
            .await
        {
            Ok(resp) => Ok(Ok(Claim::parse(self.clone(), id, Self::json(resp).await?)?)),
            Err(Error::Subscription { code, holder, .. }) if code == "ALREADY_CLAIMED" => {
                Ok(Err(NoClaim::Claimed { holder: holder.unwrap_or_default() }))
            }
            Err(Error::Subscription { code, .. }) if code == "NO_PENDING_WORK" => Ok(Err(NoClaim::NoPendingWork)),
            Err(e) => Err(e),
        }
    }

    /// Claims work, waiting up to `timeout` for some: retries whenever the wake stream moves (a
    /// long-poll on it) and at least every `lease_poll` (a lease that ran out writes no event).
    pub async fn wait_for_claim(
        &self,
        id: &str,
        worker: &str,
        wake_stream: &str,
        lease_poll: Duration,
        timeout: Duration,
    ) -> Result<Option<Claim>, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let wake = self.client.stream(wake_stream);
        let mut from = wake.head().await?.next_offset;
        loop {
            if let Ok(claim) = self.claim(id, worker).await? {
                return Ok(Some(claim));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let wait = lease_poll.min(deadline - now);
            let mut req = Request::new(Method::GET, wake.url().clone(), true, Some(wait + Duration::from_secs(5)));
            req.url.query_pairs_mut().append_pair("offset", from.as_str()).append_pair("live", "long-poll");
            match tokio::time::timeout(wait, self.client.send_once(&req)).await {
                Ok(Ok(resp)) => {
                    if let Some(next) = resp.headers().get("stream-next-offset").and_then(|v| v.to_str().ok()) {
                        from = StreamOffset::new(next);
                    }
                }
                Ok(Err(_)) => tokio::time::sleep(wait.min(Duration::from_millis(200))).await,
                Err(_) => {}
            }
        }
    }
}

/// Work a pull-wake worker holds: the wake's generation and its token, and the streams with
/// unprocessed data. Everything done with it is fenced by the generation.
#[derive(Clone)]
pub struct Claim {
    subs: Subscriptions,
    pub subscription: String,
    pub wake_id: String,
    pub generation: u64,
    token: String,
    pub streams: Vec<LinkInfo>,
    pub lease_ttl: Duration,
    /// Next producer sequence number per output stream within this wake.
    seqs: Arc<Mutex<HashMap<String, u64>>>,
    /// Where acks go: `ack` for a claimed pull wake, `callback` for a webhook.
    via: &'static str,
}

/// What an ack or commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// Work came in meanwhile: a new wake was issued at once.
    pub next_wake: bool,
    /// A retry of a commit that already happened: nothing was done again.
    pub duplicate: bool,
    /// Per output append: where its stream ends now.
    pub appends: Vec<(String, StreamOffset)>,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("subscription", &self.subscription)
            .field("generation", &self.generation)
            .field("streams", &self.streams)
            .finish()
    }
}

impl Claim {
    pub(crate) fn parse(subs: Subscriptions, id: &str, v: Value) -> Result<Claim, Error> {
        let via = if v.get("callback_token").is_some() { "callback" } else { "ack" };
        let token = v.get("token").or_else(|| v.get("callback_token")).cloned().unwrap_or(Value::Null);
        let bad = || Error::InvalidResponse("wake lacks wake_id, generation or token".into());
        Ok(Claim {
            subs,
            subscription: id.to_owned(),
            wake_id: v["wake_id"].as_str().ok_or_else(bad)?.to_owned(),
            generation: v["generation"].as_u64().ok_or_else(bad)?,
            token: token.as_str().ok_or_else(bad)?.to_owned(),
            streams: serde_json::from_value(v["streams"].clone())?,
            lease_ttl: Duration::from_millis(v["lease_ttl_ms"].as_u64().unwrap_or(30_000)),
            seqs: Arc::default(),
            via,
        })
    }

    fn fenced_body(&self, acks: &[(&str, &StreamOffset)], done: bool) -> Value {
        let acks: Vec<Value> = acks.iter().map(|(s, o)| json!({ "stream": s, "offset": o.as_str() })).collect();
        json!({ "wake_id": self.wake_id, "generation": self.generation, "acks": acks, "done": done })
    }

    /// Acknowledges progress (a claim's `…/ack`, a webhook's `…/callback`). Without `done` it is
    /// a heartbeat that extends the lease; with it the wake ends.
    pub async fn ack(&self, acks: &[(&str, &StreamOffset)], done: bool) -> Result<Committed, Error> {
        let resp = self
            .subs
            .call(
                Method::POST,
                &["subscriptions", &self.subscription, self.via],
                Some(self.fenced_body(acks, done)),
                Some(&self.token),
                false,
            )
            .await?;
        let v = Subscriptions::json(resp).await?;
        Ok(Committed { next_wake: v["next_wake"].as_bool().unwrap_or(false), duplicate: false, appends: Vec::new() })
    }

    /// Gives the wake up unfinished; its work is offered again at once.
    pub async fn release(&self) -> Result<(), Error> {
        let body = json!({ "wake_id": self.wake_id, "generation": self.generation });
        self.subs
            .call(Method::POST, &["subscriptions", &self.subscription, "release"], Some(body), Some(&self.token), false)
            .await
            .map(drop)
    }

    /// Starts a transactional commit: outputs and acks that happen together or not at all.
    pub fn commit(&self) -> Commit<'_> {
        Commit { claim: self, appends: Vec::new(), acks: Vec::new(), reserved: Vec::new() }
    }
}

/// A commit being built ([`Claim::commit`]). A clone is the same commit: send it again when
/// the outcome of sending it was unknown.
#[derive(Clone)]
pub struct Commit<'a> {
    claim: &'a Claim,
    appends: Vec<Value>,
    acks: Vec<(String, StreamOffset)>,
    /// Sequence numbers taken by this commit, per stream.
    reserved: Vec<(String, u64)>,
}

impl Commit<'_> {
    fn next_seq(&mut self, stream: &str) -> u64 {
        let mut seqs = self.claim.seqs.lock().unwrap_or_else(|p| p.into_inner());
        let seq = seqs.entry(stream.to_owned()).or_insert(0);
        let this = *seq;
        *seq += 1;
        self.reserved.push((stream.to_owned(), this));
        this
    }

    fn producer(&mut self, stream: &str) -> Value {
        let seq = self.next_seq(stream);
        json!({ "id": format!("sub:{}", self.claim.subscription), "epoch": self.claim.generation, "seq": seq })
    }

    /// Appends a JSON value (an array appends its elements) to a JSON stream.
    pub fn append_json(mut self, stream: &str, value: Value) -> Self {
        let producer = self.producer(stream);
        self.appends.push(json!({ "stream": stream, "producer": producer, "data": value }));
        self
    }

    /// Appends text to a byte stream.
    pub fn append_text(mut self, stream: &str, text: &str) -> Self {
        let producer = self.producer(stream);
        self.appends.push(json!({ "stream": stream, "producer": producer, "data": text }));
        self
    }

    /// Acknowledges `stream` up to `offset`.
    pub fn ack(mut self, stream: &str, offset: &StreamOffset) -> Self {
        self.acks.push((stream.to_owned(), offset.clone()));
        self
    }

    /// Sends it. The same commit may be sent again after an unknown outcome (it is a duplicate
    /// then); after [`Error::Subscription`] with code `FENCED` the work belongs to another worker.
    pub async fn send(self, done: bool) -> Result<Committed, Error> {
        let acks: Vec<(&str, &StreamOffset)> = self.acks.iter().map(|(s, o)| (s.as_str(), o)).collect();
        let mut body = self.claim.fenced_body(&acks, done);
        if let Some(m) = body.as_object_mut() {
            m.insert("appends".into(), Value::Array(self.appends.clone()));
        }
        let segments = ["subscriptions", self.claim.subscription.as_str(), "commit"];
        // Safe to repeat: the outputs are producer appends and the acks only move forward.
        let resp = self.claim.subs.call(Method::POST, &segments, Some(body), Some(&self.claim.token), true).await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                // Refused for sure (a 4xx, not an unknown outcome): the sequence numbers are free
                // again for the next commit of this wake.
                if matches!(&e, Error::Subscription { status: 400..=499, .. }) {
                    let mut seqs = self.claim.seqs.lock().unwrap_or_else(|p| p.into_inner());
                    for (stream, seq) in &self.reserved {
                        if let Some(s) = seqs.get_mut(stream) {
                            *s = (*s).min(*seq);
                        }
                    }
                }
                return Err(e);
            }
        };
        let v = Subscriptions::json(resp).await?;
        let appends = v["appends"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| {
                        (
                            x["stream"].as_str().unwrap_or("").to_owned(),
                            StreamOffset::new(x["next_offset"].as_str().unwrap_or("")),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Committed {
            next_wake: v["next_wake"].as_bool().unwrap_or(false),
            duplicate: v["duplicate"].as_bool().unwrap_or(false),
            appends,
        })
    }
}
