//! Oncelog's PostgreSQL engine: several identical, stateless server nodes over one database.
//!
//! The database is the only truth. A node caches nothing that decides a write: every write
//! locks its stream's row (`SELECT … FOR UPDATE`) and decides with the shared
//! [`oncelog_storage::rules`] against the state it reads under that lock, then commits the
//! data, the new tail, the producer state and the closure in the **same transaction** — so an
//! acknowledged append is durable together with everything that makes its retry a duplicate,
//! on whichever node the retry lands. Node memory holds only wake-up plumbing, reads' TTL
//! touches waiting to be written, parked requests, counters, and what a write is framed for
//! (each stream's id and configuration as last seen: judged again under the row lock).
//!
//! Module map:
//! - this file: [`PgEngine`], [`PgOptions`], opening (connect, check, migrate, start tasks),
//!   the [`Engine`] implementation (thin: each method one call below), shutdown;
//! - [`conninfo`]: the libpq connection string split into the driver's part and TLS settings;
//!   [`tls`]: the rustls connector for those settings, and TLS failures in words;
//! - [`schema`]: versioned migrations (`migrations/*.sql`), applied under an advisory lock;
//! - `writer`: the committers — appends batched per node into one transaction per group,
//!   parking of early producer requests;
//! - `group`: loading, deciding and writing a group of appends (shared with `transact`);
//! - `ops`: create/fork, delete, trim, compact, transact, and the sweeps (expiry, retention,
//!   garbage collection), each a transaction;
//! - `read`: head, reads through fork chains, live waits, listings;
//! - `flight`: single-flight reads shared by the live readers one commit woke;
//! - `seen`: streams as this node last saw them, so an append needs no `head` round trip;
//! - `watch`: waiters' wake-ups and TTL touches; `row`: a `streams` row as rules see it;
//!   `error`: open errors and the mapping of driver errors to [`StorageError`];
//! - `shared`: what every task of a node shares (pool, counters, lock keys, effects to apply);
//! - `bus`: wake-ups between nodes (batched `pg_notify` after commit, a `LISTEN` connection,
//!   a poll of watched tails as the safety net), and readiness from that connection.

mod bus;
pub mod conninfo;
mod error;
mod flight;
mod group;
mod ops;
mod read;
mod row;
pub mod schema;
mod seen;
mod shared;
pub mod tls;
mod watch;
mod writer;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use oncelog_protocol::Offset;
use oncelog_storage::machine::parking::ParkingLot;
use oncelog_storage::rules;
use oncelog_storage::*;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_postgres_rustls::MakeRustlsConnect;

pub use error::{refuses_login, Described, OpenError};
use ops::retry;
use shared::{Counters, Shared};
use watch::{Touches, Watches};
use writer::{Cmd, Committer};

/// How this engine connects and behaves.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// `postgres://user[:password]@host[:port]/database[?options]` (libpq's URL form).
    pub url: String,
    /// Where the tables live: several Oncelog clusters can share one database, each in its own
    /// schema. Lowercase letters, digits and `_`.
    pub schema: String,
    /// Connections per node for requests (waiters do not hold one while they wait).
    pub pool_size: usize,
    /// Committer tasks per node: a stream's appends always go to the same one.
    pub committers: usize,
    /// How long idle producer state and idempotency keys count.
    pub retention: rules::Retention,
    /// How long opening keeps trying to reach the database.
    pub connect_timeout: Duration,
    /// The deadline of every request's work in the database (a transaction, a read): past it
    /// the request is answered 503, never left hanging. The sessions' own bounds derive from it
    /// (see [`session_bounds`]).
    pub request_timeout: Duration,
    /// Start even when the database's `synchronous_commit` is below `on` (`off`, `local`,
    /// `remote_write`): an acknowledged append may then be lost in a database crash or a
    /// failover. For operators who accept that window knowingly.
    pub accept_commit_loss: bool,
}

impl PgOptions {
    pub fn new(url: impl Into<String>) -> Self {
        PgOptions {
            url: url.into(),
            schema: "oncelog".into(),
            pool_size: 16,
            committers: 1,
            retention: rules::Retention::default(),
            connect_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(5),
            accept_commit_loss: false,
        }
    }
}

/// The engine handle; clones share one engine.
#[derive(Clone)]
pub struct PgEngine {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    committers: Vec<mpsc::UnboundedSender<Cmd>>,
    committer_tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Background work (touch flushes, safety-net wake-ups, garbage collection).
    tasks: Mutex<Vec<JoinHandle<()>>>,
    closing: AtomicBool,
}

impl PgEngine {
    /// Connects (retrying up to `connect_timeout`), refuses a database that would not keep
    /// acknowledged commits, applies migrations, and starts the committers and background tasks.
    pub async fn open(opts: PgOptions) -> Result<PgEngine, OpenError> {
        let (cfg, tls) = session_config(&opts.url, &opts.schema, &[], opts.request_timeout)?;
        let mut client = connect(&cfg, &tls, opts.connect_timeout).await?;
        warn_if_plaintext(&client, &cfg).await?;
        // Migrations may take longer than a request may.
        client.batch_execute("SET statement_timeout = 0").await?;
        durability_check(&client, opts.accept_commit_loss).await?;
        schema::migrate(&mut client, &opts.schema).await?;
        let counts =
            client.query_one("SELECT (SELECT count(*) FROM streams), (SELECT count(*) FROM producers)", &[]).await?;
        drop(client);
        let listen_cfg = cfg.clone();
        let pool = session_pool(cfg, tls.clone(), opts.pool_size.max(2))?;
        let (notify_tx, notify_rx) = mpsc::unbounded_channel();
        let shared = Arc::new_cyclic(|me| Shared {
            me: me.clone(),
            rows: flight::Flights::keeping(4096),
            scans: Default::default(),
            pool,
            schema: opts.schema.clone(),
            retention: opts.retention,
            deadline: opts.request_timeout,
            watches: Watches::default(),
            touches: Touches::default(),
            chains: Mutex::new(HashMap::new()),
            seen: Default::default(),
            stats: Counters {
                streams: AtomicI64::new(counts.get(0)),
                producers: AtomicI64::new(counts.get(1)),
                parked: Arc::default(),
            },
            unavailable: Mutex::new(None),
            degraded: AtomicBool::new(false),
            listen_down: Mutex::new(None),
            node: oncelog_storage::clock::unique_id(),
            notify: notify_tx,
            kick: tokio::sync::Notify::new(),
        });
        let mut committers = Vec::new();
        let mut committer_tasks = Vec::new();
        for _ in 0..opts.committers.max(1) {
            let (tx, rx) = mpsc::unbounded_channel();
            let c = Committer { rx, shared: shared.clone(), lot: ParkingLot::counting(shared.stats.parked.clone()) };
            committer_tasks.push(tokio::spawn(c.run()));
            committers.push(tx);
        }
        let tasks = vec![
            tokio::spawn(background(shared.clone())),
            tokio::spawn(bus::notifier(shared.clone(), notify_rx)),
            tokio::spawn(bus::listener(shared.clone(), listen_cfg, tls)),
        ];
        Ok(PgEngine {
            inner: Arc::new(Inner {
                shared,
                committers,
                committer_tasks: Mutex::new(committer_tasks),
                tasks: Mutex::new(tasks),
                closing: AtomicBool::new(false),
            }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Sets the counters behind [`Engine::stats`] to the database's counts now (the background
    /// task does it every 30 s).
    pub async fn refresh_stats(&self) -> Result<(), StorageError> {
        self.shared().count().await.map_err(StorageError::from)
    }

    fn closing(&self) -> bool {
        self.inner.closing.load(Ordering::Acquire)
    }
}

/// The driver's configuration and the TLS connector for a libpq connection string (URL or
/// `key=value` form, TLS parameters and `PGSSL*` / `PGPASSWORD` variables included), as every
/// connection of the engine uses them; for tools and tests that talk to the same database.
pub fn driver_config(url: &str) -> Result<(tokio_postgres::Config, MakeRustlsConnect), OpenError> {
    let (driver_url, tls_params) = conninfo::split(url)?;
    let mut cfg = tokio_postgres::Config::from_str(&driver_url).map_err(OpenError::Url)?;
    cfg.ssl_mode(tls_params.mode.driver());
    // libpq's convention: a password the URL does not carry comes from PGPASSWORD (so it need
    // not appear in process listings).
    if cfg.get_password().is_none() {
        if let Ok(p) = std::env::var("PGPASSWORD") {
            cfg.password(p);
        }
    }
    Ok((cfg, tls::connector(&tls_params)?))
}

/// Under `sslmode=prefer` (libpq's default) a server that offers no TLS gets a plaintext
/// connection without a word: says so, as a warning, when `client`'s session is not encrypted.
/// Other modes either insist on TLS (`require` and above: no fallback) or ask for none.
pub async fn warn_if_plaintext(
    client: &tokio_postgres::Client,
    cfg: &tokio_postgres::Config,
) -> Result<(), tokio_postgres::Error> {
    if cfg.get_ssl_mode() != tokio_postgres::config::SslMode::Prefer {
        return Ok(());
    }
    let row = client.query_opt("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await?;
    if !row.is_some_and(|r| r.get::<_, bool>(0)) {
        tracing::warn!("sslmode=prefer and the server offered no TLS: this connection to PostgreSQL is plaintext (passwords and data readable on the network); set sslmode=require, or verify-full with sslrootcert, to insist on TLS");
    }
    Ok(())
}

/// Refuses a database whose commits this engine's acknowledgements could outlive: with
/// `synchronous_commit` `off` a commit returns before its WAL is flushed (lost in a crash),
/// with `local` or `remote_write` before a synchronous standby has flushed it (lost in a
/// failover to it). `on` and `remote_apply` keep every acknowledged append across both. Also
/// warns when standbys stream but none is synchronous: a failover to one may lose the last
/// acknowledged appends, whatever `synchronous_commit` says.
async fn durability_check(client: &tokio_postgres::Client, accept_loss: bool) -> Result<(), OpenError> {
    let sync: String = client.query_one("SHOW synchronous_commit", &[]).await?.get(0);
    if matches!(sync.as_str(), "off" | "local" | "remote_write") {
        if !accept_loss {
            return Err(OpenError::AsyncCommit(sync));
        }
        tracing::warn!(synchronous_commit = %sync, "acknowledged appends may be lost in a database crash or failover (accepted by --pg-accept-commit-loss)");
    }
    let names: String = client.query_one("SHOW synchronous_standby_names", &[]).await?.get(0);
    let standbys: i64 = client.query_one("SELECT count(*) FROM pg_stat_replication", &[]).await?.get(0);
    if names.trim().is_empty() && standbys > 0 {
        tracing::warn!(standbys, "standbys stream asynchronously (synchronous_standby_names is empty): a failover to one may lose the last acknowledged appends; see docs/OPERATIONS.md");
    }
    Ok(())
}

/// The connection settings of every session Oncelog opens to PostgreSQL, the engine's and a
/// sink's: `url` as [`driver_config`] takes it, `schema` (checked: a plain identifier, never
/// quoted) first on the search path and then `also`, the [`session_bounds`] of
/// `request_timeout`, and this side's own watch on a dead path.
pub fn session_config(
    url: &str,
    schema: &str,
    also: &[&str],
    request_timeout: Duration,
) -> Result<(tokio_postgres::Config, MakeRustlsConnect), OpenError> {
    if !schema::valid_schema(schema) {
        return Err(OpenError::Schema(schema.to_owned()));
    }
    let (mut cfg, tls) = driver_config(url)?;
    let path = std::iter::once(schema).chain(also.iter().copied()).collect::<Vec<_>>().join(",");
    let options =
        format!("{} -c search_path={path} {}", cfg.get_options().unwrap_or(""), session_bounds(request_timeout));
    cfg.options(options.trim());
    cfg.connect_timeout(Duration::from_secs(5));
    // This side notices a dead path too: unacknowledged data for 3 s, or 3 unanswered
    // keepalives a second apart after 2 s of silence, ends the connection.
    cfg.tcp_user_timeout(Duration::from_secs(3));
    cfg.keepalives_idle(Duration::from_secs(2));
    cfg.keepalives_interval(Duration::from_secs(1));
    cfg.keepalives_retries(3);
    Ok((cfg, tls))
}

/// A pool of at most `size` sessions of `cfg` ([`session_config`]): a broken connection is
/// replaced on the next `get`, and waiting for one is bounded.
pub fn session_pool(cfg: tokio_postgres::Config, tls: MakeRustlsConnect, size: usize) -> Result<Pool, OpenError> {
    let mgr = Manager::from_config(cfg, tls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Ok(Pool::builder(mgr)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .build()?)
}

/// The bounds every session sets (`-c` options at connect), so that a node cut off from the
/// database cannot hold stream rows, and so other nodes, for long:
/// - `idle_in_transaction_session_timeout` (3/5 of the request deadline, at least 1 s): a
///   transaction whose node stopped talking is ended by PostgreSQL and its locks released — the
///   other nodes' appends waiting on those rows go on after at most this long;
/// - `lock_timeout` (4/5) and `statement_timeout` (the deadline): no statement outlives the
///   request it serves; both are retried as conflicts, and answered 503 without marking the node
///   unready;
/// - TCP keepalives and `tcp_user_timeout` on the server's side of the socket: a peer that is
///   gone is noticed in seconds, even outside a transaction.
pub fn session_bounds(request_timeout: Duration) -> String {
    let ms = request_timeout.as_millis().max(1000) as u64;
    format!(
        "-c idle_in_transaction_session_timeout={} -c lock_timeout={} -c statement_timeout={ms} \
         -c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3 -c tcp_user_timeout=3000",
        (ms * 3 / 5).max(1000),
        ms * 4 / 5,
    )
}

async fn connect(
    cfg: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    within: Duration,
) -> Result<tokio_postgres::Client, OpenError> {
    let started = tokio::time::Instant::now();
    loop {
        match cfg.connect(tls.clone()).await {
            Ok((client, conn)) => {
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "setup connection ended");
                    }
                });
                return Ok(client);
            }
            // A TLS refusal does not go away by trying again, nor does a missing database or
            // role, or a wrong password.
            Err(e) if tls::refusal(&e).is_some() => return Err(OpenError::Tls(tls::refusal(&e).unwrap_or_default())),
            Err(e) if error::refused_for_good(&e) => return Err(OpenError::Refused(error::with_causes(&e))),
            Err(e) if started.elapsed() < within => {
                tracing::warn!(cause = %error::with_causes(&e), "PostgreSQL not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(OpenError::Unreachable { secs: within.as_secs(), cause: error::with_causes(&e) }),
        }
    }
}

/// How often reads' TTL touches are written.
const TOUCH_FLUSH: Duration = Duration::from_millis(500);
/// How often removed and trimmed data is collected.
const GC_EVERY: Duration = Duration::from_secs(2);
/// How often the counters behind `Engine::stats()` are set to the database's counts: between
/// refreshes a node adds what it changed itself, so with several nodes each is right again
/// within this long.
const COUNT_EVERY: Duration = Duration::from_secs(30);

/// Background work of a node: TTL touches, the waiters' safety net, readiness, collection.
async fn background(shared: Arc<Shared>) {
    let mut ticks: u64 = 0;
    let mut interval = tokio::time::interval(TOUCH_FLUSH);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        ticks += 1;
        let probe = async {
            shared.flush_touches().await?;
            let c = shared.client().await?;
            c.simple_query("SELECT 1").await?;
            Ok::<(), error::Fail>(())
        };
        // The probe decides whether this node can use the database: any failure of it, a
        // missed deadline included, makes the node unready until a probe or request succeeds.
        match shared.within(probe).await {
            Ok(()) => shared.note_success(),
            Err(f) => shared.note_unreachable(&StorageError::from(f)),
        }
        if ticks.is_multiple_of((COUNT_EVERY.as_millis() / TOUCH_FLUSH.as_millis()) as u64) {
            if let Err(f) = shared.count().await {
                tracing::debug!(error = %StorageError::from(f), "counting streams failed; retried later");
            }
        }
        if ticks.is_multiple_of((GC_EVERY.as_millis() / TOUCH_FLUSH.as_millis()) as u64) {
            loop {
                match shared.gc().await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(f) => {
                        tracing::warn!(error = %StorageError::from(f), "garbage collection failed; retried later");
                        break;
                    }
                }
            }
        }
    }
}

impl Housekeeping for PgEngine {
    async fn expire(&self, now_ms: i64) -> Result<usize, StorageError> {
        retry!(self.shared(), async { self.shared().expire(now_ms).await.map(Ok) })
    }

    async fn retain(&self, now_ms: i64) -> Result<Retained, StorageError> {
        retry!(self.shared(), async { self.shared().retain(now_ms).await.map(Ok) })
    }

    async fn prune(&self, now_ms: i64) -> Result<PruneOutcome, StorageError> {
        retry!(self.shared(), async { self.shared().prune(now_ms).await.map(Ok) })
    }

    async fn compaction_candidates(&self, min_bytes: u64) -> Result<Vec<(String, Offset)>, StorageError> {
        retry!(self.shared(), async { self.shared().compaction_candidates(min_bytes).await.map(Ok) })
    }
}

impl Engine for PgEngine {
    async fn create(&self, req: CreateRequest) -> Result<CreateOutcome, CreateError> {
        if self.closing() {
            return Err(StorageError::ShuttingDown.into());
        }
        retry!(self.shared(), self.shared().create_once(&req))
    }

    async fn append(&self, req: AppendRequest) -> Result<AppendOutcome, AppendError> {
        if self.closing() {
            return Err(StorageError::ShuttingDown.into());
        }
        let k = self.inner.committers.len();
        let i = (xxhash_rust::xxh3::xxh3_64(req.path.as_bytes()) % k as u64) as usize;
        let (reply, rx) = oneshot::channel();
        let cmd = Cmd::Append { req, reply, arrival: tokio::time::Instant::now() };
        if self.inner.committers[i].send(cmd).is_err() {
            return Err(StorageError::ShuttingDown.into());
        }
        // The committer answers within the deadline of its group; this bounds the wait for a
        // committer still busy with an earlier one. The request may yet commit after this
        // answer: a 503 says "unknown", and the producer's retry gets the right answer.
        let bound = self.shared().deadline + rules::PARK_TIMEOUT;
        match tokio::time::timeout(bound, rx).await {
            Ok(answer) => answer.unwrap_or(Err(StorageError::ShuttingDown.into())),
            Err(_) => Err(StorageError::Unavailable(Arc::new(error::Stalled { ms: bound.as_millis() as u64 })).into()),
        }
    }

    async fn trim(&self, path: &str, to: Offset, now_ms: i64) -> Result<TrimOutcome, TrimError> {
        if self.closing() {
            return Err(StorageError::ShuttingDown.into());
        }
        retry!(self.shared(), self.shared().trim_once(path, to, now_ms))
    }

    async fn delete_if(&self, path: &str, req: DeleteRequest, now_ms: i64) -> Result<(), LookupError> {
        if self.closing() {
            return Err(StorageError::ShuttingDown.into());
        }
        self.shared().seen.forget(path);
        retry!(self.shared(), self.shared().delete_once(path, &req, now_ms))
    }

    async fn head(&self, path: &str, now_ms: i64) -> Result<StreamInfo, LookupError> {
        let info = retry!(self.shared(), self.shared().head(path, now_ms));
        match &info {
            Ok(info) => self.shared().seen.remember(path, info),
            Err(LookupError::NotFound | LookupError::Gone) => self.shared().seen.forget(path),
            Err(_) => {}
        }
        info
    }

    fn last_seen(&self, path: &str) -> Option<StreamInfo> {
        self.shared().seen.get(path)
    }

    /// A woken reader's read takes the stream's state from what its wait saw (no row read); a
    /// bounded read reads whole rows and cuts the answer (rows are not read in part yet).
    async fn read(&self, req: ReadRequest<'_>) -> Result<ReadChunk, LookupError> {
        let ReadRequest { path, from, max_bytes, now_ms, .. } = req;
        let chunk = match req.seen {
            Some(seen) => retry!(self.shared(), self.shared().read_woken(path, from, max_bytes, seen, now_ms))?,
            None => retry!(self.shared(), self.shared().read(path, from, max_bytes.max(1), now_ms))?,
        };
        Ok(if req.bounded { chunk.cut_to(max_bytes) } else { chunk })
    }

    async fn wait(
        &self,
        path: &str,
        after: Offset,
        timeout: Duration,
        now_ms: i64,
    ) -> Result<WaitOutcome, LookupError> {
        // Not bounded as a whole (a wait lasts as long as asked); each row read in it is.
        retry!(@unbounded self.shared(), self.shared().wait(path, after, timeout, now_ms))
    }

    async fn compact(&self, req: CompactRequest) -> Result<TrimOutcome, CompactError> {
        if self.closing() {
            return Err(StorageError::ShuttingDown.into());
        }
        retry!(self.shared(), self.shared().compact_once(&req))
    }

    async fn transact(&self, txn: TxnRequest) -> Result<TxnOutcome, TxnError> {
        if self.closing() {
            return Err(StorageError::ShuttingDown.into());
        }
        retry!(self.shared(), self.shared().transact_once(&txn))
    }

    async fn meta_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, bytes::Bytes)>, StorageError> {
        retry!(self.shared(), async { self.shared().meta_scan(prefix).await.map(Ok) })
    }

    async fn list_streams(&self, prefix: &str, now_ms: i64) -> Result<Vec<Listed>, StorageError> {
        retry!(self.shared(), async { self.shared().list_streams(prefix, now_ms).await.map(Ok) })
    }

    async fn shutdown(&self) -> Result<(), StorageError> {
        if self.inner.closing.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut stopped = Vec::new();
        for c in &self.inner.committers {
            let (tx, rx) = oneshot::channel();
            if c.send(Cmd::Stop(tx)).is_ok() {
                stopped.push(rx);
            }
        }
        for rx in stopped {
            let _ = rx.await;
        }
        let tasks: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in tasks {
            t.abort();
        }
        let committers: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.inner.committer_tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in committers {
            let _ = t.await;
        }
        let flushed = self.shared().flush_touches().await;
        self.shared().pool.close();
        flushed.map_err(StorageError::from)
    }

    fn readiness(&self) -> Readiness {
        if self.closing() {
            return Readiness::NotReady { reason: "shutting down".into() };
        }
        let unavailable = self.shared().unavailable.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let listen_down = self.shared().listen_down.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match unavailable.or(listen_down) {
            Some(reason) => Readiness::NotReady { reason },
            None => Readiness::Ready,
        }
    }

    fn stats(&self) -> EngineStats {
        let get = |a: &AtomicI64| u64::try_from(a.load(Ordering::Relaxed)).unwrap_or(0);
        let stats = &self.shared().stats;
        EngineStats {
            streams: get(&stats.streams),
            producers: get(&stats.producers),
            parked_appends: stats.parked.load(Ordering::Relaxed),
        }
    }

    fn shared(&self) -> bool {
        true
    }
}
