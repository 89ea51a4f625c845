//! JSON mode (protocol section 9.1).
//!
//! Stored form: every message is its JSON text followed by one `,` byte. A read of any range of
//! whole messages is rendered as `[` + stored bytes without the final `,` + `]`. Offsets count
//! stored bytes, so every offset the server mints is a message boundary, and a stream's stored
//! bytes are exactly the concatenation of its appends.

use serde_json::value::RawValue;

/// Deepest nesting of arrays and objects accepted in a message (the top-level array a batch is
/// flattened from does not count). Every JSON reader has a limit (serde_json's is 128): refusing
/// deeper input at the door means whatever is stored can be read back by the project's own client
/// and by typical ones.
pub const MAX_DEPTH: usize = 64;

/// Why a JSON body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("body is not valid JSON")]
    Invalid,
    #[error("JSON is nested more than 64 levels deep")]
    TooDeep,
    #[error("an empty JSON array appends nothing")]
    EmptyArray,
}

/// Whether an empty array is allowed: it is on create (an empty stream), never on append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmptyArray {
    Allowed,
    Rejected,
}

/// Validates a body and returns its stored form: a top-level array is flattened one level into
/// its elements, anything else is one message.
pub fn encode_body(body: &[u8], empty: EmptyArray) -> Result<Vec<u8>, JsonError> {
    // One level more for the batch array, which is flattened away.
    if scan(body)? > MAX_DEPTH + 1 {
        return Err(JsonError::TooDeep);
    }
    let text = std::str::from_utf8(body).map_err(|_| JsonError::Invalid)?;
    let value: &RawValue = serde_json::from_str(text).map_err(|_| JsonError::Invalid)?;
    let raw = value.get();
    let mut out = Vec::with_capacity(raw.len() + 1);
    if raw.starts_with('[') {
        let items: Vec<&RawValue> = serde_json::from_str(raw).map_err(|_| JsonError::Invalid)?;
        if items.is_empty() && empty == EmptyArray::Rejected {
            return Err(JsonError::EmptyArray);
        }
        for item in items {
            out.extend_from_slice(item.get().as_bytes());
            out.push(b',');
        }
    } else {
        out.extend_from_slice(raw.as_bytes());
        out.push(b',');
    }
    Ok(out)
}

/// The deepest nesting of `[` / `{` in `text`, outside strings. Run before parsing, so that no
/// parser ever recurses into input deeper than the limit. Also refuses a `\u` escape of a lone
/// surrogate (`"\ud800"`), which the parser lets through but which is no Unicode text: RFC 8259
/// leaves it to the reader, I-JSON (RFC 7493) forbids it, and common readers (the project's own
/// among them) fail on it, so a stream holding one could not be read past it.
fn scan(text: &[u8]) -> Result<usize, JsonError> {
    /// Where the scanner is inside a string.
    enum Str {
        Plain,
        /// After a `\`.
        Escape,
        /// Inside `\uXXXX`: digits read, value so far.
        Hex(u8, u32),
    }
    let (mut depth, mut deepest) = (0usize, 0usize);
    // Inside a string, and whether the last escape was a high surrogate awaiting its pair.
    let (mut string, mut high) = (None::<Str>, false);
    for &b in text {
        let Some(state) = string.as_mut() else {
            match b {
                b'"' => string = Some(Str::Plain),
                b'[' | b'{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
            continue;
        };
        match state {
            Str::Plain if high && b != b'\\' => return Err(JsonError::Invalid),
            Str::Plain if b == b'\\' => *state = Str::Escape,
            Str::Plain if b == b'"' => string = None,
            Str::Plain => {}
            Str::Escape if b == b'u' => *state = Str::Hex(0, 0),
            Str::Escape if high => return Err(JsonError::Invalid),
            Str::Escape => *state = Str::Plain,
            Str::Hex(n, v) => {
                let digit = char::from(b).to_digit(16).ok_or(JsonError::Invalid)?;
                let (n, v) = (*n + 1, *v * 16 + digit);
                if n < 4 {
                    *state = Str::Hex(n, v);
                    continue;
                }
                match (v, high) {
                    (0xD800..=0xDBFF, false) => high = true,
                    (0xDC00..=0xDFFF, true) => high = false,
                    (0xD800..=0xDFFF, _) | (_, true) => return Err(JsonError::Invalid),
                    _ => {}
                }
                *state = Str::Plain;
            }
        }
    }
    Ok(deepest)
}

/// Renders stored bytes (whole messages) as the JSON array a GET returns.
pub fn render_array(stored: &[u8]) -> Vec<u8> {
    let inner = stored.strip_suffix(b",").unwrap_or(stored);
    let mut out = Vec::with_capacity(inner.len() + 2);
    out.push(b'[');
    out.extend_from_slice(inner);
    out.push(b']');
    out
}

/// Writes `[` + the JSON texts joined by `,` + `]` to `out`: the one array that carries a batch of
/// messages on the wire (a producer's POST body, a client joining read chunks).
pub fn write_array<'a>(items: impl IntoIterator<Item = &'a [u8]>, out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.push(b']');
}

/// Splits stored bytes into the text of each message (for SSE, which sends one array per event).
pub fn messages(stored: &[u8]) -> impl Iterator<Item = &[u8]> {
    // Stored messages are serde-validated JSON texts each followed by ','; a ',' inside a message
    // is always inside a string or nested value, so splitting must track nesting.
    let mut rest = stored;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = message_end(rest);
        let (msg, tail) = rest.split_at(end);
        rest = tail.get(1..).unwrap_or(&[]);
        Some(msg)
    })
}

/// Index of the `,` that ends the first stored message.
fn message_end(bytes: &[u8]) -> usize {
    let (mut depth, mut in_str, mut escaped) = (0i32, false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if in_str {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth -= 1,
            b',' if depth == 0 => return i,
            _ => {}
        }
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stored(body: &str) -> String {
        String::from_utf8(encode_body(body.as_bytes(), EmptyArray::Rejected).unwrap()).unwrap()
    }

    #[test]
    fn nesting_is_limited_and_strings_do_not_count() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        // A message 64 deep is fine alone or inside a batch array; 65 is not.
        assert!(encode_body(nested(64).as_bytes(), EmptyArray::Allowed).is_ok());
        assert!(encode_body(format!("[{}]", nested(64)).as_bytes(), EmptyArray::Allowed).is_ok());
        assert_eq!(encode_body(format!("[{}]", nested(65)).as_bytes(), EmptyArray::Allowed), Err(JsonError::TooDeep));
        assert_eq!(
            encode_body(format!("{{\"a\":{}}}", nested(200)).as_bytes(), EmptyArray::Allowed),
            Err(JsonError::TooDeep)
        );
        let in_string = format!("\"{}\\\"{}\"", "[".repeat(300), "{".repeat(300));
        assert!(encode_body(in_string.as_bytes(), EmptyArray::Allowed).is_ok());
        // What is accepted can be read back by a default serde_json reader.
        let stored = encode_body(format!("[{}]", nested(64)).as_bytes(), EmptyArray::Allowed).expect("accepted");
        assert!(serde_json::from_slice::<serde_json::Value>(&render_array(&stored)).is_ok());
    }

    #[test]
    fn flattens_exactly_one_level() {
        assert_eq!(stored(r#"{"event": "created"}"#), r#"{"event": "created"},"#);
        assert_eq!(stored(r#"[{"a":1}, {"b":2}]"#), r#"{"a":1},{"b":2},"#);
        assert_eq!(stored("[[1,2], [3,4]]"), "[1,2],[3,4],");
        assert_eq!(stored("[[[1,2,3]]]"), "[[1,2,3]],");
        assert_eq!(stored("\"s\""), "\"s\",");
    }

    #[test]
    fn rejects_invalid_and_empty() {
        assert_eq!(encode_body(b"{", EmptyArray::Rejected), Err(JsonError::Invalid));
        assert_eq!(encode_body(b"", EmptyArray::Rejected), Err(JsonError::Invalid));
        assert_eq!(encode_body(b"[]", EmptyArray::Rejected), Err(JsonError::EmptyArray));
        assert_eq!(encode_body(b" [ ] ", EmptyArray::Allowed), Ok(vec![]));
        assert_eq!(encode_body(&[0xff], EmptyArray::Rejected), Err(JsonError::Invalid));
    }

    #[test]
    fn lone_surrogate_escapes_are_refused() {
        for bad in [
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800x""#,
            r#""\ud800\n""#,
            r#""\ud800\u0041""#,
            r#""\ud800\ud800""#,
            r#"{"\udbff": 1}"#,
            r#"[1, {"v": "a\uDFFFb"}]"#,
            r#""\uZZZZ""#,
        ] {
            assert_eq!(encode_body(bad.as_bytes(), EmptyArray::Rejected), Err(JsonError::Invalid), "{bad}");
        }
        for good in
            [r#""\ud83d\ude00""#, r#""\uD83D\uDE00 and \u00e9""#, r#"{"k\u0041": "\\ud800"}"#, r#""\"\ud800\udc00\"""#]
        {
            let stored = encode_body(good.as_bytes(), EmptyArray::Rejected).expect(good);
            // Whatever is accepted reads back as text.
            assert!(serde_json::from_slice::<serde_json::Value>(&render_array(&stored)).is_ok(), "{good}");
        }
    }

    #[test]
    fn renders_arrays() {
        let mut out = Vec::new();
        write_array([&b"1"[..], b"{\"a\":2}"], &mut out);
        assert_eq!(out, br#"[1,{"a":2}]"#);
        assert_eq!(render_array(b""), b"[]");
        assert_eq!(render_array(br#"{"a":1},[2,3],"#), br#"[{"a":1},[2,3]]"#);
    }

    proptest! {
        #[test]
        fn messages_split_what_encode_joined(items in proptest::collection::vec("[a-z,\\[\\]{}\"\\\\]{0,8}", 1..8)) {
            let values: Vec<serde_json::Value> = items.iter().map(|s| serde_json::json!({"k": s, "n": [s, s]})).collect();
            let body = serde_json::to_vec(&values).unwrap();
            let enc = encode_body(&body, EmptyArray::Rejected).unwrap();
            let back: Vec<serde_json::Value> = messages(&enc).map(|m| serde_json::from_slice(m).unwrap()).collect();
            prop_assert_eq!(&back, &values);
            let arr: Vec<serde_json::Value> = serde_json::from_slice(&render_array(&enc)).unwrap();
            prop_assert_eq!(arr, values);
        }
    }
}
