//! `/metrics`, `/healthz` and `/readyz`, and whatever other routes the
//! composition root adds (the operator page, `cli::console`).

use crate::metrics::Metrics;
use crate::ports::Probes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// Failures of the HTTP server.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The address could not be bound.
    #[error("cannot listen on {addr} ({source}); choose another address with --metrics-addr")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("metrics server failed: {0}")]
    Serve(#[source] std::io::Error),
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    probes: Arc<dyn Probes>,
}

async fn metrics_text(State(s): State<AppState>) -> impl IntoResponse {
    s.probes.before_scrape().await;
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    match s.probes.ready().await {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

/// Binds `addr` now (so a taken port fails start-up) and returns the
/// server future and the bound address. `more` adds routes of its own
/// (it must not claim the three above).
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    probes: Arc<dyn Probes>,
    more: Option<Router>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, impl Future<Output = Result<(), HttpError>>), HttpError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(HttpError::Serve)?;
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, probes });
    let app = match more {
        Some(more) => app.merge(more),
        None => app,
    };
    let fut = async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(HttpError::Serve)
    };
    Ok((bound, fut))
}
