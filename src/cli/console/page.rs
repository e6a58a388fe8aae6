//! The operator page's HTML: plain documents, no script, one inline style
//! sheet, every value from a row or a container escaped (owners, ids and
//! messages come from tenants, who are untrusted). Pure functions of what
//! [`super`] read, tested as tables below.

use crate::cli::table::{age, first_line};
use crate::client::SandboxSummary;
use crate::ports::ControllerView;
use chrono::{DateTime, Utc};
use std::fmt::Write as _;

/// What every page says in its header and whether it offers actions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame<'a> {
    /// The deployment this process runs.
    pub(crate) deployment: &'a str,
    /// Whether `--operator-token-file` was given.
    pub(crate) actions: bool,
}

/// `text` with `& < > " '` replaced by entities: safe in element content
/// and in quoted attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse}th,td{text-align:left;padding:.2em .8em;border-bottom:1px solid #ddd;vertical-align:top}\
th{font-weight:600}pre{background:#f6f6f6;padding:1em;overflow:auto}\
.phase-ready{color:#1a7f37}.phase-failed{color:#c62828}.phase-provisioning,.phase-pending,.phase-paused{color:#9a6700}\
form{display:inline-block;margin:.3em 1em .3em 0}footer{margin-top:2em;color:#666}";

/// How often the pages reload themselves (a `<meta>` refresh, no script).
pub(crate) const REFRESH_SECONDS: u32 = 10;

fn document(frame: Frame<'_>, title: &str, refresh: bool, body: &str) -> String {
    let refresh = if refresh {
        format!("<meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">")
    } else {
        String::new()
    };
    let actions = if frame.actions {
        "Actions need the token of <code>--operator-token-file</code>."
    } else {
        "Read-only: start <code>sandboxd run</code> with <code>--operator-token-file</code> for actions."
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width\">{refresh}\
<title>{title} · sandboxd</title><style>{STYLE}</style></head><body>\
<header><a href=\"/\">sandboxd</a> · deployment <b>{deployment}</b></header>\n{body}\n\
<footer>{actions} Reloads every {REFRESH_SECONDS} s. \
<a href=\"/metrics\">/metrics</a> · <a href=\"/readyz\">/readyz</a></footer></body></html>\n",
        title = escape(title),
        deployment = escape(frame.deployment),
    )
}

/// A form that POSTs `action`, with the token field when actions are on;
/// nothing when they are off.
fn action_form(frame: Frame<'_>, action: &str, label: &str) -> String {
    if !frame.actions {
        return String::new();
    }
    format!(
        "<form method=\"post\" action=\"{action}\">\
<input type=\"password\" name=\"token\" placeholder=\"operator token\" autocomplete=\"off\" required> \
<button type=\"submit\">{label}</button></form>",
        action = escape(action),
        label = escape(label),
    )
}

/// `/`: the controller (leadership, reaping, warm pools) and every
/// sandbox.
pub(crate) fn overview(
    frame: Frame<'_>,
    controller: &ControllerView,
    sandboxes: &[SandboxSummary],
    now: DateTime<Utc>,
) -> String {
    let mut b = String::new();
    b.push_str("<h1>sandboxd</h1>\n<h2>Controller</h2>\n<table>");
    let _ = write!(
        b,
        "<tr><th>Leader</th><td id=\"leader\">{}</td></tr>",
        escape(&controller.leadership)
    );
    match &controller.reaping_paused {
        // The circuit breaker is the leader's: a standby cannot tell.
        _ if !controller.leads => b.push_str(
            "<tr><th>Reaping</th><td id=\"reaping\">the leader's page says (this process stands by)</td></tr>",
        ),
        None => b.push_str("<tr><th>Reaping</th><td id=\"reaping\">active</td></tr>"),
        Some(why) => {
            let _ = write!(
                b,
                "<tr><th>Reaping</th><td id=\"reaping\">paused: {}<br>{}</td></tr>",
                escape(why),
                action_form(frame, "/reaping/resume", "Resume reaping")
            );
        }
    }
    b.push_str("</table>\n<h2>Warm pool</h2>\n");
    if controller.pools.is_empty() {
        b.push_str("<p id=\"pool\">No warm pool (<code>--warm-pool</code>, or one learned from demand).</p>\n");
    } else {
        b.push_str("<table id=\"pool\"><tr><th>Pool</th><th>Ready</th><th>Starting</th><th>Target</th></tr>");
        for p in &controller.pools {
            let _ = write!(
                b,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&p.pool),
                p.ready,
                p.starting,
                p.target
            );
        }
        b.push_str("</table>\n");
    }
    let _ = writeln!(b, "<h2>Sandboxes ({})</h2>", sandboxes.len());
    if sandboxes.is_empty() {
        b.push_str("<p id=\"sandboxes\">None.</p>");
    } else {
        b.push_str(
            "<table id=\"sandboxes\"><tr><th>ID</th><th>Phase</th><th>Owner</th><th>Engines</th>\
<th>Age</th><th>Heals</th><th>Message</th></tr>",
        );
        for s in sandboxes {
            let _ = write!(
                b,
                "<tr data-id=\"{id}\"><td><a href=\"/sandboxes/{id}\">{id}</a></td>\
<td class=\"phase-{phase}\">{phase}</td><td>{owner}</td><td>{engines}</td><td>{age}</td>\
<td>{heals}</td><td>{message}</td></tr>",
                id = escape(&s.id),
                phase = escape(&s.phase),
                owner = escape(s.owner.as_deref().unwrap_or("-")),
                engines = escape(&s.engines.join(", ")),
                age = s.created_at.map_or_else(|| "-".to_owned(), |c| age(c, now)),
                heals = s.heals,
                message = escape(&first_line(&s.message, 120)),
            );
        }
        b.push_str("</table>");
    }
    document(frame, "sandboxes", true, &b)
}

/// `/sandboxes/ID`: what `sandboxd describe ID` prints (`described`,
/// without secrets) and the actions on it.
pub(crate) fn sandbox(frame: Frame<'_>, id: &str, described: &str, wanted: bool) -> String {
    let mut b = String::new();
    let _ = write!(
        b,
        "<h1>{id}</h1>\n<pre id=\"describe\">{}</pre>\n",
        escape(described),
        id = escape(id)
    );
    if frame.actions && wanted {
        b.push_str("<h2>Actions</h2>\n<p>");
        b.push_str(&action_form(
            frame,
            &format!("/sandboxes/{id}/resume"),
            "Resume (if paused)",
        ));
        b.push_str(&action_form(
            frame,
            &format!("/sandboxes/{id}/release"),
            "Release (delete its row; its containers are torn down)",
        ));
        b.push_str("</p>\n");
    }
    document(frame, id, true, &b)
}

/// A page that says one thing: an action's outcome, a refusal, a sandbox
/// not found, a failed read.
pub(crate) fn message(frame: Frame<'_>, title: &str, text: &str, back: &str) -> String {
    let body = format!(
        "<h1>{}</h1>\n<p id=\"message\">{}</p>\n<p><a href=\"{}\">Back</a></p>",
        escape(title),
        escape(text),
        escape(back)
    );
    document(frame, title, false, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::PoolView;

    const ON: Frame<'static> = Frame {
        deployment: "default",
        actions: true,
    };
    const OFF: Frame<'static> = Frame {
        deployment: "default",
        actions: false,
    };

    #[test]
    fn escape_neutralises_markup_in_text_and_attributes() {
        for (text, escaped) in [
            ("agent-7", "agent-7"),
            (
                "<script>alert(1)</script>",
                "&lt;script&gt;alert(1)&lt;/script&gt;",
            ),
            ("\" onmouseover=\"x", "&quot; onmouseover=&quot;x"),
            ("a & b 'c'", "a &amp; b &#39;c&#39;"),
            ("", ""),
        ] {
            assert_eq!(escape(text), escaped, "{text}");
        }
    }

    fn summary(owner: &str, message: &str) -> SandboxSummary {
        SandboxSummary {
            id: "agent-7".into(),
            phase: "ready".into(),
            owner: Some(owner.into()),
            engines: vec!["postgres".into(), "redis".into()],
            created_at: Some(Utc::now() - chrono::Duration::minutes(5)),
            generation: Some(1),
            observed_generation: 1,
            heals: 2,
            network: None,
            message: message.into(),
        }
    }

    fn view(paused: Option<&str>) -> ControllerView {
        ControllerView {
            leadership: "this process (h) leads in term 3".into(),
            leads: true,
            reaping_paused: paused.map(str::to_owned),
            pools: vec![PoolView {
                pool: "postgres".into(),
                ready: 1,
                starting: 1,
                target: 2,
            }],
        }
    }

    #[test]
    fn the_overview_lists_each_sandbox_escaped_with_the_leader_and_the_pool() {
        let hostile = summary("<img src=x onerror=alert(1)>", "</td><script>x</script>");
        let page = overview(OFF, &view(None), &[hostile], Utc::now());
        for (needle, present) in [
            ("<a href=\"/sandboxes/agent-7\">agent-7</a>", true),
            ("<td class=\"phase-ready\">ready</td>", true),
            ("&lt;img src=x onerror=alert(1)&gt;", true),
            ("<img", false),
            ("<script", false),
            ("postgres, redis", true),
            ("<td>5m0s</td>", true),
            ("<td>2</td>", true),
            ("leads in term 3", true),
            ("<td>postgres</td><td>1</td><td>1</td><td>2</td>", true),
            ("<td id=\"reaping\">active</td>", true),
            ("<form", false),
            ("Read-only", true),
        ] {
            assert_eq!(page.contains(needle), present, "{needle} in\n{page}");
        }
    }

    #[test]
    fn a_standby_leaves_reaping_to_the_leader_s_page() {
        let standby = ControllerView {
            leadership: "standby: h2 leads in term 4".into(),
            leads: false,
            ..view(None)
        };
        let page = overview(ON, &standby, &[], Utc::now());
        assert!(page.contains("standby: h2 leads in term 4"), "{page}");
        assert!(page.contains("the leader's page says"), "{page}");
        assert!(!page.contains(">active<"), "{page}");
    }

    #[test]
    fn forms_appear_only_with_actions_on_each_asking_for_the_token() {
        let paused = view(Some("12 rows vanished at once"));
        for (frame, forms) in [(OFF, 0), (ON, 1)] {
            let page = overview(frame, &paused, &[], Utc::now());
            assert!(page.contains("paused: 12 rows vanished at once"), "{page}");
            assert_eq!(page.matches("<form").count(), forms, "{page}");
            assert_eq!(page.matches("name=\"token\"").count(), forms, "{page}");
        }
        for (frame, wanted, forms) in [(OFF, true, 0), (ON, true, 2), (ON, false, 0)] {
            let page = sandbox(frame, "agent-7", "Name: agent-7", wanted);
            assert_eq!(page.matches("<form").count(), forms, "{page}");
            assert_eq!(
                page.matches("type=\"password\" name=\"token\"").count(),
                forms
            );
        }
        let page = sandbox(ON, "agent-7", "", true);
        assert!(page.contains("action=\"/sandboxes/agent-7/release\""));
        assert!(page.contains("action=\"/sandboxes/agent-7/resume\""));
    }

    #[test]
    fn no_page_has_a_script_or_loads_anything_from_elsewhere() {
        let pages = [
            overview(ON, &view(Some("x")), &[summary("o", "m")], Utc::now()),
            sandbox(
                ON,
                "agent-7",
                "Name: agent-7\nPassword: *** (--show-secrets)",
                true,
            ),
            message(OFF, "Refused", "no token", "/"),
        ];
        for page in pages {
            assert!(!page.contains("<script"), "{page}");
            assert!(!page.contains("src="), "{page}");
            assert!(
                !page.contains("http://") && !page.contains("https://"),
                "{page}"
            );
        }
    }
}
