//! The servers of a run and every other process it starts: installing the peers once, one
//! fresh server (port, data directory) per run, listening on 127.0.0.1 only, and the load
//! generators, each bounded in time.
//!
//! Only processes started here are ever signalled, through their [`Child`] handles (so by the
//! PID they were started with, and never after they were reaped), and only directories created
//! here are deleted: a [`Process`] kills its process when dropped, an [`OwnedDir`] removes its
//! directory when dropped, so an error or an interruption (SIGINT, SIGTERM: see
//! [`catch_interrupts`]) leaves nothing behind.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::options::Server;
use super::{say, PeersError, PREFIX};

/// Electric's Rust server from crates.io.
pub const ELECTRIC_VERSION: &str = "0.1.5";
/// The reference Node server from npm.
pub const NODE_VERSION: &str = "0.3.7";

/// Where the binaries and the peers are, and what Oncelog is started with.
#[derive(Clone, Debug)]
pub struct Paths {
    pub cache: PathBuf,
    pub run_dir: PathBuf,
    pub oncelog_bin: PathBuf,
    pub bench_bin: PathBuf,
    pub electric_bin: PathBuf,
    pub node_prefix: PathBuf,
    pub node_launcher: PathBuf,
    /// Where each server's temporary directory is created ($TMPDIR, else /tmp).
    pub tmp: PathBuf,
    /// ONCELOG_PEERS_ONCELOG_ARGS, split into words.
    pub oncelog_extra: Vec<String>,
}

impl Paths {
    fn node_package_json(&self) -> PathBuf {
        self.node_prefix.join("node_modules/@durable-streams/server/package.json")
    }

    /// The installed Node server's version, if it is installed.
    pub fn node_installed(&self) -> Option<String> {
        let text = fs::read_to_string(self.node_package_json()).ok()?;
        package_version(&text)
    }
}

// ---------------------------------------------------------------------------------------------
// Interruption

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// SIGINT and SIGTERM only raise a flag; every wait here looks at it, stops what it waits for
/// and returns [`PeersError::Interrupted`], whose unwinding drops (so kills and deletes) what
/// the run started and created.
pub fn catch_interrupts() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(signal, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
        }
    }
}

pub fn check_interrupted() -> Result<(), PeersError> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        Err(PeersError::Interrupted)
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Processes and directories owned by the run

/// A child process of this run. Dropping it kills it (if it still runs) and reaps it.
pub struct Process {
    child: Child,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL (if still running), then reap.
    pub fn kill(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }

    /// SIGTERM, up to 10 s to exit, then SIGKILL.
    pub fn terminate(&mut self) {
        if self.alive() {
            if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
                // SAFETY: kill(2) on our own child, not yet reaped (try_wait said it runs), so
                // the PID is still ours.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
            for _ in 0..100 {
                if !self.alive() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        self.kill();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A directory this run created (`mktemp -d`); removed with everything in it when dropped.
#[derive(Debug)]
pub struct OwnedDir {
    path: PathBuf,
}

impl OwnedDir {
    /// Creates `BASE/PREFIX.XXXXXX` (mode 0700), a name that did not exist.
    pub fn create_in(base: &Path, prefix: &str) -> io::Result<OwnedDir> {
        const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut last = io::Error::other("no attempt");
        for attempt in 0..100u64 {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(attempt);
            let mut bits = hasher.finish();
            let suffix: String = (0..6)
                .map(|_| {
                    let c = CHARS[(bits % CHARS.len() as u64) as usize] as char;
                    bits /= CHARS.len() as u64;
                    c
                })
                .collect();
            let path = base.join(format!("{prefix}.{suffix}"));
            match fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(OwnedDir { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for OwnedDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// How a bounded wait ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Waited {
    /// The exit status as a shell reports it (128 + signal for a signalled process).
    Exited(i32),
    /// Still running at the limit: killed (SIGKILL) and reaped.
    TimedOut,
}

fn shell_status(status: ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}

/// Waits for `child` up to `limit` (none: as long as it takes), then kills it. Interruption
/// kills it too.
pub fn wait_bounded(child: &mut Child, limit: Option<Duration>) -> Result<Waited, PeersError> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(Waited::Exited(shell_status(status))),
            Ok(None) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(PeersError::Wait { pid: child.id(), source: e });
            }
        }
        if check_interrupted().is_err() || limit.is_some_and(|l| start.elapsed() >= l) {
            let _ = child.kill();
            let _ = child.wait();
            check_interrupted()?;
            return Ok(Waited::TimedOut);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `command` with stdout and stderr to the given files, for at most `limit`; returns its
/// exit status as `timeout --signal=KILL` did (137 when it was killed at the limit, 127 when it
/// could not be started).
pub fn run_bounded(mut command: Command, out: &Path, err: &Path, limit: Duration) -> Result<i32, PeersError> {
    let open =
        |p: &Path| File::create(p).map_err(|source| PeersError::Io { what: "cannot create", path: p.into(), source });
    command.stdin(Stdio::null()).stdout(open(out)?).stderr(open(err)?);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = fs::write(err, format!("cannot start {:?}: {e}\n", command.get_program()));
            return Ok(127);
        }
    };
    Ok(match wait_bounded(&mut child, Some(limit))? {
        Waited::Exited(code) => code,
        Waited::TimedOut => 137,
    })
}

// ---------------------------------------------------------------------------------------------
// Installing the peers

pub fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `command -v NAME`: NAME found as an executable file on PATH.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|dir| is_executable(&dir.join(name))))
}

/// Runs an installer with its output in `log`, waiting as long as it takes (or until
/// interrupted). On failure the log's last 5 lines go to stderr.
fn install_logged(mut command: Command, log: &Path) -> Result<bool, PeersError> {
    let file =
        File::create(log).map_err(|source| PeersError::Io { what: "cannot create", path: log.into(), source })?;
    let err = file.try_clone().map_err(|source| PeersError::Io { what: "cannot share", path: log.into(), source })?;
    command.stdin(Stdio::null()).stdout(file).stderr(err);
    let ok = match command.spawn() {
        Ok(mut child) => wait_bounded(&mut child, None)? == Waited::Exited(0),
        Err(e) => {
            let _ = fs::write(log, format!("cannot start {:?}: {e}\n", command.get_program()));
            false
        }
    };
    if !ok {
        eprint!("{}", tail_lines(&fs::read(log).unwrap_or_default(), 5));
    }
    Ok(ok)
}

/// Installs a peer into the cache if it is not there yet. `Ok(false)`: it cannot be used (the
/// reason was printed).
pub fn install(server: Server, paths: &Paths) -> Result<bool, PeersError> {
    match server {
        Server::Oncelog => Ok(true),
        Server::Electric => {
            if is_executable(&paths.electric_bin) {
                return Ok(true);
            }
            let root = paths.cache.join("electric");
            say(&format!("installing Electric's server (durable-streams {ELECTRIC_VERSION}) into {}", root.display()));
            let mut cargo = Command::new("cargo");
            cargo.args(["install", "--locked", "--root"]).arg(&root);
            cargo.args(["durable-streams", "--version", ELECTRIC_VERSION]);
            Ok(install_logged(cargo, &paths.run_dir.join("install-electric.log"))?
                && is_executable(&paths.electric_bin))
        }
        Server::Node => {
            if !on_path("node") {
                eprintln!("node is not installed");
                return Ok(false);
            }
            if paths.node_package_json().is_file() {
                return Ok(true);
            }
            if !on_path("npm") {
                eprintln!("npm is not installed");
                return Ok(false);
            }
            say(&format!("installing @durable-streams/server@{NODE_VERSION} into {}", paths.node_prefix.display()));
            let mut npm = Command::new("npm");
            npm.arg("install").arg("--prefix").arg(&paths.node_prefix);
            npm.arg(format!("@durable-streams/server@{NODE_VERSION}"));
            install_logged(npm, &paths.run_dir.join("install-node.log"))
        }
    }
}

/// The `"version"` of a package.json (its first such line).
pub fn package_version(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let rest = line.trim_start_matches(' ').strip_prefix("\"version\":")?;
        let rest = rest.trim_start_matches(' ').strip_prefix('"')?;
        rest.split_once('"').map(|(v, _)| v.to_string())
    })
}

// ---------------------------------------------------------------------------------------------
// One server

/// Program and arguments that start `kind` on 127.0.0.1:`port` with `data` as its data
/// directory (Oncelog also gets ONCELOG_PEERS_ONCELOG_ARGS, then `extra`).
pub fn server_command(
    kind: Server,
    paths: &Paths,
    port: u16,
    data: &Path,
    extra: &[String],
) -> (PathBuf, Vec<OsString>) {
    let port = port.to_string();
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |words: &[&str]| args.extend(words.iter().map(OsString::from));
    let program = match kind {
        Server::Oncelog => {
            push(&["serve", "--addr", &format!("127.0.0.1:{port}"), "--data-dir"]);
            args.push(data.into());
            args.extend(paths.oncelog_extra.iter().map(OsString::from));
            paths.oncelog_bin.clone()
        }
        Server::Electric => {
            push(&["--host", "127.0.0.1", "--port", &port, "--data-dir"]);
            args.push(data.into());
            args.extend(["--durability", "wal"].map(OsString::from));
            paths.electric_bin.clone()
        }
        Server::Node => {
            args.push(paths.node_launcher.clone().into());
            args.push("--prefix".into());
            args.push(paths.node_prefix.clone().into());
            args.extend(["--host", "127.0.0.1", "--port", &port, "--data-dir"].map(OsString::from));
            args.push(data.into());
            PathBuf::from("node")
        }
    };
    args.extend(extra.iter().map(OsString::from));
    (program, args)
}

/// The line each server prints on stdout once it accepts connections.
fn listening_prefix(kind: Server) -> &'static str {
    match kind {
        Server::Oncelog => "oncelog listening on ",
        Server::Electric => "durable-streams-server listening on ",
        Server::Node => "node-server listening on ",
    }
}

pub fn reports_listening(kind: Server, stdout: &str) -> bool {
    stdout.lines().any(|l| l.starts_with(listening_prefix(kind)))
}

/// Where streams live: Oncelog under `/v1/stream`, the peers take every path as a stream name.
pub fn stream_prefix(kind: Server) -> &'static str {
    match kind {
        Server::Oncelog => "/v1/stream",
        _ => "",
    }
}

/// The last `n` lines of a log.
pub fn tail_lines(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    let mut out = lines[lines.len().saturating_sub(n)..].join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// A server started for one run: a fresh port and temporary directory (data in `data/`, its
/// output in `server.out` / `server.err`).
pub struct RunningServer {
    pub kind: Server,
    pub port: u16,
    pub url: String,
    dir: OwnedDir,
    process: Option<Process>,
}

impl RunningServer {
    /// Creates the directory, picks the port and starts the server (without waiting for it).
    pub fn launch(kind: Server, paths: &Paths, extra: &[String]) -> Result<RunningServer, PeersError> {
        let dir = OwnedDir::create_in(&paths.tmp, "oncelog-peers").map_err(|source| PeersError::Io {
            what: "cannot create a directory in",
            path: paths.tmp.clone(),
            source,
        })?;
        let port = crate::port::free_port().map_err(PeersError::Port)?;
        let mut server = RunningServer { kind, port, url: format!("http://127.0.0.1:{port}"), dir, process: None };
        server.spawn(paths, extra)?;
        Ok(server)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir().join("data")
    }

    pub fn prefix(&self) -> &'static str {
        stream_prefix(self.kind)
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Process::pid)
    }

    /// Whether the server (as last started) still runs.
    pub fn alive(&mut self) -> bool {
        self.process.as_mut().is_some_and(Process::alive)
    }

    fn spawn(&mut self, paths: &Paths, extra: &[String]) -> Result<(), PeersError> {
        let (program, args) = server_command(self.kind, paths, self.port, &self.data_dir(), extra);
        let append = |name: &str| {
            let path = self.dir().join(name);
            OpenOptions::new().create(true).append(true).open(&path).map_err(|source| PeersError::Io {
                what: "cannot open",
                path: path.clone(),
                source,
            })
        };
        let (out, err) = (append("server.out")?, append("server.err")?);
        let mut log = err.try_clone().ok();
        let spawned = Command::new(&program).args(&args).stdin(Stdio::null()).stdout(out).stderr(err).spawn();
        match spawned {
            Ok(child) => self.process = Some(Process { child }),
            Err(e) => {
                // Reported as an exit during startup, with this line as its log.
                if let Some(f) = log.as_mut() {
                    use std::io::Write as _;
                    let _ = writeln!(f, "cannot start {}: {e}", program.display());
                }
                self.process = None;
            }
        }
        Ok(())
    }

    /// Waits (up to 60 s) for the "listening" line. `Ok(false)`: it exited or never listened
    /// (said on stderr).
    pub fn wait_listening(&mut self) -> Result<bool, PeersError> {
        let name = self.kind.name();
        for _ in 0..600 {
            check_interrupted()?;
            if fs::read_to_string(self.dir().join("server.out")).is_ok_and(|out| reports_listening(self.kind, &out)) {
                return Ok(true);
            }
            if !self.alive() {
                eprintln!("{PREFIX}: {name} exited during startup:");
                eprint!("{}", tail_lines(&fs::read(self.dir().join("server.err")).unwrap_or_default(), 20));
                self.process = None;
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("{PREFIX}: {name} did not report listening within 60 s");
        Ok(false)
    }

    /// SIGKILL (a simulated crash); the directory stays.
    pub fn crash(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// Starts the server again on the same port and data directory (after [`Self::crash`]).
    pub fn relaunch(&mut self, paths: &Paths) -> Result<(), PeersError> {
        self.crash();
        self.spawn(paths, &[])
    }

    /// Stops the server (SIGTERM, SIGKILL after 10 s), keeps its output as `TAG.server.out` /
    /// `TAG.server.err`, deletes its directory.
    pub fn stop(mut self, tag: &Path) {
        if let Some(mut p) = self.process.take() {
            p.terminate();
        }
        for name in ["server.out", "server.err"] {
            let _ = fs::copy(self.dir().join(name), with_suffix(tag, name));
        }
        // Dropping `self` removes the directory.
    }
}

/// `TAG.SUFFIX` (the run's log names: `s1.oncelog.r1.server.err`).
pub fn with_suffix(tag: &Path, suffix: &str) -> PathBuf {
    let mut name = tag.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

// ---------------------------------------------------------------------------------------------
// What a server uses

/// VmRSS of a process in MB (10^6 bytes), rounded.
pub fn rss_mb(pid: u32) -> Option<String> {
    rss_mb_of_status(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

fn rss_mb_of_status(status: &str) -> Option<String> {
    let kb: f64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
    Some(format!("{:.0}", kb * 1024.0 / 1e6))
}

/// Space available to unprivileged users on the filesystem of `path`, in KiB (`df -Pk`).
pub fn free_kb(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain data; all zeros is a valid value.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a statvfs struct to fill.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    let (available, fragment): (u64, u64) = (stat.f_bavail, stat.f_frsize);
    Some(available.saturating_mul(fragment) / 1024)
}

/// `du -sm PATH`: disk usage in MiB, rounded up.
pub fn du_mb(path: &Path) -> Option<String> {
    let out = Command::new("du").arg("-sm").arg(path).stderr(Stdio::null()).output().ok()?;
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths() -> Paths {
        Paths {
            cache: "/c".into(),
            run_dir: "/c/runs/x".into(),
            oncelog_bin: "/t/release/oncelog".into(),
            bench_bin: "/t/release/oncelog-bench".into(),
            electric_bin: "/c/electric/bin/durable-streams-server".into(),
            node_prefix: "/c/node-server".into(),
            node_launcher: "/r/scripts/peers/node-server.mjs".into(),
            tmp: std::env::temp_dir(),
            oncelog_extra: vec!["--hot-tail-mb".into(), "0".into()],
        }
    }

    fn words(v: &[OsString]) -> Vec<&str> {
        v.iter().map(|w| w.to_str().unwrap()).collect()
    }

    #[test]
    fn servers_listen_on_loopback_only() {
        let p = paths();
        let extra = ["--max-read-bytes".to_string(), "8".to_string()];
        let (prog, args) = server_command(Server::Oncelog, &p, 4242, Path::new("/d/data"), &extra);
        assert_eq!(prog, PathBuf::from("/t/release/oncelog"));
        assert_eq!(
            words(&args),
            [
                "serve",
                "--addr",
                "127.0.0.1:4242",
                "--data-dir",
                "/d/data",
                "--hot-tail-mb",
                "0",
                "--max-read-bytes",
                "8"
            ]
        );
        let (prog, args) = server_command(Server::Electric, &p, 7, Path::new("/d/data"), &[]);
        assert_eq!(prog, PathBuf::from("/c/electric/bin/durable-streams-server"));
        assert_eq!(
            words(&args),
            ["--host", "127.0.0.1", "--port", "7", "--data-dir", "/d/data", "--durability", "wal"]
        );
        let (prog, args) = server_command(Server::Node, &p, 7, Path::new("/d/data"), &[]);
        assert_eq!(prog, PathBuf::from("node"));
        assert_eq!(
            words(&args),
            [
                "/r/scripts/peers/node-server.mjs",
                "--prefix",
                "/c/node-server",
                "--host",
                "127.0.0.1",
                "--port",
                "7",
                "--data-dir",
                "/d/data"
            ]
        );
    }

    #[test]
    fn listening_lines() {
        assert!(reports_listening(Server::Oncelog, "x\noncelog listening on http://127.0.0.1:1\n"));
        assert!(!reports_listening(Server::Oncelog, " oncelog listening on http://127.0.0.1:1\n"));
        assert!(!reports_listening(Server::Electric, "oncelog listening on http://127.0.0.1:1\n"));
        assert!(reports_listening(Server::Electric, "durable-streams-server listening on 127.0.0.1:1"));
        assert!(reports_listening(Server::Node, "node-server listening on http://127.0.0.1:1\n"));
        assert_eq!(stream_prefix(Server::Oncelog), "/v1/stream");
        assert_eq!(stream_prefix(Server::Node), "");
    }

    #[test]
    fn small_parsers() {
        let status = "Name:\toncelog\nVmPeak:\t  99999 kB\nVmRSS:\t   17090 kB\nThreads: 9\n";
        assert_eq!(rss_mb_of_status(status).as_deref(), Some("18"));
        assert_eq!(rss_mb_of_status("VmRSS:\t 29000 kB").as_deref(), Some("30"));
        assert_eq!(rss_mb_of_status("Name: x\n"), None);
        let pkg =
            "{\n  \"name\": \"@durable-streams/server\",\n  \"version\": \"0.3.7\",\n  \"x\": {\"version\": \"9\"}\n}";
        assert_eq!(package_version(pkg).as_deref(), Some("0.3.7"));
        assert_eq!(package_version("{}"), None);
        assert_eq!(tail_lines(b"a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(tail_lines(b"", 2), "");
        assert_eq!(
            with_suffix(Path::new("/r/s1.oncelog.r1"), "server.err"),
            PathBuf::from("/r/s1.oncelog.r1.server.err")
        );
    }

    #[test]
    fn owned_dirs_are_removed_when_dropped() {
        let dir = OwnedDir::create_in(&std::env::temp_dir(), "oncelog-peers-test").unwrap();
        let path = dir.path().to_path_buf();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        assert!(name.starts_with("oncelog-peers-test.") && name.len() == "oncelog-peers-test.".len() + 6);
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o700);
        fs::write(path.join("f"), b"x").unwrap();
        let other = OwnedDir::create_in(&std::env::temp_dir(), "oncelog-peers-test").unwrap();
        assert_ne!(other.path(), path);
        drop(dir);
        assert!(!path.exists());
        assert!(other.path().exists());
    }

    #[test]
    fn runs_are_bounded_in_time() {
        let dir = OwnedDir::create_in(&std::env::temp_dir(), "oncelog-peers-test").unwrap();
        let (out, err) = (dir.path().join("o"), dir.path().join("e"));
        let mut sleep = Command::new("sleep");
        sleep.arg("30");
        let start = Instant::now();
        assert_eq!(run_bounded(sleep, &out, &err, Duration::from_millis(200)).unwrap(), 137);
        assert!(start.elapsed() < Duration::from_secs(10));
        let mut sh = Command::new("sh");
        sh.args(["-c", "echo hi; echo oops >&2; exit 3"]);
        assert_eq!(run_bounded(sh, &out, &err, Duration::from_secs(20)).unwrap(), 3);
        assert_eq!(fs::read_to_string(&out).unwrap(), "hi\n");
        assert_eq!(fs::read_to_string(&err).unwrap(), "oops\n");
        let missing = Command::new("/nonexistent/oncelog-peers-test");
        assert_eq!(run_bounded(missing, &out, &err, Duration::from_secs(1)).unwrap(), 127);
    }

    #[test]
    fn dropping_a_process_kills_it() {
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let mut p = Process { child };
        assert!(p.alive());
        drop(p);
        // Reaped: no /proc entry left for it (unless the PID was reused at once).
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(!stat.contains("(sleep)"), "{stat}");
    }
}
