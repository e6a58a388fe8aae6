//! The operator page in a real browser: `sandboxd run` as a process, its
//! page loaded by Debian's `chromium` (headless, `--dump-dom`: the DOM
//! after the page and whatever it navigated to have loaded).
//!
//! Actions are posted by a local file whose form submits itself, as the
//! page's own form does when its button is pressed: the browser sends the
//! same request (a form POST from another origin is exactly what the
//! token must stop).

use crate::common;

use common::{eventually, free_port, http_get, kill_and_wait_healed, request, sandbox_id, TestEnv};
use sandboxd::client::Client;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const READY: Duration = Duration::from_secs(90);
const TOKEN: &str = "operator-token-0123456789abcdef";

/// A directory of this test's own (the token file, the browser's profile,
/// the pages that post actions).
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sandboxd-operator-page-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The DOM of `url` once it (and any navigation it starts) has loaded, as
/// headless chromium serialises it.
fn browse(dir: &Path, url: &str) -> String {
    let out = Command::new("chromium")
        .args([
            "--headless",
            // The tests run as root, where chromium's own sandbox cannot.
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run chromium ({e}): install it with `. scripts/lib.sh; ensure_chromium` (scripts/test.sh does)")
        });
    assert!(
        out.status.success(),
        "chromium --dump-dom {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What the browser shows after posting `action` on `port` with `token`
/// in the form (none: an empty field).
fn post(dir: &Path, port: u16, action: &str, token: &str) -> String {
    let page = dir.join("post.html");
    std::fs::write(
        &page,
        format!(
            "<!doctype html><form method=\"post\" action=\"http://127.0.0.1:{port}{action}\">\
             <input name=\"token\" value=\"{token}\"></form>\
             <script>document.forms[0].submit()</script>"
        ),
    )
    .unwrap();
    browse(dir, &format!("file://{}", page.display()))
}

/// [`TOKEN`] in a private file under `dir`, as `--operator-token-file`
/// requires (mode 0600).
fn token_file(dir: &std::path::Path) -> PathBuf {
    let file = dir.join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    file
}

#[tokio::test]
async fn the_operator_page_lists_a_sandbox_shows_its_heal_and_refuses_actions_without_the_token() {
    let env = TestEnv::new().await;
    let dir = scratch();
    let token_file = token_file(&dir);
    let port = free_port();
    let _leader = env.spawn_binary(
        port,
        &[("SANDBOXD_OPERATOR_TOKEN_FILE", token_file.to_str().unwrap())],
    );
    eventually("/readyz answers 200", Duration::from_secs(30), || async {
        matches!(http_get(port, "/readyz").await, Some((200, _))).then_some(())
    })
    .await;

    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("page");
    let ready = client
        .provision(&id, &request(&["postgres"], &[]), READY)
        .await
        .unwrap();
    let password = ready.services["postgres"].password.expose().to_owned();
    let owner = client.desired(&id).await.unwrap().unwrap().owner;
    let base = format!("http://127.0.0.1:{port}");

    // The list: the sandbox with its phase, owner and engine; the leader.
    let list = browse(&dir, &format!("{base}/"));
    let row = format!("<a href=\"/sandboxes/{id}\">{id}</a>");
    for needle in [
        row.as_str(),
        "<td class=\"phase-ready\">ready</td>",
        &format!("<td>{owner}</td>"),
        "<td>postgres</td>",
        "leads in term",
        // The pool learned from this request.
        "<th>Pool</th><th>Ready</th><th>Starting</th><th>Target</th></tr><tr><td>postgres</td>",
    ] {
        assert!(list.contains(needle), "{needle:?} not on the page:\n{list}");
    }

    // A `docker kill`; the sandbox's page shows the heal (its count and
    // its event), as `sandboxd describe` does, and never the password.
    let (_, healed) =
        kill_and_wait_healed(&env, &client, &id, "postgres", Duration::from_secs(60)).await;
    assert_eq!(healed.services["postgres"].heals, 1);
    let page = eventually(
        "the sandbox's page shows the heal",
        Duration::from_secs(30),
        || async {
            let page = browse(&dir, &format!("{base}/sandboxes/{id}"));
            (page.contains("Heals:        1") && page.contains("healed")).then_some(page)
        },
    )
    .await;
    assert!(page.contains("Phase:        ready"), "{page}");
    assert!(page.contains("*** (--show-secrets)"), "{page}");
    assert!(
        !page.contains(&password),
        "the password is on the page:\n{page}"
    );
    assert!(
        page.contains(&format!("action=\"/sandboxes/{id}/release\"")),
        "{page}"
    );
    let list = browse(&dir, &format!("{base}/"));
    assert!(!list.contains(&password));

    // Actions: refused without the token and with a wrong one; the row
    // stays. With the token, the release goes through.
    let release = format!("/sandboxes/{id}/release");
    let refused = post(&dir, port, &release, "");
    assert!(
        refused.contains("Refused") && refused.contains("needs the operator token"),
        "{refused}"
    );
    let refused = post(&dir, port, &release, "operator-token-0123456789abcdeX");
    assert!(refused.contains("Wrong operator token"), "{refused}");
    assert!(client.desired(&id).await.unwrap().is_some());
    assert_eq!(
        client.status(&id).await.unwrap().unwrap().phase,
        sandboxd::domain::Phase::Ready
    );

    // A second process of the deployment stands by; started without a
    // token file, its page is read-only and says who leads.
    let standby_port = free_port();
    let _standby = env.spawn_binary(standby_port, &[]);
    let standby = format!("http://127.0.0.1:{standby_port}");
    let page = eventually("the standby's page", Duration::from_secs(30), || async {
        http_get(standby_port, "/healthz").await?;
        let page = browse(&dir, &format!("{standby}/"));
        page.contains("standby:").then_some(page)
    })
    .await;
    assert!(
        page.contains("Read-only") && !page.contains("<form"),
        "{page}"
    );
    let refused = post(&dir, standby_port, &release, TOKEN);
    assert!(refused.contains("Actions are off"), "{refused}");
    assert!(client.desired(&id).await.unwrap().is_some());

    let done = post(&dir, port, &release, TOKEN);
    assert!(done.contains("Released"), "{done}");
    assert!(client.desired(&id).await.unwrap().is_none());
    eventually("containers gone", Duration::from_secs(30), || async {
        env.containers(Some(&id)).await.is_empty().then_some(())
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plain HTTP/1.1 `method` of `path` on 127.0.0.1:`port` whose Host is
/// `host` (and `headers`, `Name: value`): what a browser sends for a page
/// of that name, whatever address the name resolves to. The status and
/// the body.
async fn request_as(
    port: u16,
    method: &str,
    host: &str,
    path: &str,
    headers: &[&str],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to sandboxd's port");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: 0\r\n"
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let buf = String::from_utf8_lossy(&buf).into_owned();
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {buf}"));
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

/// Issue 50, finding 10: the port answered any Host, so a page on another
/// site whose name was made to resolve to 127.0.0.1 (DNS rebinding) could
/// read every tenant's ids and owners through the operator's browser. Now
/// every route answers only addresses, localhost and the names given to
/// --http-host; a forged Host gets 403 naming the flag, forwarding headers
/// change nothing, and an action with the right token is refused too.
#[tokio::test]
async fn the_http_port_answers_only_the_hosts_it_is_served_on_so_no_rebinding_page_reads_owners_or_ids(
) {
    let env = TestEnv::new().await;
    let dir = scratch();
    let token_file = token_file(&dir);
    let port = free_port();
    let _sandboxd = env.spawn_binary(
        port,
        &[
            ("SANDBOXD_OPERATOR_TOKEN_FILE", token_file.to_str().unwrap()),
            ("SANDBOXD_HTTP_HOSTS", "sandboxd.internal"),
        ],
    );
    eventually("/readyz answers 200", Duration::from_secs(30), || async {
        matches!(http_get(port, "/readyz").await, Some((200, _))).then_some(())
    })
    .await;
    let client = Client::from_pool(env.pool.clone());
    let id = sandbox_id("rebind");
    let owner = "tenant-of-record";
    let mut req = request(&["redis"], &[]);
    req.owner = owner.into();
    client.apply(&id, &req).await.unwrap();

    // Served: the page shows the sandbox and its owner.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        format!("localhost:{port}"),
        format!("sandboxd.internal:{port}"),
        "SANDBOXD.INTERNAL.".to_owned(),
    ] {
        let (code, page) = request_as(port, "GET", &host, "/", &[]).await;
        assert_eq!(code, 200, "{host}: {page}");
        assert!(
            page.contains(id.as_str()) && page.contains(owner),
            "{host}: {page}"
        );
    }
    let (code, metrics) =
        request_as(port, "GET", &format!("127.0.0.1:{port}"), "/metrics", &[]).await;
    assert_eq!(code, 200, "{metrics}");

    // A rebinding page: its own name, on every route.
    let rebind = format!("rebind.attacker.example:{port}");
    let page = format!("/sandboxes/{id}");
    for path in ["/", page.as_str(), "/metrics", "/readyz", "/healthz"] {
        for headers in [
            &[][..],
            &["X-Forwarded-Host: 127.0.0.1", "Forwarded: host=localhost"][..],
        ] {
            let (code, body) = request_as(port, "GET", &rebind, path, headers).await;
            assert_eq!(code, 403, "{path} {headers:?}: {body}");
            assert!(body.contains("--http-host NAME"), "{path}: {body}");
            assert!(
                !body.contains(id.as_str()) && !body.contains(owner),
                "{path}: {body}"
            );
        }
    }
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let release = format!("/sandboxes/{id}/release");
    let (code, body) = request_as(port, "POST", &rebind, &release, &[&bearer]).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        client.desired(&id).await.unwrap().is_some(),
        "released through a rebinding page"
    );

    assert!(client.release(&id).await.unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}
