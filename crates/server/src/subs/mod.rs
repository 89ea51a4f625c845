//! The subscription API under `/v1/stream/__ds/` (protocol sections 6 and 7), plus Oncelog's
//! transactional commit (docs/PROTOCOL-EXTENSIONS.md): thin handlers over
//! [`oncelog_subscriptions::Subscriptions`].
//!
//! - [`wire`]: request bodies and answers.
//! - [`ssrf`]: which webhook URLs may be called.
//! - [`dispatch`]: the task that delivers webhooks and retries them.
//! - [`error`]: why a subscription request was refused.

pub mod dispatch;
pub mod error;
pub mod ssrf;
pub mod wire;

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use base64::Engine as _;
use bytes::Bytes;
use oncelog_protocol::content_type;
use oncelog_protocol::headers::ProducerHeaders;
use oncelog_storage::{AppendRequest, Engine};
use oncelog_subscriptions::{AckRequest, AckVia, Fence, PutVerdict, SubError, SubKind};
use serde_json::{json, Value};

use crate::auth::scope::Op;
use crate::auth::AuthError;
use crate::reply;
use crate::request::RequestError;
use crate::request_kind::{Fenced, NoCall, SubCall};
use crate::state::AppState;
use crate::stored_body::{stored_body, Stored};

pub use error::SubApiError;

/// Most output appends one commit may carry.
pub const MAX_COMMIT_APPENDS: usize = 64;

/// After new data in `path` (an append, a create with data, a commit's output): the
/// subscriptions linked to it are woken. A failure is only logged: the write stands, and the
/// dispatcher's periodic pass issues the wake.
pub(crate) async fn after_write<E: Engine>(st: &AppState<E>, path: &str, now_ms: i64) {
    if let Err(e) = st.subs.on_write(path, now_ms).await {
        tracing::warn!(stream = path, error = %e, "subscriptions not woken now; the dispatcher will retry");
    }
}

/// The base URL clients reach this server at, for `callback_url` and `jwks_url`.
pub fn base_url<E>(st: &AppState<E>, req_headers: &HeaderMap) -> String {
    if let Some(u) = st.config.public_url.as_ref().or(st.base_url.get()) {
        return u.trim_end_matches('/').to_owned();
    }
    let host = req_headers.get("host").and_then(|v| v.to_str().ok()).unwrap_or("localhost");
    let scheme = if st.config.tls.is_some() { "https" } else { "http" };
    format!("{scheme}://{host}")
}

/// Every request under `/v1/stream/__ds/`, dispatched by its [`SubCall`] to the call's handler.
pub async fn route<E: Engine>(
    st: &AppState<E>,
    method: &Method,
    uri: &Uri,
    req_headers: &HeaderMap,
    body: Body,
    access: &crate::auth::Access,
) -> Result<Response, SubApiError> {
    let call = SubCall::parse(method, uri.path()).map_err(|e| match e {
        NoCall::Method => SubApiError::Method,
        NoCall::Route => SubApiError::NoRoute,
    })?;
    let now = st.clock.now_ms();
    let read = |body| crate::body::read(body, req_headers, st.config.body_limits());
    match call {
        // Answered by `crate::listing` before the subscription API is asked
        // (`handlers::dispatch`); never a subscription call.
        SubCall::Streams => Err(SubApiError::NoRoute),
        SubCall::Jwks => {
            let keys = st.sub_keys.get(st.engine.as_ref(), now).await?;
            let mut resp = reply::json(StatusCode::OK, &keys.jwks());
            let h = resp.headers_mut();
            h.insert("content-type", axum::http::HeaderValue::from_static("application/jwk-set+json"));
            h.insert("cache-control", axum::http::HeaderValue::from_static("public, max-age=300"));
            Ok(resp)
        }
        SubCall::List => {
            let list = st.subs.list().await?;
            let items: Vec<Value> = list.iter().map(|r| json!({ "id": r.id, "type": match r.config.kind { SubKind::Webhook { .. } => "webhook", SubKind::PullWake { .. } => "pull-wake" }, "pattern": r.config.pattern, "generation": r.generation })).collect();
            Ok(reply::json(StatusCode::OK, &json!({ "subscriptions": items })))
        }
        SubCall::Put(id) => {
            let config = wire::sub_config(&read(body).await?)?;
            may_link(access, &config)?;
            let quota = quota(st, access, &config);
            Ok(put(st, &id, req_headers, config, &quota, now).await?)
        }
        SubCall::Get(id) => {
            let view = st.subs.get(&id, now).await?;
            Ok(reply::json(StatusCode::OK, &render_view(st, &view, req_headers, now).await?))
        }
        SubCall::Delete(id) => {
            st.subs.delete(&id, now).await?;
            Ok(reply::no_content())
        }
        SubCall::AddStreams(id) => {
            let add = wire::stream_list(&read(body).await?)?;
            if let Some(scope) = &access.scope {
                if let Some(p) = add.iter().find(|p| !scope.allows(p, Op::Read)) {
                    return Err(AuthError::Forbidden { op: Op::Read, stream: p.clone() }.into());
                }
            }
            st.subs.relink(&id, add, Vec::new(), now).await?;
            Ok(reply::no_content())
        }
        SubCall::RemoveStream { id, path } => {
            st.subs.relink(&id, Vec::new(), vec![path], now).await?;
            Ok(reply::no_content())
        }
        SubCall::Claim(id) => {
            let worker = wire::worker(&read(body).await?)?;
            let notice = st.subs.claim(&id, &worker, now).await;
            crate::metrics::subscription_call("claim", if notice.is_ok() { "ok" } else { "refused" });
            let notice = notice?;
            let keys = st.sub_keys.get(st.engine.as_ref(), now).await?;
            let token = keys.mint(&id, notice.uid, notice.generation, now);
            Ok(reply::json(StatusCode::OK, &wire::notice(&notice, &token, None)))
        }
        SubCall::Fenced { id, call } => {
            let token = bearer(req_headers).ok_or(SubError::TokenInvalid)?;
            let body = read(body).await?;
            let r = fenced_op(st, &id, call, &token, &body, now).await;
            let outcome = match &r {
                Ok((_, true)) => "duplicate",
                Ok(_) => "ok",
                Err(SubApiError::Sub(SubError::Fenced)) => "fenced",
                Err(_) => "refused",
            };
            crate::metrics::subscription_call(call.name(), outcome);
            Ok(r?.0)
        }
    }
}

fn bearer(h: &HeaderMap) -> Option<String> {
    let v = h.get("authorization")?.to_str().ok()?;
    let t = v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer "))?.trim();
    (!t.is_empty()).then(|| t.to_owned())
}

/// With access control on, a subscription may only follow what its creator may read, wake
/// events go only to a stream its creator may append to, and its commits may only write under
/// `outputs` prefixes its creator may append under.
fn may_link(access: &crate::auth::Access, config: &oncelog_subscriptions::SubConfig) -> Result<(), SubApiError> {
    let Some(scope) = &access.scope else { return Ok(()) };
    let refuse = |op, stream: String| Err(AuthError::Forbidden { op, stream }.into());
    if let Some(p) = config.streams.iter().find(|p| !scope.allows(p, Op::Read)) {
        return refuse(Op::Read, p.clone());
    }
    if let Some(prefix) = config
        .pattern
        .as_deref()
        .map(oncelog_subscriptions::glob::literal_prefix)
        .filter(|p| !scope.allows_all_under(p, Op::Read))
    {
        return refuse(Op::Read, format!("every stream under {prefix:?} (the pattern's prefix)"));
    }
    if let SubKind::PullWake { wake_stream } = &config.kind {
        if !scope.allows(wake_stream, Op::Append) {
            return refuse(Op::Append, wake_stream.clone());
        }
    }
    if let Some(p) = config.outputs.iter().find(|p| !scope.allows_all_under(p, Op::Append)) {
        return refuse(Op::Append, format!("every stream under {p:?} (an output prefix)"));
    }
    Ok(())
}

/// How many subscriptions a create may find: `--max-subscriptions` in all, and with access
/// control `--max-subscriptions-per-prefix` under each prefix grant of the creator's token
/// that covers what the subscription follows (its pattern's literal prefix, its streams, its
/// wake stream): a tenant confined to its prefix cannot take every subscription of the server.
fn quota<E>(
    st: &AppState<E>,
    access: &crate::auth::Access,
    config: &oncelog_subscriptions::SubConfig,
) -> oncelog_subscriptions::Quota {
    let mut prefixes = Vec::new();
    if let Some(scope) = &access.scope {
        let pattern = config.pattern.as_deref().map(oncelog_subscriptions::glob::literal_prefix);
        let wake = match &config.kind {
            SubKind::PullWake { wake_stream } => Some(wake_stream.as_str()),
            SubKind::Webhook { .. } => None,
        };
        for target in pattern.as_deref().into_iter().chain(config.streams.iter().map(String::as_str)).chain(wake) {
            prefixes.extend(scope.prefixes_covering(target, Op::Read));
        }
        prefixes.sort();
        prefixes.dedup();
    }
    oncelog_subscriptions::Quota {
        max: st.config.max_subscriptions,
        prefixes,
        per_prefix: st.config.max_subscriptions_per_prefix,
    }
}

async fn put<E: Engine>(
    st: &AppState<E>,
    id: &str,
    req_headers: &HeaderMap,
    config: oncelog_subscriptions::SubConfig,
    quota: &oncelog_subscriptions::Quota,
    now: i64,
) -> Result<Response, SubApiError> {
    if let SubKind::Webhook { url } = &config.kind {
        ssrf::check(url, st.config.dev_webhooks)?;
        // Keys exist (durably) before the first webhook subscription is acknowledged.
        st.sub_keys.get(st.engine.as_ref(), now).await?;
    }
    let (verdict, view) = st.subs.put_within(id, config, quota, now).await?;
    let status = if verdict == PutVerdict::Created { StatusCode::CREATED } else { StatusCode::OK };
    Ok(reply::json(status, &render_view(st, &view, req_headers, now).await?))
}

async fn render_view<E: Engine>(
    st: &AppState<E>,
    view: &oncelog_subscriptions::SubView,
    req_headers: &HeaderMap,
    now: i64,
) -> Result<Value, SubApiError> {
    let signing = match view.record.config.kind {
        SubKind::Webhook { .. } => Some(st.sub_keys.get(st.engine.as_ref(), now).await?.kid().to_owned()),
        SubKind::PullWake { .. } => None,
    };
    let jwks_url = format!("{}/v1/stream/__ds/jwks.json", base_url(st, req_headers));
    Ok(wire::sub_view(view, signing.as_deref().map(|kid| (kid, jwks_url.as_str()))))
}

/// Callback, ack, release and commit: the token and the body's generation and wake id are the
/// fence; everything after it happens in one transaction or not at all.
/// Answers with the response and whether it was a resent commit (a duplicate).
async fn fenced_op<E: Engine>(
    st: &AppState<E>,
    id: &str,
    op: Fenced,
    token: &str,
    body: &[u8],
    now: i64,
) -> Result<(Response, bool), SubApiError> {
    let req = wire::fenced(body)?;
    let keys = st.sub_keys.get(st.engine.as_ref(), now).await?;
    let hide = st.auth.hides_forbidden();
    // Normally the subscription first (404), then the token (401), then the fence (409). With
    // `--auth-hide-forbidden` the answer must not depend on whether the subscription exists: the
    // token is checked first, and a token that is not this subscription's answers as a missing
    // subscription would.
    let claims =
        if hide { Some(keys.verify(token, now).ok().filter(|c| c.id == id).ok_or(SubError::NotFound)?) } else { None };
    let record = st.subs.record(id).await?;
    let claims = match claims {
        Some(c) => c,
        None => keys.verify(token, now)?,
    };
    if claims.id != id {
        return Err(SubError::TokenInvalid.into());
    }
    let fence = Fence {
        uid: claims.uid,
        token_generation: claims.generation,
        generation: req.generation,
        wake_id: req.wake_id.clone(),
    };
    let (via, outputs) = match op {
        Fenced::Release => {
            st.subs.release(id, &fence, now).await?;
            return Ok((reply::no_content(), false));
        }
        Fenced::Callback => (AckVia::Callback, Vec::new()),
        Fenced::Ack => (AckVia::Ack, Vec::new()),
        Fenced::Commit => {
            // With access control on, the token is a write grant only under the prefixes the
            // subscription was created with (and its creator was allowed to append under);
            // checked before any output stream is looked up, so the refusal does not depend on
            // whether the stream exists.
            let allowed = (!st.auth.is_open()).then_some(OutputRule { prefixes: &record.config.outputs, hide });
            let outputs = outputs(st, &req.body, allowed, now).await?;
            (AckVia::Commit, outputs)
        }
    };
    let out = st
        .subs
        .ack(id, AckRequest { fence, acks: req.acks, done: req.done, via, outputs: outputs.clone() }, now)
        .await?;
    // Outputs are new data in their streams: wake whoever follows them.
    for a in &outputs {
        after_write(st, &a.path, now).await;
    }
    let mut v = json!({ "ok": true, "next_wake": out.next_wake });
    if via == AckVia::Commit {
        if let Some(m) = v.as_object_mut() {
            m.insert("duplicate".into(), json!(out.duplicate));
            let appends: Vec<Value> = outputs
                .iter()
                .zip(&out.appends)
                .map(|(a, o)| json!({ "stream": a.path, "next_offset": o.next_offset.to_string(), "duplicate": o.status != oncelog_storage::AppendStatus::Appended }))
                .collect();
            m.insert("appends".into(), json!(appends));
        }
    }
    Ok((reply::json(StatusCode::OK, &v), out.duplicate))
}

/// Where a commit may write under access control: paths under `prefixes`; `hide`: a path
/// outside them is answered as a missing stream (`--auth-hide-forbidden`).
struct OutputRule<'a> {
    prefixes: &'a [String],
    hide: bool,
}

/// A commit's `appends`, framed for their streams as a `POST` would be. Each needs producer
/// headers: without them a retried commit would write its outputs twice.
async fn outputs<E: Engine>(
    st: &AppState<E>,
    body: &serde_json::Map<String, Value>,
    allowed: Option<OutputRule<'_>>,
    now: i64,
) -> Result<Vec<AppendRequest>, SubApiError> {
    let items = match body.get("appends") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(wire::WireError::Field("appends").into()),
    };
    if items.len() > MAX_COMMIT_APPENDS {
        return Err(SubApiError::Output { index: MAX_COMMIT_APPENDS, why: "at most 64 appends per commit" });
    }
    let mut out = Vec::with_capacity(items.len());
    for (index, a) in items.iter().enumerate() {
        let bad = |why| SubApiError::Output { index, why };
        let stream = a.get("stream").and_then(Value::as_str).ok_or(bad("stream is required"))?;
        let p = a.get("producer").ok_or(bad("producer {id, epoch, seq} is required"))?;
        let producer = match (
            p.get("id").and_then(Value::as_str),
            p.get("epoch").and_then(Value::as_u64),
            p.get("seq").and_then(Value::as_u64),
        ) {
            (Some(id), Some(epoch), Some(seq)) if !id.is_empty() => ProducerHeaders { id: id.to_owned(), epoch, seq },
            _ => return Err(bad("producer needs a non-empty id and integer epoch and seq")),
        };
        if let Some(rule) = &allowed {
            if !rule.prefixes.iter().any(|p| stream.starts_with(p.as_str())) {
                let stream = stream.to_owned();
                return Err(match rule.hide {
                    true => SubApiError::OutputLookup { index, stream, source: oncelog_storage::LookupError::NotFound },
                    false => SubApiError::OutputNotAllowed { index, stream },
                });
            }
        }
        let info = st.engine.head(stream, now).await.map_err(|source| SubApiError::OutputLookup {
            index,
            stream: stream.to_owned(),
            source,
        })?;
        let ct = match a.get("content_type") {
            None | Some(Value::Null) => info.config.content_type.clone(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad("content_type must be a string")),
        };
        let json = content_type::is_json(&ct) && content_type::is_json(&info.config.content_type);
        // The body as a `POST` would carry it, then framed as a `POST`'s is.
        let body = match (a.get("data"), a.get("data_base64").and_then(Value::as_str)) {
            (Some(v), None) if json => Bytes::from(v.to_string()),
            (Some(Value::String(s)), None) => Bytes::from(s.clone()),
            (None, Some(b64)) if !json => Bytes::from(
                base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| bad("data_base64 is not base64"))?,
            ),
            _ => {
                return Err(bad(
                    "data (JSON for JSON streams, else a string) or data_base64 (byte streams) is required",
                ))
            }
        };
        let Stored { json_framed, data, body_digest } =
            stored_body(&info, Some(&ct), &body, true).map_err(|e| match e {
                RequestError::NotStateProtocol(_) => bad("this stream takes State Protocol messages only"),
                _ => bad("data is not appendable JSON (an empty array appends nothing)"),
            })?;
        if data.is_empty() {
            return Err(bad("an output must carry data"));
        }
        out.push(AppendRequest {
            path: stream.to_owned(),
            stream_id: Some(info.id),
            json_framed,
            content_type: Some(ct),
            body_digest,
            data,
            close: a.get("close").and_then(Value::as_bool).unwrap_or(false),
            stream_seq: None,
            producer: Some(producer),
            if_match: None,
            expected_offset: None,
            idempotency_key: None,
            now_ms: now,
        });
    }
    Ok(out)
}
