//! SSE readers of one stream share the events a commit makes (framed once, sent by every reader
//! it woke): each reader still gets exactly its own bytes, in order, once — whatever offset it
//! reads from while others share frames.

mod common;

use std::time::Duration;

use oncelog_server::ServerConfig;
use reqwest::{Client, StatusCode};

/// An SSE response read event by event: the text of its data events, and how many control
/// events said it is up to date.
struct Reader {
    resp: reqwest::Response,
    buf: String,
    data: String,
    up_to_date: usize,
}

impl Reader {
    async fn open(http: &Client, url: &str, offset: &str) -> Reader {
        let resp = http.get(format!("{url}?offset={offset}&live=sse")).send().await.expect("sse");
        assert_eq!(resp.status(), StatusCode::OK);
        Reader { resp, buf: String::new(), data: String::new(), up_to_date: 0 }
    }

    /// Reads until `done` holds, 10 s at most.
    async fn until(&mut self, what: &str, done: impl Fn(&Reader) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done(self) {
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk()).await;
            let Ok(Ok(Some(chunk))) = chunk else { panic!("{what}: SSE ended or stalled with data {:?}", self.data) };
            self.buf.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
            while let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                if event.starts_with("event: data\n") {
                    for line in event.lines().filter_map(|l| l.strip_prefix("data:")) {
                        self.data.push_str(line);
                    }
                } else if event.starts_with("event: control\n") && event.contains("\"upToDate\":true") {
                    self.up_to_date += 1;
                }
            }
        }
    }
}

async fn append(http: &Client, url: &str, body: String) {
    let r = http.post(url).header("content-type", "text/plain").body(body).send().await.expect("post");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_catching_up_never_takes_a_frame_made_at_another_offset() {
    // Eight bytes per read: the reader from the start takes many steps, each after a read that
    // saw the stream, while a reader at the tail has framed the newest append.
    let config = ServerConfig { max_read_bytes: 8, ..ServerConfig::default() };
    let s = common::TestServer::start(config, None).await;
    let http = Client::new();
    let url = s.url("s");
    assert_eq!(
        http.put(&url).header("content-type", "text/plain").send().await.expect("put").status(),
        StatusCode::CREATED
    );
    let mut all = String::new();
    for i in 0..40 {
        let m = format!("m{i:03},");
        append(&http, &url, m.clone()).await;
        all.push_str(&m);
    }
    let mut tail = Reader::open(&http, &url, "now").await;
    tail.until("tail reader's first control", |r| r.up_to_date >= 1).await;
    append(&http, &url, "x000,".into()).await;
    all.push_str("x000,");
    tail.until("tail reader gets x000", |r| r.data == "x000,").await;

    let mut from_start = Reader::open(&http, &url, "-1").await;
    from_start.until("reader from the start", |r| r.data.len() >= all.len()).await;
    assert_eq!(from_start.data, all, "the reader from the start gets the stream as written");

    for i in 1..6 {
        let m = format!("x{i:03},");
        append(&http, &url, m.clone()).await;
        all.push_str(&m);
    }
    from_start.until("reader from the start, live", |r| r.data.len() >= all.len()).await;
    tail.until("tail reader, live", |r| r.data.len() >= 30).await;
    assert_eq!(from_start.data, all);
    assert_eq!(tail.data, all[all.len() - 30..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_readers_at_the_tail_each_get_every_append_once_in_order() {
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = Client::new();
    let url = s.url("fan");
    assert_eq!(
        http.put(&url).header("content-type", "text/plain").send().await.expect("put").status(),
        StatusCode::CREATED
    );
    let mut readers = Vec::new();
    for _ in 0..50 {
        let mut r = Reader::open(&http, &url, "now").await;
        r.until("first control", |r| r.up_to_date >= 1).await;
        readers.push(r);
    }
    let mut all = String::new();
    for i in 0..20 {
        let m = format!("a{i:03},");
        append(&http, &url, m.clone()).await;
        all.push_str(&m);
    }
    let tasks: Vec<_> = readers
        .into_iter()
        .map(|mut r| {
            let want = all.clone();
            tokio::spawn(async move {
                r.until("a reader at the tail", |r| r.data.len() >= want.len()).await;
                assert_eq!(r.data, want, "every append once, in order");
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("reader");
    }
}
