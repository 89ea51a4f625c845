//! The connection string as libpq users write it, split into what the driver parses and the
//! TLS parameters it does not.
//!
//! `tokio-postgres` parses the URL form (`postgres://…?k=v`) and the `key=value` form, but knows
//! only `sslmode=disable|prefer|require` and refuses `sslrootcert`, `sslcert` and `sslkey` as
//! unknown options. Those are libpq's standard names, and managed databases hand out URLs that
//! use them, so they are taken out here (written by hand: a few lines of tokenising, no crate
//! parses exactly this) and handed to [`crate::tls`]; the rest goes to the driver unchanged.
//! A parameter the URL leaves out comes from libpq's environment variable (`PGSSLMODE`,
//! `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`), as `PGPASSWORD` does.

use std::path::PathBuf;

/// libpq's `sslmode`: how much TLS a connection insists on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS when the server offers it, else plain; the certificate is not checked (libpq's default).
    Prefer,
    /// TLS or no connection; the certificate is not checked (unless `sslrootcert` names a file:
    /// then as `VerifyCa`, as libpq does).
    Require,
    /// TLS with a certificate chain to a trusted root; the host name is not checked.
    VerifyCa,
    /// TLS with a trusted chain that names the host connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(v: &str) -> Result<Self, ConnInfoError> {
        Ok(match v {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // libpq's "allow" tries plain first; nothing here would use it.
            other => return Err(ConnInfoError::SslMode(other.to_owned())),
        })
    }

    /// What the driver is told: whether TLS is tried, and whether it is required.
    pub fn driver(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        }
    }
}

/// Where the trusted roots come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Roots {
    /// The operating system's store (no `sslrootcert`, or `sslrootcert=system`).
    System,
    /// A PEM file of CA certificates.
    File(PathBuf),
}

/// The TLS half of a connection string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsParams {
    pub mode: SslMode,
    pub roots: Roots,
    /// A client certificate (PEM chain) and its key, for servers that ask for one.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// A connection string this engine cannot use.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConnInfoError {
    #[error("sslmode={0:?} is not one of disable, prefer, require, verify-ca, verify-full")]
    SslMode(String),
    #[error("sslcert and sslkey go together: give both or neither")]
    ClientPair,
    #[error("a quoted value is not closed")]
    Unclosed,
    #[error("bad percent-encoding in the URL")]
    Percent,
}

const TLS_KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Splits `url` into the string for the driver (without the TLS parameters) and the TLS
/// parameters, with libpq's environment variables filling what the string leaves out.
pub fn split(url: &str) -> Result<(String, TlsParams), ConnInfoError> {
    split_with(url, |k| std::env::var(k).ok())
}

/// [`split`] with the environment given (tests).
pub fn split_with(url: &str, env: impl Fn(&str) -> Option<String>) -> Result<(String, TlsParams), ConnInfoError> {
    let (rest, mut found) = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        split_url(url)?
    } else {
        split_key_value(url)?
    };
    for (key, var) in TLS_KEYS.iter().zip(["PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"]) {
        if !found.iter().any(|(k, _)| k == key) {
            if let Some(v) = env(var) {
                found.push(((*key).to_owned(), v));
            }
        }
    }
    let get = |k: &str| found.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    let mode = get("sslmode").map(|v| SslMode::parse(&v)).transpose()?.unwrap_or(SslMode::Prefer);
    let roots = match get("sslrootcert") {
        None => Roots::System,
        Some(v) if v == "system" => Roots::System,
        Some(v) => Roots::File(v.into()),
    };
    // libpq: require with a root certificate file checks the chain.
    let mode = if mode == SslMode::Require && matches!(roots, Roots::File(_)) { SslMode::VerifyCa } else { mode };
    let client = match (get("sslcert"), get("sslkey")) {
        (Some(c), Some(k)) => Some((c.into(), k.into())),
        (None, None) => None,
        _ => return Err(ConnInfoError::ClientPair),
    };
    Ok((rest, TlsParams { mode, roots, client }))
}

/// `postgres://…?a=b&sslmode=x`: the query's TLS pairs taken out, percent-decoded.
fn split_url(url: &str) -> Result<(String, Vec<(String, String)>), ConnInfoError> {
    let Some((base, query)) = url.split_once('?') else { return Ok((url.to_owned(), Vec::new())) };
    let mut kept = Vec::new();
    let mut found = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(k)?;
        if TLS_KEYS.contains(&key.as_str()) {
            found.push((key, percent_decode(v)?));
        } else {
            kept.push(pair);
        }
    }
    let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    Ok((rest, found))
}

fn percent_decode(s: &str) -> Result<String, ConnInfoError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).ok_or(ConnInfoError::Percent)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| ConnInfoError::Percent)?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ConnInfoError::Percent)
}

/// `host=h sslmode=x sslrootcert='/a b'`: the TLS pairs taken out (values may be single-quoted
/// with `\'` and `\\` escapes, as libpq allows); the others kept as written.
fn split_key_value(s: &str) -> Result<(String, Vec<(String, String)>), ConnInfoError> {
    let mut kept: Vec<&str> = Vec::new();
    let mut found = Vec::new();
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        let key_end = rest.find(|c: char| c == '=' || c.is_whitespace()).unwrap_or(rest.len());
        let key = rest[..key_end].to_owned();
        let mut after = rest[key_end..].trim_start();
        let mut value = String::new();
        if let Some(a) = after.strip_prefix('=') {
            after = a.trim_start();
            if let Some(q) = after.strip_prefix('\'') {
                let mut chars = q.char_indices();
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some((_, e)) = chars.next() {
                                value.push(e);
                            }
                        }
                        '\'' => {
                            end = Some(i + 1);
                            break;
                        }
                        c => value.push(c),
                    }
                }
                after = &q[end.ok_or(ConnInfoError::Unclosed)?..];
            } else {
                let end = after.find(char::is_whitespace).unwrap_or(after.len());
                value = after[..end].to_owned();
                after = &after[end..];
            }
        }
        let token = &rest[..rest.len() - after.len()];
        if TLS_KEYS.contains(&key.as_str()) {
            found.push((key, value));
        } else {
            kept.push(token.trim());
        }
        rest = after.trim_start();
    }
    Ok((kept.join(" "), found))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn url_form_keeps_the_driver_options_and_takes_the_tls_ones() {
        let (rest, tls) = split_with(
            "postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write&sslmode=verify-full&sslrootcert=%2Ftmp%2Fca%20x.crt&application_name=a",
            no_env,
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write&application_name=a");
        assert_eq!(
            tls,
            TlsParams { mode: SslMode::VerifyFull, roots: Roots::File("/tmp/ca x.crt".into()), client: None }
        );
        let (rest, tls) = split_with("postgresql://u@h/db?sslmode=disable", no_env).unwrap();
        assert_eq!(rest, "postgresql://u@h/db");
        assert_eq!(tls.mode, SslMode::Disable);
        assert_eq!(split_with("postgres://h/db", no_env).unwrap().1.mode, SslMode::Prefer);
    }

    #[test]
    fn key_value_form_with_quotes() {
        let (rest, tls) = split_with(
            r"host=h  sslmode=require sslrootcert='/a b\'c' user=u sslcert=/c.pem sslkey = /k.pem dbname=d",
            no_env,
        )
        .unwrap();
        assert_eq!(rest, "host=h user=u dbname=d");
        // require with a root file checks the chain, as libpq does.
        assert_eq!(
            tls,
            TlsParams {
                mode: SslMode::VerifyCa,
                roots: Roots::File("/a b'c".into()),
                client: Some(("/c.pem".into(), "/k.pem".into()))
            }
        );
        assert_eq!(split_with("host=h sslrootcert='x", no_env), Err(ConnInfoError::Unclosed));
    }

    #[test]
    fn bad_values_are_refused_with_their_reason() {
        assert_eq!(split_with("postgres://h/db?sslmode=allow", no_env), Err(ConnInfoError::SslMode("allow".into())));
        assert_eq!(split_with("postgres://h/db?sslcert=/c.pem", no_env), Err(ConnInfoError::ClientPair));
        assert_eq!(split_with("postgres://h/db?sslmode=%zz", no_env), Err(ConnInfoError::Percent));
    }

    #[test]
    fn the_environment_fills_what_the_string_leaves_out() {
        let env = |k: &str| match k {
            "PGSSLMODE" => Some("verify-full".to_owned()),
            "PGSSLROOTCERT" => Some("system".to_owned()),
            _ => None,
        };
        assert_eq!(
            split_with("postgres://h/db", env).unwrap().1,
            TlsParams { mode: SslMode::VerifyFull, roots: Roots::System, client: None }
        );
        assert_eq!(split_with("postgres://h/db?sslmode=disable", env).unwrap().1.mode, SslMode::Disable);
    }
}
