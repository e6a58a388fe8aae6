//! Event notifications on a real Postgres and Docker: a `LISTEN
//! sandbox_events` client receives every event as it is recorded (a heal
//! of a killed container included) without owner, message or credential;
//! a webhook receiver on 127.0.0.1 receives the same events, signed; and a
//! webhook that accepts connections and never answers does not delay a
//! heal (its timeouts, retries and drops are counted).

mod common;

use common::{docker_ok, eventually, hold_lease, request, sandbox_id, total, TestEnv, BIN};
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
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// The keys of a `NOTIFY sandbox_events` payload: what every role that may
/// connect is allowed to know.
const PUBLIC_KEYS: [&str; 8] = [
    "count",
    "detail",
    "engine",
    "first_at",
    "last_at",
    "reason",
    "sandbox_id",
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

/// Payloads from `listener` until one of sandbox `id` satisfies `done`
/// (all of them, in order, that are `id`'s).
async fn notified_until(
    listener: &mut PgListener,
    id: &SandboxId,
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
        if v["sandbox_id"] == id.as_str() {
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
    kill(&env, &id, "redis").await;
    let got = notified_until(&mut listener, &id, Duration::from_secs(90), |v| {
        v["reason"] == "healed"
    })
    .await;

    let provisioned = got
        .iter()
        .find(|(v, _)| v["reason"] == "provisioned")
        .unwrap_or_else(|| panic!("no provisioned event in {got:?}"));
    assert_eq!(provisioned.0["engine"], "redis");
    let (heal, _) = got.last().unwrap();
    assert_eq!(heal["engine"], "redis");
    assert_eq!(heal["detail"], "exited");
    assert_eq!(heal["count"], 1);
    for (v, raw) in &got {
        assert_eq!(
            keys(v),
            PUBLIC_KEYS.iter().map(|k| k.to_string()).collect(),
            "{raw}"
        );
        assert!(!raw.contains(&password), "a password in {raw}");
        assert!(!raw.contains("integration-test"), "the owner in {raw}");
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
    assert!(message.contains("its container stopped"), "{message}");
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
    let store = sandboxd::adapters::PgStore::from_pool(env.pool.clone());
    let term = Term(hold_lease(&env.pool).await);
    let suffix = env.deployment.as_str().to_owned();
    let (mine, theirs) = (format!("orch-{suffix}"), format!("other-{suffix}"));
    let (orchestrator, _) = env.create_login_role(&mine).await;
    store.grant_orchestrator(&mine, true).await.unwrap();
    // An own-rows-only orchestrator may LISTEN too: nothing restricts a
    // channel, which is why the payload carries no owner and no message.
    let mut listener = PgListener::connect_with(&orchestrator).await.unwrap();
    listener.listen(NOTIFY_CHANNEL).await.unwrap();
    let id = sandbox_id("theirs");
    // A status whose password a careless message repeats.
    sqlx::query(
        "INSERT INTO sandbox_status (id, phase, services, leader_term)
         VALUES ($1, 'ready', '{\"postgres\": {\"password\": \"pw-in-status-0123456789\"}}', $2)",
    )
    .bind(id.as_str())
    .bind(term.0)
    .execute(&env.pool)
    .await
    .unwrap();
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
    assert_eq!(values[2]["sandbox_id"], mine_id.as_str());
    for (raw, v) in got.iter().zip(&values) {
        assert!(!raw.contains("pw-in-status"), "{raw}");
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
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
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
                let _ = tx.send(Delivery {
                    signature: header(SIGNATURE_HEADER),
                    head,
                    body: buf[body_at..body_at + length].to_vec(),
                });
            });
        }
    });
    (port, rx)
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
    kill(&env, &id, "redis").await;
    let announced = notified_until(&mut listener, &id, Duration::from_secs(90), |v| {
        v["reason"] == "healed"
    })
    .await;

    // The webhook gets each announced event: the same JSON plus owner,
    // incarnation and message, signed.
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
        assert!(object.contains_key("incarnation"));
        object.remove("incarnation");
        assert_eq!(
            &stripped, public,
            "the webhook's JSON is the NOTIFY payload plus three fields"
        );
    }
    let heal = received.last().unwrap();
    assert_eq!(
        (heal["reason"].as_str(), heal["detail"].as_str()),
        (Some("healed"), Some("exited"))
    );
    let text = controller.metrics.render();
    assert!(
        total(&text, "sandboxd_webhook_deliveries_total") >= received.len() as f64,
        "{text}"
    );
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
        // (the second heal waits out the 2 s crash-loop back-off).
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
fn sandboxd_run_refuses_an_https_webhook_or_a_missing_secret_without_echoing_the_url() {
    for (args, says) in [
        (
            vec![
                "--webhook-url",
                "https://hooks.example/T0K3N",
                "--webhook-secret-file",
                "/dev/null",
            ],
            "only http:// is supported",
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
    use sandboxd::adapters::webhook::HttpWebhook;
    use sandboxd::ports::webhook::{WebhookError, WebhookTransport};
    let port = answering(vec![
        Some("204 No Content"),
        Some("401 Unauthorized"),
        Some("503 Service Unavailable"),
        None,
    ])
    .await;
    let hook = HttpWebhook::new(WebhookUrl::parse(&format!("http://127.0.0.1:{port}/h")).unwrap());
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
