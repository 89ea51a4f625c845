//! Where the server is and how to authenticate: the connection arguments every client
//! subcommand flattens in, and the client they make. A leaf of the binary: the subcommands
//! (`commands`, `ship`, `sub`, `sink`) use it, it uses none of them.

use std::path::PathBuf;

use oncelog_client::{Client, RetryPolicy, StreamHandle};

/// Why the connection arguments could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error(transparent)]
    Client(#[from] oncelog_client::Error),
    /// A `--header` without a colon.
    #[error("header {0:?} is not \"Name: value\"")]
    BadHeader(String),
    /// The `--cacert` file could not be read.
    #[error("--cacert {}: {source}", path.display())]
    CaCert { path: PathBuf, source: std::io::Error },
}

/// Where the server is and how to authenticate; shared by every client subcommand.
#[derive(clap::Args)]
pub struct Conn {
    /// Streams root URL: stream NAME lives at URL/NAME.
    #[arg(long, env = "ONCELOG_URL", default_value = "http://127.0.0.1:4437/v1/stream")]
    url: String,

    /// Value of the Authorization header sent with every request, e.g. "Bearer TOKEN".
    #[arg(long, env = "ONCELOG_AUTH", hide_env_values = true)]
    auth: Option<String>,

    /// Extra header for every request, as "Name: value" (repeatable).
    #[arg(long = "header", short = 'H', value_name = "NAME: VALUE")]
    headers: Vec<String>,

    /// PEM file of a CA to trust for https, besides the system's roots (a private CA).
    #[arg(long, env = "ONCELOG_CACERT")]
    cacert: Option<PathBuf>,
}

impl Conn {
    pub(crate) fn client(&self, retry: Option<RetryPolicy>) -> Result<Client, ConnError> {
        let mut b = Client::builder(&self.url);
        if let Some(auth) = &self.auth {
            b = b.default_header("authorization", auth)?;
        }
        for h in &self.headers {
            let (name, value) = h.split_once(':').ok_or_else(|| ConnError::BadHeader(h.clone()))?;
            b = b.default_header(name.trim(), value.trim())?;
        }
        if let Some(r) = retry {
            b = b.retry_policy(r);
        }
        if let Some(path) = &self.cacert {
            let pem = std::fs::read(path).map_err(|source| ConnError::CaCert { path: path.clone(), source })?;
            b = b.ca_cert_pem(pem);
        }
        Ok(b.build()?)
    }

    pub(crate) fn stream(&self, name: &str) -> Result<StreamHandle, ConnError> {
        Ok(self.client(None)?.stream(name))
    }
}
