//! The service-level objectives of sandboxd (docs/slo.md) and the
//! Prometheus rules generated from them (`deploy/prometheus/slo.yml`).
//!
//! Each objective is a target share of good events over 30 days; its error
//! budget is the rest (0.5% for a 99.5% target). The rules record, per
//! objective, the burn rate (the error ratio over the budget: 1 spends the
//! budget in exactly 30 days) over five windows, and alert when a long and
//! a short window both burn too fast: the multi-window, multi-burn-rate
//! alerts of Google's SRE workbook. 14.4 times over 1 h and 5 min (2% of
//! the budget in an hour) and 6 times over 6 h and 30 min (5% in six
//! hours) page; once over 3 days and 6 h (10% in three days) opens a
//! ticket. The short window lets an alert stop soon after the burning
//! stops.
//!
//! Only in test builds: `crate::cli::reference`'s tests check, and with
//! `SANDBOXD_WRITE_DOCS=1` write, the rules file and the objectives' table
//! in docs/slo.md (`SANDBOXD_WRITE_DOCS=1 cargo test --lib reference`).

use std::fmt::Write as _;

/// One objective.
pub(crate) struct Objective {
    /// Its `slo` label and the runbook section's suffix.
    pub(crate) id: &'static str,
    /// Its part of the alerts' names (`SandboxdSLO<Name>Burn1h`).
    pub(crate) name: &'static str,
    /// What a user feels, in a line.
    pub(crate) title: &'static str,
    /// The target share of good events over 30 days.
    pub(crate) target: f64,
    /// How it is measured.
    pub(crate) sli: Sli,
}

/// How an objective's error ratio over a window is measured.
pub(crate) enum Sli {
    /// Bad events over all events, from counters (selectors of them).
    Events {
        bad: &'static str,
        total: &'static str,
    },
    /// Observations of a histogram above `le` seconds over all of them.
    Latency {
        histogram: &'static str,
        selector: &'static str,
        le: &'static str,
    },
    /// A gauge's bad share, sampled at each evaluation and averaged.
    Sampled {
        bad: &'static str,
        total: &'static str,
    },
}

/// The objectives (docs/slo.md says why each number).
pub(crate) const OBJECTIVES: [Objective; 6] = [
    Objective {
        id: "availability",
        name: "Availability",
        title: "A wanted sandbox is ready (or paused on idle, by design)",
        target: 0.995,
        sli: Sli::Sampled {
            bad: r#"sandboxd_sandboxes{job="sandboxd", phase=~"provisioning|healing|failed"}"#,
            total: r#"sandboxd_sandboxes{job="sandboxd", phase=~"ready|paused|provisioning|healing|failed"}"#,
        },
    },
    Objective {
        id: "latency-pool",
        name: "LatencyPool",
        title: "A request served from the warm pool is ready within 0.25 s",
        target: 0.99,
        sli: Sli::Latency {
            histogram: "sandboxd_request_to_ready_seconds",
            selector: r#"job="sandboxd", from="pool""#,
            le: "0.25",
        },
    },
    Objective {
        id: "latency-template",
        name: "LatencyTemplate",
        title: "A request started from a template is ready within 2.5 s",
        target: 0.99,
        sli: Sli::Latency {
            histogram: "sandboxd_request_to_ready_seconds",
            selector: r#"job="sandboxd", from="template""#,
            le: "2.5",
        },
    },
    Objective {
        id: "latency-cold",
        name: "LatencyCold",
        title: "A request started cold is ready within 10 s",
        target: 0.99,
        sli: Sli::Latency {
            histogram: "sandboxd_request_to_ready_seconds",
            selector: r#"job="sandboxd", from="cold""#,
            le: "10",
        },
    },
    Objective {
        id: "heal",
        name: "Heal",
        title: "A container that died is replaced and ready within 10 s of the heal's start",
        target: 0.99,
        sli: Sli::Latency {
            histogram: "sandboxd_heal_seconds",
            selector: r#"job="sandboxd""#,
            le: "10",
        },
    },
    Objective {
        id: "reconcile",
        name: "Reconcile",
        title: "A reconcile succeeds",
        target: 0.99,
        sli: Sli::Events {
            bad: r#"controller_runtime_reconcile_errors_total{job="sandboxd"}"#,
            total: r#"controller_runtime_reconcile_total{job="sandboxd"}"#,
        },
    },
];

/// One multi-window alert: both windows burn faster than `factor`.
struct Burn {
    long: &'static str,
    short: &'static str,
    factor: f64,
    severity: &'static str,
    /// What that rate spends.
    spends: &'static str,
}

const BURNS: [Burn; 3] = [
    Burn {
        long: "1h",
        short: "5m",
        factor: 14.4,
        severity: "critical",
        spends: "2% of the 30-day error budget in an hour",
    },
    Burn {
        long: "6h",
        short: "30m",
        factor: 6.0,
        severity: "critical",
        spends: "5% of the 30-day error budget in six hours",
    },
    Burn {
        long: "3d",
        short: "6h",
        factor: 1.0,
        severity: "warning",
        spends: "10% of the 30-day error budget in three days",
    },
];

/// Every window a burn rate is recorded over (the alerts' and the
/// budget's, 30 days).
const WINDOWS: [&str; 6] = ["5m", "30m", "1h", "6h", "3d", "30d"];

impl Objective {
    /// Its error budget: the share of bad events it allows.
    fn budget(&self) -> f64 {
        1.0 - self.target
    }

    /// The error ratio over `window`, in PromQL. A window without events
    /// has none (a ratio of 0, not NaN).
    fn error_ratio(&self, window: &str) -> String {
        match &self.sli {
            Sli::Events { bad, total } => format!(
                "sum(rate({bad}[{window}])) / clamp_min(sum(rate({total}[{window}])), 1e-9)"
            ),
            Sli::Latency {
                histogram,
                selector,
                le,
            } => format!(
                "(sum(rate({histogram}_count{{{selector}}}[{window}])) - sum(rate({histogram}_bucket{{{selector}, le=\"{le}\"}}[{window}]))) / clamp_min(sum(rate({histogram}_count{{{selector}}}[{window}])), 1e-9)"
            ),
            Sli::Sampled { .. } => format!(
                "avg_over_time(sandboxd_slo:bad_ratio{{slo=\"{}\"}}[{window}])",
                self.id
            ),
        }
    }

    fn runbook(&self) -> String {
        format!(
            "https://github.com/sandboxd/sandboxd/blob/main/docs/runbook.md#sandboxdslo{}",
            self.name.to_lowercase()
        )
    }
}

/// A number as the rules write it (no trailing zeros).
fn number(x: f64) -> String {
    let text = format!("{x:.6}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// `deploy/prometheus/slo.yml`.
pub(crate) fn rules() -> String {
    let mut y = String::new();
    y.push_str(
        "# Service-level objectives of sandboxd (docs/slo.md) as Prometheus rules:\n\
         # each objective's target, its burn rate (its error ratio over its error\n\
         # budget) over six windows, the budget left over 30 days, and multi-window,\n\
         # multi-burn-rate alerts (14.4x over 1h and 5m, 6x over 6h and 30m page;\n\
         # 1x over 3d and 6h opens a ticket).\n\
         #\n\
         # Generated from src/metrics/slo.rs: do not edit. Rewrite it with\n\
         #   SANDBOXD_WRITE_DOCS=1 cargo test --lib reference\n\
         # Unit tests: slo_test.yml (`promtool test rules slo_test.yml`).\n\
         groups:\n",
    );
    for o in &OBJECTIVES {
        let _ = writeln!(y, "  - name: sandboxd-slo-{}", o.id);
        y.push_str("    rules:\n");
        // The target itself, so a dashboard can show it beside the budget.
        let _ = write!(
            y,
            "      - record: sandboxd_slo:objective\n        labels:\n          slo: {id}\n        expr: vector({target})\n",
            id = o.id,
            target = number(o.target),
        );
        if let Sli::Sampled { bad, total } = &o.sli {
            let _ = write!(
                y,
                "      - record: sandboxd_slo:bad_ratio\n        labels:\n          slo: {id}\n        expr: sum({bad}) / clamp_min(sum({total}), 1)\n",
                id = o.id
            );
        }
        for window in WINDOWS {
            let _ = write!(
                y,
                "      - record: sandboxd_slo:burn_rate:{window}\n        labels:\n          slo: {id}\n        expr: ({ratio}) / {budget}\n",
                id = o.id,
                ratio = o.error_ratio(window),
                budget = number(o.budget()),
            );
        }
        let _ = write!(
            y,
            "      - record: sandboxd_slo:error_budget_remaining\n        labels:\n          slo: {id}\n        expr: 1 - sandboxd_slo:burn_rate:30d{{slo=\"{id}\"}}\n",
            id = o.id
        );
        for b in &BURNS {
            let _ = write!(
                y,
                "      - alert: SandboxdSLO{name}Burn{long}\n\
                 \x20       # Both windows burn: the smaller of their burn rates over {factor}.\n\
                 \x20       expr: min by (slo) ({{__name__=~\"sandboxd_slo:burn_rate:({long}|{short})\", slo=\"{id}\"}}) > {factor}\n\
                 \x20       for: 2m\n\
                 \x20       labels:\n\
                 \x20         severity: {severity}\n\
                 \x20       annotations:\n\
                 \x20         summary: \"sandboxd burns its {id} error budget at {factor} times the rate that lasts 30 days (over {long} and {short})\"\n\
                 \x20         description: \"Objective: {title}, for {target}% of events over 30 days. The budget burns {{{{ $value | humanize }}}} times faster than it lasts, over the last {long} and {short}: {spends}.\"\n\
                 \x20         runbook_url: {runbook}\n",
                name = o.name,
                long = b.long,
                short = b.short,
                factor = number(b.factor),
                id = o.id,
                severity = b.severity,
                title = o.title,
                target = number(o.target * 100.0),
                spends = b.spends,
                runbook = o.runbook(),
            );
        }
    }
    y
}

/// The objectives' table of docs/slo.md.
pub(crate) fn table() -> String {
    let mut t = String::from(
        "| objective (`slo`) | what a user feels | target over 30 days | error budget | measured as bad over all |\n|---|---|---:|---:|---|\n",
    );
    for o in &OBJECTIVES {
        let measure = match &o.sli {
            Sli::Events { bad, total } => format!("rate of `{bad}` over `{total}`"),
            Sli::Latency {
                histogram,
                selector,
                le,
            } => format!("`{histogram}{{{selector}}}` above {le} s"),
            Sli::Sampled { bad, total } => format!("`{bad}` over `{total}`, sampled"),
        };
        let _ = writeln!(
            t,
            "| `{}` | {} | {}% | {}% | {} |",
            o.id,
            o.title,
            number(o.target * 100.0),
            number(o.budget() * 100.0),
            measure.replace('|', "\\|")
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn repo(path: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
    }

    #[test]
    fn every_objective_has_a_runbook_section_and_its_thresholds_are_bucket_bounds() {
        let runbook = std::fs::read_to_string(repo("docs/runbook.md"))
            .unwrap()
            .to_lowercase();
        let exposed = super::super::Metrics::new().render();
        for o in &OBJECTIVES {
            let anchor = o.runbook().rsplit_once('#').unwrap().1.to_owned();
            assert!(runbook.contains(&format!("## {anchor}")), "{anchor}");
            if let Sli::Latency { histogram, le, .. } = &o.sli {
                let bound = format!("le=\"{le}\"");
                assert!(
                    exposed
                        .lines()
                        .any(|l| l.starts_with(&format!("{histogram}_bucket{{"))
                            && l.contains(&bound)),
                    "{histogram} has a bucket {bound}"
                );
            }
        }
    }

    #[test]
    fn numbers_are_written_without_trailing_zeros() {
        for (x, text) in [(14.4, "14.4"), (6.0, "6"), (0.005, "0.005"), (99.5, "99.5")] {
            assert_eq!(number(x), text);
        }
        assert_eq!(number(1.0 - 0.995), "0.005");
    }
}
