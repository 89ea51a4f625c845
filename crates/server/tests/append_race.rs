//! The append race of the engine seam: a POST is looked up (and its framing decided) before its
//! body arrives; if the stream is deleted and re-created as JSON in between, the engine must not
//! store the unframed body in the JSON stream. The request names the incarnation it was framed
//! for; the engine refuses it, and the server decides it again against the new stream.

mod common;

use std::time::Duration;

use oncelog_server::ServerConfig;
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn a_stream_replaced_while_the_body_is_in_flight_never_gets_unframed_json() {
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = reqwest::Client::new();
    let put = |ct: &'static str| http.put(s.url("r")).header("content-type", ct).send();
    assert_eq!(put("text/plain").await.expect("put").status(), StatusCode::CREATED);

    // The request's headers and half of its body: the handler looks the stream up and waits.
    let body = br#"{"a":1}"#;
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
    let head = format!(
        "POST /v1/stream/r HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("write head");
    conn.write_all(&body[..3]).await.expect("write part");
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Meanwhile the path is replaced by a JSON stream.
    assert_eq!(http.delete(s.url("r")).send().await.expect("delete").status(), StatusCode::NO_CONTENT);
    assert_eq!(put("application/json").await.expect("put").status(), StatusCode::CREATED);

    conn.write_all(&body[3..]).await.expect("write rest");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.expect("read answer");
    let status = answer.split_whitespace().nth(1).unwrap_or_default().to_owned();
    assert!(status == "204" || status == "409", "answer: {answer}");

    // Another message, then the whole stream must be one valid JSON array of whole messages.
    let r = http.post(s.url("r")).header("content-type", "application/json").body("[2]").send().await.expect("post");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let text = http.get(s.url("r")).send().await.expect("get").text().await.expect("text");
    let parsed: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("stream holds invalid JSON {text:?}: {e}"));
    let expected = if status == "204" { serde_json::json!([{"a": 1}, 2]) } else { serde_json::json!([2]) };
    assert_eq!(parsed, expected);
    // Re-decided against the new stream, the append lands framed.
    assert_eq!(status, "204", "the request was re-validated against the new stream");
}
