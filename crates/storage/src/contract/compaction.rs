//! Compaction of State Protocol streams: a snapshot at the tail replaces the history.

use oncelog_protocol::state::Materialized;
use oncelog_protocol::Offset;

use super::*;
use crate::compaction;

fn change(op: &str, key: &str, value: &str) -> String {
    format!(r#"{{"type":"doc","key":"{key}","value":{value},"headers":{{"operation":"{op}"}}}}"#)
}

fn json_append(path: &str, messages: &[String]) -> AppendRequest {
    let refs: Vec<&str> = messages.iter().map(String::as_str).collect();
    json_req(path, &refs)
}

/// The state a reader from the earliest offset materialises, and where it began.
async fn materialise<E: Engine>(e: &E, path: &str) -> (Materialized, Offset) {
    let earliest = e.head(path, 0).await.expect("head").earliest;
    let (mut state, mut at) = (Materialized::default(), earliest);
    loop {
        let c = e.read(ReadRequest::new(path, at, 1 << 20, 0)).await.expect("read");
        state.fold(&c.data).expect("State Protocol messages");
        at = c.next;
        if c.up_to_date() {
            return (state, earliest);
        }
    }
}

pub async fn compaction_replaces_the_history_with_a_snapshot<H: Harness>() {
    let mut h = H::open().await;
    let e = h.engine();
    let state_stream = |path: &str| CreateRequest { compaction: true, ..create_req(path, "application/json") };
    // Only JSON streams without retention can be made for compaction.
    assert!(matches!(
        e.create(CreateRequest { compaction: true, ..create_req("t", "text/plain") }).await,
        Err(CreateError::CompactionNeedsJson)
    ));
    let with_retention = crate::retention::RetentionRequest {
        policy: crate::retention::RetentionPolicy { max_age_s: Some(60), max_bytes: None },
        named_age: true,
        named_bytes: false,
    };
    let r = e.create(CreateRequest { retention: with_retention, ..state_stream("r") }).await;
    assert!(matches!(r, Err(CreateError::CompactionWithRetention)), "{r:?}");
    let info = create(e, state_stream("s")).await;
    assert!(info.config.compaction);
    // The same create again is the same stream; without the policy it is another configuration.
    assert!(matches!(e.create(state_stream("s")).await, Ok(CreateOutcome::Existing(_))));
    assert!(matches!(e.create(create_req("s", "application/json")).await, Err(CreateError::ConfigMismatch(_))));

    let mut history = Vec::new();
    for i in 0..30 {
        history.push(change("insert", &format!("k{}", i % 5), &i.to_string()));
        history.push(change("update", &format!("k{}", i % 5), &format!("{{\"v\":{i}}}")));
        if i % 7 == 3 {
            history.push(change("delete", &format!("k{}", i % 5), "null"));
        }
    }
    let first = AppendRequest {
        producer: Some(oncelog_protocol::headers::ProducerHeaders { id: "p".into(), epoch: 0, seq: 0 }),
        ..json_append("s", &history[..10])
    };
    let first_end = append(e, first.clone()).await.next_offset;
    let tail = append(e, json_append("s", &history[10..])).await.next_offset;
    let (whole, _) = materialise(e, "s").await;

    let done = compaction::compact(e, "s", 0).await.expect("compact");
    assert!(done.written, "{done:?}");
    assert_eq!(done.earliest, tail, "the snapshot starts where the history ended");
    assert_eq!((done.history_bytes, done.entities), (tail.0, whole.len()));
    assert!(done.snapshot_bytes < done.history_bytes && done.tail == Offset(tail.0 + done.snapshot_bytes));
    // Twice: as written, and reopened.
    for round in 0..2 {
        let e = h.engine();
        let (state, earliest) = materialise(e, "s").await;
        assert_eq!((state, earliest), (whole.clone(), tail), "round {round}: the snapshot folds to the same state");
        let gone = e.read(ReadRequest::new("s", Offset::ZERO, 1 << 20, 0)).await;
        assert!(matches!(gone, Err(LookupError::Trimmed { earliest }) if earliest == tail), "round {round}: {gone:?}");
        // Producer state outlives the history: a retry of the first append is still a duplicate.
        let dup = append(e, first.clone()).await;
        assert_eq!((dup.status, dup.next_offset), (AppendStatus::Duplicate, first_end), "round {round}");
        h.reopen().await;
    }
    let e = h.engine();
    // Later appends fold on top of the snapshot; compacting again right away gains nothing.
    let more = vec![change("insert", "late", "true"), change("delete", "k1", "null")];
    append(e, json_append("s", &more)).await;
    let mut expected = whole.clone();
    expected.fold(&json_framed(&more.iter().map(String::as_str).collect::<Vec<_>>())).expect("fold");
    assert_eq!(materialise(e, "s").await.0, expected);
    let again = compaction::compact(e, "s", 0).await.expect("compact");
    assert!(again.written, "the new history is folded into a new snapshot");
    assert_eq!(materialise(e, "s").await.0, expected);
    let idle = compaction::compact(e, "s", 0).await.expect("compact");
    assert!(!idle.written, "a snapshot of a snapshot is no smaller: {idle:?}");

    // The engine refuses a snapshot made at another tail, of another stream, or of a stream not
    // made for compaction or closed.
    let head = e.head("s", 0).await.expect("head");
    let stale = CompactRequest {
        path: "s".into(),
        stream_id: Some(head.id),
        at: Offset(head.tail.0 - 1),
        pieces: vec![json_framed(&["{}"])],
        now_ms: 0,
    };
    assert!(matches!(e.compact(stale).await, Err(CompactError::Stale { tail }) if tail == head.tail));
    create(e, create_req("plain", "application/json")).await;
    assert!(matches!(compaction::compact(e, "plain", 0).await, Err(CompactError::NotCompactable)));
    create(e, CreateRequest { closed: true, ..state_stream("closed") }).await;
    assert!(matches!(compaction::compact(e, "closed", 0).await, Err(CompactError::Closed)));
    assert!(matches!(compaction::compact(e, "nope", 0).await, Err(CompactError::NotFound)));
    // A fork of a compaction stream is one too; a plain stream's fork cannot become one.
    let fork = create(e, fork_req("f", "s", None, 0)).await;
    assert!(fork.config.compaction);
    let r = e.create(CreateRequest { compaction: true, ..fork_req("g", "plain", None, 0) }).await;
    assert!(matches!(r, Err(CreateError::CompactionOfPlainSource)), "{r:?}");
}
