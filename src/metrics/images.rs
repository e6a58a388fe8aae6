//! Engine images and templates: pulls and builds of absent images, the
//! fetches running in the background, and the pre-initialised templates.

use super::{outcome, register};
use crate::domain::id::EngineName;
use crate::domain::template_volume::Refusal;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// The images' and templates' metrics.
pub(crate) struct ImageMetrics {
    pulls: IntCounterVec,
    builds: IntCounterVec,
    fetches: IntGauge,
    template_builds: IntCounterVec,
    templates_ready: IntGauge,
    templates_refused: IntGaugeVec,
}

impl ImageMetrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        let m = ImageMetrics {
            builds: register(registry, IntCounterVec::new(
                Opts::new("sandboxd_image_builds_total", "Image builds run by --image-build-command, by result"),
                &["result"]
            )),
            pulls: register(registry, IntCounterVec::new(
                Opts::new(
                    "sandboxd_image_pulls_total",
                    "Image pulls attempted, by result"
                ),
                &["result"]
            )),
            fetches: register(registry, IntGauge::new(
                "sandboxd_image_fetches",
                "Absent images being pulled or built in the background now (one fetch per image, outside the worker slots)"
            )),
            template_builds: register(registry, IntCounterVec::new(
                Opts::new(
                    "sandboxd_template_builds_total",
                    "Template jobs run, by engine and result (ok, failed); a job that finds its template built already counts as ok"
                ),
                &["engine", "result"]
            )),
            templates_ready: register(registry, IntGauge::new(
                "sandboxd_templates_ready",
                "Pre-initialised templates this process has ready (one per engine image and feature set in use)"
            )),
            templates_refused: register(registry, IntGaugeVec::new(
                Opts::new(
                    "sandboxd_templates_refused",
                    "Templates this process cannot build because a volume under the template's name may be neither reused nor replaced, by reason (another_deployment, not_a_template, in_use); their sandboxes start cold (docs/runbook.md, SandboxdTemplateRefused)"
                ),
                &["reason"]
            )),
        };
        for r in Refusal::ALL {
            m.templates_refused.with_label_values(&[r.as_str()]);
        }
        for ok in [true, false] {
            m.pulls.with_label_values(&[outcome(ok)]);
            m.builds.with_label_values(&[outcome(ok)]);
        }
        m
    }

    /// One image pull attempted.
    pub(crate) fn pulled(&self, ok: bool) {
        self.pulls.with_label_values(&[outcome(ok)]).inc();
    }

    /// One image build run by the build command.
    pub(crate) fn built(&self, ok: bool) {
        self.builds.with_label_values(&[outcome(ok)]).inc();
    }

    /// How many image fetches run in the background.
    pub(crate) fn fetches(&self, running: usize) {
        self.fetches.set(running as i64);
    }

    /// One template job ended.
    pub(crate) fn template_built(&self, engine: EngineName, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.template_builds
            .with_label_values(&[engine.as_str(), result])
            .inc();
    }

    /// How many templates are ready.
    pub(crate) fn templates_ready(&self, n: usize) {
        self.templates_ready.set(n as i64);
    }

    /// How many templates are refused, by reason.
    pub(crate) fn templates_refused(&self, counts: &[(Refusal, usize)]) {
        for (r, n) in counts {
            self.templates_refused
                .with_label_values(&[r.as_str()])
                .set(*n as i64);
        }
    }
}
