//! Where `oncelog` sets up its log (stderr): `--log-level` and `--log-format` for the commands
//! that run unattended (`serve`, `sink`, `ship`, `backup`), and quiet text for the client commands.
//!
//! `RUST_LOG`, when set, wins over `--log-level`: its directives can set levels per module
//! (`RUST_LOG=info,oncelog_postgres=debug`), which one level cannot. One that does not parse is
//! ignored, with a warning, rather than stopping a server over its log settings.
//!
//! Two guards sit between an event and stderr, whatever wrote it (our code, a driver, the
//! object-store client):
//! - text fields and messages have their control characters escaped ([`escape_controls`]): a
//!   request-supplied string (a subscription id, a path) cannot forge a log line with a newline
//!   or repaint a terminal with ANSI escapes. JSON already escapes them.
//! - every secret the process was given (a password in `--storage` or `--target`, in
//!   `AWS_ENDPOINT_URL`, the AWS secret key and session token) is replaced by `***` in each line
//!   written ([`Scrubbed`]): an error that quotes a URL or a connection string is printed whole
//!   but never with its password.

use std::io::Write;
use std::sync::Arc;

use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::MakeWriter;
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

/// Installs the process's subscriber, writing to stderr; `secrets` (see [`secrets_in`]) never
/// reach it.
pub fn init(args: &LogArgs, secrets: Vec<String>) {
    let env = std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty());
    let (filter, ignored) = match env.as_deref().map(EnvFilter::try_new) {
        Some(Ok(f)) => (f, None),
        Some(Err(e)) => (EnvFilter::new(args.log_level.directive()), Some(e)),
        None => (EnvFilter::new(args.log_level.directive()), None),
    };
    let writer = Scrubbed::new(secrets);
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    match args.log_format {
        Format::Text => {
            builder.fmt_fields(escaped_fields()).with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init()
        }
        // No colour codes inside JSON strings; `flatten_event` puts `message` and the fields at
        // the top level, where log shippers look for them.
        Format::Json => builder.json().flatten_event(true).with_ansi(false).init(),
    }
    if let Some(e) = ignored {
        tracing::warn!(error = %e, "RUST_LOG ignored: it does not parse; --log-level applies");
    }
}

/// The text format's fields, as the default formatter writes them (`name=value`, the message
/// bare, strings quoted), with control characters escaped.
fn escaped_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = match field.name() {
            "message" => format!("{value:?}"),
            name => format!("{}={value:?}", name.strip_prefix("r#").unwrap_or(name)),
        };
        w.write_str(&escape_controls(&text))
    })
    .delimited(" ")
}

/// `text` with each control character (newline, carriage return, escape, DEL, the C1 range)
/// written as an escape sequence, so one event stays one line and paints nothing.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The secrets of this process that a log line must not show: the passwords in `conns` (URLs'
/// user info and `password=` parameters, key=value strings' `password`), and from the
/// environment the password of `AWS_ENDPOINT_URL`, `AWS_SECRET_ACCESS_KEY` and
/// `AWS_SESSION_TOKEN`. Values shorter than 8 characters are left out: replacing every `test` or
/// `a` of a log would hide more than it protects (and a credential that short protects little).
pub fn secrets_in(conns: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let endpoint = std::env::var("AWS_ENDPOINT_URL").ok();
    for conn in conns.iter().copied().chain(endpoint.as_deref()) {
        out.extend(passwords(conn));
    }
    for var in ["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "PGPASSWORD"] {
        out.extend(std::env::var(var).ok());
    }
    out.retain(|s| s.chars().count() >= MIN_SECRET_CHARS);
    // The longest first, so a secret containing another is hidden whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// The shortest value searched for in log lines.
const MIN_SECRET_CHARS: usize = 8;

/// The passwords written in one connection string or URL, as written and percent-decoded.
fn passwords(conn: &str) -> Vec<String> {
    let mut found = Vec::new();
    if let Some((_, rest)) = conn.split_once("://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            if let Some((_, password)) = userinfo.split_once(':') {
                found.push(password.to_owned());
            }
        }
    }
    // `password=` in a URL's query or in a key=value string (`sslpassword=` too), quoted or not.
    let mut rest = conn;
    while let Some(at) = rest.find("password=") {
        let value = &rest[at + "password=".len()..];
        let secret = match value.strip_prefix('\'') {
            Some(quoted) => quoted.split('\'').next().unwrap_or(""),
            None => value.split([' ', '&', '#']).next().unwrap_or(""),
        };
        found.push(secret.to_owned());
        rest = value;
    }
    let decoded: Vec<String> = found.iter().filter_map(|p| percent_decoded(p)).collect();
    found.extend(decoded);
    found
}

/// `text` with its `%XX` escapes decoded, when it has any and they make UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    if !text.contains('%') {
        return None;
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Stderr with the process's secrets replaced by `***` in every line. The formatter writes each
/// event with one `write_all` of the whole line, so a secret is never split between two writes.
#[derive(Clone)]
struct Scrubbed {
    secrets: Arc<Vec<String>>,
}

impl Scrubbed {
    fn new(secrets: Vec<String>) -> Scrubbed {
        Scrubbed { secrets: Arc::new(secrets) }
    }

    /// `bytes` with every secret replaced (bytes that are not UTF-8 are passed on as they are:
    /// the secrets are UTF-8, and the formatter writes UTF-8).
    fn scrub<'a>(&self, bytes: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        let Ok(text) = std::str::from_utf8(bytes) else { return std::borrow::Cow::Borrowed(bytes) };
        if !self.secrets.iter().any(|s| text.contains(s.as_str())) {
            return std::borrow::Cow::Borrowed(bytes);
        }
        let mut text = text.to_owned();
        for s in self.secrets.iter() {
            text = text.replace(s.as_str(), "***");
        }
        std::borrow::Cow::Owned(text.into_bytes())
    }
}

impl<'a> MakeWriter<'a> for Scrubbed {
    type Writer = ScrubbedLine;

    fn make_writer(&'a self) -> ScrubbedLine {
        ScrubbedLine { to: self.clone() }
    }
}

/// One event's writer.
struct ScrubbedLine {
    to: Scrubbed,
}

impl Write for ScrubbedLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().lock().write_all(&self.to.scrub(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_other_text_kept() {
        assert_eq!(escape_controls("plain: ünïcode ok"), "plain: ünïcode ok");
        assert_eq!(escape_controls("a\nb\r\x1b[31mred\x7f\u{85}"), "a\\nb\\r\\u{1b}[31mred\\u{7f}\\u{85}");
    }

    #[test]
    fn a_text_line_cannot_be_forged_by_a_field_or_the_message() {
        let out = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(escaped_fields())
            .with_ansi(false)
            .with_writer(move || Capture(sink.clone()))
            .finish();
        let forged = "sub\n2026-12-05T00:00:00Z  INFO oncelog: forged\x1b[2J";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(subscription = %forged, path = forged, "webhook {forged} failed");
        });
        let text = String::from_utf8(out.lock().expect("lock").clone()).expect("utf-8");
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(!text.contains('\x1b'), "{text:?}");
        assert!(text.contains("subscription=sub\\n2026"), "{text:?}");
    }

    struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn passwords_are_found_in_urls_and_key_value_strings() {
        let found = |c: &str| passwords(c);
        assert_eq!(found("postgres://u:hunter22@db:5432/x"), ["hunter22"]);
        assert_eq!(found("http://key:s%40cret@s3.local:9000"), ["s%40cret", "s@cret"]);
        assert_eq!(found("host=db password=hunter22 user=u"), ["hunter22"]);
        assert_eq!(found("host=db password='two words' user=u"), ["two words"]);
        assert_eq!(found("postgres://u@db/x?sslpassword=keypass&password=pw12"), ["keypass", "pw12"]);
        assert!(found("postgres://u@db/x").is_empty());
    }

    #[test]
    fn every_secret_is_replaced_in_a_line() {
        let s = Scrubbed::new(vec!["hunter22".into(), "s@cret".into()]);
        let line = b"error connecting to host=db password=hunter22 and http://k:s@cret@h\n";
        assert_eq!(&*s.scrub(line), b"error connecting to host=db password=*** and http://k:***@h\n");
        assert_eq!(&*s.scrub(b"nothing here\n"), b"nothing here\n");
    }
}
