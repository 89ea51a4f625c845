//! The JSON of the subscription API: request bodies parsed into typed values (with a short
//! reason when they are not what the protocol says), and answers rendered.

use oncelog_protocol::headers::format_rfc3339;
use oncelog_protocol::Offset;
use oncelog_subscriptions::{Ack, Link, LinkType, SubConfig, SubKind, SubView, WakeNotice, DEFAULT_LEASE_TTL_MS};
use serde_json::{json, Map, Value};

/// Why a request body was refused (400 `INVALID_REQUEST`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the body must be a JSON object")]
    NotObject,
    #[error("type must be \"webhook\" or \"pull-wake\"")]
    Type,
    #[error("{0} has the wrong type")]
    Field(&'static str),
    #[error("{0} is required")]
    Missing(&'static str),
    #[error("an offset is not a token this server returned")]
    Offset { stream: String },
}

fn object(body: &[u8]) -> Result<Map<String, Value>, WireError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(WireError::NotObject),
    }
}

fn opt_str(m: &Map<String, Value>, name: &'static str) -> Result<Option<String>, WireError> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(WireError::Field(name)),
    }
}

fn str_list(m: &Map<String, Value>, name: &'static str) -> Result<Vec<String>, WireError> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            items.iter().map(|v| v.as_str().map(str::to_owned).ok_or(WireError::Field(name))).collect()
        }
        Some(_) => Err(WireError::Field(name)),
    }
}

/// `PUT …/subscriptions/{id}`.
pub fn sub_config(body: &[u8]) -> Result<SubConfig, WireError> {
    let m = object(body)?;
    let kind = match m.get("type").and_then(Value::as_str) {
        Some("webhook") => {
            let url = m
                .get("webhook")
                .and_then(|w| w.get("url"))
                .and_then(Value::as_str)
                .ok_or(WireError::Missing("webhook.url"))?;
            SubKind::Webhook { url: url.to_owned() }
        }
        Some("pull-wake") => {
            SubKind::PullWake { wake_stream: opt_str(&m, "wake_stream")?.ok_or(WireError::Missing("wake_stream"))? }
        }
        _ => return Err(WireError::Type),
    };
    let lease_ttl_ms = match m.get("lease_ttl_ms") {
        None | Some(Value::Null) => DEFAULT_LEASE_TTL_MS,
        Some(v) => v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or(WireError::Field("lease_ttl_ms"))?,
    };
    Ok(SubConfig {
        kind,
        pattern: opt_str(&m, "pattern")?,
        streams: str_list(&m, "streams")?,
        lease_ttl_ms,
        description: opt_str(&m, "description")?,
        outputs: str_list(&m, "outputs")?,
    })
}

/// `POST …/streams`: a non-empty list of paths.
pub fn stream_list(body: &[u8]) -> Result<Vec<String>, WireError> {
    let list = str_list(&object(body)?, "streams")?;
    if list.is_empty() {
        return Err(WireError::Missing("streams"));
    }
    Ok(list)
}

/// `POST …/claim`.
pub fn worker(body: &[u8]) -> Result<String, WireError> {
    opt_str(&object(body)?, "worker")?.filter(|w| !w.is_empty()).ok_or(WireError::Missing("worker"))
}

/// The fields every callback, ack, release and commit carries.
pub struct Fenced {
    pub wake_id: String,
    pub generation: u64,
    pub acks: Vec<Ack>,
    pub done: bool,
    pub body: Map<String, Value>,
}

pub fn fenced(body: &[u8]) -> Result<Fenced, WireError> {
    let m = object(body)?;
    let wake_id = opt_str(&m, "wake_id")?.ok_or(WireError::Missing("wake_id"))?;
    let generation = m.get("generation").and_then(Value::as_u64).ok_or(WireError::Missing("generation"))?;
    let mut acks = Vec::new();
    match m.get("acks") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for a in items {
                let stream = a.get("stream").and_then(Value::as_str).ok_or(WireError::Field("acks[].stream"))?;
                let offset = a.get("offset").and_then(Value::as_str).ok_or(WireError::Field("acks[].offset"))?;
                let offset = Offset::parse(offset).map_err(|_| WireError::Offset { stream: stream.to_owned() })?;
                acks.push(Ack { stream: stream.to_owned(), offset });
            }
        }
        Some(_) => return Err(WireError::Field("acks")),
    }
    let done = match m.get("done") {
        None | Some(Value::Null) => false,
        Some(v) => v.as_bool().ok_or(WireError::Field("done"))?,
    };
    Ok(Fenced { wake_id, generation, acks, done, body: m })
}

fn link(l: &Link) -> Value {
    json!({
        "path": l.path,
        "link_type": match l.link_type { LinkType::Explicit => "explicit", LinkType::Glob => "glob" },
        "acked_offset": l.acked.to_string(),
        "tail_offset": l.tail.to_string(),
        "has_pending": l.has_pending(),
    })
}

/// The body of `GET …/subscriptions/{id}` (and of `PUT`); `kid`/`jwks_url` for webhooks.
pub fn sub_view(v: &SubView, signing: Option<(&str, &str)>) -> Value {
    let r = &v.record;
    let (kind, webhook, wake_stream) = match &r.config.kind {
        SubKind::Webhook { url } => {
            let signing = signing.map(|(kid, jwks_url)| json!({ "alg": "ed25519", "kid": kid, "jwks_url": jwks_url }));
            ("webhook", json!({ "url": url, "signing": signing }), Value::Null)
        }
        SubKind::PullWake { wake_stream } => ("pull-wake", Value::Null, json!(wake_stream)),
    };
    json!({
        "id": r.id,
        "subscription_id": r.id,
        "type": kind,
        "pattern": r.config.pattern,
        "streams": v.links.iter().map(link).collect::<Vec<_>>(),
        "webhook": webhook,
        "wake_stream": wake_stream,
        "lease_ttl_ms": r.config.lease_ttl_ms,
        "description": r.config.description,
        "outputs": r.config.outputs,
        "created_at": format_rfc3339(r.created_ms),
        "generation": r.generation,
        "status": if r.failures > 0 { "failed" } else { "active" },
        "next_attempt_at": (r.failures > 0).then(|| format_rfc3339(r.next_attempt_ms)),
    })
}

/// A wake as a claim answer or a webhook body (`token` is the claim or callback token).
pub fn notice(n: &WakeNotice, token: &str, callback_url: Option<&str>) -> Value {
    let mut v = json!({
        "subscription_id": n.id,
        "wake_id": n.wake_id,
        "generation": n.generation,
        "streams": n.streams.iter().map(link).collect::<Vec<_>>(),
        "lease_ttl_ms": n.lease_ttl_ms,
    });
    if let (Some(url), Some(m)) = (callback_url, v.as_object_mut()) {
        m.insert("callback_url".into(), json!(url));
        m.insert("callback_token".into(), json!(token));
    } else if let Some(m) = v.as_object_mut() {
        m.insert("token".into(), json!(token));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_bodies() {
        let c =
            sub_config(br#"{"type":"webhook","pattern":"events/*","webhook":{"url":"https://x"},"lease_ttl_ms":1000}"#)
                .expect("webhook");
        assert_eq!((c.kind, c.lease_ttl_ms), (SubKind::Webhook { url: "https://x".into() }, 1000));
        let c = sub_config(br#"{"type":"pull-wake","streams":["a","b"],"wake_stream":"w"}"#).expect("pull");
        assert_eq!((c.streams.len(), c.lease_ttl_ms), (2, DEFAULT_LEASE_TTL_MS));
        for (bad, want) in [
            (&b"[]"[..], WireError::NotObject),
            (b"{", WireError::NotObject),
            (br#"{"type":"poll"}"#, WireError::Type),
            (br#"{"type":"webhook","pattern":"a"}"#, WireError::Missing("webhook.url")),
            (br#"{"type":"pull-wake","pattern":"a"}"#, WireError::Missing("wake_stream")),
            (br#"{"type":"pull-wake","wake_stream":"w","streams":[1]}"#, WireError::Field("streams")),
            (br#"{"type":"pull-wake","wake_stream":"w","lease_ttl_ms":"5"}"#, WireError::Field("lease_ttl_ms")),
            (br#"{"type":"pull-wake","wake_stream":"w","lease_ttl_ms":-1}"#, WireError::Field("lease_ttl_ms")),
        ] {
            assert_eq!(sub_config(bad).err(), Some(want), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn fenced_bodies() {
        let f = fenced(br#"{"wake_id":"w_1_2","generation":2,"acks":[{"stream":"a","offset":"0000000000000000_0000000000000005"}],"done":true}"#).expect("ok");
        assert_eq!((f.generation, f.done, f.acks[0].offset), (2, true, Offset(5)));
        assert!(matches!(
            fenced(br#"{"wake_id":"w","generation":1,"acks":[{"stream":"a","offset":"-1"}]}"#),
            Err(WireError::Offset { .. })
        ));
        assert_eq!(fenced(br#"{"generation":1}"#).err(), Some(WireError::Missing("wake_id")));
        assert_eq!(fenced(br#"{"wake_id":"w","generation":"1"}"#).err(), Some(WireError::Missing("generation")));
    }
}
