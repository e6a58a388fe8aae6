//! Controllers for the unit tests and the simulation, wired by the
//! composition root exactly as `sandboxd run` wires them (deadlines, the
//! fence, the elector, the queue), over whatever fakes the test hands in.

use crate::config::ControllerConfig;
use crate::controller::Controller;
use crate::domain::clock::Clock;
use crate::engine::Registry;
use crate::metrics::Metrics;
use crate::ports::{Runtime, Store};
use std::sync::Arc;

impl Controller {
    /// A controller over `runtime` and `store` running the engines of
    /// `engines`, built by [`crate::cli::run::controller_with`].
    pub(crate) fn with_engines(
        runtime: Arc<dyn Runtime>,
        store: Arc<dyn Store>,
        engines: Registry,
        config: ControllerConfig,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> Self {
        crate::cli::run::controller_with(runtime, store, engines, config, clock, metrics)
    }
}
