//! Bearer tokens (JWT) and signed URLs as the server's access control: [`TokenAuth`].
//!
//! Keys: an HMAC secret (a file whose bytes, without a trailing newline, are the key; it verifies
//! `HS256/384/512` tokens and signs URLs) and/or a JWKS file of public keys (`EdDSA`, `ES256`,
//! `RS256`, ...), chosen by the token's `kid`. The algorithm family picks the key kind, so a token
//! cannot make the server use a public key as an HMAC secret. Both files are re-read when they
//! change ([`TokenAuth::reload`], run every second by [`TokenAuth::spawn_reloader`]); a file that
//! fails to parse keeps the previous keys.
//!
//! Claims: `exp` is required, `nbf` honoured, both with [`LEEWAY_S`] of leeway on arrival and
//! against the server's clock (NumericDates may have fractions of a second, RFC 7519 section
//! 2); a live read ends at `exp` itself (the leeway allows for clock skew when a token is
//! presented, it is no grace period). `iss` and `aud` are required and checked when configured
//! (`aud` may be one string or an array holding the audience). A token whose header has `crit`
//! is refused: this server implements no JWS extension (RFC 7515 section 4.1.11). The grants
//! are in the `oncelog` claim ([`super::scope`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use axum::http::request::Parts;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::scope::{required, stream_path, Scope, ScopeClaim};
use super::signed_url::{self, SignatureError};
use super::{Access, AuthError, Authorize, Why};
use crate::reload::modified;
use crate::request_kind::Kind;

/// Clock skew tolerated for `exp` and `nbf`.
pub const LEEWAY_S: i64 = 30;

/// Where keys come from and what is checked.
#[derive(Debug, Clone, Default)]
pub struct TokenConfig {
    /// HMAC secret file (`--auth-secret-file`).
    pub secret_file: Option<PathBuf>,
    /// JWKS file (`--auth-jwks`).
    pub jwks_file: Option<PathBuf>,
    /// Required `iss`, when set.
    pub issuer: Option<String>,
    /// Required `aud`, when set.
    pub audience: Option<String>,
    /// Answer `404` instead of `403`, so a private stream's existence is not revealed.
    pub hide_forbidden: bool,
}

/// Why keys could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("authentication needs --auth-secret-file or --auth-jwks")]
    NoKeys,
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is empty")]
    EmptySecret { path: PathBuf },
    #[error("{path} is not a JWKS document: {source}")]
    Jwks { path: PathBuf, source: serde_json::Error },
}

/// The claims Oncelog reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<Audience>,
    /// Required.
    #[serde(default)]
    pub exp: Option<NumericDate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<NumericDate>,
    #[serde(default)]
    pub oncelog: ScopeClaim,
}

/// `aud`: one audience or several (RFC 7519 section 4.1.3). Checked by `jsonwebtoken`'s
/// validation; held here so that a token with an array still decodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Audience {
    One(String),
    Many(Vec<String>),
}

/// A JWT time: seconds since the Unix epoch, possibly with a fraction (RFC 7519 section 2),
/// kept in milliseconds. Written as whole seconds when it is a whole second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NumericDate {
    pub ms: i64,
}

impl NumericDate {
    pub fn from_secs(s: i64) -> NumericDate {
        NumericDate { ms: s.saturating_mul(1000) }
    }
}

impl Serialize for NumericDate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.ms % 1000 == 0 {
            s.serialize_i64(self.ms / 1000)
        } else {
            s.serialize_f64(self.ms as f64 / 1000.0)
        }
    }
}

impl<'de> Deserialize<'de> for NumericDate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = serde_json::Number::deserialize(d)?;
        let ms = match n.as_i64() {
            Some(s) => s.saturating_mul(1000),
            // A fraction (or beyond i64): floored to the millisecond; `as` saturates.
            None => (n.as_f64().ok_or_else(|| serde::de::Error::custom("not a NumericDate"))? * 1000.0).floor() as i64,
        };
        Ok(NumericDate { ms })
    }
}

#[derive(Default)]
struct Keys {
    secret: Option<Vec<u8>>,
    jwks: Option<JwkSet>,
}

/// Token and signed-URL access control; see the module docs.
pub struct TokenAuth {
    config: TokenConfig,
    keys: RwLock<Keys>,
    /// Modification times the loaded keys were read at, to notice changes.
    seen: Mutex<(Option<SystemTime>, Option<SystemTime>)>,
}

fn read_secret(path: &Path) -> Result<Vec<u8>, KeyError> {
    let mut bytes = std::fs::read(path).map_err(|source| KeyError::Read { path: path.into(), source })?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    if bytes.is_empty() {
        return Err(KeyError::EmptySecret { path: path.into() });
    }
    Ok(bytes)
}

fn read_jwks(path: &Path) -> Result<JwkSet, KeyError> {
    let text = std::fs::read(path).map_err(|source| KeyError::Read { path: path.into(), source })?;
    serde_json::from_slice(&text).map_err(|source| KeyError::Jwks { path: path.into(), source })
}

/// Reads an HMAC secret file as the server and `oncelog token` do.
pub fn load_secret(path: &Path) -> Result<Vec<u8>, KeyError> {
    read_secret(path)
}

impl TokenAuth {
    pub fn load(config: TokenConfig) -> Result<Arc<TokenAuth>, KeyError> {
        if config.secret_file.is_none() && config.jwks_file.is_none() {
            return Err(KeyError::NoKeys);
        }
        let auth = TokenAuth { config, keys: RwLock::new(Keys::default()), seen: Mutex::new((None, None)) };
        auth.reload()?;
        Ok(Arc::new(auth))
    }

    /// Re-reads each key file whose modification time changed. Returns whether anything was
    /// reloaded; on an error the previous keys stay in force.
    pub fn reload(&self) -> Result<bool, KeyError> {
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut changed = false;
        if let Some(path) = &self.config.secret_file {
            let m = modified(path);
            if m.is_none() || m != seen.0 {
                let secret = read_secret(path)?;
                self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner).secret = Some(secret);
                seen.0 = m;
                changed = true;
            }
        }
        if let Some(path) = &self.config.jwks_file {
            let m = modified(path);
            if m.is_none() || m != seen.1 {
                let jwks = read_jwks(path)?;
                self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner).jwks = Some(jwks);
                seen.1 = m;
                changed = true;
            }
        }
        Ok(changed)
    }

    /// Reloads changed key files every `every`, for the life of the runtime.
    pub fn spawn_reloader(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let auth = Arc::clone(self);
        crate::reload::every(every, "authentication keys", move || auth.reload())
    }

    fn refuse(why: Why) -> AuthError {
        AuthError::Unauthenticated { why }
    }

    /// Verifies a JWT: signature, `iss` / `aud`, `exp` / `nbf`; returns its scope, expiry and
    /// principal (its `sub`, else a digest of the token). A refusal says which check failed.
    fn verify(&self, token: &str, now_ms: i64) -> Result<(Scope, i64, String), AuthError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Self::refuse(Why::Malformed))?;
        if header.crit.is_some() {
            return Err(Self::refuse(Why::CriticalHeader));
        }
        let no_key = || Self::refuse(Why::NoKey);
        let key = {
            let keys = self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            match header.alg {
                Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
                    DecodingKey::from_secret(keys.secret.as_deref().ok_or_else(no_key)?)
                }
                _ => {
                    let jwks = keys.jwks.as_ref().ok_or_else(no_key)?;
                    let jwk = match &header.kid {
                        Some(kid) => jwks.find(kid),
                        None if jwks.keys.len() == 1 => jwks.keys.first(),
                        None => None,
                    };
                    DecodingKey::from_jwk(jwk.ok_or_else(no_key)?).map_err(|_| no_key())?
                }
            }
        };
        let mut v = Validation::new(header.alg);
        v.validate_exp = false;
        v.validate_nbf = false;
        v.required_spec_claims = HashSet::new();
        v.validate_aud = false;
        if let Some(iss) = &self.config.issuer {
            v.set_issuer(&[iss]);
            v.required_spec_claims.insert("iss".into());
        }
        if let Some(aud) = &self.config.audience {
            v.set_audience(&[aud]);
            v.validate_aud = true;
            v.required_spec_claims.insert("aud".into());
        }
        let claims =
            jsonwebtoken::decode::<Claims>(token, &key, &v).map_err(|e| Self::refuse(decode_refusal(&e)))?.claims;
        let leeway_ms = LEEWAY_S * 1000;
        let exp_ms = claims.exp.ok_or_else(|| Self::refuse(Why::NoExpiry))?.ms;
        if now_ms > exp_ms.saturating_add(leeway_ms) {
            return Err(Self::refuse(Why::Expired { at_ms: exp_ms }));
        }
        if let Some(nbf) = claims.nbf.filter(|nbf| now_ms.saturating_add(leeway_ms) < nbf.ms) {
            return Err(Self::refuse(Why::NotYetValid { from_ms: nbf.ms }));
        }
        let scope = Scope::from_claim(&claims.oncelog).map_err(|_| Self::refuse(Why::BadGrant))?;
        let principal = match claims.sub {
            Some(sub) => format!("sub:{sub}"),
            None => {
                use sha2::Digest as _;
                let digest = sha2::Sha256::digest(token.as_bytes());
                format!(
                    "token:{}",
                    base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, &digest[..12])
                )
            }
        };
        Ok((scope, exp_ms, principal))
    }

    /// Verifies a signed URL's `expires` and `sig`.
    fn verify_signed(&self, parts: &Parts, expires: &str, sig: &str, now_ms: i64) -> Result<(Scope, i64), AuthError> {
        let keys = self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let secret = keys.secret.as_deref().ok_or(AuthError::Signature(SignatureError::Invalid))?;
        if parts.method != axum::http::Method::GET {
            return Err(AuthError::Signature(SignatureError::Invalid));
        }
        let now_s = u64::try_from(now_ms.div_euclid(1000)).unwrap_or(0);
        signed_url::verify(secret, parts.uri.path(), expires, sig, now_s).map_err(AuthError::Signature)?;
        let path = stream_path(parts).ok_or(AuthError::Signature(SignatureError::Invalid))?;
        let expires_ms = expires.parse::<i64>().unwrap_or(0).saturating_mul(1000);
        Ok((Scope::read_one(&path), expires_ms))
    }
}

/// Which check of `jsonwebtoken`'s refused a token.
fn decode_refusal(e: &jsonwebtoken::errors::Error) -> Why {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::InvalidSignature => Why::BadSignature,
        ErrorKind::InvalidIssuer => Why::WrongIssuer,
        ErrorKind::InvalidAudience => Why::WrongAudience,
        ErrorKind::MissingRequiredClaim(c) if c == "iss" => Why::WrongIssuer,
        ErrorKind::MissingRequiredClaim(c) if c == "aud" => Why::WrongAudience,
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidKeyFormat | ErrorKind::InvalidAlgorithmName => Why::NoKey,
        _ => Why::Malformed,
    }
}

/// `expires` and `sig` from a query string, when both are there.
fn signature_params(query: Option<&str>) -> Option<(String, String)> {
    let (mut expires, mut sig) = (None, None);
    for (k, v) in form_urlencoded::parse(query?.as_bytes()) {
        match k.as_ref() {
            "expires" => expires = Some(v.into_owned()),
            "sig" => sig = Some(v.into_owned()),
            _ => {}
        }
    }
    Some((expires?, sig?))
}

impl Authorize for TokenAuth {
    fn authorize(&self, parts: &Parts, now_ms: i64) -> Result<Access, AuthError> {
        if crate::auth::scope::subscription_token_checked(&parts.method, parts.uri.path()) {
            // Checked by its handler: the bearer is a subscription token, not a JWT.
            return Ok(Access::default());
        }
        let bearer = parts.headers.get("authorization").map(|v| v.to_str().unwrap_or(""));
        let (scope, expires_at_ms, principal) = match (bearer, signature_params(parts.uri.query())) {
            (Some(h), _) => {
                let token = h
                    .strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
                    .ok_or(Self::refuse(Why::NotBearer))?;
                self.verify(token.trim(), now_ms)?
            }
            (None, Some((expires, sig))) => {
                let (scope, expires_at_ms) = self.verify_signed(parts, &expires, &sig, now_ms)?;
                (scope, expires_at_ms, format!("url:{sig}"))
            }
            (None, None) => return Err(Self::refuse(Why::NoCredentials)),
        };
        // The stream listing needs no grant of its own: it lists only what the grants allow.
        if let Some(path) = stream_path(parts).filter(|_| !crate::auth::scope::filtered_by_grants(parts.uri.path())) {
            // Classified once by the front service (or here, when called on its own).
            let kind =
                parts.extensions.get::<Kind>().copied().unwrap_or_else(|| Kind::of(&parts.method, &parts.headers));
            for (stream, op) in required(kind, &path, &parts.headers) {
                if !scope.allows(&stream, op) {
                    return Err(if self.config.hide_forbidden {
                        AuthError::Hidden
                    } else {
                        AuthError::Forbidden { op, stream }
                    });
                }
            }
        }
        Ok(Access {
            expires_at_ms: Some(expires_at_ms),
            principal: Some(principal),
            scope: Some(std::sync::Arc::new(scope)),
        })
    }

    fn hides_forbidden(&self) -> bool {
        self.config.hide_forbidden
    }
}

/// Why a token could not be signed.
pub type SignError = jsonwebtoken::errors::Error;

/// Signs an `HS256` token carrying `scope`, valid until `expires_at_s` (Unix seconds).
pub fn issue(
    secret: &[u8],
    scope: ScopeClaim,
    expires_at_s: i64,
    issuer: Option<String>,
    audience: Option<String>,
    subject: Option<String>,
) -> Result<String, SignError> {
    let claims = Claims {
        sub: subject,
        iss: issuer,
        aud: audience.map(Audience::One),
        exp: Some(NumericDate::from_secs(expires_at_s)),
        nbf: None,
        oncelog: scope,
    };
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret))
}
