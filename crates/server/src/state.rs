//! What every handler shares: the engine, the configuration, the clock, access control,
//! metrics, live-reader places, rate limits and the subscription service, behind one `Arc`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use oncelog_storage::clock::{Clock, SystemClock};
use oncelog_storage::Engine;

use crate::auth::{AllowAll, Authorize};
use crate::config::ServerConfig;
use crate::live::LiveSlots;
use crate::metrics;
use crate::rate::RateLimits;
use crate::signing::KeyRing;

/// Everything a handler needs: one `Arc`, so cloning it (axum does, per request and layer) is one
/// reference count, whatever it holds.
pub struct AppState<E>(Arc<Shared<E>>);

/// What [`AppState`] shares; reached through `Deref`.
pub struct Shared<E> {
    pub engine: Arc<E>,
    pub config: Arc<ServerConfig>,
    pub clock: Arc<dyn Clock>,
    /// Consulted for every stream request ([`crate::auth`]).
    pub auth: Arc<dyn Authorize>,
    /// The Prometheus handle; `None` when metrics are off.
    pub metrics: Option<PrometheusHandle>,
    /// Per-stream counters (`--metrics-streams`); `None` when off, which is all an append or a
    /// read then checks.
    pub stream_metrics: Option<Arc<metrics::StreamSeries>>,
    /// Set when shutdown begins, so `/readyz` turns 503 while in-flight requests drain.
    pub(crate) draining: Arc<AtomicBool>,
    /// Places for live readers.
    pub live: Arc<LiveSlots>,
    /// Append rate limits per writer.
    pub rate: Arc<RateLimits>,
    /// Subscriptions over the engine (loaded at first use).
    pub subs: Arc<oncelog_subscriptions::Subscriptions<E>>,
    /// The webhook signing key and token key (loaded or created at first use).
    pub sub_keys: Arc<KeyRing>,
    /// The listening address as a URL, set by [`crate::serve`]: the default of
    /// [`ServerConfig::public_url`].
    pub base_url: Arc<std::sync::OnceLock<String>>,
    /// Where the metrics listener of its own (`--metrics-addr`) listens, set by
    /// [`crate::serve`] once bound (the port an address with port 0 got).
    pub metrics_addr: Arc<std::sync::OnceLock<std::net::SocketAddr>>,
}

impl<E> Clone for AppState<E> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<E> std::ops::Deref for AppState<E> {
    type Target = Shared<E>;

    fn deref(&self) -> &Shared<E> {
        &self.0
    }
}

impl<E> Shared<E> {
    /// A copy sharing every part (for the builder methods, which run before serving).
    fn parts(&self) -> Shared<E> {
        Shared {
            engine: self.engine.clone(),
            config: self.config.clone(),
            clock: self.clock.clone(),
            auth: self.auth.clone(),
            metrics: self.metrics.clone(),
            stream_metrics: self.stream_metrics.clone(),
            draining: self.draining.clone(),
            live: self.live.clone(),
            rate: self.rate.clone(),
            subs: self.subs.clone(),
            sub_keys: self.sub_keys.clone(),
            base_url: self.base_url.clone(),
            metrics_addr: self.metrics_addr.clone(),
        }
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

impl<E: Engine> AppState<E> {
    /// The real clock, no access control, metrics as `config` says.
    pub fn new(engine: Arc<E>, config: ServerConfig) -> Self {
        let metrics = config.metrics_path.as_ref().and_then(|_| metrics::install());
        // A pattern `validate` refused gives no series (the binary validates before this).
        let stream_metrics = match (&metrics, &config.metrics_streams) {
            (Some(_), Some(p)) => metrics::StreamSeries::new(p, config.metrics_streams_max).ok().map(Arc::new),
            _ => None,
        };
        let live = LiveSlots::new(config.max_live_readers, config.max_live_readers_per_stream, config.max_connections);
        let rate = RateLimits::new(config.append_rate_limit, config.append_byte_rate_limit, config.max_append_bytes);
        Self(Arc::new(Shared {
            live,
            rate,
            subs: Arc::new(oncelog_subscriptions::Subscriptions::new(engine.clone())),
            sub_keys: Arc::default(),
            base_url: Arc::default(),
            metrics_addr: Arc::default(),
            engine,
            config: Arc::new(config),
            clock: Arc::new(SystemClock::default()),
            auth: Arc::new(AllowAll),
            metrics,
            stream_metrics,
            draining: Arc::new(AtomicBool::new(false)),
        }))
    }

    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        Self(Arc::new(Shared { clock, ..self.0.parts() }))
    }

    pub fn with_auth(self, auth: Arc<dyn Authorize>) -> Self {
        Self(Arc::new(Shared { auth, ..self.0.parts() }))
    }
}
