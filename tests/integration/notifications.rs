//! Event notifications on a real Postgres and Docker: a `LISTEN
//! sandbox_events` client receives every event as it is recorded (a heal
//! of a killed container included) without sandbox id, owner, message or credential;
//! a webhook receiver on 127.0.0.1 receives the same events, signed; and a
//! webhook that accepts connections and never answers does not delay a
//! heal (its timeouts, retries and drops are counted).

use crate::common;

use common::{
    docker_ok, eventually, hold_lease, request, sandbox_id, seed_status, total, TestEnv, BIN,
};
use sandboxd::client::Client;
use sandboxd::config::{WebhookConfig, WebhookUrl};
use sandboxd::domain::event::{Event, EventReason};
use sandboxd::domain::lease::Term;
use sandboxd::domain::notice::{self, NOTIFY_CHANNEL, SIGNATURE_HEADER};
use sandboxd::domain::{Phase, SandboxId, Secret};
use sandboxd::ports::store::{EventBatch, Store};
use serde_json::Value;
use sqlx::postgres::PgListener;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

/// The keys of a `NOTIFY sandbox_events` payload: what every role that may
/// connect is allowed to know (never the detail, which may name a fork's
/// source, a seed or a checkpoint).
const PUBLIC_KEYS: [&str; 7] = [
    "count",
    "engine",
    "first_at",
    "incarnation",
    "last_at",
    "reason",
    "seq",
];

const SECRET: &str = "webhook-secret-for-the-notification-tests";

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

/// Listens on `sandbox_events` (subscribed once this returns).
async fn listen(env: &TestEnv) -> PgListener {
    let mut listener = PgListener::connect_with(&env.pool).await.expect("listener");
    listener.listen(NOTIFY_CHANNEL).await.expect("LISTEN");
    listener
}

/// Payloads from `listener` until one of the row of `incarnation`
/// satisfies `done` (all of them, in order, that are that row's: the
/// payload names the row by its incarnation, never by its id).
async fn notified_until(
    listener: &mut PgListener,
    incarnation: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Vec<(Value, String)> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let n = tokio::time::timeout_at(deadline, listener.recv())
            .await
            .unwrap_or_else(|_| panic!("no such notification within {within:?}; got {got:?}"))
            .expect("the listener's connection");
        let raw = n.payload().to_owned();
        let v: Value = serde_json::from_str(&raw).expect("the payload is JSON");
        if v["incarnation"] == incarnation {
            let stop = done(&v);
            got.push((v, raw));
            if stop {
                return got;
            }
        }
    }
}

/// Kills the engine container of `engine` in sandbox `id`.
async fn kill(env: &TestEnv, id: &SandboxId, engine: &str) {
    let container = env
        .containers(Some(id))
        .await
        .into_iter()
        .find(|c| c.labels.engine == engine)
        .expect("the engine's container");
    docker_ok(&["kill", container.id.as_str()]);
}

/// Waits until `engine` of `id` is ready after its `heals`th heal; returns
/// how long that took.
async fn healed(client: &Client, id: &SandboxId, engine: &str, heals: u32) -> Duration {
    let started = Instant::now();
    eventually(
        &format!("heal {heals}"),
        Duration::from_secs(90),
        || async {
            let s = client.status(id).await.unwrap()?;
            (s.phase == Phase::Ready && s.services.get(engine)?.heals == heals).then_some(())
        },
    )
    .await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listen_client_receives_the_provisioned_and_heal_events_without_owner_message_or_password(
) {
    let env = TestEnv::new().await;
    let mut listener = listen(&env).await;
    let controller = env.start(env.config());
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("listen");
    let ready = client
        .provision(&id, &request(&["redis"], &[]), Duration::from_secs(90))
        .await
        .expect("ready");
    let password = ready.services["redis"].password.expose().to_owned();
    let incarnation = client.incarnation(&id).await.unwrap().expect("the row");
    kill(&env, &id, "redis").await;
    let got = notified_until(
        &mut listener,
        incarnation.as_str(),
        Duration::from_secs(90),
        |v| v["reason"] == "healed",
    )
    .await;

    let provisioned = got
        .iter()
        .find(|(v, _)| v["reason"] == "provisioned")
        .unwrap_or_else(|| panic!("no provisioned event in {got:?}"));
    assert_eq!(provisioned.0["engine"], "redis");
    let (heal, _) = got.last().unwrap();
    assert_eq!(heal["engine"], "redis");
    // The detail is the row's, read by seq.
    let detail: Option<String> =
        sqlx::query_scalar("SELECT detail FROM sandbox_events WHERE seq = $1")
            .bind(heal["seq"].as_i64().unwrap())
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(
        detail.as_deref(),
        Some("stopped"),
        "docker kill is an order from outside"
    );
    assert_eq!(heal["count"], 1);
    for (v, raw) in &got {
        assert_eq!(
            keys(v),
            PUBLIC_KEYS.iter().map(|k| k.to_string()).collect(),
            "{raw}"
        );
        assert!(!raw.contains(&password), "a password in {raw}");
        assert!(!raw.contains("integration-test"), "the owner in {raw}");
        assert!(!raw.contains(id.as_str()), "the sandbox id in {raw}");
        assert!(raw.len() < 1000, "{raw}");
        // The payload names the row it announces, as stored.
        let (reason, count): (String, i32) =
            sqlx::query_as("SELECT reason, count FROM sandbox_events WHERE seq = $1")
                .bind(v["seq"].as_i64().unwrap())
                .fetch_one(&env.pool)
                .await
                .expect("the announced row");
        assert_eq!(
            (reason.as_str(), i64::from(count)),
            (v["reason"].as_str().unwrap(), v["count"].as_i64().unwrap())
        );
    }
    // The heal's message is read by seq, where row-level security applies.
    let message: String = sqlx::query_scalar("SELECT message FROM sandbox_events WHERE seq = $1")
        .bind(heal["seq"].as_i64().unwrap())
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(
        message.contains("killed or stopped from outside"),
        "{message}"
    );
    assert!(!message.contains(&password));
    controller.stop().await;
}

fn event(reason: EventReason, detail: Option<&str>, message: &str) -> Event {
    Event {
        reason,
        engine: Some("postgres".into()),
        detail: detail.map(String::from),
        message: message.into(),
    }
}

#[tokio::test]
async fn every_recorded_event_is_announced_a_repeat_with_its_count_and_an_other_owners_row_stays_unreadable(
) {
    let env = TestEnv::new().await;
    let store =
        sandboxd::adapters::PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    let term = Term(hold_lease(&env.pool).await);
    let suffix = env.deployment.as_str().to_owned();
    let (mine, theirs) = (format!("orch-{suffix}"), format!("other-{suffix}"));
    let (orchestrator, _) = env.create_login_role(&mine).await;
    store.grant_orchestrator(&mine, true).await.unwrap();
    // An own-rows-only orchestrator may LISTEN too: nothing restricts a
    // channel, which is why the payload carries no sandbox id, owner or
    // message.
    let mut listener = PgListener::connect_with(&orchestrator).await.unwrap();
    listener.listen(NOTIFY_CHANNEL).await.unwrap();
    let id = sandbox_id("theirs");
    // A status whose password a careless message repeats.
    seed_status(
        &env.pool,
        id.as_str(),
        r#"{"postgres": {"password": "pw-in-status-0123456789"}}"#,
        term.0,
    )
    .await;
    let long = format!("{} pw-in-status-0123456789", "é".repeat(990));
    let events = [
        event(EventReason::Failed, Some(&"d".repeat(64)), &long),
        event(EventReason::Failed, Some(&"d".repeat(64)), &long),
    ];
    let batch = EventBatch {
        sandbox: &id,
        owner: &theirs,
        incarnation: None,
        events: &events,
        keep: 10,
    };
    let notices = store.record_events(batch, term).await.unwrap();
    // What the webhook gets: in full, scrubbed, as counted.
    assert_eq!(notices.len(), 2);
    assert_eq!(notices[0].seq, notices[1].seq, "counted into one row");
    assert_eq!((notices[0].count, notices[1].count), (1, 2));
    assert_eq!(notices[1].owner, theirs);
    assert!(notices[1].message.ends_with("***"), "scrubbed");
    // A deposed leader's events are neither stored nor announced.
    assert!(store.record_events(batch, Term(term.0 + 1)).await.is_err());
    let mine_id = sandbox_id("mine");
    let one = [event(EventReason::Provisioned, Some("cold"), "created")];
    store
        .record_events(
            EventBatch {
                sandbox: &mine_id,
                owner: &mine,
                incarnation: None,
                events: &one,
                keep: 10,
            },
            term,
        )
        .await
        .unwrap();

    let mut got = Vec::new();
    for _ in 0..3 {
        let n = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .expect("a notification")
            .unwrap();
        got.push(n.payload().to_owned());
    }
    let values: Vec<Value> = got
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    assert_eq!(values[0]["seq"], values[1]["seq"]);
    assert_eq!(
        (values[0]["count"].as_i64(), values[1]["count"].as_i64()),
        (Some(1), Some(2))
    );
    for (raw, v) in got.iter().zip(&values) {
        assert!(!raw.contains("pw-in-status"), "{raw}");
        assert!(
            !raw.contains(id.as_str()) && !raw.contains(mine_id.as_str()),
            "a sandbox id in {raw}"
        );
        assert!(
            !raw.contains(&theirs) && !raw.contains(&mine),
            "an owner in {raw}"
        );
        assert!(raw.len() < 1000, "{} bytes", raw.len());
        assert_eq!(keys(v), PUBLIC_KEYS.iter().map(|k| k.to_string()).collect());
    }
    // The orchestrator reads its own event by seq, not the other owner's.
    let read = |seq: i64| {
        sqlx::query_scalar::<_, String>("SELECT message FROM sandbox_events WHERE seq = $1")
            .bind(seq)
            .fetch_optional(&orchestrator)
    };
    assert_eq!(
        read(values[2]["seq"].as_i64().unwrap())
            .await
            .unwrap()
            .as_deref(),
        Some("created")
    );
    assert_eq!(
        read(values[0]["seq"].as_i64().unwrap()).await.unwrap(),
        None
    );
    // Nothing else came (the refused write announced nothing).
    assert!(
        tokio::time::timeout(Duration::from_millis(500), listener.recv())
            .await
            .is_err(),
        "an extra notification"
    );
}

/// Issue 50: the details of a fork (its source's id), a seed (its hash)
/// and a checkpoint or reset (its name) are the owner's business; another
/// role listening on the channel hears that such events happened, and
/// nothing of what they name. The owner reads the detail from the row.
#[tokio::test]
async fn a_listener_of_another_role_hears_no_fork_source_seed_hash_or_checkpoint_name() {
    let env = TestEnv::new().await;
    let store =
        sandboxd::adapters::PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY);
    let term = Term(hold_lease(&env.pool).await);
    let suffix = env.deployment.as_str().to_owned();
    let (owner, eavesdropper) = (format!("own-{suffix}"), format!("ear-{suffix}"));
    let (owner_pool, _) = env.create_login_role(&owner).await;
    let (ear_pool, _) = env.create_login_role(&eavesdropper).await;
    store.grant_orchestrator(&owner, true).await.unwrap();
    store.grant_orchestrator(&eavesdropper, true).await.unwrap();
    let mut listener = PgListener::connect_with(&ear_pool).await.unwrap();
    listener.listen(NOTIFY_CHANNEL).await.unwrap();

    // What the controller writes for a fork of `source-…`, a seed and a
    // checkpoint, as sandboxd::domain::event builds them.
    let source = sandbox_id("fork-source");
    let (hash, checkpoint) = ("sha256:5eed5eed5eed", "before-migration-42");
    let id = sandbox_id("forked");
    let events = [
        event(EventReason::Forked, Some(source.as_str()), "forked"),
        event(EventReason::Seeded, Some(hash), "seeded"),
        event(EventReason::Checkpointed, Some(checkpoint), "checkpointed"),
        event(EventReason::Reset, Some(checkpoint), "reset"),
    ];
    store
        .record_events(
            EventBatch {
                sandbox: &id,
                owner: &owner,
                incarnation: None,
                events: &events,
                keep: 10,
            },
            term,
        )
        .await
        .unwrap();

    for want in ["forked", "seeded", "checkpointed", "reset"] {
        let n = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .expect("a notification")
            .unwrap();
        let raw = n.payload();
        let v: Value = serde_json::from_str(raw).unwrap();
        assert_eq!(v["reason"], want, "{raw}");
        assert!(v.get("detail").is_none(), "a detail in {raw}");
        for secret in [source.as_str(), "fork-source", "5eed5eed", checkpoint] {
            assert!(!raw.contains(secret), "{secret} in {raw}");
        }
        // The owner reads it from the row; the eavesdropper reads nothing.
        let seq = v["seq"].as_i64().unwrap();
        async fn read(pool: &sqlx::PgPool, seq: i64) -> Option<Option<String>> {
            sqlx::query_scalar("SELECT detail FROM sandbox_events WHERE seq = $1")
                .bind(seq)
                .fetch_optional(pool)
                .await
                .unwrap()
        }
        let theirs = read(&owner_pool, seq)
            .await
            .flatten()
            .expect("the owner's row");
        assert!(
            [source.as_str(), hash, checkpoint].contains(&theirs.as_str()),
            "{theirs}"
        );
        assert_eq!(read(&ear_pool, seq).await, None);
    }
}

/// One request a webhook receiver got.
#[derive(Debug)]
struct Delivery {
    head: String,
    signature: String,
    body: Vec<u8>,
}

/// A webhook receiver on 127.0.0.1 that answers every POST with 200 and
/// hands it over; returns its port.
async fn receiver() -> (u16, mpsc::UnboundedReceiver<Delivery>) {
    let (port, rx, _) = receiver_with(None).await;
    (port, rx)
}

/// A webhook receiver on 127.0.0.1, over TLS with `tls`, that answers
/// every POST with 200 and hands it over; returns its port, the requests,
/// and each connection's TLS handshake result (`Ok` for plain http).
async fn receiver_with(
    tls: Option<TlsAcceptor>,
) -> (
    u16,
    mpsc::UnboundedReceiver<Delivery>,
    mpsc::UnboundedReceiver<Result<(), String>>,
) {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    let (handshakes_tx, handshakes) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            let handshakes_tx = handshakes_tx.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    None => {
                        let _ = handshakes_tx.send(Ok(()));
                        answer_one(s, tx).await;
                    }
                    Some(tls) => match tls.accept(s).await {
                        Ok(s) => {
                            let _ = handshakes_tx.send(Ok(()));
                            answer_one(s, tx).await;
                        }
                        Err(e) => {
                            let _ = handshakes_tx.send(Err(e.to_string()));
                        }
                    },
                }
            });
        }
    });
    (port, rx, handshakes)
}

/// Reads one POST from `s`, answers 200 and hands the request to `tx`.
async fn answer_one(
    mut s: impl AsyncRead + AsyncWrite + Unpin,
    tx: mpsc::UnboundedSender<Delivery>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head, body_at) = loop {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the request's head");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break (String::from_utf8(buf[..i].to_vec()).unwrap(), i + 4);
        }
    };
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
            .unwrap_or_default()
    };
    let length: usize = header("content-length").parse().unwrap();
    while buf.len() < body_at + length {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the body");
        buf.extend_from_slice(&chunk[..n]);
    }
    s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let _ = s.shutdown().await;
    let _ = tx.send(Delivery {
        signature: header(SIGNATURE_HEADER),
        head,
        body: buf[body_at..body_at + length].to_vec(),
    });
}

/// The controller's metrics once it has counted `n` webhook deliveries.
async fn delivered_at_least(controller: &common::RunningController, n: usize) -> String {
    eventually(
        &format!("{n} webhook deliveries counted"),
        Duration::from_secs(10),
        || async {
            let text = controller.metrics.render();
            (total(&text, "sandboxd_webhook_deliveries_total") >= n as f64).then_some(text)
        },
    )
    .await
}

fn webhook(url: &str) -> WebhookConfig {
    WebhookConfig::new(WebhookUrl::parse(url).unwrap(), Secret::new(SECRET))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_on_localhost_receives_the_same_events_signed() {
    let env = TestEnv::new().await;
    let (port, mut deliveries) = receiver().await;
    let mut listener = listen(&env).await;
    let mut config = env.config();
    config.webhook = Some(webhook(&format!(
        "http://127.0.0.1:{port}/hooks/sandboxd?token=t0k3n"
    )));
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("hook");
    let ready = client
        .provision(&id, &request(&["redis"], &[]), Duration::from_secs(90))
        .await
        .expect("ready");
    let password = ready.services["redis"].password.expose().to_owned();
    let incarnation = client.incarnation(&id).await.unwrap().expect("the row");
    kill(&env, &id, "redis").await;
    let announced = notified_until(
        &mut listener,
        incarnation.as_str(),
        Duration::from_secs(90),
        |v| v["reason"] == "healed",
    )
    .await;

    // The webhook gets each announced event: the same JSON plus sandbox
    // id, owner and message, signed.
    let mut received: Vec<Value> = Vec::new();
    while received.len() < announced.len() {
        let d = tokio::time::timeout(Duration::from_secs(30), deliveries.recv())
            .await
            .unwrap_or_else(|_| panic!("the webhook got {received:?}, NOTIFY {announced:?}"))
            .unwrap();
        assert!(
            d.head
                .starts_with("POST /hooks/sandboxd?token=t0k3n HTTP/1.1"),
            "{}",
            d.head
        );
        assert!(
            d.head
                .to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{}",
            d.head
        );
        let t = notice::verify(SECRET.as_bytes(), &d.signature, &d.body)
            .unwrap_or_else(|| panic!("a bad signature {:?}", d.signature));
        assert!(
            (chrono::Utc::now().timestamp() - t).abs() < 300,
            "signed at {t}"
        );
        assert!(notice::verify(b"another-secret-entirely", &d.signature, &d.body).is_none());
        let body = String::from_utf8(d.body).unwrap();
        assert!(!body.contains(&password), "a password in {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        if v["sandbox_id"] == id.as_str() {
            received.push(v);
        }
    }
    assert_eq!(
        announced.len(),
        received.len(),
        "NOTIFY {announced:?}, webhook {received:?}"
    );
    for ((public, _), full) in announced.iter().zip(&received) {
        let mut stripped = full.clone();
        let object = stripped.as_object_mut().unwrap();
        assert_eq!(object.remove("owner").unwrap(), "integration-test");
        assert!(object.remove("message").unwrap().as_str().unwrap().len() > 10);
        assert_eq!(object.remove("sandbox_id").unwrap(), id.as_str());
        object.remove("detail").unwrap();
        assert_eq!(
            &stripped, public,
            "the webhook's JSON is the NOTIFY payload plus four fields"
        );
    }
    let heal = received.last().unwrap();
    assert_eq!(
        (heal["reason"].as_str(), heal["detail"].as_str()),
        (Some("healed"), Some("stopped"))
    );
    // The receiver hands a request over once it has answered, a moment
    // before the sender reads that answer and counts the delivery.
    let text = delivered_at_least(&controller, received.len()).await;
    // Each event once: no attempt failed, none was sent again.
    assert_eq!(
        common::sample(&text, "sandboxd_webhook_retries_total"),
        Some(0.0)
    );
    assert_eq!(total(&text, "sandboxd_webhook_attempt_errors_total"), 0.0);
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_that_never_answers_does_not_delay_a_heal() {
    let env = TestEnv::new().await;
    // Accepts every connection and never reads or answers.
    let hang = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = hang.local_addr().unwrap().port();
    let (accepted_tx, mut accepted) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hang.accept().await {
            held.push(s);
            let _ = accepted_tx.send(());
        }
    });
    // An attempt hangs for 40 s: a heal that waited for the webhook would
    // take at least that.
    let attempt = Duration::from_secs(40);
    let mut config = env.config();
    config.webhook = Some(WebhookConfig {
        timeout: attempt,
        retries: 1,
        queue: 1,
        ..webhook(&format!("http://127.0.0.1:{port}/hook"))
    });
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("hang");
    client
        .provision(&id, &request(&["redis"], &[]), Duration::from_secs(90))
        .await
        .expect("ready");
    tokio::time::timeout(Duration::from_secs(30), accepted.recv())
        .await
        .expect("the webhook is tried")
        .unwrap();

    // Two heals while the webhook hangs on the first event: the first
    // heal's event waits in the queue (one place), the second's is dropped.
    let mut took = Vec::new();
    for heal in 1..=2 {
        kill(&env, &id, "redis").await;
        took.push(healed(&client, &id, "redis", heal).await);
    }
    eprintln!("heals with a hanging webhook took {took:?}");
    for (i, t) in took.iter().enumerate() {
        // Generous for a loaded machine, and far below one hung attempt
        // (a kill from outside is healed at once, with no back-off).
        assert!(*t < Duration::from_secs(25), "heal {} took {t:?}", i + 1);
    }
    eventually(
        "the second heal's event",
        Duration::from_secs(30),
        || async {
            let events = client.events(&id, 10).await.unwrap();
            (events
                .iter()
                .filter(|e| e.reason == "healed")
                .map(|e| e.count)
                .sum::<i32>()
                >= 2)
                .then_some(())
        },
    )
    .await;
    eventually("a dropped event", Duration::from_secs(30), || async {
        let text = controller.metrics.render();
        (common::sample(&text, "sandboxd_webhook_dropped_total")? >= 1.0).then_some(())
    })
    .await;
    // The hung attempt times out and is retried, both counted.
    eventually(
        "a timed-out attempt and its retry",
        attempt + Duration::from_secs(30),
        || async {
            let text = controller.metrics.render();
            let timeouts = text
                .lines()
                .find(|l| {
                    l.starts_with("sandboxd_webhook_attempt_errors_total{error=\"timeout\"}")
                })?
                .rsplit(' ')
                .next()?
                .parse::<f64>()
                .ok()?;
            let retries = common::sample(&text, "sandboxd_webhook_retries_total")?;
            (timeouts >= 1.0 && retries >= 1.0).then_some(())
        },
    )
    .await;
    assert_eq!(
        common::sample(&controller.metrics.render(), "sandboxd_webhook_queue_depth"),
        Some(1.0),
        "the first heal's event still waits"
    );
    controller.stop().await;
}

#[test]
fn sandboxd_run_refuses_another_scheme_an_empty_ca_file_or_a_missing_secret_without_echoing_the_url(
) {
    for (args, says) in [
        (
            vec![
                "--webhook-url",
                "ftp://hooks.example/T0K3N",
                "--webhook-secret-file",
                "/dev/null",
            ],
            "only https:// and http:// are supported",
        ),
        (
            vec![
                "--webhook-url",
                "https://127.0.0.1:9/T0K3N",
                "--webhook-secret-file",
                "/dev/null",
                "--webhook-ca-file",
                "/dev/null",
            ],
            "holds no usable CA certificate",
        ),
        (
            vec![
                "--webhook-url",
                "http://127.0.0.1:9/T0K3N",
                "--webhook-secret-file",
                "/dev/null",
                "--webhook-ca-file",
                "/dev/null",
            ],
            "--webhook-ca-file is for an https:// --webhook-url",
        ),
        (
            vec!["--webhook-url", "http://127.0.0.1:9/T0K3N"],
            "--webhook-url and --webhook-secret-file go together",
        ),
    ] {
        let out = std::process::Command::new(BIN)
            .arg("run")
            .args(&args)
            // Never reached: the flags are checked first.
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(says), "{stderr}");
        assert!(!stderr.contains("T0K3N"), "{stderr}");
    }
}

/// A server on 127.0.0.1 that answers each connection with the next of
/// `answers` (`None`: closes without answering); returns its port.
async fn answering(answers: Vec<Option<&'static str>>) -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        for answer in answers {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            let _ = s.read(&mut buf).await;
            if let Some(status) = answer {
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        }
    });
    port
}

#[tokio::test]
async fn the_http_client_reports_success_a_refusal_a_server_error_and_a_closed_connection() {
    use sandboxd::cli::webhook_client;
    use sandboxd::ports::webhook::{WebhookError, WebhookTransport};
    let port = answering(vec![
        Some("204 No Content"),
        Some("401 Unauthorized"),
        Some("503 Service Unavailable"),
        None,
    ])
    .await;
    let hook = webhook_client(
        &WebhookUrl::parse(&format!("http://127.0.0.1:{port}/h")).unwrap(),
        None,
    )
    .expect("an http:// transport");
    let body = br#"{"seq":1}"#;
    let signature = notice::sign(SECRET.as_bytes(), 1, body);
    hook.post(body, &signature).await.expect("a 204 is success");
    let refused = hook.post(body, &signature).await.unwrap_err();
    assert!(matches!(refused, WebhookError::Status(401)) && !refused.is_retryable());
    let failed = hook.post(body, &signature).await.unwrap_err();
    assert!(matches!(failed, WebhookError::Status(503)) && failed.is_retryable());
    let closed = hook.post(body, &signature).await.unwrap_err();
    assert!(
        matches!(closed, WebhookError::Unreachable(_)) && closed.is_retryable(),
        "{closed}"
    );
    // Nothing listens any more.
    let gone = hook.post(body, &signature).await.unwrap_err();
    assert!(matches!(gone, WebhookError::Unreachable(_)), "{gone}");
}

/// A CA the tests make: its certificate and key.
struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl TestCa {
    fn new(name: &str) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// The CA's certificate in a PEM file of its own.
    fn pem_file(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join(format!("ca-{}.pem", std::process::id()));
        std::fs::write(&path, self.cert.pem()).unwrap();
        path
    }

    /// A TLS server configuration whose certificate, issued by this CA,
    /// names `names` (DNS names or IP addresses).
    fn server(&self, names: &[&str]) -> TlsAcceptor {
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
        TlsAcceptor::from(Arc::new(config))
    }
}

/// A directory of this test's own for key material, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "sandboxd-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The webhook configuration `sandboxd run` makes of `--webhook-url url
/// --webhook-secret-file … --webhook-ca-file ca`.
fn https_webhook(dir: &TempDir, url: &str, ca: &std::path::Path) -> WebhookConfig {
    let secret = dir.0.join("secret");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    WebhookConfig::from_flags(Some(url), Some(&secret), Some(ca))
        .expect("the webhook flags")
        .expect("a webhook")
}

#[tokio::test]
async fn the_https_client_verifies_the_receivers_certificate_and_never_follows_a_redirect() {
    use sandboxd::cli::webhook_client;
    use sandboxd::ports::webhook::{WebhookError, WebhookTransport};
    let dir = TempDir::new("https-client");
    let ca = TestCa::new("sandboxd test CA");
    let ca_file = ca.pem_file(&dir.0);
    let body = br#"{"seq":1}"#;
    let signature = notice::sign(SECRET.as_bytes(), 1, body);
    let client = |port: u16, host: &str| {
        let config = https_webhook(
            &dir,
            &format!("https://{host}:{port}/h/T0K3N?k=v"),
            &ca_file,
        );
        assert!(config.check().is_ok());
        webhook_client(&config.url, config.tls.as_ref()).expect("its TLS client")
    };

    // Trusted, and naming the address: delivered, over TLS.
    let (port, mut got, mut handshakes) =
        receiver_with(Some(ca.server(&["127.0.0.1", "localhost"]))).await;
    for host in ["127.0.0.1", "localhost"] {
        client(port, host)
            .post(body, &signature)
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        assert_eq!(handshakes.recv().await.unwrap(), Ok(()));
        let d = got.recv().await.unwrap();
        assert!(
            d.head.starts_with("POST /h/T0K3N?k=v HTTP/1.1"),
            "{}",
            d.head
        );
        assert_eq!(
            notice::verify(SECRET.as_bytes(), &d.signature, &d.body),
            Some(1)
        );
    }

    // Issued by a CA sandboxd does not trust: refused in the handshake,
    // retryable like any unreachable receiver, the URL's path not echoed.
    let stranger = TestCa::new("a CA nobody trusts");
    let (port, mut got, mut handshakes) =
        receiver_with(Some(stranger.server(&["127.0.0.1", "localhost"]))).await;
    let e = client(port, "127.0.0.1")
        .post(body, &signature)
        .await
        .unwrap_err();
    assert!(
        matches!(e, WebhookError::Unreachable(_)) && e.is_retryable() && e.kind() == "unreachable",
        "{e}"
    );
    eprintln!("an untrusted receiver: {e}");
    assert!(e.to_string().contains("TLS handshake"), "{e}");
    assert!(!e.to_string().contains("T0K3N"), "{e}");
    assert!(handshakes.recv().await.unwrap().is_err());
    assert!(
        got.try_recv().is_err(),
        "a request reached an untrusted receiver"
    );

    // Trusted CA, but the certificate names another host.
    let (port, mut got, mut handshakes) = receiver_with(Some(ca.server(&["hooks.internal"]))).await;
    let e = client(port, "127.0.0.1")
        .post(body, &signature)
        .await
        .unwrap_err();
    eprintln!("a certificate for another host: {e}");
    assert!(matches!(e, WebhookError::Unreachable(_)), "{e}");
    assert!(handshakes.recv().await.unwrap().is_err());
    assert!(got.try_recv().is_err(), "a request reached the wrong host");

    // A plain-http server behind an https:// URL: no handshake, no request.
    let port = answering(vec![Some("200 OK")]).await;
    let e = client(port, "127.0.0.1")
        .post(body, &signature)
        .await
        .unwrap_err();
    assert!(matches!(e, WebhookError::Unreachable(_)), "{e}");

    // A redirect over https is an answer, not followed and not retried.
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = ca.server(&["127.0.0.1"]);
    tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let mut s = acceptor.accept(s).await.unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let _ = s.read(&mut buf).await;
        let _ = s
            .write_all(
                b"HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:9/elsewhere\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )
            .await;
        let _ = s.shutdown().await;
    });
    let e = client(port, "127.0.0.1")
        .post(body, &signature)
        .await
        .unwrap_err();
    assert!(
        matches!(e, WebhookError::Status(302)) && !e.is_retryable(),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_https_webhook_trusted_through_its_ca_file_receives_the_events_signed() {
    let env = TestEnv::new().await;
    let dir = TempDir::new("https-webhook");
    let ca = TestCa::new("sandboxd test CA");
    let ca_file = ca.pem_file(&dir.0);
    let (port, mut deliveries, mut handshakes) =
        receiver_with(Some(ca.server(&["127.0.0.1"]))).await;
    let mut config = env.config();
    config.webhook = Some(https_webhook(
        &dir,
        &format!("https://127.0.0.1:{port}/hooks/sandboxd?token=t0k3n"),
        &ca_file,
    ));
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("tls-hook");
    let ready = client
        .provision(&id, &request(&["redis"], &[]), Duration::from_secs(90))
        .await
        .expect("ready");
    let password = ready.services["redis"].password.expose().to_owned();

    // The provisioned event arrives over TLS, signed, and in full.
    let provisioned = loop {
        let d = tokio::time::timeout(Duration::from_secs(30), deliveries.recv())
            .await
            .expect("the https webhook gets the provisioned event")
            .unwrap();
        assert_eq!(handshakes.try_recv(), Ok(Ok(())), "each request over TLS");
        assert!(
            d.head
                .starts_with("POST /hooks/sandboxd?token=t0k3n HTTP/1.1"),
            "{}",
            d.head
        );
        notice::verify(SECRET.as_bytes(), &d.signature, &d.body)
            .unwrap_or_else(|| panic!("a bad signature {:?}", d.signature));
        let body = String::from_utf8(d.body).unwrap();
        assert!(!body.contains(&password), "a password in {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        if v["sandbox_id"] == id.as_str() && v["reason"] == "provisioned" {
            break v;
        }
    };
    assert_eq!(provisioned["engine"], "redis");
    assert_eq!(provisioned["owner"], "integration-test");
    let text = delivered_at_least(&controller, 1).await;
    assert_eq!(total(&text, "sandboxd_webhook_attempt_errors_total"), 0.0);
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_https_receiver_whose_certificate_is_not_trusted_gets_nothing_and_each_attempt_is_an_error(
) {
    let env = TestEnv::new().await;
    let dir = TempDir::new("https-untrusted");
    let trusted = TestCa::new("the CA sandboxd trusts");
    let ca_file = trusted.pem_file(&dir.0);
    // The receiver's certificate names the address but comes from another CA.
    let stranger = TestCa::new("a CA nobody trusts");
    let (port, mut deliveries, mut handshakes) =
        receiver_with(Some(stranger.server(&["127.0.0.1"]))).await;
    let mut config = env.config();
    config.webhook = Some(WebhookConfig {
        retries: 1,
        timeout: Duration::from_secs(5),
        ..https_webhook(
            &dir,
            &format!("https://127.0.0.1:{port}/hooks/T0K3N"),
            &ca_file,
        )
    });
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("tls-untrusted");
    client
        .provision(&id, &request(&["redis"], &[]), Duration::from_secs(90))
        .await
        .expect("ready: an unreachable webhook does not hold a sandbox up");

    // The first event: tried, refused in the handshake, retried once,
    // given up; every attempt counted as unreachable.
    eventually(
        "the refused attempts and a given-up event",
        Duration::from_secs(60),
        || async {
            let text = controller.metrics.render();
            let unreachable = text
                .lines()
                .find(|l| {
                    l.starts_with("sandboxd_webhook_attempt_errors_total{error=\"unreachable\"}")
                })?
                .rsplit(' ')
                .next()?
                .parse::<f64>()
                .ok()?;
            let failed = text
                .lines()
                .find(|l| l.starts_with("sandboxd_webhook_deliveries_total{result=\"failed\"}"))?
                .rsplit(' ')
                .next()?
                .parse::<f64>()
                .ok()?;
            (unreachable >= 2.0 && failed >= 1.0).then_some(())
        },
    )
    .await;
    let refused = handshakes.recv().await.unwrap();
    assert!(refused.is_err(), "the handshake failed: {refused:?}");
    while let Ok(h) = handshakes.try_recv() {
        assert!(h.is_err(), "a handshake succeeded");
    }
    assert!(
        deliveries.try_recv().is_err(),
        "an event reached the untrusted receiver"
    );
    let text = controller.metrics.render();
    assert_eq!(
        text.lines()
            .find(|l| l.starts_with("sandboxd_webhook_deliveries_total{result=\"delivered\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .map(|v| v.parse::<f64>().unwrap())
            .unwrap_or(0.0),
        0.0,
        "{text}"
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listen_client_and_the_webhook_receive_the_checkpoint_and_reset_events() {
    let env = TestEnv::new().await;
    let (port, mut deliveries) = receiver().await;
    let mut listener = listen(&env).await;
    let mut config = env.config();
    config.webhook = Some(webhook(&format!("http://127.0.0.1:{port}/hooks")));
    let controller = env.start(config);
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("ckptnote");
    let ready = client
        .provision(&id, &request(&["redis"], &[]), Duration::from_secs(90))
        .await
        .expect("ready");
    let password = ready.services["redis"].password.expose().to_owned();
    client
        .checkpoint(&id, "seed", Duration::from_secs(30))
        .await
        .expect("checkpoint");
    client
        .reset(&id, Some("seed"), Duration::from_secs(30))
        .await
        .expect("reset to the checkpoint");
    client
        .reset(&id, None, Duration::from_secs(30))
        .await
        .expect("reset to the baseline");
    let incarnation = client.incarnation(&id).await.unwrap().expect("the row");
    let resets = std::sync::atomic::AtomicUsize::new(0);
    let announced = notified_until(
        &mut listener,
        incarnation.as_str(),
        Duration::from_secs(30),
        |v| {
            v["reason"] == "reset" && resets.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 1
        },
    )
    .await;
    // The payload names no checkpoint: the detail is the row's.
    let mut words: Vec<(String, String)> = Vec::new();
    for (v, raw) in &announced {
        assert!(!raw.contains("\"seed\""), "a checkpoint's name in {raw}");
        let detail: Option<String> =
            sqlx::query_scalar("SELECT detail FROM sandbox_events WHERE seq = $1")
                .bind(v["seq"].as_i64().unwrap())
                .fetch_one(&env.pool)
                .await
                .unwrap();
        let reason = v["reason"].as_str().unwrap_or_default().to_owned();
        if reason != "provisioned" {
            words.push((reason, detail.unwrap_or_default()));
        }
    }
    assert_eq!(
        words,
        [
            ("checkpointed".to_owned(), "seed".to_owned()),
            ("reset".to_owned(), "seed".to_owned()),
            ("reset".to_owned(), "baseline".to_owned()),
        ],
        "{announced:?}"
    );
    for (v, raw) in &announced {
        assert_eq!(
            keys(v),
            PUBLIC_KEYS.iter().map(|k| k.to_string()).collect(),
            "{raw}"
        );
        assert!(!raw.contains(&password), "a password in {raw}");
    }

    // The webhook gets the same events, signed, with their messages.
    let mut received: Vec<Value> = Vec::new();
    while received.len() < announced.len() {
        let d = tokio::time::timeout(Duration::from_secs(30), deliveries.recv())
            .await
            .unwrap_or_else(|_| panic!("the webhook got {received:?}, NOTIFY {announced:?}"))
            .unwrap();
        notice::verify(SECRET.as_bytes(), &d.signature, &d.body)
            .unwrap_or_else(|| panic!("a bad signature {:?}", d.signature));
        let body = String::from_utf8(d.body).unwrap();
        assert!(!body.contains(&password), "a password in {body}");
        received.push(serde_json::from_str(&body).unwrap());
    }
    for ((announced, _), delivered) in announced.iter().zip(&received) {
        assert_eq!(delivered["seq"], announced["seq"], "in order: {received:?}");
        assert_eq!(delivered["reason"], announced["reason"]);
    }
    let delivered: Vec<&str> = received
        .iter()
        .filter(|v| v["reason"] != "provisioned")
        .map(|v| v["detail"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        delivered,
        ["seed", "seed", "baseline"],
        "the webhook's details"
    );
    let reset = received.last().unwrap();
    assert!(
        reset["message"]
            .as_str()
            .is_some_and(|m| m.contains("baseline")),
        "{reset}"
    );
    client.release(&id).await.unwrap();
    controller.stop().await;
}
