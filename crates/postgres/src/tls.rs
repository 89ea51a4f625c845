//! TLS to PostgreSQL with rustls (no OpenSSL): one connector per engine, built from the
//! connection string's [`TlsParams`], used by the pool, the setup connection and the `LISTEN`
//! connection alike; and the reason a TLS connection failed, in words an operator can act on.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::conninfo::{Roots, SslMode, TlsParams};

/// Why the TLS settings cannot be used (found at start, before any connection).
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("sslrootcert {path}: {cause}")]
    RootFile { path: String, cause: String },
    #[error("sslrootcert {0}: no certificate in the file")]
    NoRoots(String),
    #[error("the system's trusted roots could not be loaded (give sslrootcert=FILE): {0}")]
    SystemRoots(String),
    #[error("sslcert {path}: {cause}")]
    CertFile { path: String, cause: String },
    #[error("sslkey {path}: {cause}")]
    KeyFile { path: String, cause: String },
    #[error("TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The connector for `params`. With `disable` it is never used (the driver does not start TLS).
pub fn connector(params: &TlsParams) -> Result<MakeRustlsConnect, TlsSetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let verifier: Arc<dyn ServerCertVerifier> = match params.mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => Arc::new(Unchecked(provider)),
        SslMode::VerifyCa => Arc::new(ChainOnly(webpki(params, provider)?)),
        SslMode::VerifyFull => webpki(params, provider)?,
    };
    let builder = builder.dangerous().with_custom_certificate_verifier(verifier);
    let config = match &params.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| TlsSetupError::CertFile { path: cert.display().to_string(), cause: e.to_string() })?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| TlsSetupError::KeyFile { path: key.display().to_string(), cause: e.to_string() })?;
            builder.with_client_auth_cert(certs, key)?
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

fn webpki(
    params: &TlsParams,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    match &params.roots {
        Roots::File(path) => {
            let shown = path.display().to_string();
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| TlsSetupError::RootFile { path: shown.clone(), cause: e.to_string() })?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(TlsSetupError::NoRoots(shown));
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                let why = found.errors.first().map_or_else(|| "none found".to_owned(), ToString::to_string);
                return Err(TlsSetupError::SystemRoots(why));
            }
            roots.add_parsable_certificates(found.certs);
        }
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsSetupError::Rustls(rustls::Error::General(e.to_string())))
}

/// `prefer` / `require`: encryption without authentication, as libpq does in these modes. The
/// handshake's signatures are still checked (the peer holds the key of the certificate it sent);
/// who that peer is, is not.
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name in the certificate may differ
/// from the host connected to.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, name, ocsp, now) {
            // Name checks come after the chain is verified, so this error means the chain is good.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Why a connection attempt failed at the TLS layer, in an operator's words; `None` when the
/// failure is not about TLS (the database is down, a password is wrong, …).
pub fn refusal(e: &tokio_postgres::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<rustls::Error>() {
            return Some(describe(r));
        }
        if let Some(r) = s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<rustls::Error>())
        {
            return Some(describe(r));
        }
        // The driver's words (a source of its "error performing TLS handshake") when the server
        // answers the TLS request with "no".
        if s.to_string().contains("server does not support TLS") {
            return Some(
                "the server does not offer TLS, and sslmode requires it (enable ssl on the server, or use sslmode=prefer or disable on a trusted network)"
                    .to_owned(),
            );
        }
        source = s.source();
    }
    None
}

fn describe(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "the server's certificate is not signed by a trusted CA (check sslrootcert)".to_owned()
        }
        rustls::Error::InvalidCertificate(CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }) => {
            "the server's certificate does not name the host connected to (sslmode=verify-full checks the host name; connect by a name the certificate lists)".to_owned()
        }
        rustls::Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => {
            "the server's certificate has expired".to_owned()
        }
        other => format!("TLS handshake failed: {other}"),
    }
}
