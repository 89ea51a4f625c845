//! Unit tests of batching, sequencing and retry decisions, against an in-memory model server
//! that runs the protocol crate's own producer state machine. Time is Tokio's paused clock, and
//! jitter is fixed, so every delay is exact and the tests take no wall-clock time.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use oncelog_protocol::producer::{validate, ProducerState, Verdict as ServerVerdict};
use oncelog_protocol::Offset;

use super::transport::{BatchRequest, BatchResponse, Transport};
use super::{Producer, ProducerBuilder};
use crate::error::Error;
use crate::offset::StreamOffset;
use crate::retry::{FixedJitter, RetryPolicy};
use crate::Client;

/// What the model does with one request.
/// A receipt of the simulated server (which keeps no digests: it never sees a changed body).
fn receipt(end: u64) -> oncelog_protocol::producer::Receipt {
    oncelog_protocol::producer::Receipt { end: Offset(end), digest: oncelog_protocol::digest::BodyDigest::UNKNOWN }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Answer normally.
    None,
    /// The connection breaks before the request reaches the server: nothing stored.
    DropBefore,
    /// The server stores the request but the answer is lost.
    DropAfter,
    /// The server answers this status without storing anything.
    Status(u16),
}

/// A one-stream, one-producer-id server.
#[derive(Debug, Default)]
struct Model {
    /// The producer's state (`None`: never seen).
    state: Option<ProducerState>,
    /// Stored bodies, with the `(epoch, seq)` that stored them.
    log: Vec<(u64, u64, Bytes)>,
    /// Bytes stored.
    tail: u64,
    /// Closed streams refuse appends.
    closed: bool,
    /// Every request received, in arrival order.
    requests: Vec<BatchRequest>,
    /// Faults for the next requests (then `Fault::None`).
    faults: VecDeque<Fault>,
    /// Faults by `(seq, attempt number for that seq)`, attempt counted from 1.
    faults_by_seq: BTreeMap<(u64, usize), Fault>,
    /// Delay before the server handles a request, by seq (models reordering).
    delays: BTreeMap<u64, Duration>,
    /// Requests sent (counted when the client sends, before any delay).
    sent: usize,
    /// Requests being handled right now (to measure pipelining).
    concurrent: usize,
    /// The most requests handled at once.
    max_concurrent: usize,
    /// Another producer session moved the epoch here before the next request.
    bump_epoch_to: Option<u64>,
}

impl Model {
    fn attempts_of(&self, epoch: u64, seq: u64) -> usize {
        self.requests.iter().filter(|r| r.epoch == epoch && r.seq == seq).count()
    }

    fn handle(&mut self, req: &BatchRequest) -> Result<BatchResponse, Error> {
        self.requests.push(req.clone());
        let attempt = self.attempts_of(req.epoch, req.seq);
        let fault =
            self.faults_by_seq.remove(&(req.seq, attempt)).or_else(|| self.faults.pop_front()).unwrap_or(Fault::None);
        if let Some(e) = self.bump_epoch_to.take() {
            self.state = Some(ProducerState::accepted(self.state.as_ref(), e, 0, receipt(self.tail), 0));
        }
        match fault {
            Fault::DropBefore => return Err(net_error()),
            Fault::Status(s) => {
                return Ok(BatchResponse { status: s, message: "injected".into(), ..BatchResponse::default() })
            }
            Fault::None | Fault::DropAfter => {}
        }
        let resp = self.apply(req);
        if fault == Fault::DropAfter {
            return Err(net_error());
        }
        Ok(resp)
    }

    fn apply(&mut self, req: &BatchRequest) -> BatchResponse {
        let offset = |t: u64| Some(StreamOffset::from(Offset(t)));
        match validate(self.state.as_ref(), req.epoch, req.seq) {
            ServerVerdict::Accept if self.closed => {
                BatchResponse { status: 409, closed: true, next_offset: offset(self.tail), ..BatchResponse::default() }
            }
            ServerVerdict::Accept => {
                self.tail += req.body.len() as u64;
                if !req.body.is_empty() {
                    self.log.push((req.epoch, req.seq, req.body.clone()));
                }
                self.closed |= req.close;
                self.state =
                    Some(ProducerState::accepted(self.state.as_ref(), req.epoch, req.seq, receipt(self.tail), 0));
                let status = if req.body.is_empty() { 204 } else { 200 };
                BatchResponse {
                    status,
                    next_offset: offset(self.tail),
                    closed: self.closed,
                    producer_epoch: Some(req.epoch),
                    producer_seq: Some(req.seq),
                    ..BatchResponse::default()
                }
            }
            ServerVerdict::Duplicate { receipt } => BatchResponse {
                status: 204,
                next_offset: Some(receipt.map_or(Offset(self.tail), |r| r.end).into()),
                closed: self.closed,
                producer_epoch: Some(req.epoch),
                producer_seq: self.state.as_ref().map(|s| s.last_seq),
                ..BatchResponse::default()
            },
            ServerVerdict::Fenced { current_epoch } => {
                BatchResponse { status: 403, producer_epoch: Some(current_epoch), ..BatchResponse::default() }
            }
            ServerVerdict::Gap { .. } if self.closed => {
                BatchResponse { status: 409, closed: true, next_offset: offset(self.tail), ..BatchResponse::default() }
            }
            ServerVerdict::Gap { expected, received } => BatchResponse {
                status: 409,
                expected_seq: Some(expected),
                received_seq: Some(received),
                ..BatchResponse::default()
            },
            ServerVerdict::NewEpochMustStartAtZero => BatchResponse { status: 400, ..BatchResponse::default() },
        }
    }

    /// The stored bytes, in order.
    fn stored(&self) -> Vec<u8> {
        self.log.iter().flat_map(|(_, _, b)| b.iter().copied()).collect()
    }

    /// Every retry of an `(epoch, seq)` carried the same body.
    fn assert_retries_identical(&self) {
        let mut first: BTreeMap<(u64, u64), &Bytes> = BTreeMap::new();
        for r in &self.requests {
            let b = first.entry((r.epoch, r.seq)).or_insert(&r.body);
            assert_eq!(*b, &r.body, "({}, {}) was sent with two different bodies", r.epoch, r.seq);
        }
    }
}

/// A network failure as the transport reports it (a reqwest error cannot be built by hand; a
/// transient status with `retry_safe` is classified the same way).
fn net_error() -> Error {
    Error::Status { status: 599, message: "connection reset (model)".into(), retry_after: None, retry_safe: true }
}

#[derive(Clone, Default)]
struct ModelTransport(Arc<Mutex<Model>>);

impl ModelTransport {
    fn with<R>(&self, f: impl FnOnce(&mut Model) -> R) -> R {
        f(&mut self.0.lock().expect("model lock"))
    }
}

impl Transport for ModelTransport {
    fn send(&self, req: BatchRequest) -> BoxFuture<'static, Result<BatchResponse, Error>> {
        let model = self.0.clone();
        Box::pin(async move {
            let delay = {
                let mut m = model.lock().expect("model lock");
                m.sent += 1;
                m.concurrent += 1;
                m.max_concurrent = m.max_concurrent.max(m.concurrent);
                m.delays.get(&req.seq).copied().unwrap_or(Duration::from_millis(1))
            };
            tokio::time::sleep(delay).await;
            let mut m = model.lock().expect("model lock");
            m.concurrent -= 1;
            m.handle(&req)
        })
    }
}

fn builder() -> ProducerBuilder {
    let client = Client::new("http://127.0.0.1:9/unused").expect("client");
    client
        .stream("s")
        .producer("p")
        .linger(Duration::ZERO)
        .retry_policy(RetryPolicy::default().with_max_attempts(None).expect("policy"))
}

fn start(b: ProducerBuilder, model: &ModelTransport, json: bool) -> Producer {
    b.spawn(Arc::new(model.clone()), 0, json, Arc::new(FixedJitter(0.5)))
}

#[tokio::test(start_paused = true)]
async fn batches_seal_by_count_by_bytes_and_by_linger() {
    let model = ModelTransport::default();
    let p = start(builder().linger(Duration::from_millis(50)).max_batch_items(3).max_batch_bytes(8), &model, false);
    // Count: three one-byte items seal a batch at once, without waiting for the linger time.
    let t0 = tokio::time::Instant::now();
    let mut rs = Vec::new();
    for b in ["a", "b", "c"] {
        rs.push(p.append(b).await.expect("append"));
    }
    let ack = rs.pop().expect("receipt").await.expect("ack");
    assert!(t0.elapsed() < Duration::from_millis(50), "sealed by count, not by linger");
    assert_eq!(ack.seq, 0);
    // Bytes: 5 + 5 > 8, so the second item starts a new batch.
    let r1 = p.append("12345").await.expect("append");
    let r2 = p.append("67890").await.expect("append");
    // Linger: a lone small item waits 50 ms for company.
    let t1 = tokio::time::Instant::now();
    let (a1, a2) = (r1.await.expect("ack"), r2.await.expect("ack"));
    assert_eq!((a1.seq, a2.seq), (1, 2));
    assert!(t1.elapsed() >= Duration::from_millis(50), "the last batch waited for the linger time");
    p.flush().await.expect("flush");
    let bodies: Vec<Bytes> = model.with(|m| m.log.iter().map(|(_, _, b)| b.clone()).collect());
    assert_eq!(bodies, vec![Bytes::from("abc"), Bytes::from("12345"), Bytes::from("67890")]);
}

#[tokio::test(start_paused = true)]
async fn json_values_travel_as_one_array_per_batch() {
    let model = ModelTransport::default();
    let p = start(builder().linger(Duration::from_millis(5)), &model, true);
    for v in [serde_json::json!({"a": 1}), serde_json::json!([1, 2]), serde_json::json!("s")] {
        p.append_json(&v).await.expect("append");
    }
    assert!(matches!(p.append("{not json").await, Err(Error::Json(_))), "JSON streams take only JSON");
    p.flush().await.expect("flush");
    assert_eq!(model.with(|m| m.stored()), br#"[{"a":1},[1,2],"s"]"#);
}

#[tokio::test(start_paused = true)]
async fn pipelines_up_to_max_in_flight_and_resolves_receipts_in_order() {
    let model = ModelTransport::default();
    // Later seqs answer faster, so answers arrive out of order.
    model.with(|m| {
        for seq in 0..20 {
            m.delays.insert(seq, Duration::from_millis(40 - seq));
        }
    });
    let p = start(builder().max_batch_items(1).max_in_flight(4), &model, false);
    let mut receipts = Vec::new();
    for i in 0..20u8 {
        receipts.push(p.append(vec![b'a' + i]).await.expect("append"));
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, r) in receipts.into_iter().enumerate() {
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let ack = r.await.expect("ack");
            order.lock().expect("lock").push(i);
            ack.seq
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.expect("task"), i as u64, "one batch per item, seqs in order");
    }
    let order = order.lock().expect("lock").clone();
    assert_eq!(order, (0..20).collect::<Vec<_>>(), "receipts resolve in order");
    model.with(|m| {
        assert_eq!(m.max_concurrent, 4, "never more than max_in_flight, and it was reached");
        assert_eq!(m.stored(), b"abcdefghijklmnopqrst");
    });
}

#[tokio::test(start_paused = true)]
async fn the_first_batch_of_an_epoch_travels_alone() {
    let model = ModelTransport::default();
    model.with(|m| {
        m.delays.insert(0, Duration::from_millis(100));
    });
    let p = start(builder().max_batch_items(1).max_in_flight(5), &model, false);
    for b in ["a", "b", "c"] {
        p.append(b).await.expect("append");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(model.with(|m| m.sent), 1, "seq 1 waits until seq 0 established the epoch");
    p.flush().await.expect("flush");
    assert_eq!(model.with(|m| m.stored()), b"abc");
}

#[tokio::test(start_paused = true)]
async fn network_errors_and_5xx_and_429_are_retried_with_the_same_seq_and_body() {
    let model = ModelTransport::default();
    model.with(|m| {
        m.faults_by_seq.insert((1, 1), Fault::DropAfter); // stored, answer lost → 204 on retry
        m.faults_by_seq.insert((2, 1), Fault::DropBefore);
        m.faults_by_seq.insert((2, 2), Fault::Status(503));
        m.faults_by_seq.insert((3, 1), Fault::Status(500));
        m.faults_by_seq.insert((3, 2), Fault::Status(429));
    });
    let p = start(builder().max_batch_items(1).max_in_flight(3), &model, false);
    let mut receipts = Vec::new();
    for b in ["a", "b", "c", "d", "e"] {
        receipts.push(p.append(b).await.expect("append"));
    }
    let mut acks = Vec::new();
    for r in receipts {
        acks.push(r.await.expect("every item is stored"));
    }
    assert!(acks[1].duplicate, "the retry of a stored batch is a duplicate");
    assert_eq!(acks[1].next_offset, StreamOffset::from(Offset(2)), "and learns where the original landed");
    model.with(|m| {
        assert_eq!(m.stored(), b"abcde", "exactly once, in order");
        m.assert_retries_identical();
        assert_eq!(m.attempts_of(0, 3), 3);
    });
    let s = p.stats();
    // Five injected failures, plus one resend per gap that a retried batch opened for its
    // successor.
    assert_eq!((s.retries, s.duplicates), (5 + s.gap_waits, 1), "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn a_gap_waits_for_the_missing_predecessor_then_resends() {
    let model = ModelTransport::default();
    model.with(|m| {
        // seq 1's first attempt fails after a long delay; seq 2 and 3 reach the server first
        // and get 409 gaps.
        m.delays.insert(1, Duration::from_millis(30));
        m.faults_by_seq.insert((1, 1), Fault::Status(503));
    });
    let p = start(builder().max_batch_items(1).max_in_flight(3), &model, false);
    let r0 = p.append("a").await.expect("append");
    r0.await.expect("seq 0 establishes the epoch");
    let mut receipts = Vec::new();
    for b in ["b", "c", "d"] {
        receipts.push(p.append(b).await.expect("append"));
    }
    for r in receipts {
        r.await.expect("stored");
    }
    model.with(|m| {
        assert_eq!(m.stored(), b"abcd");
        m.assert_retries_identical();
        let seqs: Vec<u64> = m.log.iter().map(|(_, s, _)| *s).collect();
        assert_eq!(seqs, vec![0, 1, 2, 3], "no seq skipped or reused");
        // The gapped batches were resent only after seq 1 was stored, not in a blind loop.
        assert_eq!(m.attempts_of(0, 2), 2);
        assert_eq!(m.attempts_of(0, 3), 2);
    });
    assert_eq!(p.stats().gap_waits, 2);
}

#[tokio::test(start_paused = true)]
async fn a_closed_stream_is_an_error_at_once_not_a_retry_loop() {
    let model = ModelTransport::default();
    model.with(|m| m.closed = true);
    let p = start(builder(), &model, false);
    let r = p.append("x").await.expect("append");
    assert!(matches!(r.await, Err(Error::StreamClosed { .. })));
    assert!(matches!(p.flush().await, Err(Error::StreamClosed { .. })), "flush reports the first error");
    assert!(matches!(p.append("y").await, Err(Error::ProducerFailed(_))), "a failed producer refuses appends");
    assert_eq!(model.with(|m| m.requests.len()), 1, "no retry");
}

#[tokio::test(start_paused = true)]
async fn fencing_is_an_error_and_auto_claim_continues_in_a_new_epoch() {
    // Without auto-claim: 403 surfaces.
    let model = ModelTransport::default();
    model.with(|m| m.bump_epoch_to = Some(5));
    let p = start(builder(), &model, false);
    let err = p.append("x").await.expect("append").await.expect_err("fenced");
    assert!(matches!(err, Error::Fenced { epoch: 0, current_epoch: 5 }), "{err:?}");
    assert!(matches!(p.flush().await, Err(Error::Fenced { .. })));

    // With auto-claim: the producer moves to epoch 6 and everything lands once.
    let model = ModelTransport::default();
    let p = start(builder().auto_claim(true).max_batch_items(1).max_in_flight(3), &model, false);
    p.append("a").await.expect("append").await.expect("stored");
    model.with(|m| m.bump_epoch_to = Some(5)); // another session claimed the id
    let mut receipts = Vec::new();
    for b in ["b", "c", "d"] {
        receipts.push(p.append(b).await.expect("append"));
    }
    for r in receipts {
        let ack = r.await.expect("stored after the claim");
        assert_eq!(ack.epoch, 6);
    }
    assert_eq!(p.epoch(), 6);
    model.with(|m| {
        assert_eq!(m.stored(), b"abcd");
        let new_epoch: Vec<u64> = m.log.iter().filter(|(e, _, _)| *e == 6).map(|(_, s, _)| *s).collect();
        assert_eq!(new_epoch, vec![0, 1, 2], "renumbered from 0 in the new epoch");
    });
    assert_eq!(p.stats().epoch_claims, 1);
}

#[tokio::test(start_paused = true)]
async fn auto_claim_resolves_batches_below_an_acknowledged_one_instead_of_resending_them() {
    let model = ModelTransport::default();
    model.with(|m| {
        m.faults_by_seq.insert((1, 1), Fault::DropAfter); // "b" is stored, its answer lost
    });
    let p = start(builder().auto_claim(true).max_batch_items(1).max_in_flight(3), &model, false);
    p.append("a").await.expect("append").await.expect("stored");
    let rb = p.append("b").await.expect("append");
    let rc = p.append("c").await.expect("append");
    tokio::time::sleep(Duration::from_millis(10)).await; // "c" acknowledged, "b" waits to retry
    model.with(|m| m.bump_epoch_to = Some(5)); // another session takes the id: "b"'s retry is fenced
    let ab = rb.await.expect("b resolved as stored");
    assert!(ab.duplicate && ab.epoch == 0, "{ab:?}");
    rc.await.expect("c stored");
    let ad = p.append("d").await.expect("append").await.expect("d stored");
    assert_eq!((ad.epoch, ad.seq), (6, 0));
    model.with(|m| assert_eq!(m.stored(), b"abcd", "b was not resent under the new epoch"));
}

#[tokio::test(start_paused = true)]
async fn reusing_an_epoch_is_detected_instead_of_silently_dropping_data() {
    let model = ModelTransport::default();
    let first = start(builder(), &model, false);
    first.append("a").await.expect("append").await.expect("stored");
    first.append("b").await.expect("append").await.expect("stored");
    first.close().await.expect("close");
    // A second session with the same epoch would see its seq 0 and 1 answered "duplicate".
    let second = start(builder(), &model, false);
    let err = second.append("c").await.expect("append").await.expect_err("epoch reuse");
    assert!(matches!(err, Error::EpochReused { epoch: 0 }), "{err:?}");
    assert_eq!(model.with(|m| m.stored()), b"ab");
}

#[tokio::test(start_paused = true)]
async fn a_full_buffer_makes_append_wait_and_try_append_fail() {
    let model = ModelTransport::default();
    model.with(|m| {
        m.delays.insert(0, Duration::from_millis(100));
    });
    let p = start(builder().max_buffered_bytes(4).max_batch_items(1), &model, false);
    let r = p.append("abc").await.expect("fits");
    assert!(matches!(p.try_append("de"), Err(Error::BufferFull)));
    assert!(p.try_append("d").is_ok(), "one byte left");
    assert!(
        matches!(p.try_append("12345").map(|_| ()), Err(Error::InvalidArgument(_))),
        "larger than the whole buffer"
    );
    let waited = Arc::new(AtomicUsize::new(0));
    let (p2, w2) = (p.clone(), waited.clone());
    let blocked = tokio::spawn(async move {
        let r = p2.append("xy").await.expect("append");
        w2.store(1, Ordering::SeqCst);
        r.await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(waited.load(Ordering::SeqCst), 0, "append waits while the buffer is full");
    r.await.expect("stored");
    blocked.await.expect("task").expect("stored once room was made");
    p.flush().await.expect("flush");
    assert_eq!(model.with(|m| m.stored()), b"abcdxy");
}

#[tokio::test(start_paused = true)]
async fn retry_exhaustion_fails_the_batch_and_its_successors_but_not_its_predecessors() {
    let model = ModelTransport::default();
    model.with(|m| {
        m.delays.insert(0, Duration::from_millis(1));
        for attempt in 1..=3 {
            m.faults_by_seq.insert((1, attempt), Fault::Status(500));
        }
        m.delays.insert(1, Duration::from_millis(5));
    });
    let policy = RetryPolicy::default().with_max_attempts(Some(3)).expect("policy");
    let p = start(builder().max_batch_items(1).retry_policy(policy), &model, false);
    let r0 = p.append("a").await.expect("append");
    r0.await.expect("seq 0 stored");
    let r1 = p.append("b").await.expect("append");
    let r2 = p.append("c").await.expect("append");
    assert!(matches!(r1.await, Err(Error::Status { status: 500, .. })));
    assert!(matches!(r2.await, Err(Error::ProducerFailed(_))));
    assert!(matches!(p.flush().await, Err(Error::Status { status: 500, .. })), "flush returns the first error");
    assert_eq!(model.with(|m| m.stored()), b"a");
}

#[tokio::test(start_paused = true)]
async fn close_stream_appends_a_final_item_and_closes_idempotently() {
    let model = ModelTransport::default();
    let p = start(builder(), &model, true);
    p.append_json(&1).await.expect("append");
    let end = p.close_stream(Some(Bytes::from_static(b"{\"last\":true}"))).await.expect("closed");
    assert_eq!(p.close_stream(None).await.expect("again"), end, "a second close returns the first result");
    assert!(matches!(p.append("2").await, Err(Error::ProducerClosed)));
    model.with(|m| {
        assert!(m.closed);
        assert_eq!(m.stored(), br#"[1][{"last":true}]"#);
        assert!(m.requests.last().is_some_and(|r| r.close));
    });
}

/// Random faults (seeded), random delays that reorder pipelined requests, several hundred items:
/// everything arrives exactly once and in order, and retries never change a batch.
#[tokio::test(start_paused = true)]
async fn random_faults_never_lose_or_duplicate() {
    for seed in 1..=5u64 {
        let model = ModelTransport::default();
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        model.with(|m| {
            for _ in 0..2000 {
                m.faults.push_back(match next() % 10 {
                    0 => Fault::DropBefore,
                    1 => Fault::DropAfter,
                    2 => Fault::Status(503),
                    _ => Fault::None,
                });
            }
            for seq in 0..400 {
                m.delays.insert(seq, Duration::from_millis(next() % 20));
            }
        });
        let p = start(builder().max_batch_items(3).max_in_flight(5), &model, false);
        let mut expected = Vec::new();
        let mut receipts = Vec::new();
        for i in 0..600u32 {
            let item = format!("{i},");
            expected.extend_from_slice(item.as_bytes());
            receipts.push(p.append(item).await.expect("append"));
        }
        p.flush().await.expect("no error");
        for r in receipts {
            r.await.expect("stored");
        }
        model.with(|m| {
            assert_eq!(m.stored(), expected, "seed {seed}: exactly once, in order");
            m.assert_retries_identical();
        });
    }
}
