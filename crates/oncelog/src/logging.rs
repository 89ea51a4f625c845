//! Where `oncelog` sets up its log (stderr): `--log-level` and `--log-format` for the commands
//! that run unattended (`serve`, `sink`, `backup`), and quiet text for the client commands.
//!
//! `RUST_LOG`, when set, wins over `--log-level`: its directives can set levels per module
//! (`RUST_LOG=info,oncelog_postgres=debug`), which one level cannot. One that does not parse is
//! ignored, with a warning, rather than stopping a server over its log settings.

use tracing_subscriber::EnvFilter;

/// How much is logged, least severe last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl Level {
    fn directive(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        }
    }
}

/// How each event is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One human-readable line per event (timestamp, level, target, message, fields).
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the event's
    /// fields at the top level (for log shippers).
    Json,
}

/// The log flags of `serve`, `sink` and `backup`.
#[derive(Clone, Debug, clap::Args)]
pub struct LogArgs {
    /// Least severe events logged: error, warn, info, debug or trace. RUST_LOG, when set, takes
    /// precedence (it can set levels per module).
    #[arg(long, env = "ONCELOG_LOG_LEVEL", value_enum, default_value = "info")]
    pub log_level: Level,
    /// How events are written to stderr: text (one line each) or json (one JSON object per line).
    #[arg(long, env = "ONCELOG_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: Format,
}

impl LogArgs {
    /// What the client commands use: errors only, as text (their output is on stdout).
    pub const QUIET: LogArgs = LogArgs { log_level: Level::Error, log_format: Format::Text };
}

/// Installs the process's subscriber, writing to stderr.
pub fn init(args: &LogArgs) {
    let env = std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty());
    let (filter, ignored) = match env.as_deref().map(EnvFilter::try_new) {
        Some(Ok(f)) => (f, None),
        Some(Err(e)) => (EnvFilter::new(args.log_level.directive()), Some(e)),
        None => (EnvFilter::new(args.log_level.directive()), None),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match args.log_format {
        Format::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        // No colour codes inside JSON strings; `flatten_event` puts `message` and the fields at
        // the top level, where log shippers look for them.
        Format::Json => builder.json().flatten_event(true).with_ansi(false).init(),
    }
    if let Some(e) = ignored {
        tracing::warn!(error = %e, "RUST_LOG ignored: it does not parse; --log-level applies");
    }
}
