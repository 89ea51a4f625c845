//! One case per refusal rule (the smuggling rules among them), the framing each valid head gets,
//! and two properties: a head split anywhere parses as it does whole, and no input panics.

use super::*;
use proptest::prelude::*;

fn parse_all(text: &[u8]) -> Result<Option<Head>, HeadError> {
    parse(&mut BytesMut::from(text), &HeadLimits::default())
}

fn refused(text: &str) -> HeadError {
    match parse_all(text.as_bytes()) {
        Err(e) => e,
        Ok(head) => panic!("{text:?} was accepted: {head:?}"),
    }
}

fn accepted(text: &str) -> Head {
    match parse_all(text.as_bytes()) {
        Ok(Some(head)) => head,
        other => panic!("{text:?} was not accepted whole: {other:?}"),
    }
}

#[test]
fn a_get_parses_with_its_fields_and_no_body() {
    let head = accepted(
        "GET /v1/stream/a?offset=-1 HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\nX-Two: 1\r\nx-two: 2\r\n\r\n",
    );
    assert_eq!(head.method, Method::GET);
    assert_eq!(head.uri.path(), "/v1/stream/a");
    assert_eq!(head.uri.query(), Some("offset=-1"));
    assert_eq!(head.version, Version::HTTP_11);
    assert_eq!(head.framing, Framing::None);
    assert!(head.keep_alive);
    assert!(!head.expect_continue);
    assert_eq!(head.headers.get("accept").map(|v| v.as_bytes()), Some(&b"*/*"[..]));
    let twos: Vec<_> = head.headers.get_all("x-two").iter().map(|v| v.as_bytes().to_vec()).collect();
    assert_eq!(twos, vec![b"1".to_vec(), b"2".to_vec()], "repeated fields are all kept, in order");
}

#[test]
fn the_bytes_after_the_head_stay_in_the_buffer() {
    let mut buf =
        BytesMut::from(&b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\n"[..]);
    let head = parse(&mut buf, &HeadLimits::default()).expect("valid").expect("complete");
    assert_eq!(head.framing, Framing::Length(5));
    assert_eq!(&buf[..], b"helloGET /b HTTP/1.1\r\n");
}

#[test]
fn field_values_and_the_target_are_slices_of_the_read_buffer_not_copies() {
    let mut buf = BytesMut::with_capacity(256);
    buf.extend_from_slice(b"PUT /v1/stream/zero-copy HTTP/1.1\r\nHost: h\r\nContent-Type: text/plain\r\n\r\n");
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.capacity();
    let head = parse(&mut buf, &HeadLimits::default()).expect("valid").expect("complete");
    let value = head.headers.get("content-type").expect("present").as_bytes();
    assert!(range.contains(&(value.as_ptr() as usize)), "the value was copied");
    assert!(range.contains(&(head.uri.path().as_ptr() as usize)), "the target was copied");
}

#[test]
fn an_incomplete_head_asks_for_more() {
    let text = b"GET / HTTP/1.1\r\nHost: h\r\n\r\n";
    for end in 0..text.len() {
        assert!(matches!(parse_all(&text[..end]), Ok(None)), "prefix of {end} bytes");
    }
}

#[test]
fn content_length_with_transfer_encoding_is_refused() {
    let e = refused("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(e, HeadError::LengthAndEncoding);
    let e = refused("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n");
    assert_eq!(e, HeadError::LengthAndEncoding);
    assert_eq!(e.status(), StatusCode::BAD_REQUEST);
}

#[test]
fn two_content_lengths_are_refused_even_when_equal() {
    assert_eq!(
        refused("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n"),
        HeadError::TwoLengths
    );
    assert_eq!(
        refused("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"),
        HeadError::TwoLengths
    );
}

#[test]
fn a_content_length_that_is_not_plain_digits_is_refused() {
    for value in ["+3", "-1", "3,3", "3, 3", "3 3", "0x3", "3.0", "", "99999999999999999999", "18446744073709551616"] {
        let text = format!("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: {value}\r\n\r\n");
        assert_eq!(refused(&text), HeadError::BadLength, "Content-Length: {value:?}");
    }
    let head = accepted("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 9999999999999999999\r\n\r\n");
    assert_eq!(head.framing, Framing::Length(9_999_999_999_999_999_999));
    assert_eq!(accepted("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 007\r\n\r\n").framing, Framing::Length(7));
    assert_eq!(accepted("POST / HTTP/1.1\r\nHost: h\r\nContent-Length:  0 \r\n\r\n").framing, Framing::Length(0));
}

#[test]
fn a_bare_lf_line_end_is_refused_whole_or_in_part() {
    assert_eq!(refused("GET / HTTP/1.1\nHost: h\r\n\r\n"), HeadError::BareLf);
    assert_eq!(refused("GET / HTTP/1.1\r\nHost: h\n\r\n"), HeadError::BareLf);
    assert_eq!(refused("GET / HTTP/1.1\r\nHost: h\r\n\n"), HeadError::BareLf);
    // Seen before the head is complete: refused without waiting for the rest.
    assert_eq!(refused("GET / HTTP/1.1\r\nHost: h\nX-A: b"), HeadError::BareLf);
}

#[test]
fn an_obs_fold_is_refused() {
    let e = refused("GET / HTTP/1.1\r\nHost: h\r\nX-Folded: a\r\n b\r\n\r\n");
    assert_eq!(e, HeadError::HeaderField);
}

#[test]
fn whitespace_before_a_colon_is_refused() {
    assert_eq!(refused("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\n\r\n"), HeadError::HeaderField);
}

#[test]
fn a_control_character_in_a_value_is_refused() {
    assert_eq!(refused("GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x01b\r\n\r\n"), HeadError::HeaderField);
}

#[test]
fn transfer_encoding_on_http10_is_refused() {
    assert_eq!(refused("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), HeadError::EncodingOnHttp10);
}

#[test]
fn chunked_missing_repeated_or_not_last_is_refused() {
    for value in ["chunked, chunked", "chunked, gzip", "gzip", "", "chunkedx", "\"chunked\""] {
        let text = format!("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: {value}\r\n\r\n");
        assert_eq!(refused(&text), HeadError::BadChunked, "Transfer-Encoding: {value:?}");
    }
    // Split over two fields: the same list.
    let e = refused("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(e, HeadError::BadChunked);
}

#[test]
fn codings_other_than_chunked_are_not_implemented() {
    let e = refused("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
    assert_eq!(e, HeadError::UnsupportedCoding);
    assert_eq!(e.status(), StatusCode::NOT_IMPLEMENTED);
    let e = refused("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(e, HeadError::UnsupportedCoding);
}

#[test]
fn chunked_is_accepted_in_any_case_with_spaces_around() {
    let head = accepted("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:  ChUnKeD \r\n\r\n");
    assert_eq!(head.framing, Framing::Chunked);
}

#[test]
fn versions_other_than_10_and_11_are_refused_with_505() {
    let e = refused("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    assert_eq!(e, HeadError::Version);
    assert_eq!(e.status(), StatusCode::HTTP_VERSION_NOT_SUPPORTED);
}

#[test]
fn a_malformed_request_line_is_refused() {
    for text in [
        "GET\r\n\r\n",
        "GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
        "G(T / HTTP/1.1\r\nHost: h\r\n\r\n",
        "/ HTTP/1.1\r\nHost: h\r\n\r\n",
    ] {
        let e = refused(text);
        assert!(matches!(e, HeadError::RequestLine | HeadError::Version | HeadError::Target), "{text:?}: {e:?}");
        assert_eq!(e.status().as_u16() / 100, if e == HeadError::Version { 5 } else { 4 });
    }
}

#[test]
fn a_head_over_the_byte_limit_is_refused_before_it_completes() {
    let limits = HeadLimits { max_headers: MAX_HEADERS, max_head_bytes: 64 };
    let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: h\r\nX-Long: "[..]);
    buf.extend_from_slice(&[b'a'; 64]);
    assert_eq!(parse(&mut buf, &limits).map(|_| ()), Err(HeadError::TooLarge { limit: 64 }));
    let mut whole = BytesMut::from(
        &b"GET / HTTP/1.1\r\nHost: h\r\nX-Long: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n"[..],
    );
    let e = parse(&mut whole, &limits).map(|_| ()).expect_err("over the limit");
    assert_eq!(e, HeadError::TooLarge { limit: 64 });
    assert_eq!(e.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
}

#[test]
fn more_header_fields_than_the_limit_are_refused() {
    let limits = HeadLimits { max_headers: 3, max_head_bytes: 64 << 10 };
    let mut ok = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\n\r\n"[..]);
    assert!(parse(&mut ok, &limits).expect("three fields").is_some());
    let mut over = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n"[..]);
    assert_eq!(parse(&mut over, &limits).map(|_| ()), Err(HeadError::TooManyHeaders { limit: 3 }));
}

#[test]
fn keep_alive_follows_the_version_and_the_connection_field() {
    assert!(accepted("GET / HTTP/1.1\r\nHost: h\r\n\r\n").keep_alive);
    assert!(!accepted("GET / HTTP/1.1\r\nHost: h\r\nConnection: Close\r\n\r\n").keep_alive);
    assert!(!accepted("GET / HTTP/1.1\r\nHost: h\r\nConnection: te, close\r\n\r\n").keep_alive);
    assert!(!accepted("GET / HTTP/1.0\r\n\r\n").keep_alive);
    assert!(accepted("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
    assert!(!accepted("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n").keep_alive);
}

#[test]
fn expect_continue_only_with_a_body_on_http11() {
    let with_body = "POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n";
    assert!(accepted(with_body).expect_continue);
    assert!(!accepted("GET / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n").expect_continue);
    assert!(!accepted("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n").expect_continue);
}

/// A valid request head with a body of the given framing.
fn request_text() -> impl Strategy<Value = Vec<u8>> {
    let method = prop::sample::select(vec!["GET", "POST", "PUT", "HEAD", "DELETE"]);
    let path = "/[a-z0-9/_.-]{0,40}(\\?[a-z=&0-9-]{0,20})?";
    let field = ("[A-Za-z][A-Za-z0-9-]{0,15}", "[ -~]{0,40}")
        .prop_filter("not a framing or host field", |(n, _)| {
            let n = n.to_ascii_lowercase();
            !["content-length", "transfer-encoding", "host", "connection", "expect"].contains(&n.as_str())
        })
        .prop_map(|(n, v)| format!("{n}: {}\r\n", v.trim()));
    let framing = prop_oneof![
        Just(String::new()),
        (0u64..100_000).prop_map(|n| format!("Content-Length: {n}\r\n")),
        Just("Transfer-Encoding: chunked\r\n".to_string()),
    ];
    (method, path, prop::collection::vec(field, 0..12), framing, "[ -~]{0,30}").prop_map(
        |(method, path, fields, framing, after)| {
            let mut text = format!("{method} {path} HTTP/1.1\r\nHost: localhost:4437\r\n");
            text.extend(fields);
            text.push_str(&framing);
            text.push_str("\r\n");
            text.push_str(&after);
            text.into_bytes()
        },
    )
}

fn summary(head: &Head) -> (Method, String, Framing, bool, Vec<(String, Vec<u8>)>) {
    let fields = head.headers.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect();
    (head.method.clone(), head.uri.to_string(), head.framing, head.keep_alive, fields)
}

proptest! {
    #[test]
    fn a_head_split_anywhere_parses_as_it_does_whole(text in request_text(), split in any::<prop::sample::Index>()) {
        let limits = HeadLimits::default();
        let mut whole = BytesMut::from(&text[..]);
        let expected = parse(&mut whole, &limits).expect("a valid head").expect("complete");
        let at = split.index(text.len() + 1);
        let mut buf = BytesMut::from(&text[..at]);
        let first = parse(&mut buf, &limits).expect("a valid prefix");
        buf.extend_from_slice(&text[at..]);
        let head = match first {
            Some(head) => head,
            None => parse(&mut buf, &limits).expect("valid").expect("complete"),
        };
        prop_assert_eq!(summary(&head), summary(&expected));
        prop_assert_eq!(&buf[..], &whole[..], "the same bytes are left for the body");
    }

    #[test]
    fn no_input_panics(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let mut buf = BytesMut::from(&bytes[..]);
        let before = buf.len();
        if let Ok(Some(_)) = parse(&mut buf, &HeadLimits::default()) {
            prop_assert!(buf.len() < before, "a parsed head is taken off the buffer");
        }
    }

    #[test]
    fn a_valid_head_with_noise_inserted_never_panics(text in request_text(), at in any::<prop::sample::Index>(), noise in prop::collection::vec(any::<u8>(), 1..4)) {
        let mut bytes = text.clone();
        let at = at.index(bytes.len() + 1);
        bytes.splice(at..at, noise);
        let _ = parse(&mut BytesMut::from(&bytes[..]), &HeadLimits::default());
    }
}

#[test]
fn empty_lines_before_the_request_line_are_skipped() {
    // RFC 9112 section 2.2: a server should ignore at least one empty line before a request (a
    // client that ended the last body with an extra CRLF).
    assert_eq!(accepted("\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n").method, Method::GET);
}
