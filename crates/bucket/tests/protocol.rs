//! The writer protocol against real stores: a real S3 API server (moto, started by
//! `scripts/test` through `scripts/s3`, its endpoint in `ONCELOG_TEST_S3_ENDPOINT`) and a local
//! directory (`file://`). Every case runs on both; nothing here mocks the client.

use std::time::Duration;

use bytes::Bytes;
use oncelog_bucket::test_support;
use oncelog_bucket::*;

/// A fresh, empty prefix on the store of kind `kind` ("s3" or "dir"); the guard keeps a
/// directory alive for the test.
fn fresh(kind: &str, name: &str) -> (Bucket, Option<tempfile::TempDir>) {
    match kind {
        "s3" => (test_support::s3_bucket(name), None),
        _ => {
            let dir = tempfile::tempdir().expect("tempdir");
            let location: Location = format!("file://{}/bucket", dir.path().display()).parse().expect("url");
            (Bucket::open(&location, &[]).expect("open"), Some(dir))
        }
    }
}

/// A cut of one segment whose ranges are `objects`.
fn cut(lsn: u64, objects: &[ObjectRef]) -> Cut {
    if objects.is_empty() {
        return Cut::default();
    }
    let seg = SegmentRef { number: 1, start: 0, ranges: objects.to_vec() };
    let end = LogPosition { lsn, segment: 1, pos: seg.end() };
    Cut { checkpoint: None, segments: vec![seg], end }
}

async fn takeover_on_an_empty_prefix_starts_epoch_one(kind: &str) {
    let (b, _dir) = fresh(kind, "empty");
    assert_eq!(b.newest().await.expect("newest"), None);
    let w = b.take_over("node-a", 1).await.expect("take over");
    assert_eq!((w.epoch(), w.published().number), (1, 1));
    let newest = b.newest().await.expect("newest").expect("a manifest");
    assert_eq!((newest.epoch, newest.number, newest.node.as_str()), (1, 1, "node-a"));
    assert_eq!(newest.cut, Cut::default());
}

async fn a_takeover_fences_the_writer_before_it(kind: &str) {
    let (b, _dir) = fresh(kind, "fence");
    let mut old = b.take_over("old", 1).await.expect("take over");
    let a = old.put("epoch-1/a", Bytes::from_static(b"frames-a")).await.expect("put");
    old.publish(cut(3, std::slice::from_ref(&a)), 2).await.expect("publish");
    // A new node takes over: it carries the old writer's published cut.
    let mut new = b.take_over("new", 3).await.expect("take over");
    assert_eq!(new.epoch(), 2);
    assert_eq!(new.published().cut, cut(3, std::slice::from_ref(&a)));
    // The old writer (paused meanwhile) can publish nothing now, and is told by whom.
    let more = old.put("epoch-1/b", Bytes::from_static(b"frames-b")).await.expect("an object is only garbage");
    let fenced = old.publish(cut(5, &[a.clone(), more.clone()]), 4).await;
    assert!(matches!(fenced, Err(BucketError::Fenced { mine: 1, by: 2 })), "{fenced:?}");
    let newest = b.newest().await.expect("newest").expect("a manifest");
    assert_eq!(
        (newest.epoch, &newest.cut),
        (2, &cut(3, std::slice::from_ref(&a))),
        "nothing of the zombie's is visible"
    );
    // The new writer goes on.
    let c = new.put("epoch-2/c", Bytes::from_static(b"frames-c")).await.expect("put");
    new.publish(cut(4, &[a, c]), 5).await.expect("publish");
    assert_eq!(b.newest().await.expect("newest").map(|m| (m.epoch, m.cut.end.lsn)), Some((2, 4)));
}

async fn a_zombie_stays_fenced_after_old_manifests_are_deleted(kind: &str) {
    let (b, _dir) = fresh(kind, "zombie");
    let b = b.keep_manifests_for(Duration::ZERO);
    let mut zombie = b.take_over("z", 1).await.expect("take over");
    let mut new = b.take_over("n", 2).await.expect("take over");
    let mut objects = Vec::new();
    for i in 0..6u64 {
        objects.push(new.put(&format!("epoch-2/{i}"), Bytes::from(vec![i as u8; 4])).await.expect("put"));
        new.publish(cut(i + 1, &objects), 3).await.expect("publish");
    }
    // Old manifests went; every takeover manifest stayed, and the newest.
    let numbers = b.manifest_numbers().await.expect("list");
    assert!(numbers.contains(&1) && numbers.contains(&2) && numbers.len() < 8, "{numbers:?}");
    assert_eq!(numbers.last(), Some(&8));
    // A third node takes over from the newest state, and tidies the manifests before it.
    let third = b.take_over("t", 4).await.expect("take over");
    assert_eq!((third.epoch(), third.published().cut.end.lsn), (3, 6));
    let numbers = b.manifest_numbers().await.expect("list");
    assert_eq!(numbers, [1, 2, 8, 9], "the takeover manifests, the newest before the takeover, the takeover's");
    // The first zombie wakes up: the name it would publish under is still taken.
    let fenced = zombie.publish(cut(1, &[]), 5).await;
    assert!(matches!(fenced, Err(BucketError::Fenced { mine: 1, by: 2 })), "{fenced:?}");
    let fenced = new.publish(cut(7, &objects), 6).await;
    assert!(matches!(fenced, Err(BucketError::Fenced { mine: 2, by: 3 })), "{fenced:?}");
    assert_eq!(b.newest().await.expect("newest").map(|m| (m.epoch, m.number)), Some((3, 9)));
}

async fn objects_are_created_once_and_checked_when_read(kind: &str) {
    let (b, _dir) = fresh(kind, "objects");
    let w = b.take_over("w", 1).await.expect("take over");
    let o = w.put("epoch-1/x", Bytes::from_static(b"0123456789")).await.expect("put");
    assert_eq!((o.len, o.crc32c), (10, crc32c::crc32c(b"0123456789")));
    // The same bytes again: a retry whose first answer was lost.
    assert_eq!(w.put("epoch-1/x", Bytes::from_static(b"0123456789")).await.expect("retry"), o);
    // Other bytes under the name: refused, the object unchanged.
    assert!(matches!(w.put("epoch-1/x", Bytes::from_static(b"other")).await, Err(BucketError::Conflict { .. })));
    assert_eq!(b.read(&o).await.expect("read"), Bytes::from_static(b"0123456789"));
    // A reference that does not match what is stored is damage, never data.
    let wrong = ObjectRef { crc32c: o.crc32c ^ 1, ..o.clone() };
    assert!(matches!(b.read(&wrong).await, Err(BucketError::Corrupt { .. })));
    let short = ObjectRef { len: 9, ..o };
    assert!(matches!(b.read(&short).await, Err(BucketError::Corrupt { .. })));
}

async fn concurrent_takeovers_get_distinct_epochs(kind: &str) {
    let (b, _dir) = fresh(kind, "race");
    b.take_over("first", 1).await.expect("take over");
    let (x, y) = tokio::join!(b.take_over("x", 2), b.take_over("y", 2));
    let (x, y) = (x.expect("x"), y.expect("y"));
    assert_ne!(x.epoch(), y.epoch());
    // Only the later epoch may publish.
    let (mut older, mut newer) = if x.epoch() < y.epoch() { (x, y) } else { (y, x) };
    assert!(matches!(older.publish(Cut::default(), 3).await, Err(BucketError::Fenced { .. })));
    newer.publish(Cut::default(), 3).await.expect("the newest epoch publishes");
}

async fn a_publish_with_a_broken_cut_is_refused(kind: &str) {
    let (b, _dir) = fresh(kind, "broken");
    let mut w = b.take_over("w", 1).await.expect("take over");
    let o = w.put("epoch-1/x", Bytes::from_static(b"abc")).await.expect("put");
    let mut bad = cut(1, &[o]);
    bad.end.pos += 1;
    assert!(matches!(w.publish(bad, 2).await, Err(BucketError::Manifest { .. })));
    assert_eq!(b.newest().await.expect("newest").map(|m| m.number), Some(1));
}

/// Every PUT's answer lost (the bucket stored it; the writer never heard): object_store tries
/// again and finds the name taken, so each object is recognised by its CRC and each publish by
/// its own manifest holding the same cut. Through the fault proxy: the S3 store only.
#[tokio::test]
async fn publishes_whose_answers_are_lost_are_recognised() {
    use oncelog_bucket::fault_proxy::{Fault, FaultProxy};
    let proxy = FaultProxy::start(&test_support::s3_endpoint());
    let b = test_support::s3_bucket_via(&proxy.url, "lost");
    let mut w = b.take_over("node", 1).await.expect("take over");
    proxy.set(Fault::LosePutAnswers);
    let mut objects = Vec::new();
    for i in 0..5u64 {
        let o = w.put(&format!("epoch-1/o{i}"), Bytes::from(format!("frames-{i}"))).await.expect("put");
        objects.push(o);
        let c = cut(i + 1, &objects);
        w.publish(c.clone(), 2).await.expect("a publish whose answer was lost is recognised");
        assert_eq!(b.newest().await.expect("newest").expect("a manifest").cut, c);
    }
    assert!(proxy.counts().lost_answers >= 10, "{:?}", proxy.counts());
    proxy.set(Fault::Pass);
    assert_eq!(w.published().number, b.newest().await.expect("newest").expect("a manifest").number);
}

/// S3 answers a conditional create `409 ConditionalRequestConflict` while another create of the
/// key is in flight; object_store calls that "already exists". It is tried again, never taken
/// for "exists": a takeover's claim and manifest, an object and a publish all go through a run
/// of such answers, and what they name is really there.
#[tokio::test]
async fn a_create_answered_409_in_flight_is_tried_again_not_taken_for_exists() {
    use oncelog_bucket::fault_proxy::{Fault, FaultProxy};
    let proxy = FaultProxy::start(&test_support::s3_endpoint());
    let b = test_support::s3_bucket_via(&proxy.url, "conflict");
    proxy.set(Fault::ConflictCreates(2));
    let mut w = b.take_over("node", 1).await.expect("a takeover through 409s");
    assert_eq!((w.epoch(), w.published().number), (1, 1));
    proxy.set(Fault::ConflictCreates(3));
    let o = w.put("epoch-1/o", Bytes::from_static(b"frames")).await.expect("a put through 409s");
    proxy.set(Fault::ConflictCreates(2));
    w.publish(cut(1, std::slice::from_ref(&o)), 2).await.expect("a publish through 409s");
    assert_eq!(proxy.counts().conflicts, 7, "{:?}", proxy.counts());
    proxy.set(Fault::Pass);
    let newest = b.newest().await.expect("newest").expect("a manifest");
    assert_eq!((newest.epoch, &newest.cut), (1, &cut(1, std::slice::from_ref(&o))));
    // And the object the manifest names is there, whole.
    assert_eq!(b.read(&o).await.expect("read"), Bytes::from_static(b"frames"));
    // A create that meets 409s past its tries is an error that says so, not "exists".
    proxy.set(Fault::ConflictCreates(100));
    match w.put("epoch-1/p", Bytes::from_static(b"more")).await {
        Err(e @ BucketError::CreateConflict { .. }) => assert!(e.to_string().contains("409"), "{e}"),
        other => panic!("expected a create conflict, got {other:?}"),
    }
}

/// A put whose answer is lost (the bucket stored the object; the writer never heard) is tried
/// again by the client, which finds the key taken: the object found is read back and checked,
/// length and CRC32C, and being the same bytes it is this put, counted once (one object, the
/// same reference), and a manifest may name it. Through the fault proxy: the S3 store only.
#[tokio::test]
async fn an_object_found_existing_after_a_lost_answer_is_checked_and_counted_once() {
    use oncelog_bucket::fault_proxy::{Fault, FaultProxy};
    let proxy = FaultProxy::start(&test_support::s3_endpoint());
    let b = test_support::s3_bucket_via(&proxy.url, "found");
    let mut w = b.take_over("node", 1).await.expect("take over");
    let before = proxy.counts();
    proxy.set(Fault::LosePutAnswers);
    let key = keys::range(1, 1, 0, 11);
    let o = w.put(&key, Bytes::from_static(b"frames-0123")).await.expect("a put whose answer was lost");
    proxy.set(Fault::Pass);
    let after = proxy.counts();
    assert_eq!(
        (after.lost_answers - before.lost_answers, after.exists - before.exists),
        (1, 1),
        "one answer lost, then the retry found the key taken: {after:?}"
    );
    assert_eq!((&o.key, o.len, o.crc32c), (&key, 11, crc32c::crc32c(b"frames-0123")));
    let stored: Vec<String> = b.objects().await.expect("list").into_iter().map(|(k, _)| k).collect();
    assert_eq!(stored, [key], "one object");
    w.publish(cut(1, std::slice::from_ref(&o)), 2).await.expect("publish");
    let newest = b.newest().await.expect("newest").expect("a manifest");
    assert_eq!(newest.cut, cut(1, std::slice::from_ref(&o)));
    assert_eq!(b.read(&o).await.expect("read"), Bytes::from_static(b"frames-0123"));
}

/// A put whose answer is lost and whose object the bucket stored is not what was sent (the
/// proxy damages the body: one byte flipped, or the last byte dropped): the retry finds the key
/// taken, the check finds other bytes, and the put is refused. Nothing names the object: the
/// writer has no reference to publish, and the newest manifest is unchanged. Through the fault
/// proxy: the S3 store only.
#[tokio::test]
async fn an_object_found_existing_with_other_bytes_is_refused_never_named() {
    use oncelog_bucket::fault_proxy::{Damage, Fault, FaultProxy};
    let proxy = FaultProxy::start(&test_support::s3_endpoint());
    let b = test_support::s3_bucket_via(&proxy.url, "damaged");
    let mut w = b.take_over("node", 1).await.expect("take over");
    let good = w.put(&keys::range(1, 1, 0, 11), Bytes::from_static(b"frames-good")).await.expect("put");
    w.publish(cut(1, std::slice::from_ref(&good)), 2).await.expect("publish");
    let published = b.newest().await.expect("newest").expect("a manifest");
    for (key, damage) in
        [(keys::range(1, 1, 11, 22), Damage::FlipFirstByte), (keys::range(1, 1, 22, 33), Damage::DropLastByte)]
    {
        let before = proxy.counts();
        proxy.set(Fault::DamagePuts(key.clone(), damage));
        let refused = w.put(&key, Bytes::from_static(b"frames-0123")).await;
        proxy.set(Fault::Pass);
        let after = proxy.counts();
        assert_eq!(
            (after.damaged - before.damaged, after.lost_answers - before.lost_answers, after.exists - before.exists),
            (2, 1, 1),
            "{damage:?}: stored damaged, answer lost, the retry found the key: {after:?}"
        );
        assert!(matches!(&refused, Err(BucketError::Conflict { key: k }) if *k == key), "{damage:?}: {refused:?}");
        // What the bucket holds under the key is the damaged object, unnamed.
        let stored: Vec<String> = b.objects().await.expect("list").into_iter().map(|(k, _)| k).collect();
        assert!(stored.contains(&key), "{stored:?}");
    }
    let newest = b.newest().await.expect("newest").expect("a manifest");
    assert_eq!((newest.number, &newest.cut), (published.number, &published.cut), "no manifest names it");
}

/// Tigris serves a request from the object's leader only when it carries `X-Tigris-Consistent:
/// true`: a bucket treated as Tigris's (here forced with [`TIGRIS_CONSISTENT`], the endpoint
/// being the fault proxy's loopback address) sends it on every request — creates, reads,
/// listings, deletes — and keeps the client settings it was given (`aws_allow_http`: without it
/// the plain-HTTP endpoint would be refused). Any other endpoint sends it on none.
#[tokio::test]
async fn a_tigris_bucket_sends_x_tigris_consistent_on_every_request() {
    use oncelog_bucket::fault_proxy::FaultProxy;
    async fn traffic(b: &Bucket) {
        let b = b.clone().keep_manifests_for(Duration::ZERO);
        let mut w = b.take_over("node", 1).await.expect("take over");
        let o = w.put(&keys::range(1, 1, 0, 6), Bytes::from_static(b"frames")).await.expect("put");
        for lsn in 1..=3 {
            w.publish(cut(lsn, std::slice::from_ref(&o)), 2).await.expect("publish");
        }
        assert_eq!(b.read(&o).await.expect("read"), Bytes::from_static(b"frames"));
        assert_eq!(b.objects().await.expect("list").len(), 1);
        b.delete(&o.key).await;
    }
    for (forced, name) in [(Some("true"), "tigris"), (None, "plain")] {
        let proxy = FaultProxy::start(&test_support::s3_endpoint());
        let extra: Vec<(&str, &str)> = forced.map(|v| (TIGRIS_CONSISTENT, v)).into_iter().collect();
        traffic(&test_support::s3_bucket_with(&proxy.url, name, &extra)).await;
        let counts = proxy.counts();
        let expected = if forced.is_some() { counts.requests } else { 0 };
        assert!(counts.requests >= 10, "{name}: {counts:?}");
        assert_eq!(counts.tigris_consistent, expected, "{name}: {counts:?}");
    }
}

/// A reader takes the newest manifest while the writer publishes as fast as it can: with old
/// manifests deleted at once (`keep` zero) the newest listed is sometimes gone when it is read,
/// and is listed again (never an error); kept for [`KEEP_MANIFESTS`], the newest read never goes
/// back, although a directory's listing misses what is created while it runs.
async fn the_newest_manifest_is_read_while_the_writer_publishes(kind: &str) {
    for keep in [Duration::ZERO, KEEP_MANIFESTS] {
        let (b, _dir) = fresh(kind, "busy");
        let b = b.keep_manifests_for(keep);
        let mut w = b.take_over("w", 1).await.expect("take over");
        let o = w.put("epoch-1/o", Bytes::from_static(b"frames")).await.expect("put");
        let publishes = if kind == "s3" { 150 } else { 1500 };
        let writer = tokio::spawn(async move {
            for i in 0..publishes {
                w.publish(cut(i + 1, std::slice::from_ref(&o)), 2).await.expect("publish");
            }
        });
        let (mut last, mut reads) = (0, 0);
        while !writer.is_finished() {
            let m = b.newest().await.expect("the newest manifest, read while the writer publishes");
            let n = m.expect("a manifest").number;
            assert!(keep.is_zero() || n >= last, "went back from {last} to {n}");
            last = n;
            reads += 1;
        }
        writer.await.expect("writer");
        assert!(reads > 10, "only {reads} reads overlapped the publishes");
    }
}

/// A takeover whose base came from a stale listing (the writer published past it and deleted
/// the manifest after it) creates a freed name below the newest: it is withdrawn, and the
/// running writer is not fenced by it; a takeover from the newest then fences it.
async fn a_takeover_from_a_stale_listing_is_withdrawn(kind: &str) {
    let (b, _dir) = fresh(kind, "stale");
    let b = b.keep_manifests_for(Duration::ZERO);
    let mut w = b.take_over("w", 1).await.expect("take over");
    let stale = b.newest().await.expect("newest").expect("the takeover manifest");
    let o = w.put("epoch-1/o", Bytes::from_static(b"frames")).await.expect("put");
    for i in 0..5 {
        w.publish(cut(i + 1, std::slice::from_ref(&o)), 2).await.expect("publish");
    }
    assert_eq!(b.manifest_numbers().await.expect("list"), [1, 5, 6], "manifest 2 is a freed name");
    let late = b.take_over_after(Some(&stale), "late", 3).await.expect("take over as of the stale listing");
    assert!(late.is_none(), "a takeover below the newest manifest took effect");
    assert_eq!(b.manifest_numbers().await.expect("list"), [1, 5, 6], "the withdrawn manifest is gone");
    w.publish(cut(6, std::slice::from_ref(&o)), 4).await.expect("the writer was not fenced");
    let newest = b.newest().await.expect("newest");
    let now = b.take_over_after(newest.as_ref(), "now", 5).await.expect("take over").expect("from the newest");
    assert_eq!(now.epoch(), 2);
    let fenced = w.publish(cut(7, std::slice::from_ref(&o)), 6).await;
    assert!(matches!(fenced, Err(BucketError::Fenced { mine: 1, by: 2 })), "{fenced:?}");
}

/// A takeover while the writer publishes as fast as it can (a node under continuous appends in
/// `--ack-mode bucket`): the writer takes every manifest name the takeover reads as next, so the
/// takeover must make it yield, and win. Nothing the old writer published is lost: its last
/// successful publish is in the takeover's cut, and it publishes nothing after it.
async fn a_takeover_wins_against_a_busy_writer(kind: &str) {
    let (b, _dir) = fresh(kind, "busy-takeover");
    let mut w = b.take_over("busy", 1).await.expect("take over");
    let o = w.put("epoch-1/o", Bytes::from_static(b"frames")).await.expect("put");
    let writer = tokio::spawn(async move {
        let mut published = 0;
        loop {
            match w.publish(cut(published + 1, std::slice::from_ref(&o)), 2).await {
                Ok(_) => published += 1,
                Err(e) => return (published, e),
            }
        }
    });
    // The writer is publishing before the takeover starts.
    while b.newest().await.expect("newest").is_none_or(|m| m.number < 5) {
        tokio::task::yield_now().await;
    }
    let new = b.take_over("new", 3).await.expect("the takeover wins against a busy writer");
    assert_eq!(new.epoch(), 2);
    let (published, stopped) = writer.await.expect("writer");
    assert!(
        matches!(stopped, BucketError::Fenced { mine: 1, by: 2 } | BucketError::Yielded { mine: 1, by: 2, .. }),
        "{stopped}"
    );
    assert_eq!(new.published().cut.end.lsn, published, "the old writer's last publish is in the takeover's cut");
    let newest = b.newest().await.expect("newest").expect("a manifest");
    assert_eq!((newest.epoch, newest.number), (2, new.published().number));
}

/// The claim, step by step: a takeover that lost its name to the writer claims the next epoch;
/// the writer finds the claim within `CLAIM_CHECK_EVERY` and yields (for good: it publishes
/// nothing more); the takeover then wins with the writer's last cut, and its claim is gone.
async fn a_writer_yields_to_a_takeovers_claim(kind: &str) {
    let (b, _dir) = fresh(kind, "claim");
    let mut w = b.take_over("w", 1).await.expect("take over");
    let o = w.put("epoch-1/o", Bytes::from_static(b"frames")).await.expect("put");
    w.publish(cut(1, std::slice::from_ref(&o)), 2).await.expect("publish");
    let base = b.newest().await.expect("newest");
    w.publish(cut(2, std::slice::from_ref(&o)), 3).await.expect("publish");
    let lost = b.take_over_after(base.as_ref(), "new", 4).await.expect("take over");
    assert!(lost.is_none(), "the writer took the name first");
    b.claim(base.as_ref(), "new").await.expect("claim");
    // The writer goes on publishing until it looks for a claim (a deadline, not a timing:
    // without the check it never stops).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut lsn = 2;
    let stopped = loop {
        match w.publish(cut(lsn + 1, std::slice::from_ref(&o)), 5).await {
            Ok(_) if std::time::Instant::now() < deadline => lsn += 1,
            r => break r,
        }
    };
    assert!(matches!(&stopped, Err(BucketError::Yielded { mine: 1, by: 2, node }) if node == "new"), "{stopped:?}");
    let again = w.publish(cut(lsn + 1, std::slice::from_ref(&o)), 6).await;
    assert!(matches!(again, Err(BucketError::Yielded { .. })), "a writer that yielded publishes again: {again:?}");
    let new = b.take_over("new", 7).await.expect("the takeover wins once the writer yielded");
    assert_eq!((new.epoch(), new.published().cut.end.lsn), (2, lsn), "the writer's last publish is carried over");
    assert_eq!(b.claimant(2).await.expect("claimant"), None, "the claim is deleted once it did its work");
}

/// A manifest as an operator might hand-edit it into the prefix: number `number`, epoch `epoch`,
/// its epoch's takeover at `number` after `before`'s.
fn edited(number: u64, epoch: u64, before: &[Takeover]) -> Bytes {
    let mut takeovers = before.to_vec();
    takeovers.push(Takeover { epoch, number });
    let m = Manifest {
        format: oncelog_bucket::manifest::FORMAT,
        number,
        epoch,
        takeovers,
        node: "edited".into(),
        written_ms: 0,
        table: None,
        cut: Cut::default(),
    };
    Bytes::from(m.encode())
}

/// Issue 45 item 11: a hand-edited manifest with the largest epoch there is used to make the
/// next takeover wrap its epoch to 0 (a panic in a debug build); one with an older epoch than
/// the writer's at the writer's next name read as "fenced by" that older epoch. Each is now
/// refused naming the manifest and the rule it broke, and nothing is created.
async fn a_hand_edited_manifest_is_refused_by_name_and_rule(kind: &str) {
    let (b, _dir) = fresh(kind, "edited");
    b.take_over("w", 1).await.expect("take over");
    let first = [Takeover { epoch: 1, number: 1 }];
    b.put_stray(&keys::manifest(2), edited(2, u64::MAX, &first)).await.expect("edit");
    let refused = b.take_over("new", 2).await;
    match &refused {
        Err(BucketError::Manifest { key, source: ManifestError::Inconsistent(rule) }) => {
            assert_eq!(key, &keys::manifest(2));
            assert!(rule.contains("epoch"), "{rule}");
        }
        other => panic!("a takeover after epoch u64::MAX: {other:?}"),
    }
    assert_eq!(b.manifest_numbers().await.expect("list"), [1, 2], "nothing created");

    let (b, _dir) = fresh(kind, "older");
    b.take_over("w", 1).await.expect("take over");
    let mut w = b.take_over("w2", 2).await.expect("take over");
    assert_eq!((w.epoch(), w.published().number), (2, 2));
    b.put_stray(&keys::manifest(3), edited(3, 1, &[])).await.expect("edit");
    let refused = w.publish(Cut::default(), 3).await;
    match &refused {
        Err(BucketError::Manifest { key, source: ManifestError::Inconsistent(rule) }) => {
            assert_eq!(key, &keys::manifest(3));
            assert!(rule.contains("older"), "{rule}");
        }
        other => panic!("a publish onto an older epoch's manifest: {other:?}"),
    }
}

/// A cut of sealed segments (`sealed`, each one object) and the growing segment after them.
fn long_cut(sealed: std::ops::RangeInclusive<u64>, objects: &[ObjectRef], growing: &ObjectRef) -> Cut {
    let mut segments: Vec<SegmentRef> =
        sealed.map(|n| SegmentRef { number: n, start: 0, ranges: vec![objects[n as usize].clone()] }).collect();
    let last = segments.last().map_or(1, |s| s.number + 1);
    segments.push(SegmentRef { number: last, start: 0, ranges: vec![growing.clone()] });
    let end = LogPosition { lsn: 1000 + last, segment: last, pos: growing.len };
    let checkpoint = Some(CheckpointRef { lsn: 10, object: growing.clone() });
    Cut { checkpoint, segments, end }
}

/// A long log's manifest names its sealed segments through a segment table: the manifest stays
/// small, reads back whole, rounds reuse the table until enough segments were sealed after it
/// or a checkpoint drops some of its own, a replaced table is handed back to be deleted, and a
/// takeover carries the table on.
async fn a_long_cut_is_published_through_a_segment_table(kind: &str) {
    let (b, _dir) = fresh(kind, "table");
    let mut w = b.take_over("w", 1).await.expect("take over");
    let mut objects = vec![ObjectRef { key: String::new(), len: 0, crc32c: 0 }];
    for n in 1..=80u64 {
        objects.push(w.put(&format!("epoch-1/seg-{n}"), Bytes::from(vec![n as u8; 100])).await.expect("put"));
    }
    let growing = w.put("epoch-1/growing", Bytes::from_static(b"tail")).await.expect("put");
    let whole = |c: &Cut| String::from_utf8(serde_json::to_vec(c).expect("json")).expect("utf8").len();
    // Below the threshold: no table.
    assert!(w.publish(long_cut(1..=10, &objects, &growing), 2).await.expect("publish").is_empty());
    assert_eq!(b.newest().await.expect("newest").expect("manifest").table, None);
    // 40 sealed segments: a table of them; the stored manifest holds only the growing one.
    let cut = long_cut(1..=40, &objects, &growing);
    assert!(w.publish(cut.clone(), 3).await.expect("publish").is_empty());
    let m = b.newest().await.expect("newest").expect("manifest");
    let table = m.table.clone().expect("a table");
    assert_eq!((table.segments, &m.cut), (40, &cut), "read back whole");
    assert!(m.encode().len() * 5 < whole(&cut), "stored {} bytes of a {}-byte cut", m.encode().len(), whole(&cut));
    // A few more sealed segments: the same table.
    let more = long_cut(1..=50, &objects, &growing);
    assert!(w.publish(more.clone(), 4).await.expect("publish").is_empty());
    let m = b.newest().await.expect("newest").expect("manifest");
    assert_eq!((m.table.as_ref(), &m.cut), (Some(&table), &more));
    // A takeover carries it; the new writer's rounds reuse it.
    let mut w2 = b.take_over("w2", 5).await.expect("take over");
    assert_eq!(w2.published().table.as_ref(), Some(&table));
    assert!(w2.publish(long_cut(1..=52, &objects, &growing), 6).await.expect("publish").is_empty());
    // A checkpoint drops the first segment: a new table; the old one is handed back.
    let dropped = long_cut(2..=52, &objects, &growing);
    let replaced = w2.publish(dropped.clone(), 7).await.expect("publish");
    assert_eq!(replaced, std::slice::from_ref(&table.object));
    let m = b.newest().await.expect("newest").expect("manifest");
    assert_eq!((m.table.as_ref().map(|t| t.segments), &m.cut), (Some(51), &dropped));
    // Sealed far past the table: a new table again.
    let far = long_cut(2..=79, &objects, &growing);
    assert_eq!(w2.publish(far.clone(), 8).await.expect("publish").len(), 1);
    assert_eq!(b.newest().await.expect("newest").expect("manifest").cut, far);
    let tables = b.objects().await.expect("list").into_iter().filter(|(k, _)| k.contains("/tab-")).count();
    assert_eq!(tables, 3, "one object per table written");
}

macro_rules! on_both {
    ($($case:ident),* $(,)?) => {
        mod s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case("s3").await;
                }
            )*
        }
        mod dir {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case("dir").await;
                }
            )*
        }
    };
}

on_both!(
    takeover_on_an_empty_prefix_starts_epoch_one,
    a_takeover_fences_the_writer_before_it,
    a_zombie_stays_fenced_after_old_manifests_are_deleted,
    objects_are_created_once_and_checked_when_read,
    concurrent_takeovers_get_distinct_epochs,
    a_publish_with_a_broken_cut_is_refused,
    the_newest_manifest_is_read_while_the_writer_publishes,
    a_takeover_from_a_stale_listing_is_withdrawn,
    a_long_cut_is_published_through_a_segment_table,
    a_takeover_wins_against_a_busy_writer,
    a_writer_yields_to_a_takeovers_claim,
    a_hand_edited_manifest_is_refused_by_name_and_rule,
);
