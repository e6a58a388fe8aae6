//! What the SRE sees: sandboxd scraped by a real Prometheus (Debian's
//! `prometheus` package, on loopback) through a scenario that provisions,
//! heals, rotates and deletes; then every dashboard expression and every
//! alert's signal must return data, and promtool must accept the rules,
//! their unit tests and the `/metrics` output.

use crate::common;

use bollard::query_parameters::KillContainerOptions;
use common::{eventually, free_port, http_get, request, sandbox_id, urlencode, TestEnv};
use sandboxd::client::Client;
use sandboxd::domain::container::ContainerState;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

struct Prometheus {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start_prometheus(target_port: u16) -> Prometheus {
    let dir = std::env::temp_dir().join(format!("sandboxd-prom-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n  - {}\nscrape_configs:\n  - job_name: sandboxd\n    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n",
        repo("deploy/prometheus/alerts.yml").display(),
        repo("deploy/prometheus/slo.yml").display()
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus (Debian package `prometheus`; scripts/test.sh installs it)");
    Prometheus {
        child,
        port,
        _dir: TempDir(dir),
    }
}

/// Runs an instant query; returns the number of series in the result.
async fn query(prom: u16, expr: &str) -> Result<usize, String> {
    let (code, body) = http_get(prom, &format!("/api/v1/query?query={}", urlencode(expr)))
        .await
        .ok_or("prometheus did not answer")?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    if code != 200 || v["status"] != "success" {
        return Err(format!("HTTP {code}: {body}"));
    }
    Ok(v["data"]["result"].as_array().map_or(0, Vec::len))
}

/// The signal of an alert: its expression without the final top-level
/// comparison (`<signal> <op> <threshold>`, the convention of alerts.yml).
fn alert_signal(expr: &str) -> String {
    let mut depth = 0i32;
    let mut cut = None;
    let bytes = expr.as_bytes();
    for (i, c) in expr.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            '>' | '<' | '=' | '!' if depth == 0 => {
                let prev = if i > 0 { bytes[i - 1] } else { b' ' };
                if !matches!(prev, b'>' | b'<' | b'=' | b'!') && bytes.get(i + 1) != Some(&b'~') {
                    cut = Some(i);
                }
            }
            _ => {}
        }
    }
    match cut {
        Some(i) => expr[..i].trim().to_owned(),
        None => expr.trim().to_owned(),
    }
}

fn dashboard_exprs() -> BTreeSet<String> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo("dashboards/sandboxd.json")).unwrap())
            .unwrap();
    let mut exprs = BTreeSet::new();
    for panel in json["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                exprs.insert(
                    e.replace("$__rate_interval", "1m")
                        .replace("$__interval", "15s"),
                );
            }
        }
    }
    exprs
}

#[test]
fn alert_signals_are_the_expression_before_the_final_comparison() {
    assert_eq!(
        alert_signal(r#"up{job="sandboxd"} == 0"#),
        r#"up{job="sandboxd"}"#
    );
    assert_eq!(
        alert_signal(r#"sum(rate(x{a!="b"}[5m])) / clamp_min(sum(rate(y[5m])), 0.001) > 0.25"#),
        r#"sum(rate(x{a!="b"}[5m])) / clamp_min(sum(rate(y[5m])), 0.001)"#
    );
    assert_eq!(alert_signal("max(g) >= 3"), "max(g)");
}

/// The GitHub anchors of `doc`'s `## ` sections.
fn section_anchors(doc: &str) -> BTreeSet<String> {
    doc.lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| {
            h.to_lowercase()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == ' ' || *c == '-')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

#[test]
fn every_dashboard_panel_links_to_a_section_of_the_runbook_or_the_objectives() {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo("dashboards/sandboxd.json")).unwrap())
            .unwrap();
    let runbook = section_anchors(&std::fs::read_to_string(repo("docs/runbook.md")).unwrap());
    let mut without = Vec::new();
    for panel in json["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        let linked = panel["links"].as_array().into_iter().flatten().any(|l| {
            let url = l["url"].as_str().unwrap_or_default();
            match url.split_once("/docs/runbook.md#") {
                Some((_, anchor)) => runbook.contains(anchor),
                None => url.ends_with("/docs/slo.md"),
            }
        });
        if !linked {
            without.push(panel["title"].as_str().unwrap_or_default().to_owned());
        }
    }
    assert!(
        without.is_empty(),
        "panels without a link to an existing runbook section: {without:?}"
    );
}

#[test]
fn promtool_accepts_the_config_the_rules_and_their_unit_tests() {
    let check = |args: &[&str], dir: &Path| {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let prom_dir = repo("deploy/prometheus");
    check(&["check", "config", "prometheus.yml"], &prom_dir);
    check(&["check", "rules", "alerts.yml", "slo.yml"], &prom_dir);
    check(
        &["test", "rules", "alerts_test.yml", "slo_test.yml"],
        &prom_dir,
    );
}

#[tokio::test]
async fn every_dashboard_and_alert_expression_returns_data_from_a_real_prometheus() {
    let env = TestEnv::new().await;
    let port = free_port();
    let _sandboxd = env.spawn_binary(port, &[("SANDBOXD_RELIST_INTERVAL", "2s")]);
    eventually("sandboxd /readyz", Duration::from_secs(30), || async {
        matches!(http_get(port, "/readyz").await, Some((200, _))).then_some(())
    })
    .await;
    let prom = start_prometheus(port);
    eventually(
        "prometheus scrapes sandboxd",
        Duration::from_secs(60),
        || async {
            (query(prom.port, r#"up{job="sandboxd"} == 1"#).await.ok()? == 1).then_some(())
        },
    )
    .await;

    // A default quota, so that the use-against-quota panel has its limit.
    sandboxd::adapters::PgStore::with_engines(env.pool.clone(), sandboxd::engine::REGISTRY)
        .set_quota(
            "*",
            sandboxd::adapters::postgres::QuotaSetting::To(100),
            sandboxd::adapters::postgres::QuotaSetting::To(100 << 30),
        )
        .await
        .expect("set a default quota");
    // The scenario: provision, kill (heal), rotate, delete.
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("obs");
    let mut req = request(&["postgres", "redis"], &[("postgres", "pg_trgm")]);
    client.provision(&id, &req, READY).await.expect("provision");
    let victim = env
        .containers(Some(&id))
        .await
        .into_iter()
        .find(|c| c.labels.engine == "redis" && c.state == ContainerState::Running)
        .unwrap();
    env.docker
        .kill_container(victim.id.as_str(), None::<KillContainerOptions>)
        .await
        .unwrap();
    // Healed (perhaps from a warm pool the requests taught, whose
    // containers carry no sandbox label): the status says so.
    eventually("the killed container is healed", READY, || async {
        let s = client.status(&id).await.ok()??;
        (s.phase == sandboxd::domain::Phase::Ready && s.services["redis"].heals >= 1).then_some(())
    })
    .await;
    req.features
        .get_mut("postgres")
        .unwrap()
        .insert("citext".into());
    client.provision(&id, &req, READY).await.expect("rotate");
    client.release(&id).await.unwrap();
    eventually(
        "deleted sandbox torn down",
        Duration::from_secs(30),
        || async { env.containers(Some(&id)).await.is_empty().then_some(()) },
    )
    .await;
    // Let Prometheus scrape the end state a few times.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let mut empty = Vec::new();
    let exprs = dashboard_exprs();
    assert!(
        exprs.len() >= 20,
        "the dashboard has its panels: {}",
        exprs.len()
    );
    for expr in &exprs {
        match query(prom.port, expr).await {
            Ok(0) => empty.push(format!("dashboard: {expr}")),
            Ok(_) => {}
            Err(e) => empty.push(format!("dashboard: {expr}: {e}")),
        }
    }

    let (_, rules) = http_get(prom.port, "/api/v1/rules")
        .await
        .expect("rules API");
    let rules: serde_json::Value = serde_json::from_str(&rules).unwrap();
    let mut alerts = BTreeSet::new();
    for group in rules["data"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            if rule["type"] != "alerting" {
                continue;
            }
            alerts.insert(rule["name"].as_str().unwrap_or_default().to_owned());
            let signal = alert_signal(rule["query"].as_str().unwrap());
            match query(prom.port, &signal).await {
                Ok(0) => empty.push(format!("alert {}: {signal}", rule["name"])),
                Ok(_) => {}
                Err(e) => empty.push(format!("alert {}: {signal}: {e}", rule["name"])),
            }
            let summary = rule["annotations"]["summary"].as_str().unwrap_or_default();
            assert!(!summary.is_empty(), "alert {} has a summary", rule["name"]);
            // An alert about particular sandboxes or owners names them.
            for (name, subject) in [
                ("SandboxdHealLoop", ".Labels.sandbox"),
                ("SandboxdAdmissionNeverFits", ".Labels.owner"),
            ] {
                assert!(
                    rule["name"] != name || summary.contains(subject),
                    "alert {name}'s summary names its {subject}: {summary}"
                );
            }
            let runbook = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_default();
            let anchor = runbook.rsplit_once('#').map(|(_, a)| a).unwrap_or_default();
            let doc = std::fs::read_to_string(repo("docs/runbook.md"))
                .unwrap()
                .to_lowercase();
            assert!(
                !anchor.is_empty() && doc.contains(&format!("## {anchor}")),
                "alert {} has a runbook section ({runbook})",
                rule["name"]
            );
        }
    }
    // Both rule files: the threshold alerts and the objectives' burn rates.
    for name in ["SandboxdDown", "Watchdog", "SandboxdSLOAvailabilityBurn1h"] {
        assert!(alerts.contains(name), "{name} loaded: {alerts:?}");
    }
    assert!(
        empty.is_empty(),
        "expressions without data:\n{}",
        empty.join("\n")
    );

    // The exposition passes promtool's linter.
    let (_, text) = http_get(port, "/metrics").await.unwrap();
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    lint.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
