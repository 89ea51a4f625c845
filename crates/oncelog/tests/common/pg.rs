//! `oncelog serve` nodes over PostgreSQL, and private PostgreSQL clusters (`scripts/postgres`):
//! what the multi-node tests (two_nodes.rs, failover.rs) start and stop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a node may take to listen (it connects to the database and migrates first).
pub const STARTUP: Duration = Duration::from_secs(60);

/// The shared test database (`./scripts/test` starts a private cluster and sets it).
pub fn database_url() -> String {
    std::env::var("ONCELOG_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("the multi-node tests need PostgreSQL: ONCELOG_TEST_POSTGRES_URL (./scripts/test starts a private cluster and sets it)")
    })
}

/// The shared test database over its Unix socket with `sslmode=prefer`: no TLS is offered there,
/// so the connection falls back to plaintext (`ONCELOG_TEST_POSTGRES_SOCKET_DIR`, which
/// `./scripts/test` sets beside the URL).
pub fn plaintext_socket_url() -> String {
    let socket_dir = std::env::var("ONCELOG_TEST_POSTGRES_SOCKET_DIR")
        .expect("ONCELOG_TEST_POSTGRES_SOCKET_DIR (./scripts/test sets it)");
    let url = database_url();
    let port = url
        .split_once("://")
        .and_then(|(_, r)| r.split_once('/'))
        .and_then(|(h, _)| h.rsplit_once(':'))
        .map(|(_, p)| p.to_owned())
        .expect("a port in the URL");
    format!("postgres://oncelog@/postgres?host={socket_dir}&port={port}&sslmode=prefer")
}

pub fn scripts_postgres() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/postgres")
}

/// A schema of its own per run: `{prefix}_{tag}_{pid}_{nanos}`.
pub fn schema(prefix: &str, tag: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_{tag}_{}_{nanos}", std::process::id())
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// One `oncelog serve` child on a fixed port (kept across restarts, so clients keep its URL).
/// Dropping it kills the child (by its PID, SIGKILL).
pub struct Node {
    child: Option<Child>,
    pub port: u16,
    db: String,
    schema: String,
    pub log: PathBuf,
    starts: usize,
}

impl Node {
    /// Starts a node on database URL `db`, schema `schema`, its stderr appended to `log`;
    /// returns once it listens.
    pub fn start(db: &str, schema: &str, log: PathBuf) -> Node {
        let mut n =
            Node { child: None, port: free_port(), db: db.to_owned(), schema: schema.to_owned(), log, starts: 0 };
        n.launch();
        n
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port.
    pub fn launch(&mut self) {
        self.starts += 1;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncelog"))
            .args(["serve", "--addr", &format!("127.0.0.1:{}", self.port), "--long-poll-timeout-ms", "1000"])
            .args(["--storage", &self.db, "--pg-schema", &self.schema, "--pg-pool-size", "8"])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn oncelog");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) > 0 {
                let _ = tx.send(line);
            }
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        self.child = Some(child);
        match rx.recv_timeout(STARTUP) {
            Ok(line) => assert!(line.starts_with("oncelog listening on"), "{line}"),
            Err(_) => panic!("node start #{} did not come up; log:\n{}", self.starts, self.log_text()),
        }
    }

    /// What the node logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL, to this child's PID
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A private cluster (`scripts/postgres` in a temporary directory), stopped on drop, however
/// the test ends.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// `postgres://oncelog@127.0.0.1:PORT/postgres`
    pub url: String,
}

impl Cluster {
    /// A fresh cluster (initdb), started.
    pub fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = Cluster::run(&["start"], dir.path());
        Cluster { dir, url }
    }

    /// A synchronous streaming standby of `primary` (`scripts/postgres standby`: pg_basebackup
    /// with a replication slot; the primary names it in `synchronous_standby_names`).
    pub fn standby_of(primary: &Cluster) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = Cluster::run(&["standby", primary.dir.path().to_str().expect("utf-8 path")], dir.path());
        Cluster { dir, url }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        std::fs::read_to_string(self.dir.path().join("port")).expect("port file").trim().parse().expect("a port")
    }

    /// Stops it like a power cut (`pg_ctl -m immediate`).
    pub fn crash(&self) {
        Cluster::run(&["crash"], self.dir.path());
    }

    /// Starts it again (same port).
    pub fn restart(&self) {
        Cluster::run(&["start"], self.dir.path());
    }

    /// Promotes a standby (`pg_ctl promote`, waiting until it accepts writes).
    pub fn promote(&self) {
        Cluster::run(&["promote"], self.dir.path());
    }

    /// Runs `statements` on it (`scripts/postgres sql`: psql as the superuser, stopping at the
    /// first error); the rows printed, or what went wrong.
    pub fn sql(&self, statements: &[&str]) -> Result<String, String> {
        let out = Command::new("bash")
            .arg(scripts_postgres())
            .arg("sql")
            .arg(self.dir.path())
            .args(statements)
            .output()
            .map_err(|e| format!("scripts/postgres sql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    /// The server log, for failure messages.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// `scripts/postgres ARGS… DIR`; its stdout, trimmed. Fails the test if it fails.
    pub fn run(args: &[&str], dir: &Path) -> String {
        let out = Command::new("bash").arg(scripts_postgres()).args(args).arg(dir).output().expect("scripts/postgres");
        assert!(out.status.success(), "scripts/postgres {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(scripts_postgres()).arg("stop").arg(self.dir.path()).output();
    }
}
