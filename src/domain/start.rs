//! How one engine's container starts: the sources its data may come from,
//! in the order they are tried, and what is left to do once the engine is
//! ready. Every start goes through this choice (a sandbox's create, heal,
//! rotation and fork, and a warm-pool fill); the controller's executor
//! (`controller::start`) prepares each source in turn, skips one that has
//! nothing to offer (an empty pool, a seed without a data file, a template
//! not made yet) and tries the next, and [`Start::falls_back`] says whether
//! a start that was tried and failed gives way to the next one or fails
//! the provision.

use super::event::Origin;
use super::pool::ClaimKind;
use super::template_volume::Refusal;

/// Where a new container's data comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A ready warm-pool container, claimed: started and seeded when it
    /// was filled; the claim sets the sandbox's credentials in it.
    Pool,
    /// A fork's copy of its source's data.
    Fork,
    /// The seed's data file (a dump or RDB the engine starts from).
    SeedFile,
    /// The seed's template: a copy of a container the seed was loaded
    /// into once.
    SeedTemplate,
    /// The engine's template: data initialised once for its image and
    /// features.
    Template,
    /// Nothing: the engine initialises its data as it starts.
    Cold,
}

impl Source {
    /// Whether a container started from it has the seed's data already
    /// (a pool container's was loaded when it was filled).
    fn carries_seed(self) -> bool {
        matches!(self, Source::Pool | Source::SeedFile | Source::SeedTemplate)
    }
}

/// What the choice depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// Whether (and as which kind) a warm-pool container may serve it
    /// ([`super::pool::claim_kind`]; `None` for a pool's own fill).
    pub(crate) claim: Option<ClaimKind>,
    /// The row is a fork: its data is its copy of the source's.
    pub(crate) fork: bool,
    /// The data starts from a seed.
    pub(crate) seeded: bool,
    /// The data lives on the sandbox's own volume, which no template or
    /// seed template may be mounted over.
    pub(crate) persistent: bool,
}

/// One start to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Start {
    /// Where its data comes from.
    pub(crate) source: Source,
    /// Whether the seed is loaded once the engine is ready (its data does
    /// not have it yet).
    pub(crate) load_seed: bool,
    /// Whether a failure of this start (the container did not come up)
    /// gives way to the next start rather than failing the provision: a
    /// template or seed template can be damaged behind sandboxd's back and
    /// is made again, a claimed pool container is removed; a fork's copy
    /// or a seed's file is the only data the sandbox may start from.
    pub(crate) falls_back: bool,
}

/// The starts to try for `wanted`, in order. The last one is always
/// available: a fork's copy (made now) or a cold start.
pub(crate) fn starts(wanted: Wanted) -> Vec<Start> {
    let mut sources = Vec::new();
    if wanted.claim.is_some() {
        sources.push(Source::Pool);
    }
    if wanted.fork {
        sources.push(Source::Fork);
    } else {
        if wanted.seeded {
            sources.push(Source::SeedFile);
            if !wanted.persistent {
                sources.push(Source::SeedTemplate);
            }
        }
        if !wanted.persistent {
            sources.push(Source::Template);
        }
        sources.push(Source::Cold);
    }
    sources
        .into_iter()
        .map(|source| Start {
            source,
            load_seed: wanted.seeded && !source.carries_seed() && source != Source::Fork,
            falls_back: !matches!(source, Source::Fork | Source::SeedFile | Source::Cold),
        })
        .collect()
}

/// What the container that came up is counted and reported as: the
/// source it started from, and a cold start says why the engine's
/// template was not used when it was refused. A start from a seed's data
/// file initialises its data at start, so it counts as cold.
pub(crate) fn origin(source: Source, template_refused: Option<Refusal>) -> Origin {
    match source {
        Source::Pool => Origin::Pool,
        Source::Fork => Origin::Fork,
        Source::SeedTemplate => Origin::SeedTemplate,
        Source::Template => Origin::Template,
        Source::SeedFile => Origin::Cold,
        Source::Cold => match template_refused {
            Some(refusal) => Origin::ColdTemplateRefused(refusal),
            None => Origin::Cold,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::Source::*;
    use super::*;

    fn wanted(claim: bool, fork: bool, seeded: bool, persistent: bool) -> Wanted {
        Wanted {
            claim: claim.then_some(ClaimKind::Create),
            fork,
            seeded,
            persistent,
        }
    }

    /// (source, load_seed, falls_back) of one start.
    type Shape = (Source, bool, bool);

    fn shape(w: Wanted) -> Vec<Shape> {
        starts(w)
            .into_iter()
            .map(|s| (s.source, s.load_seed, s.falls_back))
            .collect()
    }

    #[test]
    fn the_starts_tried_in_order_for_each_kind_of_row() {
        let table: &[(&str, Wanted, &[Shape])] = &[
            (
                "a plain sandbox: the pool, its template, cold",
                wanted(true, false, false, false),
                &[
                    (Pool, false, true),
                    (Template, false, true),
                    (Cold, false, false),
                ],
            ),
            (
                "a pool's fill: no pool, no fork",
                wanted(false, false, false, false),
                &[(Template, false, true), (Cold, false, false)],
            ),
            (
                "a seeded sandbox: the seed's pool, its file, its template, then loaded",
                wanted(true, false, true, false),
                &[
                    (Pool, false, true),
                    (SeedFile, false, false),
                    (SeedTemplate, false, true),
                    (Template, true, true),
                    (Cold, true, false),
                ],
            ),
            (
                "a seeded pool's fill",
                wanted(false, false, true, false),
                &[
                    (SeedFile, false, false),
                    (SeedTemplate, false, true),
                    (Template, true, true),
                    (Cold, true, false),
                ],
            ),
            (
                "a persistent sandbox: nothing mounted over its volume",
                wanted(false, false, false, true),
                &[(Cold, false, false)],
            ),
            (
                "a seeded persistent sandbox: its seed's file, else loaded",
                wanted(false, false, true, true),
                &[(SeedFile, false, false), (Cold, true, false)],
            ),
            (
                "a fork: its copy of the source's data, nothing else",
                wanted(false, true, false, false),
                &[(Fork, false, false)],
            ),
        ];
        for (what, w, expected) in table {
            assert_eq!(shape(*w), *expected, "{what}");
        }
    }

    #[test]
    fn the_last_start_never_falls_back_and_nothing_follows_a_fork() {
        for claim in [false, true] {
            for fork in [false, true] {
                for seeded in [false, true] {
                    for persistent in [false, true] {
                        let w = wanted(claim && !fork, fork, seeded, persistent);
                        let all = starts(w);
                        let last = all.last().expect("something to try");
                        assert!(!last.falls_back, "{w:?}");
                        assert!(matches!(last.source, Fork | Cold), "{w:?}");
                        assert_eq!(
                            all.iter().filter(|s| !s.falls_back).count(),
                            if seeded && !fork { 2 } else { 1 },
                            "only a seed's file and the last start fail the provision: {w:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_origin_is_the_start_that_came_up() {
        let refused = Refusal::InUse;
        for (source, refusal, origin) in [
            (Pool, None, Origin::Pool),
            (Fork, None, Origin::Fork),
            (SeedTemplate, None, Origin::SeedTemplate),
            (Template, None, Origin::Template),
            (SeedFile, None, Origin::Cold),
            (Cold, None, Origin::Cold),
            (Cold, Some(refused), Origin::ColdTemplateRefused(refused)),
        ] {
            assert_eq!(super::origin(source, refusal), origin, "{source:?}");
        }
    }
}
