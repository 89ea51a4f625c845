//! Receiving webhooks: checking a delivery's `webhook-signature` against the server's published
//! keys (protocol section 12), and turning the wake it carries into a [`Claim`] whose acks go
//! to its callback URL.
//!
//! ```text
//! let keys = WebhookKeys::fetch(&client).await?;          // once, and again on an unknown kid
//! verify(&keys, signature_header, &raw_body, now_s, 300)?; // before trusting anything
//! let claim = client.subscriptions().claim_from_webhook(&raw_body)?;
//! // ... process claim.streams, then claim.ack(..) or claim.commit()...send(true)
//! ```

use std::collections::HashMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use ed25519_dalek::{Signature, VerifyingKey};
use reqwest::Method;
use serde_json::Value;

use crate::client::Client;
use crate::error::Error;
use crate::http::Request;
use crate::subscription::{Claim, Subscriptions};

/// The server's webhook signing keys by key id, from its JWKS (`__ds/jwks.json`).
#[derive(Debug, Clone, Default)]
pub struct WebhookKeys {
    keys: HashMap<String, VerifyingKey>,
}

/// Why a delivery was not accepted as the server's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook-signature is not t=...,kid=...,ed25519=...")]
    Malformed,
    #[error("the signing key {0} is not among the server's keys (fetch them again)")]
    UnknownKey(String),
    #[error("the signature is older or newer than the tolerance allows")]
    Stale,
    #[error("the signature does not match the body")]
    BadSignature,
}

impl WebhookKeys {
    /// Reads a JWKS document: Ed25519 (`OKP`) keys only.
    pub fn from_jwks(jwks: &Value) -> WebhookKeys {
        let mut keys = HashMap::new();
        for k in jwks["keys"].as_array().into_iter().flatten() {
            if k["kty"] != "OKP" || k["crv"] != "Ed25519" {
                continue;
            }
            let (Some(kid), Some(x)) = (k["kid"].as_str(), k["x"].as_str()) else { continue };
            let Ok(bytes) = B64.decode(x) else { continue };
            let Ok(bytes) = <[u8; 32]>::try_from(bytes.as_slice()) else { continue };
            if let Ok(key) = VerifyingKey::from_bytes(&bytes) {
                keys.insert(kid.to_owned(), key);
            }
        }
        WebhookKeys { keys }
    }

    /// Fetches the server's keys.
    pub async fn fetch(client: &Client) -> Result<WebhookKeys, Error> {
        let mut url = client.base_url().clone();
        if let Ok(mut segs) = url.path_segments_mut() {
            segs.pop_if_empty().push("__ds").push("jwks.json");
        }
        let req = Request::new(Method::GET, url, true, Some(client.request_timeout()));
        let resp = client.send(&req, client.retry_policy()).await?;
        if !resp.status().is_success() {
            return Err(Error::InvalidResponse(format!("JWKS answered {}", resp.status())));
        }
        let bytes = resp.bytes().await.map_err(|e| Error::transport(e, true))?;
        Ok(WebhookKeys::from_jwks(&serde_json::from_slice(&bytes)?))
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Checks a delivery: `header` is its `webhook-signature`, `body` the raw bytes received,
/// `now_s` the receiver's Unix time, `tolerance_s` how far the signing time may be from it (the
/// suite and the reference use 300 s).
pub fn verify(keys: &WebhookKeys, header: &str, body: &[u8], now_s: i64, tolerance_s: i64) -> Result<(), WebhookError> {
    let field = |name: &str| header.split(',').find_map(|f| f.trim().strip_prefix(name));
    let (Some(t), Some(kid), Some(sig)) = (field("t="), field("kid="), field("ed25519=")) else {
        return Err(WebhookError::Malformed);
    };
    let t: i64 = t.parse().map_err(|_| WebhookError::Malformed)?;
    if (now_s - t).abs() > tolerance_s {
        return Err(WebhookError::Stale);
    }
    let key = keys.keys.get(kid).ok_or_else(|| WebhookError::UnknownKey(kid.to_owned()))?;
    let sig = B64.decode(sig).map_err(|_| WebhookError::Malformed)?;
    let sig = Signature::from_slice(&sig).map_err(|_| WebhookError::Malformed)?;
    let mut msg = format!("{t}.").into_bytes();
    msg.extend_from_slice(body);
    key.verify_strict(&msg, &sig).map_err(|_| WebhookError::BadSignature)
}

impl Subscriptions {
    /// The wake a (verified) webhook delivery carries, as a [`Claim`]: acks go to its callback.
    pub fn claim_from_webhook(&self, body: &[u8]) -> Result<Claim, Error> {
        let v: Value = serde_json::from_slice(body)?;
        let id = v["subscription_id"]
            .as_str()
            .ok_or_else(|| Error::InvalidResponse("webhook lacks subscription_id".into()))?
            .to_owned();
        Claim::parse(self.clone(), &id, v)
    }
}
