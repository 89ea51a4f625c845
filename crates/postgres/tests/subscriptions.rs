//! Subscriptions over several nodes: two `Subscriptions`, each over its own engine on one schema,
//! as two server processes would have them. What one node does, the other must see; a claim, a
//! fence and a webhook delivery must hold across both. See `common` for the database they need.

mod common;

use std::sync::Arc;

use oncelog_postgres::PgEngine;
use oncelog_protocol::Offset;
use oncelog_storage::contract::{self, create_req, json_req};
use oncelog_storage::Engine;
use oncelog_subscriptions::*;

type Node = Subscriptions<PgEngine>;

/// An engine to write streams with, and two nodes on its schema.
async fn two_nodes() -> (PgEngine, Node, Node) {
    let schema = common::fresh_schema();
    let a = PgEngine::open(common::options(&schema)).await.expect("open node A");
    let b = PgEngine::open(common::options(&schema)).await.expect("open node B");
    (a.clone(), Subscriptions::new(Arc::new(a)), Subscriptions::new(Arc::new(b)))
}

fn pull(pattern: &str) -> SubConfig {
    SubConfig {
        kind: SubKind::PullWake { wake_stream: "wake".into() },
        pattern: Some(pattern.into()),
        streams: Vec::new(),
        lease_ttl_ms: 1_000,
        description: None,
        outputs: Vec::new(),
    }
}

fn webhook(pattern: &str) -> SubConfig {
    SubConfig { kind: SubKind::Webhook { url: "https://hooks.example/x".into() }, ..pull(pattern) }
}

fn fence(n: &WakeNotice) -> Fence {
    Fence { uid: n.uid, token_generation: n.generation, generation: n.generation, wake_id: n.wake_id.clone() }
}

/// Streams `wake` and `jobs/a`, the pull-wake subscription `p` over `jobs/*` made on `a`, and
/// one message in `jobs/a` that woke it (generation 1, unclaimed).
async fn pending_pull(e: &PgEngine, a: &Node) {
    contract::create(e, create_req("wake", "application/json")).await;
    contract::create(e, create_req("jobs/a", "application/json")).await;
    a.put("p", pull("jobs/*"), 0).await.expect("put");
    contract::append(e, json_req("jobs/a", &["1"])).await;
    a.on_write("jobs/a", 100).await.expect("on_write");
}

#[test]
fn what_one_node_changes_the_other_sees() {
    contract::run(|| async {
        let (e, a, b) = two_nodes().await;
        contract::create(&e, create_req("wake", "application/json")).await;
        contract::create(&e, create_req("jobs/a", "application/json")).await;
        // B has loaded its state (nothing) before A creates anything.
        assert!(b.list().await.expect("list on B").is_empty());
        let (_, made) = a.put("p", pull("jobs/*"), 0).await.expect("put on A");
        assert_eq!(b.get("p", 1).await.expect("B sees the subscription A made").record, made.record);
        // A write that lands on B wakes it there, and a worker claims it through B...
        contract::append(&e, json_req("jobs/a", &["1"])).await;
        b.on_write("jobs/a", 10).await.expect("on_write on B");
        assert_eq!(b.claim("p", "w1", 20).await.expect("claim on B").generation, 1);
        // ...which A knows: another worker's claim there is refused.
        match a.claim("p", "w2", 30).await {
            Err(SubError::AlreadyClaimed { holder, generation: 1 }) => assert_eq!(holder, "w1"),
            r => panic!("{r:?}"),
        }
        assert!(b.delete("p", 40).await.expect("delete on B"));
        assert!(matches!(a.get("p", 41).await, Err(SubError::NotFound)), "deleted on B, gone on A");
    });
}

#[test]
fn creates_on_two_nodes_at_once_get_their_own_incarnations() {
    contract::run(|| async {
        let (_, a, b) = two_nodes().await;
        let (x, y) = tokio::join!(a.put("x", pull("x/*"), 0), b.put("y", pull("y/*"), 0));
        let (x, y) = (x.expect("put x on A").1.record, y.expect("put y on B").1.record);
        assert_ne!(x.uid, y.uid, "one uid each: tokens of one never fit the other");
        // The same id on both at once: one creates it, the other confirms it.
        let (p, q) = tokio::join!(a.put("z", pull("z/*"), 1), b.put("z", pull("z/*"), 1));
        let mut verdicts = [p.expect("put z on A").0, q.expect("put z on B").0];
        verdicts.sort_by_key(|v| *v == PutVerdict::Existing);
        assert_eq!(verdicts, [PutVerdict::Created, PutVerdict::Existing]);
        let ids: Vec<(String, u64)> = a.list().await.expect("list").into_iter().map(|r| (r.id, r.uid)).collect();
        assert_eq!(ids.len(), 3);
        assert_eq!(ids, b.list().await.expect("list").into_iter().map(|r| (r.id, r.uid)).collect::<Vec<_>>());
    });
}

#[test]
fn two_nodes_never_both_win_a_claim() {
    contract::run(|| async {
        let (e, a, b) = two_nodes().await;
        pending_pull(&e, &a).await;
        const ROUNDS: i64 = 40;
        for round in 0..ROUNDS {
            let now = 1_000 + round * 10;
            let (ra, rb) = tokio::join!(a.claim("p", "wa", now), b.claim("p", "wb", now));
            let won = match (&ra, &rb) {
                (Ok(n), Err(SubError::AlreadyClaimed { .. } | SubError::Conflict)) => n,
                (Err(SubError::AlreadyClaimed { .. } | SubError::Conflict), Ok(n)) => n,
                _ => panic!("round {round}: exactly one claim must win: A {ra:?}, B {rb:?}"),
            };
            assert_eq!(won.generation, round as u64 + 1);
            // The work stays pending: the release wakes it again at once (the next generation).
            let via = if round % 2 == 0 { &a } else { &b };
            via.release("p", &fence(won), now + 1).await.expect("release");
        }
        assert_eq!(b.get("p", 5_000).await.expect("get").record.generation, ROUNDS as u64 + 1);
    });
}

#[test]
fn a_zombie_stays_fenced_on_every_node() {
    contract::run(|| async {
        let (e, a, b) = two_nodes().await;
        pending_pull(&e, &a).await;
        let old = a.claim("p", "wa", 1_000).await.expect("claim on A");
        assert_eq!(old.generation, 1);
        // By B's clock A's lease (to 2_000) has ended: B's worker gets the work, a new wake.
        let new = b.claim("p", "wb", 2_100).await.expect("claim on B after the lease ended");
        assert_eq!(new.generation, 2);
        let end = e.head("jobs/a", 0).await.expect("head").tail;
        let before = a.get("p", 2_100).await.expect("get");
        // A's worker, its clock behind (by it the lease still runs), acks and releases with its
        // old fence through either node: fenced.
        for (name, node) in [("A", &a), ("B", &b)] {
            let ack = AckRequest {
                fence: fence(&old),
                acks: vec![Ack { stream: "jobs/a".into(), offset: end }],
                done: true,
                via: AckVia::Ack,
                outputs: vec![],
            };
            let r = node.ack("p", ack, 1_500).await;
            assert!(matches!(r, Err(SubError::Fenced)), "ack via {name}: {r:?}");
            let r = node.release("p", &fence(&old), 1_500).await;
            assert!(matches!(r, Err(SubError::Fenced)), "release via {name}: {r:?}");
        }
        assert_eq!(b.get("p", 2_100).await.expect("get"), before, "fenced requests change nothing");
        // The current holder finishes through A.
        let ack = AckRequest {
            fence: fence(&new),
            acks: vec![Ack { stream: "jobs/a".into(), offset: end }],
            done: true,
            via: AckVia::Ack,
            outputs: vec![],
        };
        assert!(!a.ack("p", ack, 2_200).await.expect("the holder's done").next_wake);
        let links = b.get("p", 2_300).await.expect("get").links;
        assert_eq!(links.iter().map(|l| (l.path.as_str(), l.acked)).collect::<Vec<_>>(), [("jobs/a", end)]);
        assert!(end > Offset::ZERO);
    });
}

#[test]
fn one_node_delivers_webhooks() {
    contract::run(|| async {
        let (e, a, b) = two_nodes().await;
        contract::create(&e, create_req("ev/a", "application/json")).await;
        a.put("hook", webhook("ev/*"), 0).await.expect("put");
        contract::append(&e, json_req("ev/a", &["1"])).await;
        a.on_write("ev/a", 1_000).await.expect("on_write");
        // Both nodes' dispatchers pass at once: the wake goes out once.
        let (da, db) = tokio::join!(a.due(1_000), b.due(1_000));
        let (da, db) = (da.expect("due on A"), db.expect("due on B"));
        assert_eq!(da.deliveries.len() + db.deliveries.len(), 1, "A {da:?}, B {db:?}");
        let (holder, other) = if da.deliveries.is_empty() { (&b, &a) } else { (&a, &b) };
        assert!(holder.is_dispatcher() && !other.is_dispatcher());
        // The delivery fails; when its retry is due, only the holder sends it.
        holder.delivery_failed("hook", 1, 100, 1_100).await.expect("failed");
        assert!(other.due(1_300).await.expect("due").deliveries.is_empty(), "not the dispatcher");
        assert_eq!(holder.due(1_300).await.expect("due").deliveries.len(), 1, "the retry");
        // The holder stops passing (it died): once its lease has run out the other takes over,
        // and delivers what is live (the wake has ended by now: a new one, generation 2).
        let took_over = other.due(1_300 + DISPATCH_LEASE_MS).await.expect("due");
        assert_eq!(took_over.deliveries.iter().map(|d| d.generation).collect::<Vec<_>>(), [2]);
        assert!(other.is_dispatcher());
        assert!(holder.due(1_400 + DISPATCH_LEASE_MS).await.expect("due").deliveries.is_empty());
        assert!(!holder.is_dispatcher());
    });
}
