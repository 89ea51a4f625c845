//! The options of `oncelog-bench peers` (those `scripts/bench-peers` always had), and their
//! validation into a [`Config`]. Values are taken as text and checked here, so a bad value gets
//! the same message it always got (`--rounds must be a whole number (got 'x')`).

use std::path::PathBuf;

/// Every scenario in table order (`--scenarios` default).
pub const DEFAULT_SCENARIOS: &str =
    "s1,s1wide,inflight1,inflight5,sse200,sse1000,sse5000,longpoll50,catchup4k,catchup64k,catchup1m,streams,recovery";
pub const DEFAULT_SERVERS: &str = "oncelog,electric,node";

/// The servers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Server {
    Oncelog,
    Electric,
    Node,
}

impl Server {
    pub fn name(self) -> &'static str {
        match self {
            Server::Oncelog => "oncelog",
            Server::Electric => "electric",
            Server::Node => "node",
        }
    }

    fn parse(word: &str) -> Option<Server> {
        [Server::Oncelog, Server::Electric, Server::Node].into_iter().find(|s| s.name() == word)
    }
}

/// The load scenarios, in table order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scenario {
    S1,
    S1Wide,
    Inflight1,
    Inflight5,
    Sse200,
    Sse1000,
    Sse5000,
    Longpoll50,
    Catchup4k,
    Catchup64k,
    Catchup1m,
    Streams,
    Recovery,
}

impl Scenario {
    pub const ALL: [Scenario; 13] = [
        Scenario::S1,
        Scenario::S1Wide,
        Scenario::Inflight1,
        Scenario::Inflight5,
        Scenario::Sse200,
        Scenario::Sse1000,
        Scenario::Sse5000,
        Scenario::Longpoll50,
        Scenario::Catchup4k,
        Scenario::Catchup64k,
        Scenario::Catchup1m,
        Scenario::Streams,
        Scenario::Recovery,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::S1 => "s1",
            Scenario::S1Wide => "s1wide",
            Scenario::Inflight1 => "inflight1",
            Scenario::Inflight5 => "inflight5",
            Scenario::Sse200 => "sse200",
            Scenario::Sse1000 => "sse1000",
            Scenario::Sse5000 => "sse5000",
            Scenario::Longpoll50 => "longpoll50",
            Scenario::Catchup4k => "catchup4k",
            Scenario::Catchup64k => "catchup64k",
            Scenario::Catchup1m => "catchup1m",
            Scenario::Streams => "streams",
            Scenario::Recovery => "recovery",
        }
    }

    pub fn is_catchup(self) -> bool {
        matches!(self, Scenario::Catchup4k | Scenario::Catchup64k | Scenario::Catchup1m)
    }

    fn parse(word: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == word)
    }
}

/// `oncelog-bench peers` options, as `scripts/bench-peers` takes them. Numbers are read as text
/// and checked by [`PeersArgs::validate`].
#[derive(clap::Args, Debug, Clone)]
pub struct PeersArgs {
    /// Which servers, in this order (oncelog, electric, node).
    #[arg(long, value_name = "LIST", default_value = DEFAULT_SERVERS, allow_hyphen_values = true)]
    pub servers: String,
    /// Which scenarios (default: all, in this order): s1, s1wide, inflight1, inflight5, sse200,
    /// sse1000, sse5000, longpoll50, catchup4k, catchup64k, catchup1m, streams, recovery
    /// (catchup = the three catch-up sizes).
    #[arg(long, value_name = "LIST", default_value = DEFAULT_SCENARIOS, hide_default_value = true, allow_hyphen_values = true)]
    pub scenarios: String,
    /// Run every scenario N times per server, report medians.
    #[arg(long, value_name = "N", default_value = "1", allow_hyphen_values = true)]
    pub rounds: String,
    /// Measured seconds of s1/inflight/sse/longpoll (at least 2).
    #[arg(long, value_name = "S", default_value = "20", allow_hyphen_values = true)]
    pub duration: String,
    /// Warm-up seconds before s1/inflight are measured.
    #[arg(long, value_name = "S", default_value = "3", allow_hyphen_values = true)]
    pub warmup: String,
    /// The live scenarios' writer rate, messages/s; 0 = closed loop.
    #[arg(long, value_name = "N", default_value = "100", allow_hyphen_values = true)]
    pub sse_rate: String,
    /// Streams in the many-streams scenario (e.g. 1000000).
    #[arg(long, value_name = "N", default_value = "20000", allow_hyphen_values = true)]
    pub streams_count: String,
    /// Size of the catch-up stream, MB.
    #[arg(long, value_name = "N", default_value = "500", allow_hyphen_values = true)]
    pub catchup_mb: String,
    /// Data written before the SIGKILL of the recovery scenario, GB (decimal allowed); skipped
    /// if the disk has less than 3x that free.
    #[arg(long, value_name = "G", default_value = "1", allow_hyphen_values = true)]
    pub recovery_gb: String,
    /// Markdown result file (default $CACHE/results/peers-<time>.md); an SVG chart of the
    /// headline figures is written next to it (FILE without .md, plus .svg).
    #[arg(long, value_name = "FILE", allow_hyphen_values = true)]
    pub out: Option<String>,
    /// Do not run cargo build (use the existing release binaries). `scripts/bench-peers` builds
    /// them first unless this is given; `oncelog-bench peers` itself never builds.
    #[arg(long)]
    pub no_build: bool,
    /// The command line to record in the result file (`scripts/bench-peers` passes what was
    /// typed); default: this process's own arguments.
    #[arg(long, hide = true)]
    pub command_line: Option<String>,
    /// The repository root (for the default target dir, the Node launcher and `git`); default:
    /// the current directory.
    #[arg(long, hide = true)]
    pub repo_root: Option<PathBuf>,
}

/// What a run does, once the options are checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub servers: Vec<Server>,
    pub scenarios: Vec<Scenario>,
    pub rounds: u64,
    pub duration: u64,
    pub warmup: u64,
    pub sse_rate: u64,
    pub streams_count: u64,
    pub catchup_mb: u64,
    /// As typed (it is quoted so in the table's row names).
    pub recovery_gb: String,
    /// `recovery_gb` in MB, rounded down.
    pub recovery_mb: u64,
    pub out: Option<PathBuf>,
    pub no_build: bool,
}

impl Config {
    pub fn selected(&self, scenario: Scenario) -> bool {
        self.scenarios.contains(&scenario)
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum OptionsError {
    NeedsValue(&'static str),
    NotWhole { flag: &'static str, got: String },
    OutOfRange,
    NotDecimal(String),
    RecoveryTooSmall,
    UnknownServer(String),
    UnknownScenario(String),
    NothingSelected,
}

impl std::fmt::Display for OptionsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OptionsError::NeedsValue(flag) => write!(f, "{flag} needs a value"),
            OptionsError::NotWhole { flag, got } => write!(f, "{flag} must be a whole number (got '{got}')"),
            OptionsError::OutOfRange => {
                f.write_str("--rounds, --streams-count and --catchup-mb must be >= 1, --duration >= 2")
            }
            OptionsError::NotDecimal(got) => write!(f, "--recovery-gb must be a number (got '{got}')"),
            OptionsError::RecoveryTooSmall => f.write_str("--recovery-gb is too small"),
            OptionsError::UnknownServer(s) => write!(f, "unknown server '{s}' (oncelog, electric, node)"),
            OptionsError::UnknownScenario(s) => write!(f, "unknown scenario '{s}'"),
            OptionsError::NothingSelected => f.write_str("no server or no scenario selected"),
        }
    }
}

impl std::error::Error for OptionsError {}

impl PeersArgs {
    /// Checks every option, in the order the script did (so the first error is the same).
    pub fn validate(&self) -> Result<Config, OptionsError> {
        let texts: [(&'static str, &str); 10] = [
            ("--servers", &self.servers),
            ("--scenarios", &self.scenarios),
            ("--rounds", &self.rounds),
            ("--duration", &self.duration),
            ("--warmup", &self.warmup),
            ("--sse-rate", &self.sse_rate),
            ("--streams-count", &self.streams_count),
            ("--catchup-mb", &self.catchup_mb),
            ("--recovery-gb", &self.recovery_gb),
            ("--out", self.out.as_deref().unwrap_or("(none)")),
        ];
        if let Some((flag, _)) = texts.iter().find(|(_, v)| v.is_empty()) {
            return Err(OptionsError::NeedsValue(flag));
        }
        let rounds = whole("--rounds", &self.rounds)?;
        let duration = whole("--duration", &self.duration)?;
        let warmup = whole("--warmup", &self.warmup)?;
        let sse_rate = whole("--sse-rate", &self.sse_rate)?;
        let streams_count = whole("--streams-count", &self.streams_count)?;
        let catchup_mb = whole("--catchup-mb", &self.catchup_mb)?;
        if rounds < 1 || duration < 2 || streams_count < 1 || catchup_mb < 1 {
            return Err(OptionsError::OutOfRange);
        }
        let recovery_mb = decimal_thousandths(&self.recovery_gb)?;
        if recovery_mb < 1 {
            return Err(OptionsError::RecoveryTooSmall);
        }
        let servers = list(&self.servers)
            .into_iter()
            .map(|w| Server::parse(w).ok_or_else(|| OptionsError::UnknownServer(w.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let scenarios = scenarios(&self.scenarios)?;
        if servers.is_empty() || scenarios.is_empty() {
            return Err(OptionsError::NothingSelected);
        }
        Ok(Config {
            servers,
            scenarios,
            rounds,
            duration,
            warmup,
            sse_rate,
            streams_count,
            catchup_mb,
            recovery_gb: self.recovery_gb.clone(),
            recovery_mb,
            out: self.out.as_ref().map(PathBuf::from),
            no_build: self.no_build,
        })
    }
}

/// Digits only (no sign, no spaces), as `^[0-9]+$`.
fn whole(flag: &'static str, text: &str) -> Result<u64, OptionsError> {
    let not_whole = || OptionsError::NotWhole { flag, got: text.to_string() };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(not_whole());
    }
    text.parse().map_err(|_| not_whole())
}

/// `--recovery-gb`: `^[0-9]+(\.[0-9]+)?$`, in MB (x 1000), rounded down.
fn decimal_thousandths(text: &str) -> Result<u64, OptionsError> {
    let bad = || OptionsError::NotDecimal(text.to_string());
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(int) || frac.is_some_and(|f| !digits(f)) {
        return Err(bad());
    }
    let gb: f64 = text.parse().map_err(|_| bad())?;
    let mb = gb * 1000.0;
    if !mb.is_finite() || mb >= u64::MAX as f64 {
        return Err(bad());
    }
    // Truncation toward zero, as awk's printf "%d".
    Ok(mb as u64)
}

/// A comma-separated list as bash's `IFS=, read -a` splits it: a trailing comma adds nothing,
/// an empty word elsewhere stays (and is then an unknown name).
fn list(text: &str) -> Vec<&str> {
    let mut words: Vec<&str> = text.split(',').collect();
    if words.len() > 1 && words.last() == Some(&"") {
        words.pop();
    }
    words
}

/// The scenario list, `catchup` standing for the three catch-up sizes where it appears.
fn scenarios(text: &str) -> Result<Vec<Scenario>, OptionsError> {
    let mut out = Vec::new();
    for word in list(text) {
        if word == "catchup" {
            out.extend([Scenario::Catchup4k, Scenario::Catchup64k, Scenario::Catchup1m]);
        } else {
            out.push(Scenario::parse(word).ok_or_else(|| OptionsError::UnknownScenario(word.to_string()))?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    #[command(args_override_self = true)]
    struct TestCli {
        #[command(flatten)]
        args: PeersArgs,
    }

    fn parse(words: &[&str]) -> Result<Config, OptionsError> {
        let argv = std::iter::once("peers").chain(words.iter().copied());
        TestCli::try_parse_from(argv).expect("clap accepts the words").args.validate()
    }

    #[test]
    fn defaults_are_the_scripts() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.servers, vec![Server::Oncelog, Server::Electric, Server::Node]);
        assert_eq!(c.scenarios, Scenario::ALL.to_vec());
        assert_eq!(
            (c.rounds, c.duration, c.warmup, c.sse_rate, c.streams_count, c.catchup_mb),
            (1, 20, 3, 100, 20_000, 500)
        );
        assert_eq!((c.recovery_gb.as_str(), c.recovery_mb), ("1", 1000));
        assert_eq!(c.out, None);
        assert!(!c.no_build);
    }

    #[test]
    fn options_are_read() {
        let c = parse(&[
            "--servers",
            "electric,oncelog",
            "--scenarios",
            "streams,s1",
            "--rounds",
            "3",
            "--duration",
            "2",
            "--warmup",
            "0",
            "--sse-rate",
            "0",
            "--streams-count",
            "007",
            "--catchup-mb",
            "20",
            "--recovery-gb",
            "2.5",
            "--out",
            "/tmp/x.md",
            "--no-build",
        ])
        .unwrap();
        assert_eq!(c.servers, vec![Server::Electric, Server::Oncelog]);
        assert_eq!(c.scenarios, vec![Scenario::Streams, Scenario::S1]);
        assert_eq!((c.rounds, c.duration, c.warmup, c.sse_rate, c.streams_count, c.catchup_mb), (3, 2, 0, 0, 7, 20));
        assert_eq!((c.recovery_gb.as_str(), c.recovery_mb), ("2.5", 2500));
        assert_eq!(c.out, Some(PathBuf::from("/tmp/x.md")));
        assert!(c.no_build);
    }

    #[test]
    fn a_repeated_option_keeps_the_last_value() {
        assert_eq!(parse(&["--rounds", "2", "--rounds", "4"]).unwrap().rounds, 4);
    }

    #[test]
    fn catchup_stands_for_the_three_sizes_wherever_it_is() {
        let three = [Scenario::Catchup4k, Scenario::Catchup64k, Scenario::Catchup1m];
        assert_eq!(parse(&["--scenarios", "catchup"]).unwrap().scenarios, three.to_vec());
        let c = parse(&["--scenarios", "s1,catchup,streams"]).unwrap();
        assert_eq!(c.scenarios, [&[Scenario::S1][..], &three, &[Scenario::Streams]].concat());
        let c = parse(&["--scenarios", "inflight1,catchup"]).unwrap();
        assert_eq!(c.scenarios, [&[Scenario::Inflight1][..], &three].concat());
        assert_eq!(parse(&["--scenarios", "catchup64k"]).unwrap().scenarios, vec![Scenario::Catchup64k]);
    }

    #[test]
    fn lists_split_as_bash_does() {
        assert_eq!(list("a,b,"), vec!["a", "b"]);
        assert_eq!(list("a,,b"), vec!["a", "", "b"]);
        assert_eq!(parse(&["--servers", "oncelog,"]).unwrap().servers, vec![Server::Oncelog]);
        assert_eq!(parse(&["--servers", "oncelog,,electric"]), Err(OptionsError::UnknownServer(String::new())));
    }

    #[test]
    fn empty_values_need_a_value() {
        assert_eq!(parse(&["--servers", ""]), Err(OptionsError::NeedsValue("--servers")));
        assert_eq!(parse(&["--rounds", ""]), Err(OptionsError::NeedsValue("--rounds")));
        assert_eq!(parse(&["--out", ""]), Err(OptionsError::NeedsValue("--out")));
        assert!(TestCli::try_parse_from(["peers", "--rounds"]).is_err());
    }

    #[test]
    fn numbers_must_be_whole() {
        let not_whole = |flag, got: &str| Err(OptionsError::NotWhole { flag, got: got.into() });
        assert_eq!(parse(&["--rounds", "x"]), not_whole("--rounds", "x"));
        assert_eq!(parse(&["--rounds", "-1"]), not_whole("--rounds", "-1"));
        assert_eq!(parse(&["--duration", "2.5"]), not_whole("--duration", "2.5"));
        assert_eq!(parse(&["--warmup", "+3"]), not_whole("--warmup", "+3"));
        assert_eq!(parse(&["--sse-rate", " 1"]), not_whole("--sse-rate", " 1"));
        assert_eq!(parse(&["--streams-count", "1e6"]), not_whole("--streams-count", "1e6"));
        assert_eq!(
            parse(&["--catchup-mb", "99999999999999999999999"]),
            not_whole("--catchup-mb", "99999999999999999999999")
        );
        // The first bad one in the script's order is reported.
        assert_eq!(parse(&["--catchup-mb", "y", "--rounds", "x"]), not_whole("--rounds", "x"));
        assert_eq!(
            OptionsError::NotWhole { flag: "--rounds", got: "x".into() }.to_string(),
            "--rounds must be a whole number (got 'x')"
        );
    }

    #[test]
    fn bounds() {
        for words in [
            ["--rounds", "0"],
            ["--duration", "1"],
            ["--duration", "0"],
            ["--streams-count", "0"],
            ["--catchup-mb", "0"],
        ] {
            assert_eq!(parse(&words), Err(OptionsError::OutOfRange), "{words:?}");
        }
        assert_eq!(parse(&["--duration", "2"]).unwrap().duration, 2);
        assert_eq!(parse(&["--warmup", "0", "--sse-rate", "0"]).unwrap().warmup, 0);
    }

    #[test]
    fn recovery_gb_is_a_decimal() {
        assert_eq!(parse(&["--recovery-gb", "10"]).unwrap().recovery_mb, 10_000);
        assert_eq!(parse(&["--recovery-gb", "0.0015"]).unwrap().recovery_mb, 1);
        assert_eq!(parse(&["--recovery-gb", "0.25"]).unwrap().recovery_mb, 250);
        for bad in ["1.", ".5", "1e3", "-1", "1,5", "x", "1.2.3"] {
            assert_eq!(parse(&["--recovery-gb", bad]), Err(OptionsError::NotDecimal(bad.into())), "{bad}");
        }
        assert_eq!(parse(&["--recovery-gb", "0"]), Err(OptionsError::RecoveryTooSmall));
        assert_eq!(parse(&["--recovery-gb", "0.0009"]), Err(OptionsError::RecoveryTooSmall));
    }

    #[test]
    fn unknown_names() {
        assert_eq!(parse(&["--servers", "oncelog,nginx"]), Err(OptionsError::UnknownServer("nginx".into())));
        assert_eq!(parse(&["--scenarios", "s1,s2"]), Err(OptionsError::UnknownScenario("s2".into())));
        assert_eq!(parse(&["--scenarios", "catchup2k"]), Err(OptionsError::UnknownScenario("catchup2k".into())));
        assert_eq!(
            OptionsError::UnknownServer("nginx".into()).to_string(),
            "unknown server 'nginx' (oncelog, electric, node)"
        );
    }

    #[test]
    fn unknown_options_are_refused() {
        assert!(TestCli::try_parse_from(["peers", "--bogus"]).is_err());
        assert!(TestCli::try_parse_from(["peers", "extra"]).is_err());
    }
}
