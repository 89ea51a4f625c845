//! The server's subscription secrets: the Ed25519 key that signs webhooks (published as a JWKS)
//! and the HMAC key of callback and claim tokens.
//!
//! Created at first use with the operating system's randomness and kept in the engine (so
//! signatures and tokens stay valid across restarts, and backups carry them). Hand-written
//! around well-kept primitives (`ed25519-dalek`, `hmac`/`sha2`): the token format is tiny and
//! ours, and the signature header is the protocol's (section 12).

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use bytes::Bytes;
use ed25519_dalek::{Signer, SigningKey};
use hmac::{Hmac, Mac};
use oncelog_storage::{Engine, MetaWrite, StorageError, TxnError, TxnRequest};
use oncelog_subscriptions::SubError;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Mutex;

/// Where the secrets are kept in the engine's metadata map: `key/{name}` (the layout of the
/// versions that kept them beside the subscriptions, so stored keys stay valid).
const SECRET_PREFIX: &str = "key/";

/// Every stored secret, by name, as the engine holds them now (another node's included).
pub async fn stored<E: Engine>(engine: &E) -> Result<BTreeMap<String, Bytes>, SubError> {
    let mut out = BTreeMap::new();
    for (k, v) in engine.meta_scan(SECRET_PREFIX.as_bytes()).await? {
        out.insert(String::from_utf8_lossy(&k[SECRET_PREFIX.len()..]).into_owned(), v);
    }
    Ok(out)
}

/// Stores `value` as the secret `name` unless one is stored; answers the one stored. When
/// another process stored one first (the guarded write lost), that one is answered: every
/// process then uses the same.
pub async fn stored_or_insert<E: Engine>(engine: &E, name: &str, value: Bytes, now_ms: i64) -> Result<Bytes, SubError> {
    let key = format!("{SECRET_PREFIX}{name}").into_bytes();
    let txn = TxnRequest {
        expect: vec![(key.clone(), None)],
        meta: vec![MetaWrite { key, value: Some(value.clone()) }],
        now_ms,
        ..Default::default()
    };
    match engine.transact(txn).await {
        Ok(_) => Ok(value),
        // Removed again meanwhile (a rotation on another node): the caller may try again.
        Err(TxnError::Conflict { .. }) => stored(engine).await?.remove(name).ok_or(SubError::Conflict),
        Err(e) => Err(e.into()),
    }
}

/// Forgets stored secrets. Unguarded: removing what is gone already is no harm.
async fn remove<E: Engine>(engine: &E, names: &[String], now_ms: i64) -> Result<(), SubError> {
    let meta =
        names.iter().map(|n| MetaWrite { key: format!("{SECRET_PREFIX}{n}").into_bytes(), value: None }).collect();
    engine.transact(TxnRequest { meta, now_ms, ..Default::default() }).await?;
    Ok(())
}

/// Webhook signing keys are stored as `webhook-ed25519/{created ms, 20 digits}`: name order is
/// age order.
const WEBHOOK_KEY_PREFIX: &str = "webhook-ed25519/";
const TOKEN_KEY: &str = "token-hmac";
/// How long a callback or claim token is accepted. The generation fence, not expiry, is what
/// ends a token's use; expiry only bounds a leaked one.
pub const TOKEN_TTL_MS: i64 = 24 * 3600 * 1000;
/// How long a replaced signing key stays published (and stored): receivers that cached the
/// key set, and deliveries signed just before the rotation, still verify.
pub const RETIRED_KEY_GRACE_MS: i64 = 3600 * 1000;

/// The secrets, loaded (or created) at first use, replaced on rotation.
#[derive(Default)]
pub struct KeyRing {
    state: Mutex<Option<Arc<Keys>>>,
}

/// One webhook signing key.
pub struct WebhookKey {
    signing: SigningKey,
    /// RFC 7638 thumbprint of the public key, prefixed `ds_`.
    pub kid: String,
    /// The public key, base64url.
    x: String,
    pub created_ms: i64,
}

/// The keys as of one moment: webhook keys oldest first (the last one signs), the token key.
pub struct Keys {
    webhook: Vec<WebhookKey>,
    token_key: [u8; 32],
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("missing or malformed subscription token")]
    Invalid,
    #[error("the subscription token has expired")]
    Expired,
}

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenClaims {
    pub id: String,
    pub uid: u64,
    pub generation: u64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Payload {
    sub: String,
    uid: u64,
    gen: u64,
    exp: i64,
}

fn random32() -> Result<[u8; 32], SubError> {
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b)
        .map_err(|e| SubError::Storage(StorageError::Backend(Arc::new(std::io::Error::other(e.to_string())))))?;
    Ok(b)
}

fn as32(v: &Bytes) -> Result<[u8; 32], SubError> {
    v.as_ref().try_into().map_err(|_| {
        SubError::Storage(StorageError::Corrupt(Arc::new(std::io::Error::other(
            "stored subscription key is not 32 bytes",
        ))))
    })
}

fn webhook_key_name(created_ms: i64) -> String {
    format!("{WEBHOOK_KEY_PREFIX}{created_ms:020}")
}

impl KeyRing {
    /// The keys, loading them (and creating the first ones) if needed.
    pub async fn get<E: Engine>(&self, engine: &E, now_ms: i64) -> Result<Arc<Keys>, SubError> {
        let mut state = self.state.lock().await;
        if let Some(k) = state.as_ref() {
            return Ok(k.clone());
        }
        let mut stored = stored(engine).await?;
        if !stored.keys().any(|k| k.starts_with(WEBHOOK_KEY_PREFIX)) {
            let name = webhook_key_name(now_ms);
            let v = stored_or_insert(engine, &name, Bytes::copy_from_slice(&random32()?), now_ms).await?;
            stored.insert(name, v);
        }
        let token_key =
            as32(&stored_or_insert(engine, TOKEN_KEY, Bytes::copy_from_slice(&random32()?), now_ms).await?)?;
        let keys = Arc::new(Keys::from_stored(&stored, token_key)?);
        *state = Some(keys.clone());
        Ok(keys)
    }

    /// Rotates the signing key once the newest is older than `max_age_ms`, and forgets keys
    /// replaced more than [`RETIRED_KEY_GRACE_MS`] ago. Only when the keys are in use (loaded).
    /// Returns whether anything changed.
    pub async fn rotate_if_due<E: Engine>(&self, engine: &E, now_ms: i64, max_age_ms: i64) -> Result<bool, SubError> {
        let mut state = self.state.lock().await;
        let Some(keys) = state.as_ref() else { return Ok(false) };
        let newest = keys.webhook.last().map_or(i64::MIN, |k| k.created_ms);
        let expired: Vec<String> = keys
            .webhook
            .windows(2)
            .filter(|w| now_ms >= w[1].created_ms.saturating_add(RETIRED_KEY_GRACE_MS))
            .map(|w| webhook_key_name(w[0].created_ms))
            .collect();
        let due = now_ms >= newest.saturating_add(max_age_ms);
        if !due && expired.is_empty() {
            return Ok(false);
        }
        if due {
            stored_or_insert(
                engine,
                &webhook_key_name(now_ms.max(newest + 1)),
                Bytes::copy_from_slice(&random32()?),
                now_ms,
            )
            .await?;
        }
        if !expired.is_empty() {
            remove(engine, &expired, now_ms).await?;
        }
        let stored = stored(engine).await?;
        *state = Some(Arc::new(Keys::from_stored(&stored, keys.token_key)?));
        Ok(true)
    }

    /// Picks up the signing keys as stored now, when they differ from the ones in use: over a
    /// shared engine another node rotates them (and two nodes starting at once may each have
    /// stored a first one). Only when the keys are in use (loaded); the token key never changes.
    /// Returns whether anything changed.
    pub async fn reload<E: Engine>(&self, engine: &E) -> Result<bool, SubError> {
        let mut state = self.state.lock().await;
        let Some(keys) = state.as_ref() else { return Ok(false) };
        let stored = stored(engine).await?;
        let fresh = Keys::from_stored(&stored, keys.token_key)?;
        let ages = |k: &Keys| k.webhook.iter().map(|w| w.created_ms).collect::<Vec<_>>();
        if fresh.webhook.is_empty() || ages(&fresh) == ages(keys) {
            return Ok(false);
        }
        *state = Some(Arc::new(fresh));
        Ok(true)
    }
}

impl Keys {
    fn from_stored(stored: &BTreeMap<String, Bytes>, token_key: [u8; 32]) -> Result<Keys, SubError> {
        let mut webhook = Vec::new();
        for (name, seed) in
            stored.range(WEBHOOK_KEY_PREFIX.to_owned()..).take_while(|(n, _)| n.starts_with(WEBHOOK_KEY_PREFIX))
        {
            let created_ms = name[WEBHOOK_KEY_PREFIX.len()..].parse().unwrap_or(0);
            webhook.push(WebhookKey::new(as32(seed)?, created_ms));
        }
        Ok(Keys { webhook, token_key })
    }

    /// The key that signs now.
    pub fn current(&self) -> &WebhookKey {
        // `get` never builds a ring without a webhook key; an empty one is a programming error
        // caught by the tests, answered with the first key of a fresh ring rather than a panic.
        self.webhook.last().unwrap_or_else(|| unreachable!("a key ring always holds a webhook key"))
    }

    pub fn kid(&self) -> &str {
        &self.current().kid
    }

    /// The JWKS document (`__ds/jwks.json`): every key still published.
    pub fn jwks(&self) -> serde_json::Value {
        let keys: Vec<serde_json::Value> = self
            .webhook
            .iter()
            .rev()
            .map(|k| serde_json::json!({ "kty": "OKP", "crv": "Ed25519", "kid": k.kid, "use": "sig", "alg": "EdDSA", "x": k.x }))
            .collect();
        serde_json::json!({ "keys": keys })
    }

    /// The `webhook-signature` header for `body` sent at `t_s` (Unix seconds): an Ed25519
    /// signature of `"{t}.{body}"` by the current key.
    pub fn sign(&self, t_s: i64, body: &[u8]) -> String {
        let k = self.current();
        let mut msg = format!("{t_s}.").into_bytes();
        msg.extend_from_slice(body);
        let sig = k.signing.sign(&msg);
        format!("t={t_s},kid={},ed25519={}", k.kid, B64.encode(sig.to_bytes()))
    }

    fn mac(&self, payload_b64: &str) -> Hmac<Sha256> {
        // HMAC takes keys of any length; 32 bytes is always accepted.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.token_key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(payload_b64.as_bytes());
        mac
    }

    /// A token for `generation` of subscription `id` (incarnation `uid`).
    pub fn mint(&self, id: &str, uid: u64, generation: u64, now_ms: i64) -> String {
        let payload = Payload { sub: id.to_owned(), uid, gen: generation, exp: now_ms.saturating_add(TOKEN_TTL_MS) };
        let p = B64.encode(serde_json::to_vec(&payload).unwrap_or_default());
        let tag = B64.encode(self.mac(&p).finalize().into_bytes());
        format!("{p}.{tag}")
    }

    pub fn verify(&self, token: &str, now_ms: i64) -> Result<TokenClaims, TokenError> {
        let (p, tag) = token.split_once('.').ok_or(TokenError::Invalid)?;
        let tag = B64.decode(tag).map_err(|_| TokenError::Invalid)?;
        self.mac(p).verify_slice(&tag).map_err(|_| TokenError::Invalid)?;
        let payload: Payload = serde_json::from_slice(&B64.decode(p).map_err(|_| TokenError::Invalid)?)
            .map_err(|_| TokenError::Invalid)?;
        if now_ms >= payload.exp {
            return Err(TokenError::Expired);
        }
        Ok(TokenClaims { id: payload.sub, uid: payload.uid, generation: payload.gen })
    }
}

impl WebhookKey {
    fn new(seed: [u8; 32], created_ms: i64) -> Self {
        let signing = SigningKey::from_bytes(&seed);
        let x = B64.encode(signing.verifying_key().as_bytes());
        let thumbprint = Sha256::digest(format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#));
        WebhookKey { kid: format!("ds_{}", B64.encode(thumbprint)), x, signing, created_ms }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(seeds: &[u8], token: u8) -> Keys {
        Keys {
            webhook: seeds.iter().map(|s| WebhookKey::new([*s; 32], i64::from(*s))).collect(),
            token_key: [token; 32],
        }
    }

    #[test]
    fn tokens_verify_only_unchanged_and_unexpired() {
        let k = ring(&[7], 9);
        let t = k.mint("sub-1", 4, 2, 1_000);
        assert_eq!(k.verify(&t, 2_000), Ok(TokenClaims { id: "sub-1".into(), uid: 4, generation: 2 }));
        assert_eq!(k.verify(&t, 1_000 + TOKEN_TTL_MS), Err(TokenError::Expired));
        // Another key, a changed payload, garbage.
        assert_eq!(ring(&[7], 8).verify(&t, 2_000), Err(TokenError::Invalid));
        let (_, tag) = t.split_once('.').unwrap_or_default();
        let forged = format!("{}.{tag}", B64.encode(br#"{"sub":"sub-1","uid":4,"gen":3,"exp":9999999999999}"#));
        assert_eq!(k.verify(&forged, 2_000), Err(TokenError::Invalid));
        assert_eq!(k.verify("x", 0), Err(TokenError::Invalid));
    }

    #[test]
    fn key_ids_are_thumbprints_and_the_newest_key_signs() {
        let k = ring(&[1], 0);
        assert!(k.kid().starts_with("ds_") && k.kid().len() == 3 + 43, "{}", k.kid());
        let two = ring(&[1, 2], 0);
        assert_ne!(two.kid(), k.kid());
        assert!(two.sign(5, b"x").contains(two.kid()));
        assert_eq!(two.jwks()["keys"].as_array().map(Vec::len), Some(2));
    }
}
