//! The operator page, served by `sandboxd run` beside `/metrics` on its
//! HTTP port (loopback unless `--metrics-addr` says otherwise):
//!
//! - `GET /`: who leads, whether reaping is paused, each warm pool, and
//!   every sandbox as `sandboxd list` shows it, with its owner;
//! - `GET /sandboxes/ID`: what `sandboxd describe ID` prints (its events
//!   included, never a password);
//! - `POST /sandboxes/ID/release`, `POST /sandboxes/ID/resume` and
//!   `POST /reaping/resume`: the actions, only when `sandboxd run` was
//!   given `--operator-token-file`, and each only with that token (the
//!   form's `token` field or `Authorization: Bearer`). The token is not a
//!   cookie, so another site's page cannot act through the operator's
//!   browser.
//!
//! Plain HTML with no script and nothing fetched from elsewhere; the
//! `Content-Security-Policy` says so to the browser too. Every read has
//! the store's deadline.

mod page;
mod token;

pub(crate) use self::token::ActionToken;
pub use self::token::TokenError;

use super::describe::{render, Described};
use crate::adapters::PgStore;
use crate::client::Client;
use crate::domain::id::{Deployment, SandboxId};
use crate::ports::Probes;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use page::Frame;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// How many of a sandbox's newest events its page shows.
const EVENTS: u32 = 50;

/// What the page reads from and acts on.
pub(crate) struct Console {
    store: PgStore,
    client: Client,
    probes: Arc<dyn Probes>,
    token: Option<ActionToken>,
    deployment: Deployment,
    timeout: Duration,
}

impl Console {
    /// A page over the state database `store` and the controller that
    /// `probes` answers for; actions only with a `token`; every read and
    /// action bounded by `timeout`.
    pub(crate) fn new(
        store: PgStore,
        probes: Arc<dyn Probes>,
        token: Option<ActionToken>,
        deployment: Deployment,
        timeout: Duration,
    ) -> Self {
        Self {
            client: Client::from_pool(store.pool().clone()),
            store,
            probes,
            token,
            deployment,
            timeout,
        }
    }

    /// The page's routes, to merge into the HTTP server's.
    pub(crate) fn routes(self) -> Router {
        Router::new()
            .route("/", get(overview))
            .route("/sandboxes/{id}", get(sandbox))
            .route("/sandboxes/{id}/release", post(release))
            .route("/sandboxes/{id}/resume", post(resume))
            .route("/reaping/resume", post(resume_reaping))
            .with_state(Arc::new(self))
    }

    fn frame(&self) -> Frame<'_> {
        Frame {
            deployment: self.deployment.as_str(),
            actions: self.token.is_some(),
        }
    }

    /// `work` within the deadline, or the page that says why not.
    async fn bounded<T, E: std::fmt::Display>(
        &self,
        what: &str,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, Said> {
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, what, "operator page: state database call failed");
                Err(Said::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "State database error",
                    format!("Could not {what}: {e}"),
                ))
            }
            Err(_) => Err(Said::new(
                StatusCode::GATEWAY_TIMEOUT,
                "State database too slow",
                format!(
                    "Could not {what} within {:?} (--store-timeout); is the state database overloaded?",
                    self.timeout
                ),
            )),
        }
    }

    /// The page of `outcome`: the page built, or the one thing said.
    fn answer(&self, outcome: Result<String, Said>) -> Response {
        match outcome {
            Ok(page) => html(StatusCode::OK, page),
            Err(said) => self.tell(said),
        }
    }

    /// The page that says `said`.
    fn tell(&self, said: Said) -> Response {
        html(
            said.status,
            page::message(self.frame(), said.title, &said.text, &said.back),
        )
    }

    /// `Ok` when actions are on and the request carries the token;
    /// otherwise the refusal.
    fn authorize(&self, action: &str, headers: &HeaderMap, body: &[u8]) -> Result<(), Said> {
        let refuse = |why: &str| {
            tracing::warn!(action, why, "operator page: action refused");
            Err(Said::new(StatusCode::FORBIDDEN, "Refused", why))
        };
        let Some(token) = &self.token else {
            return refuse("Actions are off: sandboxd run was started without --operator-token-file, so this page is read-only.");
        };
        match presented(headers, body) {
            None => refuse("This action needs the operator token (the form's token field, or an Authorization: Bearer header)."),
            Some(p) if token.admits(&p) => Ok(()),
            Some(_) => refuse("Wrong operator token."),
        }
    }
}

/// A page that says one thing: an action's outcome, a refusal, a sandbox
/// not found, a failed read.
struct Said {
    status: StatusCode,
    title: &'static str,
    text: String,
    /// Where its Back link goes.
    back: String,
}

impl Said {
    fn new(status: StatusCode, title: &'static str, text: impl Into<String>) -> Self {
        Self {
            status,
            title,
            text: text.into(),
            back: "/".into(),
        }
    }

    fn back_to(mut self, back: String) -> Self {
        self.back = back;
        self
    }
}

/// The token a request presents: its `Authorization: Bearer` header, or
/// else its form's `token` field; `None` when neither has one.
fn presented(headers: &HeaderMap, body: &[u8]) -> Option<String> {
    if let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Some(bearer.trim().to_owned());
    }
    #[derive(serde::Deserialize)]
    struct Form {
        token: Option<String>,
    }
    serde_urlencoded::from_bytes::<Form>(body)
        .ok()
        .and_then(|f| f.token)
        .filter(|t| !t.is_empty())
}

/// An HTML response with the headers that keep the page to itself: no
/// script, no framing, nothing fetched from elsewhere, nothing cached.
fn html(status: StatusCode, body: String) -> Response {
    const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    r
}

fn sandbox_id(id: &str) -> Result<SandboxId, Said> {
    SandboxId::parse(id)
        .map_err(|e| Said::new(StatusCode::NOT_FOUND, "Not a sandbox id", e.to_string()))
}

async fn overview(State(c): State<Arc<Console>>) -> Response {
    let page = async {
        let sandboxes = c
            .bounded("list the sandboxes", c.client.summaries())
            .await?;
        let view = c.probes.view();
        Ok(page::overview(
            c.frame(),
            &view,
            &sandboxes,
            chrono::Utc::now(),
        ))
    };
    c.answer(page.await)
}

async fn sandbox(State(c): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    let page = async {
        let id = sandbox_id(&id)?;
        let read = async {
            tokio::try_join!(
                c.client.status(&id),
                c.client.desired(&id),
                c.client.row(&id),
                c.client.events(&id, EVENTS),
            )
        };
        let (status, desired, row, events) = c.bounded("read the sandbox", read).await?;
        if status.is_none() && desired.is_none() && events.is_empty() {
            return Err(Said::new(
                StatusCode::NOT_FOUND,
                "No such sandbox",
                format!("Sandbox {id} has no desired row, status or events."),
            ));
        }
        let described = render(
            &Described {
                id: id.as_str(),
                desired: desired.as_ref(),
                row: row.as_ref(),
                status: status.as_ref(),
                events: &events,
                show_secrets: false,
                deployment: &c.deployment,
            },
            chrono::Utc::now(),
        );
        Ok(page::sandbox(
            c.frame(),
            id.as_str(),
            &described,
            desired.is_some(),
        ))
    };
    c.answer(page.await)
}

/// An action's outcome, always a [`Said`]: `Ok` when done, `Err` when
/// refused or failed.
type Acted = Result<Said, Said>;

fn acted(c: &Console, outcome: Acted) -> Response {
    c.tell(outcome.unwrap_or_else(|refused| refused))
}

/// The actions on one sandbox.
#[derive(Debug, Clone, Copy)]
enum SandboxAction {
    /// `sandboxd release`: delete the desired row.
    Release,
    /// `sandboxd resume`: touch the row (a paused sandbox starts again).
    Resume,
}

impl SandboxAction {
    fn name(self) -> &'static str {
        match self {
            Self::Release => "release",
            Self::Resume => "resume",
        }
    }

    /// Does it; `false` when there was nothing to act on.
    async fn run(self, c: &Console, id: &SandboxId) -> Result<bool, Said> {
        match self {
            Self::Release => c.bounded("release the sandbox", c.client.release(id)).await,
            Self::Resume => c.bounded("resume the sandbox", c.client.touch(id)).await,
        }
    }

    /// What the page says after it: done, or nothing to act on.
    fn said(self, id: &SandboxId, done: bool) -> Said {
        let (status, title, text) = match (self, done) {
            (Self::Release, true) => (
                StatusCode::OK,
                "Released",
                format!("Sandbox {id}'s row is deleted; sandboxd tears its containers down."),
            ),
            (Self::Release, false) => (
                StatusCode::NOT_FOUND,
                "Nothing to release",
                format!("Sandbox {id} has no desired row."),
            ),
            (Self::Resume, true) => (
                StatusCode::OK,
                "Resumed",
                format!("Sandbox {id} is touched: a paused sandbox starts again, and its idle timer restarts."),
            ),
            (Self::Resume, false) => (
                StatusCode::NOT_FOUND,
                "Nothing to resume",
                format!("Sandbox {id} is not desired, has expired, or is being released."),
            ),
        };
        Said::new(status, title, text).back_to(format!("/sandboxes/{id}"))
    }
}

/// `action` on sandbox `id`, if the request carries the token.
async fn act(
    c: &Console,
    action: SandboxAction,
    id: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let outcome: Acted = async {
        let id = sandbox_id(id)?;
        c.authorize(action.name(), headers, body)?;
        let done = action.run(c, &id).await?;
        if done {
            tracing::info!(sandbox = %id, action = action.name(), "operator page: done");
        }
        Ok(action.said(&id, done))
    }
    .await;
    acted(c, outcome)
}

async fn release(
    State(c): State<Arc<Console>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    act(&c, SandboxAction::Release, &id, &headers, &body).await
}

async fn resume(
    State(c): State<Arc<Console>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    act(&c, SandboxAction::Resume, &id, &headers, &body).await
}

async fn resume_reaping(
    State(c): State<Arc<Console>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let outcome: Acted = async {
        c.authorize("resume-reaping", &headers, &body)?;
        Ok(
            match c
                .bounded("resume reaping", c.store.resume_reaping())
                .await?
            {
                Some(pause) => {
                    tracing::info!(reason = %pause.reason, "operator page: reaping resumed");
                    Said::new(
                        StatusCode::OK,
                        "Reaping resumed",
                        format!("Reaping had been paused: {}", pause.reason),
                    )
                }
                None => Said::new(
                    StatusCode::OK,
                    "Reaping was not paused",
                    "Nothing to resume.",
                ),
            },
        )
    }
    .await;
    acted(&c, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_presents_its_bearer_header_or_else_its_form_field() {
        let bearer = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            h
        };
        let none = HeaderMap::new();
        for (headers, body, expected) in [
            (&none, "", None),
            (&none, "token=", None),
            (&none, "token=abc%20def&x=1", Some("abc def")),
            (&none, "other=1", None),
            (&none, "%%%not a form", None),
            (&bearer("Bearer s3cret"), "token=form", Some("s3cret")),
            (&bearer("Basic s3cret"), "token=form", Some("form")),
        ] {
            assert_eq!(
                presented(headers, body.as_bytes()).as_deref(),
                expected,
                "{body}"
            );
        }
    }
}
