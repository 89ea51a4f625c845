//! The connection loop driven over an in-memory socket: pipelining (split anywhere, as a
//! property), refusals, request bodies of each framing, `Expect: 100-continue`, streamed and
//! `HEAD` answers, half-close, the header timeout and graceful shutdown.

use super::*;
use crate::chunked::{Chunk, ChunkedDecoder};
use http_body::Frame;
use proptest::prelude::*;
use std::collections::VecDeque;
use std::convert::Infallible;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;

/// A response body: whole (with its exact size, or claiming `claimed`), or streamed from a
/// channel (size unknown).
enum TestBody {
    Whole { data: Option<Bytes>, claimed: Option<u64> },
    Stream(mpsc::Receiver<Bytes>),
}

impl TestBody {
    fn text(text: impl Into<String>) -> Self {
        TestBody::Whole { data: Some(Bytes::from(text.into())), claimed: None }
    }
}

impl Body for TestBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            TestBody::Whole { data, .. } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            TestBody::Stream(rx) => rx.poll_recv(cx).map(|d| d.map(|d| Ok(Frame::data(d)))),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            TestBody::Whole { claimed: Some(n), .. } => http_body::SizeHint::with_exact(*n),
            TestBody::Whole { data, .. } => {
                http_body::SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            TestBody::Stream(_) => http_body::SizeHint::default(),
        }
    }
}

/// A service from a closure.
struct Handler<F>(F);

impl<F, Fut> Service<Request<RequestBody>> for Handler<F>
where
    F: FnMut(Request<RequestBody>) -> Fut,
    Fut: Future<Output = Result<Response<TestBody>, Infallible>>,
{
    type Response = Response<TestBody>;
    type Error = Infallible;
    type Future = Fut;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody>) -> Fut {
        (self.0)(request)
    }
}

/// Reads a whole request body: its bytes, or the error that ended it.
async fn read_body(body: RequestBody) -> Result<Vec<u8>, body::BodyError> {
    let mut body = pin!(body);
    let mut bytes = Vec::new();
    while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        if let Ok(data) = frame?.into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}

/// Answers "METHOD PATH LEN:BODY" after reading the whole body; 400 with the reason when the
/// body fails.
fn echo() -> Handler<
    impl FnMut(Request<RequestBody>) -> Pin<Box<dyn Future<Output = Result<Response<TestBody>, Infallible>> + Send>>,
> {
    Handler(|request: Request<RequestBody>| {
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let answer = match read_body(body).await {
                Ok(bytes) => Response::new(TestBody::text(format!(
                    "{} {} {}:{}",
                    parts.method,
                    parts.uri.path(),
                    bytes.len(),
                    String::from_utf8_lossy(&bytes)
                ))),
                Err(e) => {
                    let mut answer = Response::new(TestBody::text(e.to_string()));
                    *answer.status_mut() = StatusCode::BAD_REQUEST;
                    answer
                }
            };
            Ok(answer)
        }) as Pin<Box<dyn Future<Output = _> + Send>>
    })
}

/// A response as the client read it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

struct Client {
    io: DuplexStream,
    buf: BytesMut,
}

impl Client {
    async fn send(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.expect("the server reads");
    }

    /// Reads more; false at the end of the stream.
    async fn fill(&mut self) -> bool {
        let read = tokio::time::timeout(Duration::from_secs(10), self.io.read_buf(&mut self.buf)).await;
        read.expect("the server answers within 10 s").expect("read") > 0
    }

    /// The next answer (`head_only`: the answer to a `HEAD`, no body read).
    async fn answer(&mut self, head_only: bool) -> Answer {
        let (status, headers, len) = loop {
            let mut fields = [httparse::EMPTY_HEADER; 32];
            let mut parsed = httparse::Response::new(&mut fields);
            if let httparse::Status::Complete(len) = parsed.parse(&self.buf).expect("a well-formed answer") {
                let headers = parsed
                    .headers
                    .iter()
                    .map(|h| (h.name.to_string(), String::from_utf8_lossy(h.value).into_owned()))
                    .collect::<Vec<_>>();
                break (parsed.code.expect("a status"), headers, len);
            }
            assert!(self.fill().await, "the connection ended inside an answer's head");
        };
        self.buf.advance(len);
        let mut answer = Answer { status, headers, body: Vec::new() };
        if head_only || status == 204 || status == 304 || status / 100 == 1 {
            return answer;
        }
        if let Some(length) = answer.header("content-length") {
            let length: usize = length.parse().expect("a length");
            while self.buf.len() < length {
                assert!(self.fill().await, "the connection ended inside a body");
            }
            answer.body = self.buf.split_to(length).to_vec();
        } else if answer.header("transfer-encoding") == Some("chunked") {
            let mut decoder = ChunkedDecoder::new();
            loop {
                match decoder.decode(&mut self.buf).expect("valid chunks") {
                    Chunk::Data(data) => answer.body.extend_from_slice(&data),
                    Chunk::End => break,
                    Chunk::NeedMore => assert!(self.fill().await, "the connection ended inside a chunked body"),
                }
            }
        } else {
            while self.fill().await {}
            answer.body = self.buf.split().to_vec();
        }
        answer
    }

    /// Whether the server closed the connection with nothing more to say.
    async fn closed(&mut self) -> bool {
        !self.fill().await && self.buf.is_empty()
    }
}

type Served = tokio::task::JoinHandle<Result<(), ConnError>>;

fn start<S, B>(service: S, config: Config, shutdown: Shutdown) -> (Client, Served)
where
    S: Service<Request<RequestBody>, Response = Response<B>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let (client, server) = tokio::io::duplex(64 << 10);
    let served = tokio::spawn(async move { serve(server, service, &config, &shutdown).await });
    (Client { io: client, buf: BytesMut::new() }, served)
}

const PIPELINE: &[u8] = b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n\
POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello\
POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nwor\r\n2;x=y\r\nld\r\n0\r\nT: 1\r\n\r\n\
PUT /d HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n\
GET /e HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";

const PIPELINE_ANSWERS: [&str; 5] = ["GET /a 0:", "POST /b 5:hello", "POST /c 5:world", "PUT /d 0:", "GET /e 0:"];

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let (mut client, served) = start(echo(), Config::default(), Shutdown::new());
    client.send(PIPELINE).await;
    for (i, expected) in PIPELINE_ANSWERS.iter().enumerate() {
        let answer = client.answer(false).await;
        assert_eq!((answer.status, answer.text().as_str()), (200, *expected), "answer {i}");
        assert!(answer.header("date").is_some());
    }
    assert!(client.closed().await, "closed after the request that asked for it");
    served.await.expect("no panic").expect("a clean end");
}

#[tokio::test]
async fn every_refused_head_is_answered_with_its_status_and_the_connection_closed() {
    let cases: [(&[u8], u16); 8] = [
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, identity\r\n\r\n", 400),
        (b"GET / HTTP/1.1\nHost: h\n\n", 400),
        (b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", 400),
        (b"GET / HTTP/3.0\r\nHost: h\r\n\r\n", 505),
    ];
    for (text, status) in cases {
        let (mut client, served) = start(echo(), Config::default(), Shutdown::new());
        client.send(text).await;
        let answer = client.answer(false).await;
        let shown = String::from_utf8_lossy(text);
        assert_eq!(answer.status, status, "{shown:?}: {}", answer.text());
        assert_eq!(answer.header("connection"), Some("close"), "{shown:?}");
        assert!(!answer.body.is_empty(), "a reason is given");
        assert!(client.closed().await, "{shown:?}: closed");
        assert!(matches!(served.await.expect("no panic"), Err(ConnError::Head(_))));
    }
}

#[tokio::test]
async fn too_many_header_fields_are_answered_431() {
    let config = Config { head_limits: HeadLimits { max_headers: 4, max_head_bytes: 1024 }, ..Config::default() };
    let (mut client, _served) = start(echo(), config, Shutdown::new());
    client.send(b"GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n").await;
    assert_eq!(client.answer(false).await.status, 431);
    let (mut client, _served) = start(echo(), config, Shutdown::new());
    client.send(&[b'G'; 2048]).await;
    assert_eq!(client.answer(false).await.status, 431, "a head over the byte limit, before it ends");
}

#[tokio::test]
async fn a_malformed_chunked_body_reaches_the_handler_and_ends_the_connection() {
    let (mut client, served) = start(echo(), Config::default(), Shutdown::new());
    client.send(b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXX\r\nGET /y HTTP/1.1\r\nHost: h\r\n\r\n").await;
    let answer = client.answer(false).await;
    assert_eq!(answer.status, 400);
    assert!(answer.text().contains("chunk"), "{}", answer.text());
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(client.closed().await, "the bytes after it are not taken for a request");
    served.await.expect("no panic").expect("ended by the server");
}

#[tokio::test]
async fn a_client_that_closes_inside_a_body_gives_the_handler_an_error() {
    let (mut client, _served) = start(echo(), Config::default(), Shutdown::new());
    client.send(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc").await;
    client.io.shutdown().await.expect("half-close");
    let answer = client.answer(false).await;
    assert_eq!(answer.status, 400);
    assert!(answer.text().contains("closed the connection inside the request body"), "{}", answer.text());
}

#[tokio::test]
async fn a_streamed_answer_is_chunked_and_each_piece_sent_when_produced() {
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let mut rx = Some(rx);
    let handler = Handler(move |_request: Request<RequestBody>| {
        let body = TestBody::Stream(rx.take().expect("one request"));
        std::future::ready(Ok::<_, Infallible>(Response::new(body)))
    });
    let (mut client, _served) = start(handler, Config::default(), Shutdown::new());
    client.send(b"GET /sse HTTP/1.1\r\nHost: h\r\n\r\n").await;
    tx.send(Bytes::from_static(b"event one")).await.expect("the body is read");
    // The first piece arrives while the body is still open: it was written when produced.
    while !String::from_utf8_lossy(&client.buf).contains("event one") {
        assert!(client.fill().await, "the connection stays open");
    }
    assert!(String::from_utf8_lossy(&client.buf).contains("transfer-encoding: chunked"));
    tx.send(Bytes::from(vec![b'z'; 40_000])).await.expect("the body is read");
    drop(tx);
    let answer = client.answer(false).await;
    assert_eq!(answer.body.len(), "event one".len() + 40_000);
    assert!(answer.body.starts_with(b"event one"));
}

#[tokio::test]
async fn expect_continue_is_answered_when_the_handler_first_reads_the_body() {
    let (mut client, _served) = start(echo(), Config::default(), Shutdown::new());
    client.send(b"POST /up HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n").await;
    let interim = client.answer(false).await;
    assert_eq!(interim.status, 100);
    client.send(b"hello").await;
    let answer = client.answer(false).await;
    assert_eq!((answer.status, answer.text().as_str()), (200, "POST /up 5:hello"));
    assert_eq!(answer.header("connection"), None, "kept open");
}

/// Answers 401 without reading the body.
fn refuse_unread(
) -> Handler<impl FnMut(Request<RequestBody>) -> std::future::Ready<Result<Response<TestBody>, Infallible>>> {
    Handler(|_request: Request<RequestBody>| {
        let mut answer = Response::new(TestBody::text("no"));
        *answer.status_mut() = StatusCode::UNAUTHORIZED;
        std::future::ready(Ok(answer))
    })
}

#[tokio::test]
async fn a_handler_that_answers_without_reading_sends_no_continue_and_closes() {
    let (mut client, _served) = start(refuse_unread(), Config::default(), Shutdown::new());
    client.send(b"POST /up HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n").await;
    let answer = client.answer(false).await;
    assert_eq!(answer.status, 401, "no interim answer first");
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(client.closed().await);
}

#[tokio::test]
async fn an_unread_body_already_buffered_is_skipped_and_the_connection_kept() {
    let (mut client, _served) = start(refuse_unread(), Config::default(), Shutdown::new());
    client
        .send(b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloPOST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\nGET /c HTTP/1.1\r\nHost: h\r\n\r\n")
        .await;
    for _ in 0..3 {
        let answer = client.answer(false).await;
        assert_eq!(answer.status, 401);
        assert_eq!(answer.header("connection"), None);
    }
}

#[tokio::test]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let (mut client, served) = start(echo(), Config::default(), Shutdown::new());
    client.send(b"POST /h HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nok").await;
    client.io.shutdown().await.expect("half-close");
    let answer = client.answer(false).await;
    assert_eq!(answer.text(), "POST /h 2:ok");
    assert!(client.closed().await);
    served.await.expect("no panic").expect("a clean end");
}

#[tokio::test]
async fn an_idle_or_slow_head_is_closed_after_the_header_timeout() {
    let config = Config { header_timeout: Duration::from_millis(100), ..Config::default() };
    let (mut idle, served) = start(echo(), config, Shutdown::new());
    assert!(idle.closed().await, "an idle connection is closed");
    served.await.expect("no panic").expect("idle: a clean end");
    let (mut slow, served) = start(echo(), config, Shutdown::new());
    slow.send(b"GET / HTTP/1.1\r\nHost:").await;
    assert!(slow.closed().await, "a head still incomplete is closed");
    assert!(matches!(served.await.expect("no panic"), Err(ConnError::HeaderTimeout(_))));
    // The timer is reset for each head: a connection used for longer than the timeout lives on.
    let (mut kept, _served) = start(echo(), config, Shutdown::new());
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        kept.send(b"GET /k HTTP/1.1\r\nHost: h\r\n\r\n").await;
        assert_eq!(kept.answer(false).await.text(), "GET /k 0:");
    }
}

#[tokio::test]
async fn graceful_shutdown_closes_an_idle_connection_and_lets_a_request_in_flight_finish() {
    let shutdown = Shutdown::new();
    let (mut idle, served) = start(echo(), Config::default(), shutdown.clone());
    idle.send(b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\n").await;
    assert_eq!(idle.answer(false).await.status, 200);
    shutdown.graceful();
    assert!(idle.closed().await);
    served.await.expect("no panic").expect("a clean end");

    let shutdown = Shutdown::new();
    let (release, wait) = tokio::sync::oneshot::channel::<()>();
    let mut wait = Some(wait);
    let handler = Handler(move |_request: Request<RequestBody>| {
        let wait = wait.take().expect("one request");
        async move {
            let _ = wait.await;
            Ok::<_, Infallible>(Response::new(TestBody::text("done")))
        }
    });
    let (mut busy, served) = start(handler, Config::default(), shutdown.clone());
    busy.send(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    shutdown.graceful();
    release.send(()).expect("the handler waits");
    let answer = busy.answer(false).await;
    assert_eq!((answer.text().as_str(), answer.header("connection")), ("done", Some("close")));
    assert!(busy.closed().await);
    served.await.expect("no panic").expect("a clean end");
}

#[tokio::test]
async fn an_http10_client_gets_an_answer_delimited_by_the_close() {
    let (tx, rx) = mpsc::channel::<Bytes>(2);
    let mut rx = Some(rx);
    let handler = Handler(move |_request: Request<RequestBody>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(TestBody::Stream(rx.take().expect("one request")))))
    });
    let (mut client, _served) = start(handler, Config::default(), Shutdown::new());
    client.send(b"GET /old HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").await;
    tx.send(Bytes::from_static(b"abc")).await.expect("read");
    tx.send(Bytes::from_static(b"def")).await.expect("read");
    drop(tx);
    let answer = client.answer(false).await;
    assert_eq!(answer.header("transfer-encoding"), None);
    assert_eq!(answer.header("connection"), Some("close"));
    assert_eq!(answer.text(), "abcdef");
}

#[tokio::test]
async fn a_head_answer_carries_the_length_and_no_body() {
    let (mut client, _served) = start(echo(), Config::default(), Shutdown::new());
    client.send(b"HEAD /h HTTP/1.1\r\nHost: h\r\n\r\nGET /g HTTP/1.1\r\nHost: h\r\n\r\n").await;
    let head = client.answer(true).await;
    assert_eq!(head.header("content-length"), Some("10"), "the length a GET would have had (\"HEAD /h 0:\")");
    let next = client.answer(false).await;
    assert_eq!(next.text(), "GET /g 0:", "no body bytes were written for the HEAD");
}

#[tokio::test]
async fn a_body_shorter_than_its_length_ends_the_connection() {
    let handler = Handler(|_request: Request<RequestBody>| {
        let body = TestBody::Whole { data: Some(Bytes::from_static(b"short")), claimed: Some(10) };
        std::future::ready(Ok::<_, Infallible>(Response::new(body)))
    });
    let (mut client, served) = start(handler, Config::default(), Shutdown::new());
    client.send(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").await;
    while client.fill().await {}
    assert!(String::from_utf8_lossy(&client.buf).ends_with("\r\n\r\nshort"));
    assert!(matches!(served.await.expect("no panic"), Err(ConnError::BodyLength { expected: 10 })));
}

#[tokio::test]
async fn a_handler_asking_to_close_is_obeyed_and_its_framing_fields_replaced() {
    let handler = Handler(|_request: Request<RequestBody>| {
        let mut answer = Response::new(TestBody::text("bye"));
        answer.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
        answer.headers_mut().insert("transfer-encoding", HeaderValue::from_static("chunked"));
        std::future::ready(Ok::<_, Infallible>(answer))
    });
    let (mut client, _served) = start(handler, Config::default(), Shutdown::new());
    client.send(b"GET / HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n").await;
    let answer = client.answer(false).await;
    assert_eq!((answer.text().as_str(), answer.header("transfer-encoding")), ("bye", None));
    assert!(client.closed().await, "the second request is not served");
}

#[tokio::test]
async fn a_large_body_piece_goes_out_whole() {
    let big = Bytes::from(vec![7u8; 300_000]);
    let piece = big.clone();
    let handler = Handler(move |_request: Request<RequestBody>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(TestBody::Whole {
            data: Some(piece.clone()),
            claimed: None,
        })))
    });
    let (mut client, _served) = start(handler, Config::default(), Shutdown::new());
    client.send(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").await;
    let answer = client.answer(false).await;
    assert_eq!(answer.body, big.to_vec());
}

/// Writes `text` in the pieces `cuts` make, yielding between them.
async fn send_in_pieces(client: &mut Client, text: &[u8], cuts: &[usize]) {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (text.len() + 1)).collect();
    at.push(0);
    at.push(text.len());
    at.sort_unstable();
    let mut pieces: VecDeque<&[u8]> = at.windows(2).map(|w| &text[w[0]..w[1]]).collect();
    while let Some(piece) = pieces.pop_front() {
        client.send(piece).await;
        tokio::task::yield_now().await;
    }
}

proptest! {
    #[test]
    fn pipelined_requests_split_anywhere_are_answered_as_whole(cuts in prop::collection::vec(any::<usize>(), 0..8), read_chunk in 1usize..64) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let answers = runtime.block_on(async {
            // Tiny reads as well: every head and body split by the server's reads too.
            let config = Config { read_chunk, ..Config::default() };
            let (mut client, served) = start(echo(), config, Shutdown::new());
            send_in_pieces(&mut client, PIPELINE, &cuts).await;
            let mut answers = Vec::new();
            for _ in 0..PIPELINE_ANSWERS.len() {
                answers.push(client.answer(false).await.text());
            }
            assert!(client.closed().await);
            served.await.expect("no panic").expect("a clean end");
            answers
        });
        prop_assert_eq!(answers, PIPELINE_ANSWERS.to_vec());
    }

    #[test]
    fn no_input_panics_the_connection(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async {
            let config = Config { header_timeout: Duration::from_millis(20), ..Config::default() };
            let (mut client, served) = start(echo(), config, Shutdown::new());
            client.send(&bytes).await;
            client.io.shutdown().await.expect("half-close");
            while client.fill().await {}
            let _ = served.await.expect("no panic");
        });
    }
}

/// A socket that takes every write whole and counts the calls: the request is read from
/// `input`, then the client's end (EOF).
struct Recorder {
    input: Bytes,
    out: Vec<u8>,
    writes: usize,
}

impl AsyncRead for Recorder {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = self.input.len().min(buf.remaining());
        buf.put_slice(&self.input[..n]);
        self.input.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Recorder {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.writes += 1;
        self.out.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.writes += 1;
        let mut n = 0;
        for b in bufs {
            self.out.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn many_small_pieces_ready_at_once_go_out_in_a_few_vectored_writes_in_order() {
    // 600 pieces of 4 KiB (queued, not copied) with a tiny one (copied) after every tenth: a
    // catch-up answer of small appends. All ready at once, as the pieces of one read are.
    let mut pieces = Vec::new();
    for i in 0..600u32 {
        pieces.push(Bytes::from(vec![(i % 251) as u8; 4096]));
        if i % 10 == 0 {
            pieces.push(Bytes::from(format!("<{i}>")));
        }
    }
    let expected: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
    for chunked in [true, false] {
        let (tx, rx) = mpsc::channel::<Bytes>(pieces.len());
        for p in &pieces {
            tx.try_send(p.clone()).expect("room for every piece");
        }
        drop(tx);
        let mut rx = Some(rx);
        let claimed = expected.len() as u64;
        let handler = Handler(move |_request: Request<RequestBody>| {
            let body = TestBody::Stream(rx.take().expect("one request"));
            let mut response = Response::new(body);
            if !chunked {
                response.headers_mut().insert(http::header::CONTENT_LENGTH, claimed.into());
            }
            std::future::ready(Ok::<_, Infallible>(response))
        });
        let mut io =
            Recorder { input: Bytes::from_static(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"), out: Vec::new(), writes: 0 };
        serve(&mut io, handler, &Config::default(), &Shutdown::new()).await.expect("served");
        let text = io.out;
        let at = text.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
        let body = if chunked {
            let mut decoder = ChunkedDecoder::new();
            let mut body = Vec::new();
            let mut input = BytesMut::from(&text[at..]);
            loop {
                match decoder.decode(&mut input).expect("well-formed chunks") {
                    Chunk::Data(data) => body.extend_from_slice(&data),
                    Chunk::End => break,
                    Chunk::NeedMore => panic!("the body ends before its last chunk"),
                }
            }
            assert!(input.is_empty(), "nothing after the last chunk");
            body
        } else {
            text[at..].to_vec()
        };
        assert!(body == expected, "the pieces in order (chunked {chunked})");
        // 2.4 MB in gathers of `gather_bytes` (1 MiB) for a known length, of `write_buffer`
        // (64 KiB) for a streamed body: one write per gather, not one a piece.
        let config = Config::default();
        let most = expected.len() / if chunked { config.write_buffer } else { config.gather_bytes } + 8;
        assert!(io.writes <= most, "{} writes for {} pieces (chunked {chunked})", io.writes, pieces.len());
    }
}

/// A connection served on one end of a socket pair with a park for it, answering one request
/// with the streamed body `rx`; the client's end.
fn start_parked(rx: mpsc::Receiver<Bytes>) -> (tokio::net::UnixStream, Park, Served) {
    use std::os::fd::AsRawFd;
    let (client, server) = tokio::net::UnixStream::pair().expect("a socket pair");
    // SAFETY: `serve_parked` owns the socket and closes the park before it drops it.
    let park = unsafe { Park::new(server.as_raw_fd()) };
    let mut rx = Some(rx);
    let handler = Handler(move |_request: Request<RequestBody>| {
        let body = TestBody::Stream(rx.take().expect("one request"));
        std::future::ready(Ok::<_, Infallible>(Response::new(body)))
    });
    let given = park.clone();
    let served =
        tokio::spawn(
            async move { serve_parked(server, Some(given), handler, &Config::default(), &Shutdown::new()).await },
        );
    (client, park, served)
}

/// Sends `data` through `park` once the connection lets it (the answer waits on its body).
async fn send_when_idle(park: &Park, data: &[u8]) -> crate::park::Sent {
    for _ in 0..10_000 {
        match park.send(data) {
            crate::park::Sent::NotNow => tokio::time::sleep(Duration::from_millis(1)).await,
            sent => return sent,
        }
    }
    panic!("the connection never waited on its body");
}

/// The chunked body of the one answer a client read whole.
fn chunked_body_of(wire: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(wire);
    let at = text.find("\r\n\r\n").expect("a head") + 4;
    assert!(text[..at].contains("transfer-encoding: chunked"), "{}", &text[..at]);
    let mut buf = BytesMut::from(&wire[at..]);
    let mut decoder = ChunkedDecoder::new();
    let mut body = Vec::new();
    loop {
        match decoder.decode(&mut buf).expect("valid chunks") {
            Chunk::Data(data) => body.extend_from_slice(&data),
            Chunk::End => return body,
            Chunk::NeedMore => panic!("the answer ended inside its body"),
        }
    }
}

#[tokio::test]
async fn pieces_written_through_the_park_go_out_as_chunks_in_order_with_the_bodys_own() {
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let (mut client, park, served) = start_parked(rx);
    // No answer waits yet: nothing may be written from outside.
    assert_eq!(park.send(b"too early"), crate::park::Sent::NotNow);
    client.write_all(b"GET /sse HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").await.expect("request");
    assert_eq!(send_when_idle(&park, b"one,").await, crate::park::Sent::All);
    // A write through the park goes before the body's next piece: whoever holds the park
    // decides the order (a parked reader produces nothing meanwhile). So the body's piece is
    // seen out before the park writes again.
    tx.send(Bytes::from_static(b"two,")).await.expect("the body is read");
    let mut wire = Vec::new();
    while !String::from_utf8_lossy(&wire).contains("two,") {
        let mut buf = [0u8; 1024];
        let n =
            tokio::time::timeout(Duration::from_secs(10), client.read(&mut buf)).await.expect("more").expect("read");
        assert!(n > 0, "the connection stays open");
        wire.extend_from_slice(&buf[..n]);
    }
    assert_eq!(send_when_idle(&park, b"three,").await, crate::park::Sent::All);
    tx.send(Bytes::from_static(b"four")).await.expect("the body is read");
    drop(tx);
    tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut wire)).await.expect("ends").expect("read");
    assert_eq!(chunked_body_of(&wire), b"one,two,three,four");
    served.await.expect("no panic").expect("a clean end");
    assert_eq!(park.send(b"after"), crate::park::Sent::NotNow, "the connection is gone: the park is closed");
}

#[tokio::test]
async fn a_piece_the_socket_takes_in_part_is_finished_by_the_connection_before_anything_else() {
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let (mut client, park, served) = start_parked(rx);
    client.write_all(b"GET /sse HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").await.expect("request");
    let reader = tokio::spawn(async move {
        // Not read until the piece is handed over: the socket's buffer cannot take it all.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut wire = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut wire))
            .await
            .expect("ends")
            .expect("read");
        wire
    });
    let big: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
    assert_eq!(send_when_idle(&park, &big).await, crate::park::Sent::Partly);
    assert_eq!(park.send(b"not now"), crate::park::Sent::NotNow, "the rest is the connection's to write");
    tx.send(Bytes::from_static(b"after")).await.expect("the body is read");
    drop(tx);
    let body = chunked_body_of(&reader.await.expect("no panic"));
    assert_eq!(body.len(), big.len() + 5);
    assert!(body[..big.len()] == big[..] && &body[big.len()..] == b"after", "the rest, then the body's piece");
    served.await.expect("no panic").expect("a clean end");
}

#[tokio::test]
async fn a_piece_a_full_socket_refuses_is_not_written_at_all() {
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let (mut client, park, served) = start_parked(rx);
    client.write_all(b"GET /sse HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").await.expect("request");
    let piece = [b'p'; 1000];
    assert_eq!(send_when_idle(&park, &piece).await, crate::park::Sent::All);
    // Small pieces until the socket, never read, takes no more.
    let mut taken = 1usize;
    let refused = loop {
        match park.send(&piece) {
            crate::park::Sent::All => taken += 1,
            other => break other,
        }
        assert!(taken < 100_000, "the socket never filled");
    };
    // A Unix socket takes a small piece whole or not at all.
    assert_eq!(refused, crate::park::Sent::Blocked);
    // Nothing of the refused piece went out.
    tx.send(Bytes::from_static(b"end")).await.expect("the body is read");
    drop(tx);
    let mut wire = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut wire)).await.expect("ends").expect("read");
    assert_eq!(chunked_body_of(&wire).len(), taken * piece.len() + 3, "the refused piece was not written");
    let _ = served.await.expect("no panic");
}
