//! Shared by the sink tests (sink_totals.rs, sink_postgres.rs): the target database as the sink
//! sees it, waiting for a sink to catch up, writers of numbered messages, and a small seeded
//! random sequence.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncelog_client::{AppendOptions, Client};

/// Runs `sql` on the database at `url` (connected as the sink connects: TLS settings included);
/// every row as its columns' text.
pub async fn query(url: &str, sql: &str) -> Result<Vec<Vec<String>>, tokio_postgres::Error> {
    let (cfg, tls) = oncelog_postgres::driver_config(url).expect("database URL");
    let (client, conn) = cfg.connect(tls).await?;
    tokio::spawn(conn);
    let mut rows = Vec::new();
    for m in client.simple_query(sql).await? {
        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
            rows.push((0..r.len()).map(|i| r.get(i).unwrap_or("").to_owned()).collect());
        }
    }
    Ok(rows)
}

/// Each stream's applied position in `schema` (missing rows: absent).
pub async fn positions(url: &str, schema: &str) -> BTreeMap<String, u64> {
    match query(url, &format!("SELECT stream, position FROM {schema}.positions")).await {
        Ok(rows) => rows.into_iter().map(|r| (r[0].clone(), r[1].parse().unwrap_or(0))).collect(),
        Err(_) => BTreeMap::new(),
    }
}

/// Each of `streams`' tail, as a byte position.
pub async fn tails(client: &Client, streams: &[String]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for s in streams {
        let head = client.stream(s).head().await.expect("head");
        out.insert(s.clone(), head.next_offset.to_oncelog().expect("Oncelog offset").0);
    }
    out
}

/// Waits until `schema`'s positions reach the tails of `streams`; panics with both after
/// `limit`. Answers how long it took.
pub async fn wait_applied(client: &Client, url: &str, schema: &str, streams: &[String], limit: Duration) -> Duration {
    let started = Instant::now();
    let want = tails(client, streams).await;
    loop {
        let have = positions(url, schema).await;
        if want.iter().all(|(s, t)| have.get(s) == Some(t)) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "the sink did not catch up within {limit:?}: tails {want:?}, positions {have:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A child process of the test, SIGKILLed (by its PID) and reaped when dropped, so a failing
/// assertion leaves no sink running behind it.
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Reaped {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

/// The exit status of `child` once it ends; killed (by PID) and `None` after `limit`.
pub fn wait_exit(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A small deterministic sequence (the tests need spread, not secrecy).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Writers appending `{"n": 1}`, `{"n": 2}`, … (1 to 4 per append) to JSON streams until
/// stopped; what each stream was sent in all.
pub struct Writers {
    stop: Arc<AtomicBool>,
    /// Per stream: (messages, sum of their n), as acknowledged by the server.
    pub sent: Vec<(String, Arc<AtomicU64>, Arc<AtomicU64>)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    /// One task per stream on the current runtime.
    pub fn start(client: &Client, streams: &[String], pause: Duration) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let mut sent = Vec::new();
        let mut tasks = Vec::new();
        for (i, s) in streams.iter().enumerate() {
            let (count, sum) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            sent.push((s.clone(), count.clone(), sum.clone()));
            let (client, s, stop) = (client.clone(), s.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = Lcg(7 + i as u64);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = 1 + rng.next(4);
                    let body: Vec<serde_json::Value> = (n + 1..=n + k).map(|v| serde_json::json!({ "n": v })).collect();
                    client
                        .stream(&s)
                        .append(serde_json::Value::Array(body).to_string(), AppendOptions::default())
                        .await
                        .expect("append");
                    count.fetch_add(k, Ordering::Relaxed);
                    sum.fetch_add((n + 1..=n + k).sum::<u64>(), Ordering::Relaxed);
                    n += k;
                    tokio::time::sleep(pause).await;
                }
            }));
        }
        Writers { stop, sent, tasks }
    }

    /// Stops them and waits for their last appends.
    pub async fn stop(self) -> Vec<(String, u64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("writer");
        }
        self.sent.iter().map(|(s, c, m)| (s.clone(), c.load(Ordering::Relaxed), m.load(Ordering::Relaxed))).collect()
    }
}
