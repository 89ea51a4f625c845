//! The client against a real Oncelog server in-process: every operation, every read mode, typed
//! errors, and what is (and is not) retried.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::TestServer;
use futures_util::StreamExt;
use oncelog_client::{
    AppendOptions, Chunk, Client, CreateOptions, Error, LiveMode, ReadFrom, ReadOptions, RetryPolicy, StreamOffset,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every test is bounded in time.
const LIMIT: Duration = Duration::from_secs(20);

async fn collect(mut s: oncelog_client::ChunkStream) -> Result<Vec<Chunk>, Error> {
    let mut out = Vec::new();
    while let Some(c) = tokio::time::timeout(LIMIT, s.next()).await.expect("reader stalled") {
        out.push(c?);
    }
    Ok(out)
}

/// A server and a fresh stream of content type `ct` on it (keep the server alive while testing).
async fn stream_on_a_server(name: &str, ct: &str) -> (TestServer, oncelog_client::StreamHandle) {
    let srv = TestServer::start().await;
    let s = Client::new(&srv.base).expect("client").stream(name);
    s.create(CreateOptions::content_type(ct)).await.expect("create");
    (srv, s)
}

fn text(chunks: &[Chunk]) -> String {
    chunks.iter().map(|c| String::from_utf8_lossy(&c.data).into_owned()).collect()
}

#[tokio::test]
async fn create_append_head_close_delete() {
    let srv = TestServer::start().await;
    let client = Client::new(&srv.base).expect("client");
    let s = client.stream("ops/one");

    let created = s.create(CreateOptions::content_type("text/plain")).await.expect("create");
    assert!(created.created && !created.closed);
    let again = s.create(CreateOptions::content_type("text/plain")).await.expect("idempotent create");
    assert!(!again.created);
    let err = s.create(CreateOptions::content_type("application/json")).await.expect_err("different config");
    assert!(matches!(err, Error::ConfigMismatch { .. }), "{err:?}");

    let a = s.append("hello ", AppendOptions::default()).await.expect("append");
    let b = s.append("world", AppendOptions::default()).await.expect("append");
    assert!(a.next_offset < b.next_offset, "offsets grow");
    let info = s.head().await.expect("head");
    assert_eq!((info.content_type.as_str(), &info.next_offset, info.closed), ("text/plain", &b.next_offset, false));

    let err = s
        .append("x", AppendOptions { content_type: Some("application/json".into()), ..AppendOptions::default() })
        .await
        .expect_err("content type mismatch");
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    let seq = |v: &str| AppendOptions { stream_seq: Some(v.into()), ..AppendOptions::default() };
    s.append("!", seq("b")).await.expect("seq b");
    let err = s.append("?", seq("a")).await.expect_err("seq regression");
    assert!(matches!(err, Error::StreamSeqConflict { .. }), "{err:?}");

    let end = s.close().await.expect("close");
    assert_eq!(s.close().await.expect("close is idempotent"), end);
    let err = s.append("late", AppendOptions::default()).await.expect_err("closed");
    match err {
        Error::StreamClosed { final_offset } => assert_eq!(final_offset, Some(end.clone())),
        other => panic!("expected StreamClosed, got {other:?}"),
    }
    assert!(s.head().await.expect("head").closed);

    s.delete().await.expect("delete");
    assert!(matches!(s.head().await, Err(Error::NotFound { .. })));
    assert!(matches!(s.delete().await, Err(Error::NotFound { .. })));
    let missing = client.stream("ops/missing");
    assert!(matches!(missing.append("x", AppendOptions::default()).await, Err(Error::NotFound { .. })));
}

#[tokio::test]
async fn every_read_mode_resumes_from_any_offset_and_ends_at_eof() {
    let srv = TestServer::start().await;
    let client = Client::new(&srv.base).expect("client");
    for (name, ct) in [("reads/text", "text/plain"), ("reads/bin", "application/octet-stream")] {
        let s = client.stream(name);
        s.create(CreateOptions::content_type(ct)).await.expect("create");
        let mut offsets = vec![];
        for part in ["alpha,", "beta,", "gamma,"] {
            offsets.push(s.append(part, AppendOptions::default()).await.expect("append").next_offset);
        }

        // Catch-up: everything, then the reader ends up to date.
        let chunks = collect(s.read(ReadOptions::default())).await.expect("catch-up");
        assert_eq!(text(&chunks), "alpha,beta,gamma,");
        let last = chunks.last().expect("a chunk");
        assert!(last.up_to_date && !last.closed);
        // Resume from the first append's end.
        let chunks = collect(s.read(ReadOptions::new(offsets[0].clone(), LiveMode::CatchUp))).await.expect("resume");
        assert_eq!(text(&chunks), "beta,gamma,");
        // `now` skips history.
        let chunks = collect(s.read(ReadOptions::new(ReadFrom::Now, LiveMode::CatchUp))).await.expect("now");
        assert_eq!(text(&chunks), "");

        // Live readers in every mode, started before more data and the close arrive.
        let mut readers = Vec::new();
        for live in [LiveMode::LongPoll, LiveMode::Sse, LiveMode::Auto] {
            readers.push(tokio::spawn(collect(s.read(ReadOptions::new(offsets[1].clone(), live)))));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        s.append("delta,", AppendOptions::default()).await.expect("append");
        tokio::time::sleep(Duration::from_millis(700)).await; // past a long-poll timeout
        s.append_and_close("omega", AppendOptions::default()).await.expect("final append");
        for (r, live) in readers.into_iter().zip(["long-poll", "sse", "auto"]) {
            let chunks = r.await.expect("task").unwrap_or_else(|e| panic!("{name} {live}: {e}"));
            assert_eq!(text(&chunks), "gamma,delta,omega", "{name} {live}");
            let last = chunks.last().expect("a chunk");
            assert!(last.closed && last.up_to_date, "{name} {live} ends at EOF");
            assert_eq!(chunks.iter().filter(|c| c.closed).count(), 1);
        }
        // On a closed stream every mode ends at once, even from the tail.
        let tail = s.head().await.expect("head").next_offset;
        for live in [LiveMode::CatchUp, LiveMode::LongPoll, LiveMode::Sse, LiveMode::Auto] {
            let chunks = collect(s.read(ReadOptions::new(tail.clone(), live))).await.expect("eof read");
            assert_eq!(chunks.len(), 1, "{live:?}: one empty EOF chunk");
            assert!(chunks[0].closed && chunks[0].data.is_empty());
        }
    }
}

#[tokio::test]
async fn sse_reconnects_when_the_server_ends_the_response() {
    // The server ends every SSE response after 400 ms; a reader spanning several responses
    // must resume at the last control offset, echoing the cursor, without gaps or repeats.
    let srv = TestServer::start_with(oncelog_server::ServerConfig {
        sse_max_duration: Duration::from_millis(400),
        ..oncelog_server::ServerConfig::default()
    })
    .await;
    let client = Client::new(&srv.base).expect("client");
    let s = client.stream("sse/reconnect");
    s.create(CreateOptions::content_type("text/plain")).await.expect("create");
    let mut reader = s.read(ReadOptions::new(ReadFrom::Beginning, LiveMode::Sse));
    let writer = s.clone();
    let w = tokio::spawn(async move {
        for i in 0..5 {
            writer.append(format!("{i};"), AppendOptions::default()).await.expect("append");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        writer.close().await.expect("close");
    });
    let mut got = String::new();
    while let Some(c) = tokio::time::timeout(LIMIT, reader.next()).await.expect("stalled") {
        got.push_str(std::str::from_utf8(&c.expect("chunk").data).expect("utf-8"));
    }
    w.await.expect("writer");
    assert_eq!(got, "0;1;2;3;4;");
    assert!(reader.status().closed);
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Event {
    id: u32,
    kind: String,
}

#[tokio::test]
async fn json_streams_give_typed_messages_in_every_mode() {
    let (_srv, s) = stream_on_a_server("json/events", "application/json").await;
    let p = s.producer("typed").linger(Duration::from_millis(2)).start().await.expect("producer");
    let events: Vec<Event> =
        (0..50).map(|id| Event { id, kind: if id % 2 == 0 { "even".into() } else { "odd".into() } }).collect();
    for e in &events {
        p.append_json(e).await.expect("append");
    }
    p.close_stream(None).await.expect("close");
    assert!(p.stats().batches < 50, "values were batched into arrays: {:?}", p.stats());
    for live in [LiveMode::CatchUp, LiveMode::LongPoll, LiveMode::Sse] {
        let got: Vec<Event> = tokio::time::timeout(
            LIMIT,
            s.read(ReadOptions::new(ReadFrom::Beginning, live)).messages::<Event>().collect::<Vec<_>>(),
        )
        .await
        .expect("bounded")
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("messages");
        assert_eq!(got, events, "{live:?}");
    }
}

#[tokio::test]
async fn producer_fences_zombies_and_answers_duplicates_with_their_offsets() {
    let (_srv, s) = stream_on_a_server("prod/fence", "text/plain").await;
    let old = s.producer("writer").epoch(0).start().await.expect("producer");
    let a = old.append("a").await.expect("append").await.expect("stored");
    assert_eq!((a.epoch, a.seq, a.duplicate), (0, 0, false));
    let new = s.producer("writer").epoch(1).start().await.expect("producer");
    new.append("b").await.expect("append").await.expect("stored");
    let err = old.append("zombie").await.expect("append").await.expect_err("fenced");
    assert!(matches!(err, Error::Fenced { epoch: 0, current_epoch: 1 }), "{err:?}");
    assert!(matches!(old.flush().await, Err(Error::Fenced { .. })));
    new.close().await.expect("close");

    // A restart that forgot to bump its epoch is caught, not silently swallowed.
    let reused = s.producer("writer").epoch(1).start().await.expect("producer");
    let err = reused.append("c").await.expect("append").await.expect_err("reuse");
    assert!(matches!(err, Error::EpochReused { epoch: 1 }), "{err:?}");
    // With auto-claim it moves on to a fresh epoch instead.
    let claimer = s.producer("writer").epoch(1).auto_claim(true).start().await.expect("producer");
    let ack = claimer.append("c").await.expect("append").await.expect("stored");
    assert_eq!(ack.epoch, 2);
    claimer.close().await.expect("close");

    let chunks = collect(s.read(ReadOptions::default())).await.expect("read");
    assert_eq!(text(&chunks), "abc");
}

#[tokio::test]
async fn header_and_query_providers_run_for_every_request() {
    let srv = TestServer::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let client = Client::builder(&srv.base)
        .default_header("x-app", "oncelog-tests")
        .expect("header")
        .header_provider(move |h| {
            let n = c2.fetch_add(1, Ordering::SeqCst) + 1;
            h.insert("authorization", format!("Bearer token-{n}").parse().expect("value"));
        })
        .query_provider(|q| q.push(("sig".into(), "abc".into())))
        .build()
        .expect("client");
    let s = client.stream("auth/one");
    s.create(CreateOptions::content_type("text/plain")).await.expect("create");
    s.append("x", AppendOptions::default()).await.expect("append");
    collect(s.read(ReadOptions::default())).await.expect("read");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn reads_stop_with_typed_errors_on_permanent_failures() {
    let srv = TestServer::start().await;
    let client = Client::new(&srv.base).expect("client");
    for live in [LiveMode::CatchUp, LiveMode::LongPoll, LiveMode::Sse] {
        let err =
            collect(client.stream("nope").read(ReadOptions::new(ReadFrom::Now, live))).await.expect_err("missing");
        assert!(matches!(err, Error::NotFound { .. }), "{live:?}: {err:?}");
    }
    let s = client.stream("bad/offset");
    s.create(CreateOptions::content_type("text/plain")).await.expect("create");
    let err = collect(s.read(ReadOptions::new(StreamOffset::new("not-an-offset"), LiveMode::CatchUp)))
        .await
        .expect_err("bad offset");
    assert!(matches!(err, Error::BadRequest { .. }), "{err:?}");
}

/// Idempotency-Key values of the requests a fake server saw (`None`: the request had none).
type Keys = Arc<std::sync::Mutex<Vec<Option<String>>>>;

/// A fake server that reads each request and hangs up without answering: the request reached
/// the server, the outcome is unknown. Counts requests and records their idempotency keys.
async fn black_hole() -> (String, Arc<AtomicUsize>, Keys) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(AtomicUsize::new(0));
    let keys = Keys::default();
    let (s2, k2) = (seen.clone(), keys.clone());
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let (seen, keys) = (s2.clone(), k2.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
                let key = head.lines().find_map(|l| l.strip_prefix("idempotency-key:")).map(|v| v.trim().to_owned());
                keys.lock().expect("keys").push(key);
                seen.fetch_add(1, Ordering::SeqCst);
                let _ = sock.shutdown().await;
            });
        }
    });
    (format!("http://{addr}/v1/stream"), seen, keys)
}

#[tokio::test]
async fn a_plain_append_is_retried_with_one_key_boundedly_and_never_without_a_key() {
    let (base, seen, keys) = black_hole().await;
    let policy = RetryPolicy::new(Duration::from_millis(5), Duration::from_millis(20), 2.0)
        .expect("policy")
        .with_max_attempts(Some(4))
        .expect("policy");
    let client = Client::builder(base).retry_policy(policy.clone()).build().expect("client");
    let s = client.stream("s").with_content_type("text/plain");

    // By default it carries an automatic key, the same on every attempt, and is retried as
    // often as the policy allows. Then calling append again would send a new key, and the
    // server may have the data: not retry-safe.
    let err = s.append("data", AppendOptions::default()).await.expect_err("no answer");
    assert!(err.is_transient() && !err.is_retry_safe(), "{err:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 4, "all attempts used");
    let sent: Vec<Option<String>> = std::mem::take(&mut *keys.lock().expect("keys"));
    assert!(sent[0].is_some() && sent.iter().all(|k| *k == sent[0]), "one key on every attempt: {sent:?}");

    // Opted out: no key, sent once (a retry could store it twice).
    seen.store(0, Ordering::SeqCst);
    let opted_out = AppendOptions { auto_idempotency_key: Some(false), ..AppendOptions::default() };
    let err = s.append("data", opted_out).await.expect_err("no answer");
    assert!(err.is_transient() && !err.is_retry_safe(), "{err:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 1, "sent once: a retry could store it twice");
    assert_eq!(std::mem::take(&mut *keys.lock().expect("keys")), vec![None]);

    // Nothing listening: no attempt reached a server, so calling append again is safe.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let nowhere =
        Client::builder(format!("http://127.0.0.1:{port}/v1/stream")).retry_policy(policy).build().expect("client");
    let err = nowhere
        .stream("s")
        .with_content_type("text/plain")
        .append("data", AppendOptions::default())
        .await
        .expect_err("refused");
    assert!(err.is_retry_safe(), "connect failures only: {err:?}");

    // Idempotent operations are retried.
    seen.store(0, Ordering::SeqCst);
    let err = s.close().await.expect_err("no answer");
    assert!(err.is_retry_safe(), "{err:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 4, "close is idempotent: all attempts used");

    // A producer's append is retried: its (id, epoch, seq) makes that safe.
    seen.store(0, Ordering::SeqCst);
    let p = s
        .producer("p")
        .retry_policy(
            RetryPolicy::new(Duration::from_millis(5), Duration::from_millis(20), 2.0)
                .expect("p")
                .with_max_attempts(Some(3))
                .expect("p"),
        )
        .start()
        .await
        .expect("producer");
    let err = p.append(Bytes::from_static(b"x")).await.expect("append").await.expect_err("no answer");
    assert!(err.is_transient(), "{err:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn append_if_writes_at_the_tail_it_saw_or_returns_the_current_one() {
    let (_srv, s) = stream_on_a_server("occ", "text/plain").await;
    let start = s.head().await.expect("head").next_offset;
    let after = s.append_if(&start, "mine").await.expect("append at the tail");
    // A second writer that saw the same tail loses and learns the current one.
    match s.append_if(&start, "theirs").await {
        Err(Error::PreconditionFailed { current, closed: false }) => assert_eq!(current, after),
        other => panic!("expected a precondition failure, got {other:?}"),
    }
    // It re-reads and tries again at the current tail.
    let end = s.append_if(&after, "theirs").await.expect("append at the new tail");
    let all = collect(s.read(ReadOptions::new(ReadFrom::Beginning, LiveMode::CatchUp))).await.expect("read");
    assert_eq!(text(&all), "minetheirs");
    assert_eq!(s.head().await.expect("head").next_offset, end);
}

#[tokio::test]
async fn an_append_with_an_expected_offset_lands_only_at_that_tail() {
    let (_srv, s) = stream_on_a_server("expect", "text/plain").await;
    let start = s.head().await.expect("head").next_offset;
    let at = |o: &oncelog_client::StreamOffset| AppendOptions {
        expected_offset: Some(o.clone()),
        ..AppendOptions::default()
    };
    let after = s.append("mine", at(&start)).await.expect("append at the tail").next_offset;
    match s.append("theirs", at(&start)).await {
        Err(e @ Error::ExpectedOffsetConflict { .. }) => {
            assert_eq!(e.status(), Some(409));
            let Error::ExpectedOffsetConflict { current } = e else { unreachable!() };
            assert_eq!(current, after);
        }
        other => panic!("expected an expected-offset conflict, got {other:?}"),
    }
    s.append("theirs", at(&after)).await.expect("append at the new tail");
    let all = collect(s.read(ReadOptions::new(ReadFrom::Beginning, LiveMode::CatchUp))).await.expect("read");
    assert_eq!(text(&all), "minetheirs");
}

#[tokio::test]
async fn a_sequence_number_reused_for_other_bytes_is_a_typed_body_mismatch() {
    let (_srv, s) = stream_on_a_server("reuse", "text/plain").await;
    let opts = || {
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in [("producer-id", "p"), ("producer-epoch", "1"), ("producer-seq", "0")] {
            headers.insert(k, v.parse().expect("header value"));
        }
        AppendOptions { headers, ..AppendOptions::default() }
    };
    s.append("one", opts()).await.expect("first");
    match s.append("two", opts()).await {
        Err(Error::BodyMismatch { epoch: 1, seq: 0 }) => {}
        other => panic!("expected a body mismatch, got {other:?}"),
    }
}

#[tokio::test]
async fn trims_retention_and_readers_whose_position_was_dropped() {
    let (_srv, s) = stream_on_a_server("trimmed", "text/plain").await;
    let mut ends = Vec::new();
    for part in ["aaaa", "bbbb", "cccc"] {
        ends.push(s.append(part, AppendOptions::default()).await.expect("append").next_offset);
    }
    let t = s.trim(&ends[1]).await.expect("trim");
    assert_eq!((t.earliest.clone(), t.next_offset.clone()), (ends[1].clone(), ends[2].clone()));
    let info = s.head().await.expect("head");
    assert_eq!(info.earliest_offset, Some(ends[1].clone()));
    // A reader from a dropped position fails with the earliest offset, or goes on from there.
    let from_start = || ReadOptions::new(ReadFrom::Offset(ends[0].clone()), LiveMode::CatchUp);
    match collect(s.read(from_start())).await {
        Err(Error::Trimmed { earliest }) => assert_eq!(earliest, ends[1]),
        other => panic!("expected Trimmed, got {other:?}"),
    }
    let reader = s.read(ReadOptions { on_trimmed: oncelog_client::OnTrimmed::RestartFromEarliest, ..from_start() });
    let status = reader.status();
    assert_eq!(status.trim_restarts, 0);
    let mut reader = reader;
    let mut got = Vec::new();
    while let Some(c) = tokio::time::timeout(LIMIT, reader.next()).await.expect("reader stalled") {
        got.push(c.expect("restarted read"));
    }
    assert_eq!(text(&got), "cccc");
    assert_eq!(reader.status().trim_restarts, 1);
    // Beyond the tail is refused.
    assert!(matches!(
        s.trim(&StreamOffset::new("9999999999999999_9999999999999999")).await,
        Err(Error::BadRequest { .. })
    ));

    // Retention asked for at creation is shown by HEAD.
    let r = s.client().stream("kept");
    let opts = CreateOptions {
        retention_max_age_seconds: Some(oncelog_client::Limit::At(3600)),
        retention_max_bytes: Some(oncelog_client::Limit::Unlimited),
        ..CreateOptions::content_type("text/plain")
    };
    r.create(opts).await.expect("create");
    let info = r.head().await.expect("head");
    assert_eq!((info.retention_max_age_seconds, info.retention_max_bytes), (Some(3600), None));
}

#[tokio::test]
async fn list_streams_follows_the_pages_to_the_last_and_lists_each_stream_once() {
    let srv = TestServer::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let client = Client::builder(&srv.base)
        .header_provider(move |_| {
            c2.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .expect("client");
    // `p/1 &x=y` sorts between `p/1` and `p/2` and becomes a cursor: it must survive the query.
    let paths = ["p/0", "p/1", "p/1 &x=y", "p/2", "p/3", "p/4", "p/5"];
    for p in paths.iter().rev().chain(["q/0", "pq"].iter()) {
        client.stream(p).create(CreateOptions::content_type("text/plain")).await.expect("create");
    }
    let tail = client.stream("p/3").append("data", AppendOptions::default()).await.expect("append").next_offset;
    client.stream("p/4").close().await.expect("close");

    let before = calls.load(Ordering::SeqCst);
    let listed: Vec<_> = client
        .list_streams_in_pages("p/", 2)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("list");
    assert_eq!(
        listed.iter().map(|l| l.path.as_str()).collect::<Vec<_>>(),
        paths,
        "in path order, each once, prefix `p/` only"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst) - before,
        4,
        "7 streams in pages of 2: four requests, the last page ends the listing"
    );
    let p3 = &listed[4];
    assert_eq!((p3.content_type.as_str(), &p3.next_offset, p3.closed), ("text/plain", &tail, false));
    assert!(listed[5].closed, "p/4 is closed");

    // One page at a time: `next` is the page's last path, `None` on the last page.
    let first = client.list_streams_page("p/", None, 3).await.expect("page");
    assert_eq!(first.next.as_deref(), Some("p/1 &x=y"));
    let second = client.list_streams_page("p/", first.next.as_deref(), 3).await.expect("page");
    assert_eq!(second.streams.iter().map(|l| l.path.as_str()).collect::<Vec<_>>(), ["p/2", "p/3", "p/4"]);
    let last = client.list_streams_page("p/", second.next.as_deref(), 3).await.expect("page");
    assert_eq!((last.streams.len(), last.next), (1, None));
    // Every stream in one page of 1000 (the default), and page sizes the server would refuse
    // are refused before anything is sent.
    let all: Vec<_> =
        client.list_streams("").collect::<Vec<_>>().await.into_iter().collect::<Result<_, _>>().expect("list");
    assert_eq!(all.len(), 9);
    for bad in [0, 1001] {
        let err = client.list_streams_page("", None, bad).await.expect_err("bad page size");
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
}

#[tokio::test]
async fn a_purge_frees_the_path_a_fork_keeps_reserved() {
    let srv = TestServer::start().await;
    let client = Client::new(&srv.base).expect("client");
    let src = client.stream("purge/src");
    src.create(CreateOptions { body: Bytes::from("old"), ..CreateOptions::content_type("text/plain") })
        .await
        .expect("create");
    let mut fork = CreateOptions::default();
    fork.headers.insert("stream-forked-from", "/v1/stream/purge/src".parse().expect("value"));
    client.stream("purge/fork").create(fork).await.expect("fork");
    // A plain delete leaves the path reserved for the fork: it cannot be created again.
    src.delete().await.expect("delete");
    let err = src.create(CreateOptions::content_type("text/plain")).await.expect_err("path reserved");
    assert!(matches!(err, Error::ConfigMismatch { .. }), "{err:?}");
    // A purge frees it; the fork reads on.
    src.delete_with(oncelog_client::DeleteOptions { purge: true, ..Default::default() }).await.expect("purge");
    assert!(src.create(CreateOptions::content_type("text/plain")).await.expect("create again").created);
    let forked = collect(client.stream("purge/fork").read(ReadOptions::new(ReadFrom::Beginning, LiveMode::CatchUp)))
        .await
        .expect("read fork");
    assert_eq!(text(&forked), "old");
}
