//! `oncelog token issue | sign-url`: mint credentials with the server's HMAC secret, for scripts
//! and for trying access control out. Tokens from an identity provider work the same way when
//! the server is given its JWKS (`docs/SECURITY.md`).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oncelog_server::auth::scope::{GrantClaim, ScopeClaim};
use oncelog_server::auth::{signed_url, token};

#[derive(clap::Subcommand)]
pub enum TokenCommand {
    /// Print a signed bearer token (HS256) granting operations on a stream or a path prefix.
    Issue(IssueArgs),
    /// Print URL with `expires` and `sig` added: a read-only link to one stream.
    SignUrl(SignUrlArgs),
}

#[derive(clap::Args)]
pub struct IssueArgs {
    /// The server's HMAC secret file (as given to `oncelog serve --auth-secret-file`).
    #[arg(long)]
    secret_file: PathBuf,
    /// Grant on every stream whose path starts with this ("" for all streams).
    #[arg(long, conflicts_with = "stream", required_unless_present = "stream")]
    prefix: Option<String>,
    /// Grant on exactly this stream.
    #[arg(long)]
    stream: Option<String>,
    /// Comma-separated operations: read, append, create, close, delete, trim, or the groups
    /// write (append, close), manage (create, delete, trim), all.
    #[arg(long, value_delimiter = ',', required = true)]
    ops: Vec<String>,
    /// How long the token is valid: a number with s, m, h or d (e.g. 90s, 15m, 1h, 7d).
    #[arg(long, value_parser = parse_duration)]
    expires_in: Duration,
    /// `iss` claim (when the server checks one).
    #[arg(long)]
    issuer: Option<String>,
    /// `aud` claim (when the server checks one).
    #[arg(long)]
    audience: Option<String>,
    /// `sub` claim: who the token is for (appears in nothing but the token).
    #[arg(long)]
    subject: Option<String>,
}

#[derive(clap::Args)]
pub struct SignUrlArgs {
    /// The server's HMAC secret file.
    #[arg(long)]
    secret_file: PathBuf,
    /// The stream URL to sign, e.g. http://127.0.0.1:4437/v1/stream/chats/42?offset=-1&live=sse
    url: String,
    /// How long the URL is valid: a number with s, m, h or d.
    #[arg(long, value_parser = parse_duration)]
    expires_in: Duration,
}

/// Why a token command failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    Key(#[from] token::KeyError),
    #[error("cannot sign the token: {0}")]
    Sign(#[from] token::SignError),
    #[error("unknown operation {0:?} (read, append, create, close, delete, write, manage, all)")]
    UnknownOp(String),
}

/// `90s`, `15m`, `1h`, `7d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{text:?}: expected a number followed by s, m, h or d"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(format!("{text:?}: the unit must be s, m, h or d")),
    };
    if secs == 0 {
        return Err("the duration must be positive".into());
    }
    Ok(Duration::from_secs(secs))
}

/// A size in bytes: a number, optionally followed by K, M, G or T (powers of 1024; `KiB`,
/// `MB` and the like are read the same way).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n: u64 =
        n.parse().map_err(|_| format!("{text:?}: expected a number of bytes, optionally followed by K, M, G or T"))?;
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("{text:?}: the unit must be K, M, G or T")),
    };
    let bytes = n.checked_mul(1 << shift).ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes == 0 {
        return Err("the size must be positive".into());
    }
    Ok(bytes)
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

const KNOWN_OPS: &[&str] = &["read", "append", "create", "close", "delete", "trim", "write", "manage", "all"];

pub fn run(cmd: TokenCommand) -> Result<String, TokenError> {
    match cmd {
        TokenCommand::Issue(a) => {
            if let Some(bad) = a.ops.iter().find(|o| !KNOWN_OPS.contains(&o.as_str())) {
                return Err(TokenError::UnknownOp(bad.clone()));
            }
            let secret = token::load_secret(&a.secret_file)?;
            let grant = GrantClaim { stream: a.stream, prefix: a.prefix, ops: a.ops };
            let expires = i64::try_from(now_s().saturating_add(a.expires_in.as_secs())).unwrap_or(i64::MAX);
            Ok(token::issue(&secret, ScopeClaim { grants: vec![grant] }, expires, a.issuer, a.audience, a.subject)?)
        }
        TokenCommand::SignUrl(a) => {
            let secret = token::load_secret(&a.secret_file)?;
            Ok(signed_url::sign_url(&secret, &a.url, now_s().saturating_add(a.expires_in.as_secs())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        for bad in ["", "h", "5", "5x", "0m", "-1h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("10GiB"), Ok(10 << 30));
        assert_eq!(parse_bytes("2kb"), Ok(2048));
        for bad in ["", "G", "0", "5x", "-1", "99999999999T"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
