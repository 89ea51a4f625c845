//! The framing each response gets, the head's bytes, and a chunked body read back by the decoder.

use super::*;
use crate::chunked::{Chunk, ChunkedDecoder};
use http::{HeaderName, HeaderValue};
use proptest::prelude::*;

const DATE: &[u8] = b"Sat, 05 Dec 2026 17:00:00 GMT";

fn encoded(head: ResponseHead<'_>) -> String {
    let mut dst = BytesMut::new();
    head.encode(DATE, &mut dst);
    String::from_utf8(dst.to_vec()).expect("ascii")
}

fn fields(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_static(value));
    }
    map
}

#[test]
fn framing_follows_status_method_version_and_length() {
    let ok = StatusCode::OK;
    assert_eq!(BodyFraming::decide(&Method::GET, Version::HTTP_11, ok, Some(5)), BodyFraming::Length(5));
    assert_eq!(BodyFraming::decide(&Method::GET, Version::HTTP_11, ok, None), BodyFraming::Chunked);
    assert_eq!(BodyFraming::decide(&Method::GET, Version::HTTP_10, ok, None), BodyFraming::UntilClose);
    assert_eq!(BodyFraming::decide(&Method::GET, Version::HTTP_10, ok, Some(0)), BodyFraming::Length(0));
    assert_eq!(BodyFraming::decide(&Method::HEAD, Version::HTTP_11, ok, Some(5)), BodyFraming::Head);
    for status in [StatusCode::NO_CONTENT, StatusCode::NOT_MODIFIED, StatusCode::CONTINUE] {
        assert_eq!(BodyFraming::decide(&Method::GET, Version::HTTP_11, status, Some(5)), BodyFraming::None, "{status}");
    }
    assert!(!BodyFraming::Head.has_body() && !BodyFraming::None.has_body());
    assert!(BodyFraming::Length(0).has_body() && BodyFraming::Chunked.has_body() && BodyFraming::UntilClose.has_body());
}

#[test]
fn a_head_is_the_status_line_the_fields_the_length_and_the_date() {
    let headers = fields(&[("content-type", "text/plain"), ("stream-next-offset", "0000_0005")]);
    let text = encoded(ResponseHead {
        status: StatusCode::OK,
        version: Version::HTTP_11,
        headers: &headers,
        framing: BodyFraming::Length(5),
        keep_alive: true,
    });
    assert_eq!(
        text,
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nstream-next-offset: 0000_0005\r\ncontent-length: 5\r\ndate: Sat, 05 Dec 2026 17:00:00 GMT\r\n\r\n"
    );
}

#[test]
fn the_engine_owns_the_framing_fields() {
    let headers =
        fields(&[("content-length", "99"), ("transfer-encoding", "gzip"), ("connection", "upgrade"), ("x-a", "1")]);
    let text = encoded(ResponseHead {
        status: StatusCode::OK,
        version: Version::HTTP_11,
        headers: &headers,
        framing: BodyFraming::Chunked,
        keep_alive: false,
    });
    assert_eq!(
        text,
        format!(
            "HTTP/1.1 200 OK\r\nx-a: 1\r\ntransfer-encoding: chunked\r\nconnection: close\r\ndate: {}\r\n\r\n",
            std::str::from_utf8(DATE).expect("ascii")
        )
    );
}

#[test]
fn head_and_304_answers_keep_the_handlers_length_and_204_drops_it() {
    let headers = fields(&[("content-length", "42")]);
    let head = |status, framing| {
        encoded(ResponseHead { status, version: Version::HTTP_11, headers: &headers, framing, keep_alive: true })
    };
    assert!(head(StatusCode::OK, BodyFraming::Head).contains("content-length: 42\r\n"));
    assert!(head(StatusCode::NOT_MODIFIED, BodyFraming::None).contains("content-length: 42\r\n"));
    assert!(!head(StatusCode::NO_CONTENT, BodyFraming::None).contains("content-length"));
    assert!(!head(StatusCode::NO_CONTENT, BodyFraming::None).contains("transfer-encoding"));
}

#[test]
fn an_http10_client_kept_open_is_told_so_and_a_date_is_not_doubled() {
    let headers = fields(&[("date", "Thu, 01 Jan 1970 00:00:00 GMT")]);
    let text = encoded(ResponseHead {
        status: StatusCode::NOT_FOUND,
        version: Version::HTTP_10,
        headers: &headers,
        framing: BodyFraming::Length(0),
        keep_alive: true,
    });
    assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"), "{text}");
    assert!(text.contains("connection: keep-alive\r\n"), "{text}");
    assert_eq!(text.matches("date: ").count(), 1, "{text}");
}

#[test]
fn an_unknown_status_gets_a_reason_phrase() {
    let headers = HeaderMap::new();
    let status = StatusCode::from_u16(599).expect("valid");
    let text = encoded(ResponseHead {
        status,
        version: Version::HTTP_11,
        headers: &headers,
        framing: BodyFraming::Length(0),
        keep_alive: true,
    });
    assert!(text.starts_with("HTTP/1.1 599 Unknown\r\n"), "{text}");
}

#[test]
fn a_chunk_starts_with_its_length_in_hex() {
    for (len, line) in
        [(1usize, "1\r\n"), (10, "a\r\n"), (255, "ff\r\n"), (4096, "1000\r\n"), (usize::MAX, "ffffffffffffffff\r\n")]
    {
        let mut dst = BytesMut::new();
        chunk_start(len, &mut dst);
        assert_eq!(&dst[..], line.as_bytes(), "{len}");
    }
}

proptest! {
    #[test]
    fn an_encoded_head_parses_back_with_its_fields(
        fields in prop::collection::vec(("x-[a-z]{1,10}", "[!-~]([ -~]{0,30}[!-~])?"), 0..10),
        len in any::<u64>(),
        keep_alive in any::<bool>(),
    ) {
        let mut headers = HeaderMap::new();
        for (name, value) in &fields {
            headers.append(HeaderName::from_bytes(name.as_bytes()).expect("token"), HeaderValue::from_str(value).expect("visible"));
        }
        let mut dst = BytesMut::new();
        ResponseHead { status: StatusCode::OK, version: Version::HTTP_11, headers: &headers, framing: BodyFraming::Length(len), keep_alive }
            .encode(DATE, &mut dst);
        let mut parsed = [httparse::EMPTY_HEADER; 16];
        let mut response = httparse::Response::new(&mut parsed);
        let status = response.parse(&dst).expect("well formed");
        prop_assert_eq!(status, httparse::Status::Complete(dst.len()));
        prop_assert_eq!(response.code, Some(200));
        let mut seen: Vec<(String, String)> = response.headers.iter().map(|h| (h.name.to_string(), String::from_utf8_lossy(h.value).into_owned())).collect();
        let length = seen.iter().position(|(n, _)| n == "content-length").expect("a length");
        prop_assert_eq!(seen.remove(length).1, len.to_string());
        seen.retain(|(n, _)| n.starts_with("x-"));
        // A header map keeps each name's values in order, grouped by name.
        let mut expected: Vec<(String, String)> = fields.into_iter().collect();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        prop_assert_eq!(seen, expected);
    }

    #[test]
    fn a_chunked_body_written_here_reads_back_through_the_decoder(pieces in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..500), 0..10)) {
        let mut wire = BytesMut::new();
        for piece in &pieces {
            chunk_start(piece.len(), &mut wire);
            wire.extend_from_slice(piece);
            wire.extend_from_slice(CHUNK_END);
        }
        wire.extend_from_slice(LAST_CHUNK);
        let mut decoder = ChunkedDecoder::new();
        let mut body = Vec::new();
        loop {
            match decoder.decode(&mut wire).expect("valid") {
                Chunk::Data(data) => body.extend_from_slice(&data),
                Chunk::End => break,
                Chunk::NeedMore => prop_assert!(false, "the body is whole"),
            }
        }
        prop_assert_eq!(body, pieces.concat());
        prop_assert!(wire.is_empty());
    }
}
