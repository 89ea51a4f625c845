//! Shared by the CLI tests: an in-process Oncelog server on a background Tokio runtime, so the
//! test body can drive `oncelog` child processes with plain blocking code. [`pg`]: `oncelog
//! serve` nodes over PostgreSQL and private clusters; [`load`]: producers, readers and the
//! exactly-once check of the multi-node tests.

#![allow(dead_code)]

pub mod freeze;
pub mod load;
pub mod pg;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use oncelog_log::{Durability, LogEngine, LogOptions};
use oncelog_server::{serve, AllowAll, AppState, Authorize, ServerConfig};

pub struct Harness {
    /// Runs the server (and any proxy) while the test thread blocks on child processes.
    pub rt: tokio::runtime::Runtime,
    /// The server's address.
    pub addr: SocketAddr,
    /// `http://ADDR/v1/stream`
    pub base: String,
    /// Scratch space for the test (data dir, epoch files).
    pub dir: tempfile::TempDir,
}

impl Harness {
    /// A server whose requests are decided by `auth` (for example to require a token).
    pub fn start_with(auth: Arc<dyn Authorize>) -> Harness {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = LogOptions::new(dir.path().join("data"));
        opts.durability = Durability::Buffered;
        let engine = LogEngine::open(opts).expect("engine");
        let config = ServerConfig { long_poll_timeout: Duration::from_millis(500), ..ServerConfig::default() };
        let state = AppState::new(Arc::new(engine), config).with_auth(auth);
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        rt.spawn(serve(listener, state, std::future::pending()));
        Harness { rt, addr, base: format!("http://{addr}/v1/stream"), dir }
    }

    pub fn start() -> Harness {
        Harness::start_with(Arc::new(AllowAll))
    }

    pub fn client(&self) -> oncelog_client::Client {
        oncelog_client::Client::new(&self.base).expect("client")
    }
}

/// The `oncelog` binary under test.
pub fn bin() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_oncelog"));
    c.env_remove("ONCELOG_URL").env_remove("ONCELOG_AUTH").env_remove("ONCELOG_PRODUCER_ID");
    c
}

/// What a finished child printed.
pub struct Output {
    /// Exit status 0.
    pub ok: bool,
    /// The exit status (`None` when a signal ended the child).
    pub code: Option<i32>,
    /// Everything printed on stdout (lossy UTF-8: see `stdout_bytes`).
    pub stdout: String,
    /// Everything printed on stdout, byte for byte.
    pub stdout_bytes: Vec<u8>,
    /// Everything printed on stderr (error messages are checked).
    pub stderr: String,
}

/// Runs `cmd` with `stdin` as its input, killing it (and failing the test) after `limit`.
pub fn run(mut cmd: std::process::Command, stdin: &[u8], limit: Duration) -> Output {
    use std::io::{Read, Write};
    use std::process::Stdio;
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn oncelog");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("oncelog {:?} did not finish within {limit:?}", cmd.get_args().collect::<Vec<_>>());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = writer.join();
    let stdout_bytes = out_t.join().unwrap_or_default();
    Output {
        ok: status.success(),
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout_bytes).into_owned(),
        stdout_bytes,
        stderr: err_t.join().unwrap_or_default(),
    }
}

/// `oncelog serve` as a child process on `127.0.0.1:0`, killed when dropped.
pub struct Server {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`, as the server printed it.
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts a server on `data_dir` with extra `args`; returns once it listens.
    pub fn start(data_dir: &std::path::Path, args: &[&str]) -> Server {
        Server::start_at(data_dir, "127.0.0.1:0", args)
    }

    /// Like [`Server::start`], on `addr` (a fixed port, so a restarted server keeps its URL).
    pub fn start_at(data_dir: &std::path::Path, addr: &str, args: &[&str]) -> Server {
        Server::start_env(data_dir, addr, args, &[])
    }

    /// Like [`Server::start_at`], with extra environment variables.
    pub fn start_env(data_dir: &std::path::Path, addr: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = bin()
            .envs(env.iter().copied())
            .args(["serve", "--addr", addr, "--data-dir"])
            .arg(data_dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn oncelog serve");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the address line");
        let url = line
            .trim()
            .strip_prefix("oncelog listening on ")
            .unwrap_or_else(|| panic!("unexpected line {line:?}"))
            .to_owned();
        Server { child, url }
    }

    /// The child's process id (for signals a test sends itself, such as SIGSTOP).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and wait for the child to be gone.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A number from `/proc/PID/status` (`VmRSS:` in kB, `Threads:`).
    fn status_field(&self, name: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("read /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} line"))
    }

    pub fn rss_bytes(&self) -> u64 {
        self.status_field("VmRSS:") * 1024
    }

    pub fn threads(&self) -> u64 {
        self.status_field("Threads:")
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.url.strip_prefix("http://").expect("http url").parse().expect("socket address")
    }
}
