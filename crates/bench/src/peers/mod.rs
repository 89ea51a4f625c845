//! `oncelog-bench peers` (what `scripts/bench-peers` runs): Oncelog side by side with two peer
//! servers in one run on this machine, servers alternating, written as a markdown table of
//! medians with Oncelog/Electric ratios and an SVG chart of the headline figures.
//!
//! * [`options`]: the options and their checks.
//! * [`servers`]: installing the peers, one fresh server per run, bounded child processes.
//! * [`scenarios`]: which generator each scenario runs and what it records.
//! * [`stats`]: recorded values, medians, rounding, ratios.
//! * [`report`]: the markdown file and the chart.
//!
//! For every scenario, round and server (in that nesting, so servers alternate within each
//! round), a fresh server with a fresh data directory is started, the generator runs against
//! it, and the server is stopped and its directory deleted; only its logs are kept, in the run
//! directory.

mod clock;
mod options;
mod report;
mod scenarios;
mod servers;
mod stats;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

pub use options::PeersArgs;

use clock::Utc;
use options::{Config, OptionsError, Server};
use report::{Header, Skipped};
use servers::{Paths, RunningServer};
use stats::Results;

/// How messages of this command begin.
const PREFIX: &str = "oncelog-bench peers";

/// Environment and notes printed after the options by `--help`.
pub const AFTER_HELP: &str = "\
Environment:
  ONCELOG_PEERS_CACHE           where the peers are installed, once (default
                                ${XDG_CACHE_HOME:-$HOME/.cache}/oncelog-peers); logs of each run
                                go to $CACHE/runs/<time>/
  ONCELOG_PEERS_ONCELOG_ARGS    extra `oncelog serve` arguments, passed through as words
                                (e.g. \"--hot-tail-mb 0\")
  ONCELOG_PEERS_MAX_READ_BYTES  Oncelog --max-read-bytes for the catch-up scenarios (default
                                empty = the server's default, what a reader gets out of the box)
  CARGO_TARGET_DIR              where the release binaries are built / looked for
  TMPDIR                        where the servers' temporary data directories are created

Peers: Electric's Rust server (crates.io durable-streams 0.1.5, `--durability wal`) and the
reference Node server (npm @durable-streams/server 0.3.7, file-backed, started by
scripts/peers/node-server.mjs). A peer that fails to install or start is reported and skipped.
Every scenario runs on a fresh server with a fresh data directory, on 127.0.0.1. Only processes
this command started are ever signalled (by their PIDs) and only directories it created are
deleted. Run by hand; never part of scripts/test.";

/// What ends a run.
#[derive(Debug, thiserror::Error)]
pub enum PeersError {
    /// A bad option.
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// SIGINT or SIGTERM.
    #[error("interrupted")]
    Interrupted,
    #[error("{what} {}: {source}", path.display())]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("HOME is not set")]
    NoHome,
    #[error("ONCELOG_PEERS_CACHE must be outside the repository")]
    CacheInRepository,
    #[error("no current directory: {0}")]
    NoCurrentDir(std::io::Error),
    #[error("Oncelog failed to start (logs: {})", log.display())]
    OncelogDidNotStart { log: PathBuf },
    #[error(
        "missing {} (build failed? try without --no-build, or build it: cargo build --release -p oncelog -p oncelog-bench)",
        bin.display()
    )]
    MissingBinary { bin: PathBuf },
    #[error("cannot wait for process {pid}: {source}")]
    Wait { pid: u32, source: std::io::Error },
    #[error("no free port: {0}")]
    Port(std::io::Error),
}

fn say(text: &str) {
    eprintln!("== {text}");
}

/// Runs the command; the exit status is 1 on an error, 130 when interrupted.
pub fn run(args: PeersArgs) -> ExitCode {
    servers::catch_interrupts();
    match run_checked(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(PeersError::Interrupted) => {
            eprintln!("{PREFIX}: interrupted; the servers it started were stopped, their directories deleted");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("{PREFIX}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// An environment variable, empty counting as unset (as `${VAR:-default}`).
fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where the peers are installed and the runs logged: ONCELOG_PEERS_CACHE, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/oncelog-peers`; refused inside the repository.
fn cache_dir(env: impl Fn(&str) -> Option<String>, cwd: &Path, root: &Path) -> Result<PathBuf, PeersError> {
    let cache = match env("ONCELOG_PEERS_CACHE") {
        Some(c) => PathBuf::from(c),
        None => {
            let base = match env("XDG_CACHE_HOME") {
                Some(x) => PathBuf::from(x),
                None => PathBuf::from(env("HOME").ok_or(PeersError::NoHome)?).join(".cache"),
            };
            base.join("oncelog-peers")
        }
    };
    let cache = cwd.join(cache);
    if cache.starts_with(root) {
        return Err(PeersError::CacheInRepository);
    }
    Ok(cache)
}

/// A command line as a shell reads it back: words of plain characters as they are, others in
/// single quotes.
fn quoted_command_line(words: &[String]) -> String {
    let plain = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b"_./,:=+@%-".contains(&b));
    words
        .iter()
        .map(|w| if plain(w) { w.clone() } else { format!("'{}'", w.replace('\'', r"'\''")) })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first line of a command's stdout (`None` if it cannot run or says nothing).
fn first_line_of(program: &str, args: &[&str], dir: &Path) -> Option<String> {
    let out =
        Command::new(program).args(args).current_dir(dir).stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).lines().next().map(|l| l.trim().to_string()).filter(|l| !l.is_empty())
}

fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// The SVG's path: the result file without `.md`, plus `.svg`.
fn svg_path(out: &Path) -> PathBuf {
    let text = out.as_os_str().to_string_lossy();
    PathBuf::from(format!("{}.svg", text.strip_suffix(".md").unwrap_or(&text)))
}

fn fatal_io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> PeersError + 'a {
    move |source| PeersError::Io { what, path: path.to_path_buf(), source }
}

/// A run in progress: what it was asked, where things are, what it found.
struct Run {
    cfg: Config,
    paths: Paths,
    max_read_bytes: Option<String>,
    results: Results,
    skipped: Skipped,
}

impl Run {
    /// One scenario, one round, one server: a fresh server, the scenario, the server stopped.
    fn scenario(&mut self, scenario: options::Scenario, server: Server, round: u64) -> Result<(), PeersError> {
        let tag = self.paths.run_dir.join(format!("{}.{}.r{round}", scenario.name(), server.name()));
        let extra: Vec<String> = match (&self.max_read_bytes, server) {
            (Some(bytes), Server::Oncelog) if scenario.is_catchup() => vec!["--max-read-bytes".into(), bytes.clone()],
            _ => Vec::new(),
        };
        eprintln!(
            "== {} {} round {round}: {} (load {})",
            Utc::now().time_of_day(),
            scenario.name(),
            server.name(),
            load_average()
        );
        let mut running = RunningServer::launch(server, &self.paths, &extra)?;
        if !running.wait_listening()? {
            running.stop(&tag);
            let log = servers::with_suffix(&tag, "server.err");
            if server == Server::Oncelog {
                return Err(PeersError::OncelogDidNotStart { log });
            }
            self.skipped.insert(server, format!("failed to start (logs: {})", log.display()));
            return Ok(());
        }
        let mut scene = scenarios::Scene {
            scenario,
            server: &mut running,
            cfg: &self.cfg,
            paths: &self.paths,
            results: &mut self.results,
            tag: tag.clone(),
            round,
        };
        scene.run()?;
        if scene.server.pid().is_some() && !scene.server.alive() {
            scene.note("server exited during the run");
        }
        running.stop(&tag);
        Ok(())
    }
}

fn run_checked(args: PeersArgs) -> Result<(), PeersError> {
    let cfg = args.validate()?;
    let cwd = std::env::current_dir().map_err(PeersError::NoCurrentDir)?;
    let root = args.repo_root.as_ref().map_or_else(|| cwd.clone(), |r| cwd.join(r));
    let cache = cache_dir(env_nonempty, &cwd, &root)?;
    let started = Utc::now();
    let stamp = started.stamp();
    let run_dir = cache.join("runs").join(&stamp);
    std::fs::create_dir_all(&run_dir).map_err(fatal_io("cannot create", &run_dir))?;
    let results_dir = cache.join("results");
    std::fs::create_dir_all(&results_dir).map_err(fatal_io("cannot create", &results_dir))?;
    let out_file = cfg.out.clone().unwrap_or_else(|| results_dir.join(format!("peers-{stamp}.md")));
    let svg_file = svg_path(&out_file);
    if let Some(parent) = out_file.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(fatal_io("cannot create", parent))?;
    }

    let target_dir = env_nonempty("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let paths = Paths {
        oncelog_bin: target_dir.join("release/oncelog"),
        bench_bin: target_dir.join("release/oncelog-bench"),
        electric_bin: cache.join("electric/bin/durable-streams-server"),
        node_prefix: cache.join("node-server"),
        node_launcher: root.join("scripts/peers/node-server.mjs"),
        tmp: env_nonempty("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from),
        oncelog_extra: std::env::var("ONCELOG_PEERS_ONCELOG_ARGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        cache: cache.clone(),
        run_dir: run_dir.clone(),
    };
    for bin in [&paths.oncelog_bin, &paths.bench_bin] {
        if !servers::is_executable(bin) {
            return Err(PeersError::MissingBinary { bin: bin.to_path_buf() });
        }
    }
    let load_before = load_average();

    let mut run = Run {
        cfg,
        paths,
        max_read_bytes: env_nonempty("ONCELOG_PEERS_MAX_READ_BYTES"),
        results: Results::default(),
        skipped: Skipped::new(),
    };
    for server in run.cfg.servers.clone() {
        let log = match server {
            Server::Oncelog => continue,
            Server::Electric => "install-electric.log",
            Server::Node => "install-node.log",
        };
        if !servers::install(server, &run.paths)? {
            run.skipped.insert(server, format!("install failed (see {})", run_dir.join(log).display()));
        }
    }

    say(&format!("peers cache {}; logs in {}", cache.display(), run_dir.display()));
    for scenario in run.cfg.scenarios.clone() {
        for round in 1..=run.cfg.rounds {
            for server in run.cfg.servers.clone() {
                if !run.skipped.contains_key(&server) {
                    run.scenario(scenario, server, round)?;
                }
            }
        }
    }

    let git_head = first_line_of("git", &["rev-parse", "--short=12", "HEAD"], &root).unwrap_or("unknown".into());
    let header = Header {
        when: Utc::now().minute_utc(),
        stamp: stamp.clone(),
        command_line: args
            .command_line
            .clone()
            .unwrap_or_else(|| quoted_command_line(&std::env::args().collect::<Vec<_>>())),
        git_dirty: first_line_of("git", &["status", "--porcelain"], &root).is_some(),
        git_head: git_head.clone(),
        cpus: first_line_of("nproc", &[], &root)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or("?".into(), |n| n.to_string())),
        kernel: first_line_of("uname", &["-sr"], &root).unwrap_or("?".into()),
        load_before,
        target_dir: target_dir.display().to_string(),
        oncelog_extra: run.paths.oncelog_extra.clone(),
        max_read_bytes: run.max_read_bytes.clone(),
        node_installed: run.paths.node_installed(),
        node_runtime: if run.cfg.servers.contains(&Server::Node) {
            first_line_of("node", &["--version"], &root)
        } else {
            None
        },
        run_dir: run_dir.display().to_string(),
    };
    let markdown = report::markdown(&header, &run.cfg, &run.results, &run.skipped);
    std::fs::write(&out_file, &markdown).map_err(fatal_io("cannot write", &out_file))?;
    let chart = report::svg(&header, &run.cfg, &run.results);
    if let Some(svg) = &chart {
        std::fs::write(&svg_file, svg).map_err(fatal_io("cannot write", &svg_file))?;
    }
    print!("{markdown}");
    eprintln!();
    say(&format!("written: {}", out_file.display()));
    if chart.is_some() {
        say(&format!("chart:   {}", svg_file.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_chosen_and_kept_out_of_the_repository() {
        let root = Path::new("/work/main");
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        let cwd = Path::new("/work/main");
        let all = env(&[("ONCELOG_PEERS_CACHE", "/c/peers"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]);
        assert_eq!(cache_dir(all, cwd, root).unwrap(), PathBuf::from("/c/peers"));
        let xdg = env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]);
        assert_eq!(cache_dir(xdg, cwd, root).unwrap(), PathBuf::from("/x/oncelog-peers"));
        let home = env(&[("HOME", "/h")]);
        assert_eq!(cache_dir(home, cwd, root).unwrap(), PathBuf::from("/h/.cache/oncelog-peers"));
        assert!(cache_dir(env(&[]), cwd, root).is_err());
        let inside = env(&[("ONCELOG_PEERS_CACHE", "/work/main/cache")]);
        assert!(matches!(cache_dir(inside, cwd, root), Err(PeersError::CacheInRepository)));
        assert!(cache_dir(env(&[("ONCELOG_PEERS_CACHE", "/work/main")]), cwd, root).is_err());
        // Relative to the current directory, which is the repository here.
        assert!(cache_dir(env(&[("ONCELOG_PEERS_CACHE", "cache")]), cwd, root).is_err());
        // A sibling whose name only starts like the repository's is outside it.
        let sibling = env(&[("ONCELOG_PEERS_CACHE", "/work/main-cache")]);
        assert_eq!(cache_dir(sibling, cwd, root).unwrap(), PathBuf::from("/work/main-cache"));
    }

    #[test]
    fn command_lines_are_quoted_only_where_needed() {
        let words: Vec<String> =
            ["oncelog-bench", "peers", "--servers", "oncelog,electric", "--out", "/tmp/a b.md", "--x", "it's", ""]
                .map(String::from)
                .to_vec();
        assert_eq!(
            quoted_command_line(&words),
            r"oncelog-bench peers --servers oncelog,electric --out '/tmp/a b.md' --x 'it'\''s' ''"
        );
    }

    #[test]
    fn the_chart_sits_next_to_the_file() {
        assert_eq!(svg_path(Path::new("/tmp/peers.md")), PathBuf::from("/tmp/peers.svg"));
        assert_eq!(svg_path(Path::new("/tmp/peers.txt")), PathBuf::from("/tmp/peers.txt.svg"));
        assert_eq!(svg_path(Path::new("docs/bench/x.md")), PathBuf::from("docs/bench/x.svg"));
    }
}
