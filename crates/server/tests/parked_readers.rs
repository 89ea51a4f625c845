//! SSE readers parked at the tail (issue 47, step 5; `oncelog_server::fanout`): a parked reader's
//! events are written by its runtime's fan-out without its task running for them, and every way
//! back to its task — a full socket, an event larger than one piece, the stream closed or
//! deleted, the keep-alive interval — keeps every byte, in order, once. The counters are the
//! witnesses (`oncelog_sse_parks_total` counts each time a reader's task parks it), so the tests
//! run in their own binary, one at a time ([`SERIAL`]).

mod common;

use std::time::Duration;

use oncelog_server::ServerConfig;
use reqwest::{Client, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The value of the sample `name` (labels written exactly), 0 when absent.
async fn sample(http: &Client, s: &common::TestServer, name: &str) -> u64 {
    let scrape = http.get(format!("{}/metrics", s.origin)).send().await.expect("scrape");
    let scrape = scrape.text().await.expect("text");
    scrape
        .lines()
        .find(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ')))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse::<f64>().expect("a number") as u64)
}

/// Polls `name` until it reaches `at_least` (5 s at most).
async fn reaches(http: &Client, s: &common::TestServer, name: &str, at_least: u64) {
    for _ in 0..500 {
        if sample(http, s, name).await >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name} never reached {at_least}");
}

async fn create(http: &Client, url: &str) {
    let r = http.put(url).header("content-type", "text/plain").send().await.expect("put");
    assert_eq!(r.status(), StatusCode::CREATED);
}

async fn append(http: &Client, url: &str, body: String) {
    let r = http.post(url).header("content-type", "text/plain").body(body).send().await.expect("post");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

/// An SSE answer read from a raw socket: its chunked body decoded, its events split.
struct Sse {
    socket: tokio::net::TcpStream,
    wire: Vec<u8>,
    body: Vec<u8>,
    ended: bool,
    data: String,
    data_events: usize,
    controls: Vec<String>,
    comments: usize,
    /// The answer's head is not read yet.
    in_head: bool,
}

impl Sse {
    /// Opens an SSE read of `path` at `offset`; `receive_buffer`: the socket's receive buffer
    /// (small, to make the server's side fill).
    async fn open(s: &common::TestServer, path: &str, offset: &str, receive_buffer: Option<u32>) -> Sse {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        if let Some(n) = receive_buffer {
            socket.set_recv_buffer_size(n).expect("rcvbuf");
        }
        let mut socket = socket.connect(s.addr).await.expect("connect");
        let request = format!("GET /v1/stream/{path}?offset={offset}&live=sse HTTP/1.1\r\nHost: localhost\r\n\r\n");
        socket.write_all(request.as_bytes()).await.expect("request");
        let mut sse = Sse {
            socket,
            wire: Vec::new(),
            body: Vec::new(),
            ended: false,
            data: String::new(),
            data_events: 0,
            controls: Vec::new(),
            comments: 0,
            in_head: true,
        };
        sse.until("the answer's head", |r| r.wire.windows(4).any(|w| w == b"\r\n\r\n")).await;
        let at = sse.wire.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
        let head = String::from_utf8_lossy(&sse.wire[..at]).into_owned();
        assert!(head.starts_with("HTTP/1.1 200") && head.contains("transfer-encoding: chunked"), "{head}");
        sse.wire.drain(..at);
        sse.in_head = false;
        sse.decode();
        sse
    }

    /// Reads until `done` holds (10 s at most).
    async fn until(&mut self, what: &str, done: impl Fn(&Sse) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done(self) {
            let mut buf = vec![0u8; 64 << 10];
            let read = tokio::time::timeout_at(deadline, self.socket.read(&mut buf)).await;
            let Ok(Ok(n)) = read else { panic!("{what}: stalled with {} data bytes", self.data.len()) };
            if n == 0 {
                assert!(done(self), "{what}: the connection closed first");
                return;
            }
            self.wire.extend_from_slice(&buf[..n]);
            self.decode();
        }
    }

    /// Decodes whole chunks from `wire`, then whole events from `body` (once past the head).
    fn decode(&mut self) {
        if self.in_head {
            return;
        }
        while let Some(line_end) = self.wire.windows(2).position(|w| w == b"\r\n") {
            let len =
                usize::from_str_radix(std::str::from_utf8(&self.wire[..line_end]).expect("hex"), 16).expect("hex");
            if len == 0 {
                self.ended = true;
                self.wire.clear();
                break;
            }
            if self.wire.len() < line_end + 2 + len + 2 {
                break;
            }
            let chunk: Vec<u8> = self.wire.drain(..line_end + 2 + len + 2).collect();
            assert_eq!(&chunk[line_end + 2 + len..], b"\r\n", "a chunk ends with CRLF");
            self.body.extend_from_slice(&chunk[line_end + 2..line_end + 2 + len]);
        }
        while let Some(end) = self.body.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.body.drain(..end + 2).collect();
            let event = String::from_utf8(event).expect("utf-8");
            if event.starts_with("event: data\n") {
                self.data_events += 1;
                for line in event.lines().filter_map(|l| l.strip_prefix("data:")) {
                    self.data.push_str(line);
                }
            } else if event.starts_with("event: control\n") {
                self.controls.push(event);
            } else if event.starts_with(':') {
                self.comments += 1;
            }
        }
    }
}

const PARKS: &str = "oncelog_sse_parks_total";

/// An SSE reader of `path` from its tail, once it got its first control event and parked
/// (`receive_buffer`: as [`Sse::open`]).
async fn parked_reader(http: &Client, s: &common::TestServer, path: &str, receive_buffer: Option<u32>) -> Sse {
    let parks = sample(http, s, PARKS).await;
    let mut reader = Sse::open(s, path, "now", receive_buffer).await;
    reader.until("the first control", |r| !r.controls.is_empty()).await;
    reaches(http, s, PARKS, parks + 1).await;
    reader
}
const PARKED_EVENTS: &str = "oncelog_sse_parked_events_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_reader_gets_a_thousand_events_without_its_task_running_for_them() {
    let _serial = SERIAL.lock().await;
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = Client::new();
    let url = s.url("thousand");
    create(&http, &url).await;
    let events = sample(&http, &s, PARKED_EVENTS).await;
    let mut reader = parked_reader(&http, &s, "thousand", None).await;
    let parks = sample(&http, &s, PARKS).await;
    let mut all = String::new();
    for i in 0..1000 {
        let m = format!("m{i:04},");
        append(&http, &url, m.clone()).await;
        all.push_str(&m);
    }
    reader.until("every append", |r| r.data.len() >= all.len()).await;
    assert_eq!(reader.data, all, "every append once, in order");
    assert_eq!(sample(&http, &s, PARKS).await, parks, "the reader's task never ran for an event");
    assert_eq!(
        sample(&http, &s, PARKED_EVENTS).await - events,
        reader.data_events as u64,
        "every data event was written by the fan-out"
    );
    assert!(reader.controls.last().expect("controls").contains("\"upToDate\":true"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_socket_hands_the_reader_back_and_no_byte_is_lost_or_doubled() {
    let _serial = SERIAL.lock().await;
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = Client::new();
    let url = s.url("full");
    create(&http, &url).await;
    let full = r#"oncelog_sse_handed_back_total{reason="full"}"#;
    let back = sample(&http, &s, full).await;
    let mut reader = parked_reader(&http, &s, "full", Some(4096)).await;
    // 16 KiB events (one piece each) into a socket nobody reads: it fills.
    let mut all = String::new();
    let mut i = 0;
    while sample(&http, &s, full).await == back {
        assert!(i < 2000, "the socket never filled");
        let m = format!("{i:05}{}", "x".repeat(16 << 10));
        append(&http, &url, m.clone()).await;
        all.push_str(&m);
        i += 1;
    }
    for j in 0..20 {
        let m = format!("after{j:02},");
        append(&http, &url, m.clone()).await;
        all.push_str(&m);
    }
    reader.until("every append", |r| r.data.len() >= all.len()).await;
    assert!(reader.data == all, "every append once, in order ({} bytes of {})", reader.data.len(), all.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_event_a_close_and_a_delete_each_take_the_reader_back_to_its_task() {
    let _serial = SERIAL.lock().await;
    let s = common::TestServer::start(ServerConfig::default(), None).await;
    let http = Client::new();

    // Larger than one piece: framed by the reader's task, then parked again.
    let url = s.url("large");
    create(&http, &url).await;
    let event = r#"oncelog_sse_handed_back_total{reason="event"}"#;
    let back = sample(&http, &s, event).await;
    let mut reader = parked_reader(&http, &s, "large", None).await;
    let parks = sample(&http, &s, PARKS).await;
    let big = "L".repeat(40 << 10);
    append(&http, &url, "small,".into()).await;
    append(&http, &url, big.clone()).await;
    append(&http, &url, "end,".into()).await;
    let want = format!("small,{big}end,");
    reader.until("all three", |r| r.data.len() >= want.len()).await;
    assert_eq!(reader.data, want);
    assert!(sample(&http, &s, event).await > back, "the large event went back to the task");
    reaches(&http, &s, PARKS, parks + 1).await;

    // Closed: the answer ends with a control saying so.
    let url = s.url("closing");
    create(&http, &url).await;
    let stream = r#"oncelog_sse_handed_back_total{reason="stream"}"#;
    let back = sample(&http, &s, stream).await;
    let mut reader = parked_reader(&http, &s, "closing", None).await;
    append(&http, &url, "last,".into()).await;
    let r = http.post(&url).header("stream-closed", "true").send().await.expect("close");
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    reader.until("the end of the answer", |r| r.ended).await;
    assert_eq!(reader.data, "last,");
    assert!(reader.controls.last().expect("a control").contains("\"streamClosed\":true"), "{:?}", reader.controls);

    // Deleted: the answer ends.
    let url = s.url("deleted");
    create(&http, &url).await;
    let mut reader = parked_reader(&http, &s, "deleted", None).await;
    assert!(http.delete(&url).send().await.expect("delete").status().is_success());
    reader.until("the end of the answer", |r| r.ended).await;
    assert!(sample(&http, &s, stream).await > back, "the readers went back to their tasks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_reader_still_sends_keep_alives_and_parks_again() {
    let _serial = SERIAL.lock().await;
    let config = ServerConfig { sse_keepalive: Duration::from_millis(100), ..ServerConfig::default() };
    let s = common::TestServer::start(config, None).await;
    let http = Client::new();
    let url = s.url("quiet");
    create(&http, &url).await;
    let parks = sample(&http, &s, PARKS).await;
    let mut reader = Sse::open(&s, "quiet", "now", None).await;
    reader.until("three keep-alives", |r| r.comments >= 3).await;
    assert!(sample(&http, &s, PARKS).await >= parks + 3, "parked again after each keep-alive");
    append(&http, &url, "still here,".into()).await;
    reader.until("the append", |r| r.data == "still here,").await;
}
