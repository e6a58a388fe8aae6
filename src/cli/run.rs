//! `sandboxd run`, and the composition root: the one place that connects
//! the adapters (Docker or Swarm, Postgres, the webhook's HTTP client, the
//! HTTP endpoints) and wraps them in the layers every call goes through
//! (deadlines, the leadership fence), builds the elector and the work
//! queue, and hands the controller its parts.

use super::console::{ActionToken, Console};
use super::{CliError, RunArgs};
use crate::adapters::deadline::BoundedStore;
use crate::adapters::webhook::{HttpWebhook, WebhookTarget};
use crate::adapters::webhook_tls::WebhookTlsError;
use crate::adapters::{http, DockerRuntime, PgStore, SwarmRuntime};
use crate::config::{
    Backend, ControllerConfig, NetworkLayout, SwarmPublish, WebhookTrust, WebhookUrl,
};
use crate::controller::{Controller, Elector, Fence, GuardedRuntime, Parts, RuntimeDeadlines};
use crate::domain::clock::{Clock, SystemClock};
use crate::domain::http_host::AllowedHosts;
use crate::engine::{Registry, REGISTRY};
use crate::metrics::Metrics;
use crate::ports::webhook::WebhookTransport;
use crate::ports::{Runtime, Store};
use crate::sched::{QueueConfig, WorkQueue};
use std::sync::Arc;

/// Builds a controller over `runtime` and `store` as `sandboxd run` does:
/// every call of both gets its configured deadline, every change to the
/// runtime waits for the leader's fence. Nothing runs until
/// [`Controller::run`].
///
/// # Panics
///
/// When the TLS client of an `https://` webhook cannot be built (no CA
/// certificate at all): `sandboxd run` reports that as an error at start.
pub fn controller(
    runtime: Arc<dyn Runtime>,
    store: Arc<dyn Store>,
    config: ControllerConfig,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
) -> Controller {
    controller_with(runtime, store, REGISTRY, config, clock, metrics)
}

/// Like [`controller`], running the engines of `engines`.
pub(crate) fn controller_with(
    runtime: Arc<dyn Runtime>,
    store: Arc<dyn Store>,
    engines: Registry,
    config: ControllerConfig,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
) -> Controller {
    let webhook = webhook_transport(&config).unwrap_or_else(|e| panic!("{e}"));
    wire(runtime, store, engines, config, clock, metrics, webhook)
}

/// The transport of the configured webhook, if any: an `https://` one
/// with its TLS client built (the platform's CA certificates plus
/// `--webhook-ca-file`'s).
fn webhook_transport(
    config: &ControllerConfig,
) -> Result<Option<Arc<dyn WebhookTransport>>, WebhookTlsError> {
    let Some(w) = &config.webhook else {
        return Ok(None);
    };
    Ok(Some(Arc::new(webhook_client(&w.url, w.tls.as_ref())?)))
}

/// The webhook's HTTP client for `url`, an `https://` one trusting the
/// platform's CA certificates plus `trust`'s: the configuration handed
/// to the adapter as plain values.
pub fn webhook_client(
    url: &WebhookUrl,
    trust: Option<&WebhookTrust>,
) -> Result<HttpWebhook, WebhookTlsError> {
    let uri = url.uri();
    let target = WebhookTarget {
        https: url.is_https(),
        host: url.host().to_owned(),
        port: url.port(),
        authority: uri
            .authority()
            .map_or_else(|| url.host().to_owned(), |a| a.as_str().to_owned()),
        path_and_query: uri.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
        shown: url.to_string(),
    };
    HttpWebhook::new(target, trust.map(|t| t.extra.as_slice()))
}

/// The controller over its parts, `webhook` built by [`webhook_transport`].
fn wire(
    runtime: Arc<dyn Runtime>,
    store: Arc<dyn Store>,
    engines: Registry,
    config: ControllerConfig,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    webhook: Option<Arc<dyn WebhookTransport>>,
) -> Controller {
    let queue_config = QueueConfig {
        concurrency: config.concurrency.max(1),
        shutdown_grace: config.shutdown_grace,
        ..QueueConfig::default()
    };
    metrics.queue.set_max_concurrent(queue_config.concurrency);
    let queue = WorkQueue::new(queue_config, metrics.clone());
    let fence = Fence::default();
    let deadlines = RuntimeDeadlines {
        call: config.docker_timeout,
        pull: config.pull_timeout,
        job: config.template_timeout,
    };
    let runtime = GuardedRuntime::new(runtime, deadlines, fence.clone(), metrics.clone());
    let store: Arc<dyn Store> = Arc::new(BoundedStore::new(store, config.store_timeout));
    let elector = Arc::new(Elector::new(
        store.clone(),
        config.lease,
        config.holder.clone(),
        fence.clone(),
        metrics.clone(),
    ));
    Controller::new(Parts {
        runtime: Arc::new(runtime),
        store,
        webhook,
        fence,
        elector,
        queue,
        engines,
        config,
        clock,
        metrics,
    })
}

/// The container runtime of `config.backend`, connected.
async fn connect_runtime(config: &ControllerConfig) -> Result<Arc<dyn Runtime>, CliError> {
    let docker = DockerRuntime::connect()
        .await?
        .with_stream_timeout(config.docker_timeout)
        .with_stale_bridge_age(config.stale_bridge_age);
    Ok(match config.backend {
        Backend::Docker => Arc::new(docker),
        Backend::Swarm => {
            tracing::info!(publish = ?config.swarm_publish, "backend: Swarm services");
            let egress = match &config.network {
                NetworkLayout::PerSandbox { egress, .. } => *egress,
                NetworkLayout::Shared { .. } => true,
            };
            Arc::new(
                SwarmRuntime::connect(
                    docker,
                    config.swarm_publish == SwarmPublish::Host,
                    egress,
                    config.swarm_helper_image.clone(),
                )
                .await?
                .with_stop_grace(config.stop_timeout),
            )
        }
    })
}

/// `sandboxd run`: migrates, then runs the controller and its HTTP
/// endpoints until a signal.
pub(super) async fn run(url: &str, args: &RunArgs) -> Result<(), CliError> {
    let config = args.to_config()?;
    // The webhook's TLS client before anything runs: an `https://` webhook
    // nothing can verify stops the start here, as a bad flag does.
    let webhook = webhook_transport(&config)?;
    // The operator page's token too.
    let token = args
        .operator_token_file
        .as_deref()
        .map(ActionToken::read)
        .transpose()?;
    // And the Host names the HTTP port answers to.
    let hosts = AllowedHosts::new(&args.http_hosts)?;
    // Migrations get the default bound; the controller's statements
    // --store-timeout, enforced by the server too.
    let engines = REGISTRY;
    let migrate_timeout = crate::adapters::postgres::DEFAULT_STATEMENT_TIMEOUT;
    PgStore::connect_with_engines(url, 1, migrate_timeout, engines)
        .await?
        .migrate()
        .await?;
    let store = PgStore::connect_with_engines(
        url,
        (config.concurrency as u32 * 2).clamp(4, 32),
        config.store_timeout,
        engines,
    )
    .await?;
    let runtime = connect_runtime(&config).await?;
    let metrics = Arc::new(Metrics::new());
    let controller = wire(
        runtime,
        Arc::new(store),
        engines,
        config.clone(),
        Arc::new(SystemClock),
        metrics.clone(),
        webhook,
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(signals(stop_tx));
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let page = operator_page(url, args, token, &config, controller.probes()).await?;
    let (bound, server) = http::serve(
        config.metrics_addr,
        metrics,
        controller.probes(),
        page.map(Console::routes),
        hosts,
        stopped(stop_rx.clone()),
    )
    .await?;
    tracing::info!(addr = %bound, "serving /metrics, /healthz and /readyz");
    if args.operator_page {
        tracing::info!(
            url = %format!("http://{bound}/"),
            actions = args.operator_token_file.is_some(),
            "serving the operator page"
        );
        if !bound.ip().is_loopback() {
            tracing::warn!(addr = %bound, "the operator page is served beyond this host: it shows every owner's sandboxes and events to whoever reaches the port (--operator-page off to stop it)");
        }
    }
    let server = tokio::spawn(server);
    controller.run(stopped(stop_rx)).await?;
    let _ = server.await;
    tracing::info!("controller stopped");
    Ok(())
}

/// The operator page, unless `--operator-page off`, with its own two
/// connections to the state database: a busy page never takes the
/// reconciles'.
async fn operator_page(
    url: &str,
    args: &RunArgs,
    token: Option<ActionToken>,
    config: &ControllerConfig,
    probes: Arc<dyn crate::ports::Probes>,
) -> Result<Option<Console>, CliError> {
    if !args.operator_page {
        if token.is_some() {
            tracing::warn!("--operator-token-file is ignored: --operator-page is off");
        }
        return Ok(None);
    }
    let store = PgStore::connect_with_engines(url, 2, config.store_timeout, REGISTRY).await?;
    Ok(Some(Console::new(
        store,
        probes,
        token,
        config.deployment.clone(),
        config.store_timeout,
    )))
}

/// First SIGTERM/SIGINT: graceful stop. Second: exit at once.
async fn signals(stop: tokio::sync::watch::Sender<bool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!(
        "signal received; finishing in-flight reconciles (signal again to exit at once)"
    );
    let _ = stop.send(true);
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::warn!("second signal; exiting now");
    std::process::exit(130);
}
