//! Media types: the stream's content type decides JSON mode and SSE encoding, and appends must
//! match it.

/// The default when a create request carries no `Content-Type` (section 5.1 allows it).
pub const DEFAULT: &str = "application/octet-stream";

/// The media type without parameters, as written: `Application/JSON; charset=utf-8` →
/// `Application/JSON`. Media types compare case-insensitively (RFC 9110 section 8.3.1), so
/// callers compare with [`str::eq_ignore_ascii_case`]; nothing here allocates (it runs several
/// times on every append).
pub fn essence(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or("").trim()
}

/// Whether two content types name the same media type (parameters such as charset are ignored).
pub fn matches(a: &str, b: &str) -> bool {
    essence(a).eq_ignore_ascii_case(essence(b))
}

/// `application/json` streams have message semantics (section 9.1).
pub fn is_json(content_type: &str) -> bool {
    essence(content_type).eq_ignore_ascii_case("application/json")
}

/// SSE carries `text/*` and JSON as UTF-8; everything else is base64-encoded (section 5.8).
pub fn sse_is_text(content_type: &str) -> bool {
    let e = essence(content_type);
    e.get(..5).is_some_and(|t| t.eq_ignore_ascii_case("text/")) || e.eq_ignore_ascii_case("application/json")
}

/// A syntactically usable media type: `type/subtype` made of token characters.
pub fn is_valid(content_type: &str) -> bool {
    let e = essence(content_type);
    let mut parts = e.splitn(2, '/');
    let is_token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b));
    matches!((parts.next(), parts.next()), (Some(t), Some(s)) if is_token(t) && is_token(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn essence_ignores_parameters_and_case() {
        assert!(matches("application/json", "Application/JSON; charset=utf-8"));
        assert!(!matches("text/plain", "text/html"));
        assert!(is_json("application/json;charset=utf-8"));
        assert!(!is_json("application/ndjson"));
        assert!(sse_is_text("text/plain"));
        assert!(!sse_is_text("application/octet-stream"));
        assert!(is_valid("application/vnd.api+json"));
        assert!(!is_valid("nonsense"));
        assert!(!is_valid("/json"));
        assert!(sse_is_text("Text/Plain; charset=utf-8"));
        assert!(is_json(" APPLICATION/json "));
        assert!(!sse_is_text("tex"));
        assert_eq!(essence("Application/JSON; charset=utf-8"), "Application/JSON");
    }
}
