//! The nodes under test: `oncelog serve` processes started, SIGKILLed, paused and restarted on
//! the same address by this process (and ended by their PIDs only) — on the log engine with its
//! data directory on a small tmpfs of the run's own when the run may mount one (root), so that
//! the disk can be filled; on PostgreSQL each in a network namespace of the run's own, and
//! restarted at times under a skewed wall clock (`skew.rs`).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Why the node could not be (re)started.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot start {bin}: {source}")]
    Spawn { bin: String, source: std::io::Error },
    #[error("the node exited before it listened (see {log})")]
    NoListen { log: String },
}

/// How to run one node.
pub struct NodeSpec {
    pub bin: PathBuf,
    /// The storage arguments (`--data-dir DIR`, or `--storage URL --pg-schema S`).
    pub storage: Vec<OsString>,
    /// The address it listens on: 127.0.0.1, or its namespace's.
    pub ip: Ipv4Addr,
    /// Its network namespace, if any.
    pub netns: Option<String>,
    /// Where its stderr goes (appended across restarts).
    pub log: PathBuf,
    /// The clock-skew library (`skew.rs`), when the run may skew this node's clock.
    pub skew_lib: Option<PathBuf>,
    /// Environment variables it gets besides the run's own (the bucket's `AWS_*`).
    pub env: Vec<(&'static str, String)>,
}

pub struct Node {
    spec: NodeSpec,
    pub port: u16,
    /// The wall-clock offset it runs under now, in milliseconds.
    pub skew_ms: i64,
    child: Option<Child>,
}

impl Node {
    /// Starts a node; returns once it listens.
    pub fn start(spec: NodeSpec) -> Result<Node, NodeError> {
        // In a namespace of its own any port is free; on loopback a free one, kept across
        // restarts so that clients keep the node's URL.
        let port = match spec.netns {
            Some(_) => 4080,
            None => std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|source| NodeError::Spawn { bin: spec.bin.display().to_string(), source })?,
        };
        let mut node = Node { spec, port, skew_ms: 0, child: None };
        node.launch()?;
        Ok(node)
    }

    pub fn url(&self) -> String {
        format!("http://{}:{}", self.spec.ip, self.port)
    }

    fn launch(&mut self) -> Result<(), NodeError> {
        let spec = &self.spec;
        let spawn = |source| NodeError::Spawn { bin: spec.bin.display().to_string(), source };
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&spec.log).map_err(spawn)?;
        let mut cmd = match &spec.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&spec.bin);
                c
            }
            None => Command::new(&spec.bin),
        };
        cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
        if let (Some(lib), true) = (&spec.skew_lib, self.skew_ms != 0) {
            cmd.env("LD_PRELOAD", lib).env("ONCELOG_SKEW_MS", self.skew_ms.to_string());
        }
        let mut child = cmd
            .args(["serve", "--addr", &format!("{}:{}", spec.ip, self.port)])
            .args(&spec.storage)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(spawn)?;
        let mut line = String::new();
        let out = child.stdout.take();
        let listening = out.is_some_and(|o| {
            BufReader::new(o).read_line(&mut line).is_ok() && line.starts_with("oncelog listening on ")
        });
        self.child = Some(child);
        if !listening {
            self.kill9();
            return Err(NodeError::NoListen { log: self.spec.log.display().to_string() });
        }
        Ok(())
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP for `pause`, then SIGCONT (a GC pause, a VM migration): the process keeps its
    /// connections and its state, and answers late.
    pub fn pause(&mut self, pause: std::time::Duration) {
        let Some(pid) = self.child.as_ref().map(Child::id) else { return };
        let signal = |sig: &str| {
            let _ =
                Command::new("kill").args([sig, &pid.to_string()]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        };
        signal("-STOP");
        std::thread::sleep(pause);
        signal("-CONT");
    }

    pub fn restart(&mut self) -> Result<(), NodeError> {
        self.kill9();
        // The port was just released by a killed process; a restart may race the kernel for it.
        let mut last = None;
        for _ in 0..50 {
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Err(last.unwrap_or(NodeError::NoListen { log: self.spec.log.display().to_string() }))
    }

    /// Restarted with its wall clock `skew_ms` off (0: the true time again).
    pub fn restart_skewed(&mut self, skew_ms: i64) -> Result<(), NodeError> {
        self.skew_ms = skew_ms;
        self.restart()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A tmpfs mounted by the run for the node's data (unmounted when dropped), and the filler file
/// that makes it full.
pub struct SmallDisk {
    dir: PathBuf,
    filler: PathBuf,
}

impl SmallDisk {
    /// Mounts a tmpfs of `mib` MiB at `dir`; `None` when this process may not mount (not root).
    pub fn mount(dir: &Path, mib: u64) -> Option<SmallDisk> {
        std::fs::create_dir_all(dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| SmallDisk { dir: dir.to_owned(), filler: dir.join("filler") })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes the filler until the disk refuses more (ENOSPC).
    pub fn fill(&self) {
        use std::io::Write;
        let Ok(mut f) = std::fs::File::create(&self.filler) else { return };
        let chunk = vec![0u8; 1 << 20];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.flush();
    }

    pub fn free(&self) {
        let _ = std::fs::remove_file(&self.filler);
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}
