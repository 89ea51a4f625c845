//! Operational endpoints outside `/v1/stream/`: liveness, readiness, metrics.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use oncelog_storage::{Engine, Readiness};

use crate::metrics;
use crate::state::AppState;

const TEXT: (&str, &str) = ("content-type", "text/plain; charset=utf-8");

/// `200` while the process serves requests.
pub async fn healthz() -> Response {
    (StatusCode::OK, [TEXT], "ok\n").into_response()
}

/// `200` once recovery is done and writes are accepted; `503` with the reason after a
/// fail-stop or while draining for shutdown.
pub async fn readyz<E: Engine>(State(st): State<AppState<E>>) -> Response {
    if st.draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, [TEXT], "not ready: shutting down\n").into_response();
    }
    match st.engine.readiness() {
        Readiness::Ready => (StatusCode::OK, [TEXT], "ready\n").into_response(),
        Readiness::NotReady { reason } => {
            (StatusCode::SERVICE_UNAVAILABLE, [TEXT], format!("not ready: {reason}\n")).into_response()
        }
    }
}

/// The Prometheus scrape. Subscription lag is the last computation when it is younger than
/// [`metrics::LAG_REFRESH_MS`], else computed now and kept for the scrapes that follow: a
/// scrape costs the series it prints, not a look at every subscription's streams.
pub async fn metrics<E: Engine>(State(st): State<AppState<E>>) -> Response {
    let Some(handle) = &st.metrics else {
        return (StatusCode::NOT_FOUND, [TEXT], "metrics are switched off\n").into_response();
    };
    let lags = match st.subs.lags_cached(metrics::MAX_LAG_SERIES, metrics::LAG_REFRESH_MS, st.clock.now_ms()).await {
        Ok(l) => l,
        Err(e) => {
            // The rest of the scrape is still worth having; the lag series are missing from it.
            tracing::debug!(error = %e, "subscription lag not computed for this scrape");
            Default::default()
        }
    };
    let scrape = metrics::Scrape {
        stats: st.engine.stats(),
        subscriptions: st.subs.count(),
        lags: &lags,
        streams: st.stream_metrics.as_deref(),
    };
    (StatusCode::OK, [("content-type", "text/plain; version=0.0.4; charset=utf-8")], metrics::render(handle, scrape))
        .into_response()
}
