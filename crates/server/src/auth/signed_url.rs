//! Pre-signed read URLs: `?expires=<unix seconds>&sig=<base64url HMAC-SHA256>`, for browsers,
//! whose `EventSource` cannot send an `Authorization` header.
//!
//! The signature covers the method (`GET`), the request path exactly as sent (percent-encoded)
//! and the expiry, joined by newlines, keyed with the server's HMAC secret; it is compared in
//! constant time. A signed URL is good for `GET` reads (catch-up, long-poll, SSE) of that one
//! stream until it expires, and for nothing else.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Why a signed URL was refused; the codes are those of the Durable Streams proxy protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the signed URL has expired")]
    Expired,
    #[error("the URL signature does not verify")]
    Invalid,
}

impl SignatureError {
    pub fn code(self) -> &'static str {
        match self {
            SignatureError::Expired => "SIGNATURE_EXPIRED",
            SignatureError::Invalid => "SIGNATURE_INVALID",
        }
    }
}

fn mac(secret: &[u8], path: &str, expires: u64) -> HmacSha256 {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
    let mut mac =
        <HmacSha256 as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(b"GET\n");
    mac.update(path.as_bytes());
    mac.update(b"\n");
    mac.update(expires.to_string().as_bytes());
    mac
}

/// The `sig` for a GET of `path` (as it appears in the URL) until `expires` (Unix seconds).
pub fn sign(secret: &[u8], path: &str, expires: u64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac(secret, path, expires).finalize().into_bytes())
}

/// Checks a signature (first) and the expiry (second) at `now_s`.
pub fn verify(secret: &[u8], path: &str, expires: &str, sig: &str, now_s: u64) -> Result<(), SignatureError> {
    let expires_n: u64 = expires.parse().map_err(|_| SignatureError::Invalid)?;
    if expires_n.to_string() != expires {
        return Err(SignatureError::Invalid);
    }
    let given = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(sig).map_err(|_| SignatureError::Invalid)?;
    mac(secret, path, expires_n).verify_slice(&given).map_err(|_| SignatureError::Invalid)?;
    if now_s >= expires_n {
        return Err(SignatureError::Expired);
    }
    Ok(())
}

/// `url` with `expires` and `sig` added to its query.
pub fn sign_url(secret: &[u8], url: &str, expires: u64) -> String {
    let (without_fragment, _) = url.split_once('#').unwrap_or((url, ""));
    let (base, query) = without_fragment.split_once('?').unwrap_or((without_fragment, ""));
    let path = match base.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => base,
    };
    let sig = sign(secret, path, expires);
    if query.is_empty() {
        format!("{base}?expires={expires}&sig={sig}")
    } else {
        format!("{base}?{query}&expires={expires}&sig={sig}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_bind_path_and_expiry() {
        let k = b"secret";
        let sig = sign(k, "/v1/stream/a", 100);
        assert_eq!(verify(k, "/v1/stream/a", "100", &sig, 99), Ok(()));
        assert_eq!(verify(k, "/v1/stream/a", "100", &sig, 100), Err(SignatureError::Expired));
        assert_eq!(verify(k, "/v1/stream/b", "100", &sig, 99), Err(SignatureError::Invalid));
        assert_eq!(verify(k, "/v1/stream/a", "101", &sig, 99), Err(SignatureError::Invalid));
        assert_eq!(verify(k, "/v1/stream/a", "0100", &sig, 99), Err(SignatureError::Invalid));
        assert_eq!(verify(b"other", "/v1/stream/a", "100", &sig, 99), Err(SignatureError::Invalid));
        assert_eq!(verify(k, "/v1/stream/a", "100", "!!", 99), Err(SignatureError::Invalid));
    }

    #[test]
    fn urls_keep_their_query() {
        let u = sign_url(b"k", "http://h:1/v1/stream/a?offset=-1&live=sse", 5);
        assert!(u.starts_with("http://h:1/v1/stream/a?offset=-1&live=sse&expires=5&sig="), "{u}");
        let u = sign_url(b"k", "http://h:1/v1/stream/a", 5);
        assert_eq!(u, format!("http://h:1/v1/stream/a?expires=5&sig={}", sign(b"k", "/v1/stream/a", 5)));
    }
}
