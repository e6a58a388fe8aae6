//! `/metrics`, `/healthz` and `/readyz`, and whatever other routes the
//! composition root adds (the operator page, `cli::console`); every route
//! answers only requests whose `Host` the port is served on
//! ([`crate::domain::http_host`]: no DNS-rebinding page reads it).

use crate::domain::http_host::{self, AllowedHosts};
use crate::metrics::Metrics;
use crate::ports::Probes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

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

/// The Host names the port answers to, and those it refused and logged
/// (each once, a few at most: a rebinding page may send many).
struct Hosts {
    allowed: AllowedHosts,
    logged: Mutex<BTreeSet<String>>,
}

/// How many refused Host names are logged.
const HOSTS_LOGGED: usize = 16;

/// Answers the request only if its Host (or, without one, its URI's
/// authority) is one the port is served on; otherwise 403, saying which
/// flag adds a name.
async fn only_served_hosts(State(hosts): State<Arc<Hosts>>, req: Request, next: Next) -> Response {
    let host = match req.headers().get(header::HOST) {
        // Not visible ASCII: no name the port is served on.
        Some(v) => Some(v.to_str().unwrap_or("")),
        None => req.uri().authority().map(|a| a.as_str()),
    };
    if hosts.allowed.admits(host) {
        return next.run(req).await;
    }
    let host = host.unwrap_or_default().to_owned();
    {
        let mut logged = hosts.logged.lock().unwrap_or_else(|e| e.into_inner());
        if logged.len() < HOSTS_LOGGED && logged.insert(host.clone()) {
            tracing::warn!(host = %host, path = %req.uri().path(), "refused a request whose Host is not a name this port is served on (a DNS-rebinding page, or a client that reaches sandboxd by a name not given to {})", http_host::FLAG);
        }
    }
    let names: Vec<&str> = hosts.allowed.names().collect();
    let body = format!(
        "sandboxd answers on this port only to the Host names it is served on: IP addresses, localhost{}. This request's Host is {host:?}.\n\
         A page on another site can reach this port through DNS rebinding; its Host is how sandboxd tells. \
         If clients reach sandboxd by this name, start it with {} NAME (SANDBOXD_HTTP_HOSTS).\n",
        names.iter().map(|n| format!(", {n}")).collect::<String>(),
        http_host::FLAG,
    );
    let mut r = (StatusCode::FORBIDDEN, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
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
/// (it must not claim the three above). Every route answers only the
/// Host names `hosts` allows.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    probes: Arc<dyn Probes>,
    more: Option<Router>,
    hosts: AllowedHosts,
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
    let hosts = Arc::new(Hosts {
        allowed: hosts,
        logged: Mutex::default(),
    });
    let app = app.layer(middleware::from_fn_with_state(hosts, only_served_hosts));
    let fut = async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(HttpError::Serve)
    };
    Ok((bound, fut))
}
