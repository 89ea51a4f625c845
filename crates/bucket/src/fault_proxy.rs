//! A fault proxy between a node and the test S3 API server (feature `test-support`): the
//! bucket as a real one misbehaves — throttling (`503 SlowDown`), slow answers, a PUT that
//! succeeded but whose answer never came back, one whose answer was lost and whose object the
//! bucket stored damaged, failing PUTs of some keys, and the bucket unreachable (every
//! connection closed at once). It also counts what passed: creates that found their key taken,
//! and requests that carried `X-Tigris-Consistent: true`. The node's client is the production one
//! (object_store over HTTP); only the wire between it and the S3 server is tampered with.
//!
//! It runs on a thread of its own with its own runtime, so a test may block (start a child
//! process, sleep) while the node behind it talks to the bucket.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// What the proxy does to the requests it gets, until told otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Fault {
    /// Every request goes through untouched.
    #[default]
    Pass,
    /// Every `n`th request is answered `503 SlowDown` without reaching the bucket.
    Throttle(u64),
    /// Every answer arrives this much later than the bucket gave it.
    Slow(Duration),
    /// Every answer to a GET (a read, or a listing) arrives this much later; writes are not
    /// slowed.
    SlowGets(Duration),
    /// Every PUT that the bucket took (a 2xx) loses its answer: the connection closes before
    /// it, so the writer cannot tell a stored object from a lost one.
    LosePutAnswers,
    /// PUTs whose path contains this text are answered `500` without reaching the bucket.
    FailPuts(String),
    /// The bucket is unreachable: every connection is closed, new ones as soon as they come.
    Down,
    /// The next this many conditional creates (PUTs with `If-None-Match: *`) are answered `409
    /// ConditionalRequestConflict` without reaching the bucket, as S3 answers while another
    /// create of the key is in flight; then creates pass.
    ConflictCreates(u64),
    /// PUTs whose path contains this text reach the bucket with their body damaged (`Damage`),
    /// and if the bucket took it (a 2xx) the answer is lost, as [`Fault::LosePutAnswers`]: the
    /// writer's retry then finds the key taken by an object that is not what it sent.
    DamagePuts(String, Damage),
}

/// How [`Fault::DamagePuts`] changes a body: deterministic, so a test knows what is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// The first byte's bits flipped: the same length, another CRC32C.
    FlipFirstByte,
    /// The last byte dropped (a torn upload): one byte shorter.
    DropLastByte,
}

impl Damage {
    fn apply(self, body: Bytes) -> Bytes {
        match self {
            Damage::FlipFirstByte => {
                let mut v = body.to_vec();
                if let Some(b) = v.first_mut() {
                    *b = !*b;
                }
                Bytes::from(v)
            }
            Damage::DropLastByte => body.slice(..body.len().saturating_sub(1)),
        }
    }
}

/// What the proxy did so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    pub throttled: u64,
    pub lost_answers: u64,
    pub failed_puts: u64,
    pub refused: u64,
    pub conflicts: u64,
    /// PUTs whose body the proxy damaged ([`Fault::DamagePuts`]).
    pub damaged: u64,
    /// Conditional creates the bucket answered `412 Precondition Failed`: the key existed.
    pub exists: u64,
    /// Requests that carried `X-Tigris-Consistent: true`.
    pub tigris_consistent: u64,
}

#[derive(Default)]
struct Shared {
    fault: Mutex<Fault>,
    requests: AtomicU64,
    throttled: AtomicU64,
    lost_answers: AtomicU64,
    failed_puts: AtomicU64,
    refused: AtomicU64,
    conflicts: AtomicU64,
    damaged: AtomicU64,
    exists: AtomicU64,
    tigris_consistent: AtomicU64,
}

impl Shared {
    fn fault(&self) -> Fault {
        self.fault.lock().map(|f| f.clone()).unwrap_or_default()
    }
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    /// `http://127.0.0.1:PORT`: the endpoint to give the node instead of the bucket's.
    pub url: String,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The proxy refuses a request by closing its connection (hyper drops it on an error).
#[derive(Debug, thiserror::Error)]
#[error("the fault proxy closed the connection")]
struct Closed;

impl FaultProxy {
    /// Starts a proxy to `upstream` (`http://HOST:PORT`) on a free loopback port.
    pub fn start(upstream: &str) -> FaultProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fault proxy");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let addr: SocketAddr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared::default());
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (upstream, state) = (upstream.trim_end_matches('/').to_owned(), shared.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("proxy runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                let client = reqwest::Client::builder()
                    .no_proxy()
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .expect("proxy client");
                loop {
                    let (conn, _) = tokio::select! {
                        _ = &mut stopped => return,
                        accepted = listener.accept() => match accepted {
                            Ok(c) => c,
                            Err(_) => continue,
                        },
                    };
                    if state.fault() == Fault::Down {
                        state.refused.fetch_add(1, Ordering::Relaxed);
                        drop(conn);
                        continue;
                    }
                    let (state, client, upstream) = (state.clone(), client.clone(), upstream.clone());
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            forward(req, state.clone(), client.clone(), upstream.clone())
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(conn), service)
                            .await;
                    });
                }
            });
        });
        FaultProxy { url: format!("http://{addr}"), shared, stop: Some(stop), thread: Some(thread) }
    }

    /// From now on, `fault`.
    pub fn set(&self, fault: Fault) {
        if let Ok(mut f) = self.shared.fault.lock() {
            *f = fault;
        }
    }

    pub fn counts(&self) -> Counts {
        let s = &self.shared;
        Counts {
            requests: s.requests.load(Ordering::Relaxed),
            throttled: s.throttled.load(Ordering::Relaxed),
            lost_answers: s.lost_answers.load(Ordering::Relaxed),
            failed_puts: s.failed_puts.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            conflicts: s.conflicts.load(Ordering::Relaxed),
            damaged: s.damaged.load(Ordering::Relaxed),
            exists: s.exists.load(Ordering::Relaxed),
            tigris_consistent: s.tigris_consistent.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r
}

async fn forward(
    req: Request<Incoming>,
    state: Arc<Shared>,
    client: reqwest::Client,
    upstream: String,
) -> Result<Response<Full<Bytes>>, Closed> {
    let n = state.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let fault = state.fault();
    let is_put = req.method() == hyper::Method::PUT;
    let is_get = req.method() == hyper::Method::GET;
    let is_create = is_put && req.headers().contains_key("if-none-match");
    if req.headers().get("x-tigris-consistent").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true")) {
        state.tigris_consistent.fetch_add(1, Ordering::Relaxed);
    }
    match &fault {
        Fault::Down => {
            state.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Closed);
        }
        Fault::Throttle(every) if *every > 0 && n.is_multiple_of(*every) => {
            state.throttled.fetch_add(1, Ordering::Relaxed);
            return Ok(answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
            ));
        }
        Fault::ConflictCreates(left) if *left > 0 && is_create => {
            if let Ok(mut f) = state.fault.lock() {
                *f = Fault::ConflictCreates(left - 1);
            }
            state.conflicts.fetch_add(1, Ordering::Relaxed);
            return Ok(answer(
                StatusCode::CONFLICT,
                "<Error><Code>ConditionalRequestConflict</Code><Message>A conflicting conditional \
                 operation is currently in progress against this resource.</Message></Error>",
            ));
        }
        Fault::FailPuts(part) if is_put && req.uri().path().contains(part.as_str()) => {
            state.failed_puts.fetch_add(1, Ordering::Relaxed);
            return Ok(answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                "<Error><Code>InternalError</Code><Message>injected</Message></Error>",
            ));
        }
        _ => {}
    }
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let (parts, body) = req.into_parts();
    let mut body = body.collect().await.map_err(|_| Closed)?.to_bytes();
    let damaged = match &fault {
        Fault::DamagePuts(part, damage) if is_put && path.contains(part.as_str()) => {
            state.damaged.fetch_add(1, Ordering::Relaxed);
            body = damage.apply(body);
            true
        }
        _ => false,
    };
    let mut out = client.request(parts.method.clone(), format!("{upstream}{path}"));
    for (name, value) in &parts.headers {
        if !matches!(name.as_str(), "host" | "content-length" | "connection" | "transfer-encoding") {
            out = out.header(name, value);
        }
    }
    let got = out.body(body).send().await.map_err(|_| Closed)?;
    let (status, headers) = (got.status(), got.headers().clone());
    let bytes = got.bytes().await.map_err(|_| Closed)?;
    match fault {
        Fault::Slow(d) => tokio::time::sleep(d).await,
        Fault::SlowGets(d) if is_get => tokio::time::sleep(d).await,
        _ => {}
    }
    if is_create && status == StatusCode::PRECONDITION_FAILED {
        state.exists.fetch_add(1, Ordering::Relaxed);
    }
    if (fault == Fault::LosePutAnswers || damaged) && is_put && status.is_success() {
        // The bucket stored it; the writer never hears so.
        state.lost_answers.fetch_add(1, Ordering::Relaxed);
        return Err(Closed);
    }
    let mut resp = Response::new(Full::new(bytes));
    *resp.status_mut() = status;
    for (name, value) in &headers {
        if !matches!(name.as_str(), "connection" | "transfer-encoding") {
            resp.headers_mut().append(name, value.clone());
        }
    }
    Ok(resp)
}
