//! PostgreSQL for the run: a primary and a synchronous streaming standby, each in its own
//! network namespace (`net.rs`), made and driven by `scripts/postgres` (its `PG_LISTEN` and
//! `PG_NETNS`; the standby shares the primary's CA, so one `sslrootcert` verifies both).
//!
//! Faults: a pause (SIGSTOP of every process of the primary's cluster, then SIGCONT), and a
//! failover: the primary stopped like a power cut ([`PgPair::crash_primary`]), the standby
//! promoted, the old primary's data thrown away and rebuilt as a synchronous standby of the new
//! one (so that the next failover has a standby to promote). Only processes of these two clusters are ever signalled, found by
//! their `postmaster.pid`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
#[error("scripts/postgres {command}: {reason}")]
pub struct PgError {
    command: String,
    reason: String,
}

/// One cluster: its directory, namespace and address.
struct Db {
    dir: PathBuf,
    ns: String,
    ip: Ipv4Addr,
}

pub struct PgPair {
    script: PathBuf,
    dbs: [Db; 2],
    /// Which of `dbs` is the primary now.
    primary: usize,
}

impl PgPair {
    /// The primary in `dirs[0]` (`ns[0]`, `ips[0]`), its standby in `dirs[1]`.
    pub fn start(script: &Path, dirs: [PathBuf; 2], ns: [String; 2], ips: [Ipv4Addr; 2]) -> Result<PgPair, PgError> {
        let [d0, d1] = dirs;
        let [n0, n1] = ns;
        let pair = PgPair {
            script: script.to_owned(),
            dbs: [Db { dir: d0, ns: n0, ip: ips[0] }, Db { dir: d1, ns: n1, ip: ips[1] }],
            primary: 0,
        };
        pair.script(&["start"], 0)?;
        pair.standby_of(0, 1)?;
        Ok(pair)
    }

    /// Runs `scripts/postgres ARGS... DIR(db)` with the db's address and namespace.
    fn script(&self, args: &[&str], db: usize) -> Result<String, PgError> {
        let mut all: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
        all.push(self.dbs[db].dir.as_os_str());
        self.invoke(&all, db)
    }

    /// Runs `scripts/postgres ARGS...` with the address and namespace of `db`; its stdout.
    fn invoke(&self, args: &[&std::ffi::OsStr], db: usize) -> Result<String, PgError> {
        let d = &self.dbs[db];
        let command = args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ");
        let out = Command::new(&self.script)
            .args(args)
            .env("PG_LISTEN", d.ip.to_string())
            .env("PG_NETNS", &d.ns)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| PgError { command: command.clone(), reason: e.to_string() })?;
        if !out.status.success() {
            return Err(PgError { command, reason: String::from_utf8_lossy(&out.stderr).trim().to_owned() });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Makes `db` a synchronous standby of `of` (a fresh copy) and waits until it is `sync`.
    fn standby_of(&self, of: usize, db: usize) -> Result<(), PgError> {
        let _ = std::fs::remove_dir_all(self.dbs[db].dir.join("data"));
        self.invoke(&["standby".as_ref(), self.dbs[of].dir.as_os_str(), self.dbs[db].dir.as_os_str()], db).map(drop)
    }

    fn port(&self, db: usize) -> String {
        std::fs::read_to_string(self.dbs[db].dir.join("port")).unwrap_or_default().trim().to_owned()
    }

    /// The URL the nodes use: both hosts (the one that takes writes is found by
    /// `target_session_attrs`), TLS verified against the clusters' CA, the certificate's name
    /// `localhost` checked while connecting to each namespace's address.
    pub fn url(&self) -> String {
        format!(
            "postgres://oncelog@localhost:{},localhost:{}/postgres?hostaddr={},{}&sslmode=verify-full&sslrootcert={}&target_session_attrs=read-write",
            self.port(0),
            self.port(1),
            self.dbs[0].ip,
            self.dbs[1].ip,
            self.dbs[0].dir.join("tls/ca.crt").display()
        )
    }

    /// The primary's and the standby's host names on the run's network.
    pub fn primary_and_standby(&self) -> (usize, usize) {
        (self.primary, 1 - self.primary)
    }

    /// The postmaster of `db` and every process it started.
    fn processes(&self, db: usize) -> Vec<u32> {
        let pid_file = std::fs::read_to_string(self.dbs[db].dir.join("data/postmaster.pid")).unwrap_or_default();
        let Some(postmaster) = pid_file.lines().next().and_then(|l| l.trim().parse::<u32>().ok()) else {
            return Vec::new();
        };
        let mut pids = vec![postmaster];
        // Its children: the processes whose parent (field 4 of /proc/PID/stat, after the
        // parenthesised name) is the postmaster.
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let parent = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if parent == Some(postmaster) {
                pids.push(pid);
            }
        }
        pids
    }

    /// Every process of the primary frozen for `pause` (a stalled VM), then resumed.
    pub fn pause_primary(&self, pause: Duration) {
        let pids = self.processes(self.primary);
        signal(&pids, "-STOP");
        std::thread::sleep(pause);
        signal(&pids, "-CONT");
    }

    /// The primary stopped like a power cut.
    pub fn crash_primary(&self) -> Result<(), PgError> {
        self.script(&["crash"], self.primary).map(drop)
    }

    /// After [`PgPair::crash_primary`]: the standby promoted, then the old primary rebuilt as
    /// the new one's synchronous standby.
    pub fn promote(&mut self) -> Result<(), PgError> {
        let (old, new) = self.primary_and_standby();
        self.script(&["promote"], new)?;
        self.primary = new;
        self.standby_of(new, old)
    }
}

fn signal(pids: &[u32], sig: &str) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(sig)
        .args(pids.iter().map(u32::to_string))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Drop for PgPair {
    /// Both clusters stopped, their data removed (about 150 MB a run; the server logs stay).
    fn drop(&mut self) {
        for db in 0..2 {
            let _ = self.script(&["crash"], db);
            let _ = std::fs::remove_dir_all(self.dbs[db].dir.join("data"));
        }
    }
}
