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
use oncelog_storage::subs::{SubError, Subscriptions};
use oncelog_storage::{Engine, StorageError};
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

const WEBHOOK_KEY: &str = "webhook-ed25519";
const TOKEN_KEY: &str = "token-hmac";
/// How long a callback or claim token is accepted. The generation fence, not expiry, is what
/// ends a token's use; expiry only bounds a leaked one.
pub const TOKEN_TTL_MS: i64 = 24 * 3600 * 1000;

/// The secrets, loaded (or created) once.
#[derive(Default)]
pub struct KeyRing {
    cell: OnceCell<Keys>,
}

pub struct Keys {
    signing: SigningKey,
    /// RFC 7638 thumbprint of the public key, prefixed `ds_`.
    pub kid: String,
    /// The public key, base64url.
    x: String,
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
    getrandom::getrandom(&mut b).map_err(|e| SubError::Storage(StorageError::Backend(std::sync::Arc::new(std::io::Error::other(e.to_string())))))?;
    Ok(b)
}

fn as32(v: &Bytes) -> Result<[u8; 32], SubError> {
    v.as_ref().try_into().map_err(|_| SubError::Storage(StorageError::Corrupt(std::sync::Arc::new(std::io::Error::other("stored subscription key is not 32 bytes")))))
}

impl KeyRing {
    pub async fn get<E: Engine>(&self, subs: &Subscriptions<E>, now_ms: i64) -> Result<&Keys, SubError> {
        self.cell
            .get_or_try_init(|| async {
                let seed = as32(&subs.key_or_insert(WEBHOOK_KEY, Bytes::copy_from_slice(&random32()?), now_ms).await?)?;
                let token_key = as32(&subs.key_or_insert(TOKEN_KEY, Bytes::copy_from_slice(&random32()?), now_ms).await?)?;
                Ok(Keys::new(seed, token_key))
            })
            .await
    }
}

impl Keys {
    pub fn new(seed: [u8; 32], token_key: [u8; 32]) -> Self {
        let signing = SigningKey::from_bytes(&seed);
        let x = B64.encode(signing.verifying_key().as_bytes());
        let thumbprint = Sha256::digest(format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#));
        Keys { kid: format!("ds_{}", B64.encode(thumbprint)), x, signing, token_key }
    }

    /// The JWKS document (`__ds/jwks.json`).
    pub fn jwks(&self) -> serde_json::Value {
        serde_json::json!({ "keys": [{ "kty": "OKP", "crv": "Ed25519", "kid": self.kid, "use": "sig", "alg": "EdDSA", "x": self.x }] })
    }

    /// The `webhook-signature` header for `body` sent at `t_s` (Unix seconds): an Ed25519
    /// signature of `"{t}.{body}"`.
    pub fn sign(&self, t_s: i64, body: &[u8]) -> String {
        let mut msg = format!("{t_s}.").into_bytes();
        msg.extend_from_slice(body);
        let sig = self.signing.sign(&msg);
        format!("t={t_s},kid={},ed25519={}", self.kid, B64.encode(sig.to_bytes()))
    }

    fn mac(&self, payload_b64: &str) -> Hmac<Sha256> {
        // HMAC takes keys of any length; 32 bytes is always accepted.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.token_key).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
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
        let payload: Payload = serde_json::from_slice(&B64.decode(p).map_err(|_| TokenError::Invalid)?).map_err(|_| TokenError::Invalid)?;
        if now_ms >= payload.exp {
            return Err(TokenError::Expired);
        }
        Ok(TokenClaims { id: payload.sub, uid: payload.uid, generation: payload.gen })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_only_unchanged_and_unexpired() {
        let k = Keys::new([7; 32], [9; 32]);
        let t = k.mint("sub-1", 4, 2, 1_000);
        assert_eq!(k.verify(&t, 2_000), Ok(TokenClaims { id: "sub-1".into(), uid: 4, generation: 2 }));
        assert_eq!(k.verify(&t, 1_000 + TOKEN_TTL_MS), Err(TokenError::Expired));
        // Another key, a changed payload, garbage.
        assert_eq!(Keys::new([7; 32], [8; 32]).verify(&t, 2_000), Err(TokenError::Invalid));
        let (_, tag) = t.split_once('.').unwrap_or_default();
        let forged = format!("{}.{tag}", B64.encode(br#"{"sub":"sub-1","uid":4,"gen":3,"exp":9999999999999}"#));
        assert_eq!(k.verify(&forged, 2_000), Err(TokenError::Invalid));
        assert_eq!(k.verify("x", 0), Err(TokenError::Invalid));
    }

    #[test]
    fn key_ids_are_thumbprints() {
        let k = Keys::new([1; 32], [0; 32]);
        assert!(k.kid.starts_with("ds_") && k.kid.len() == 3 + 43, "{}", k.kid);
        assert_ne!(Keys::new([2; 32], [0; 32]).kid, k.kid);
    }
}
