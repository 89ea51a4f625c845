//! TLS for the server (rustls, `ring` provider): certificates from PEM files, offered with ALPN
//! `h2` and `http/1.1`, and re-read when the files change, for new connections only (open
//! connections keep the certificate they started with and are never dropped for a renewal).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::ring::default_provider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::reload::modified;

/// The certificate chain and key files (`--tls-cert`, `--tls-key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the certificate chain {path}: {reason}")]
    Cert { path: PathBuf, reason: String },
    #[error("cannot read the private key {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("the key does not fit the certificate or is of an unsupported kind: {0}")]
    Pair(rustls::Error),
}

fn load(files: &TlsFiles) -> Result<Arc<CertifiedKey>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Cert { path: files.cert.clone(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Cert { path: files.cert.clone(), reason: "no certificate in the file".into() });
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| TlsError::Key { path: files.key.clone(), reason: e.to_string() })?;
    let signing = default_provider().key_provider.load_private_key(key).map_err(TlsError::Pair)?;
    let ck = CertifiedKey::new(certs, signing);
    ck.keys_match().map_err(TlsError::Pair)?;
    Ok(Arc::new(ck))
}

/// The current certificate, swapped in place when its files change.
#[derive(Debug)]
pub struct CertStore {
    files: TlsFiles,
    current: RwLock<Arc<CertifiedKey>>,
    seen: Mutex<(Option<SystemTime>, Option<SystemTime>)>,
}

impl CertStore {
    pub fn load(files: TlsFiles) -> Result<Arc<CertStore>, TlsError> {
        let current = load(&files)?;
        let seen = (modified(&files.cert), modified(&files.key));
        Ok(Arc::new(CertStore { files, current: RwLock::new(current), seen: Mutex::new(seen) }))
    }

    /// Re-reads the files if either changed; returns whether the certificate was replaced. On an
    /// error (say, a half-written file) the previous certificate stays in force.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = (modified(&self.files.cert), modified(&self.files.key));
        if now == *seen {
            return Ok(false);
        }
        let ck = load(&self.files)?;
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = ck;
        *seen = now;
        Ok(true)
    }

    /// Checks the files every `every` for the life of the runtime.
    pub fn spawn_reloader(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let store = Arc::clone(self);
        crate::reload::every(every, "TLS certificate", move || store.reload())
    }

    /// A rustls acceptor that asks this store for the certificate of every new connection.
    pub fn acceptor(self: &Arc<Self>) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Pair)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
    }
}
