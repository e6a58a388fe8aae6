//! Warm pools learned from demand: which engine and feature sets get a
//! pool, and how big, from the requests of the last window. Agents ask for
//! features (`pg_trgm`, `vector`, RediSearch), and a pool kept only for
//! what an operator listed serves none of them; so every set requested
//! within the window gets a pool of its own, every such pool at least one
//! container, the busiest more (one for each request of the last minute,
//! the rate a refill must keep up with), and all of them together at most
//! a fixed number of containers, which the memory budget counts up front.
//! When there is not room for every set, the most recently requested go
//! first: the set nobody asked for since is the one whose container would
//! wait longest for a claim. Pure: the controller keeps the request times.

use super::PoolKey;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::time::Duration;

/// Requests within this much time before now size a pool beyond one.
const BURST: Duration = Duration::from_secs(60);

/// The request times of each engine and feature set (any order).
pub(crate) type Asks = BTreeMap<PoolKey, Vec<DateTime<Utc>>>;

/// The learned pools and their sizes: the sets of `asks` requested
/// within `window` of `now` that `configured` does not already size,
/// holding at most `max` containers together.
pub(crate) fn sizes(
    asks: &Asks,
    now: DateTime<Utc>,
    window: Duration,
    max: usize,
    configured: &BTreeMap<PoolKey, usize>,
) -> BTreeMap<PoolKey, usize> {
    let within = |d: Duration, t: &DateTime<Utc>| {
        chrono::Duration::from_std(d).is_ok_and(|d| now.signed_duration_since(*t) <= d)
    };
    // (key, last request, requests in the window, wish)
    let mut wanted: Vec<(&PoolKey, DateTime<Utc>, usize, usize)> = asks
        .iter()
        .filter(|(key, _)| !configured.contains_key(*key))
        .filter_map(|(key, times)| {
            let recent: Vec<_> = times.iter().filter(|t| within(window, t)).collect();
            let last = **recent.iter().max()?;
            let burst = recent.iter().filter(|t| within(BURST, t)).count();
            Some((key, last, recent.len(), burst.clamp(1, max.max(1))))
        })
        .collect();
    // Most recently requested first; ties by name, so the answer is stable.
    wanted.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let mut left = max;
    let mut sizes = BTreeMap::new();
    for (key, ..) in &wanted {
        if left == 0 {
            break;
        }
        sizes.insert((*key).clone(), 1);
        left -= 1;
    }
    // Then the busiest grow towards their wish.
    wanted.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| b.1.cmp(&a.1)));
    for (key, _, _, wish) in wanted {
        let Some(size) = sizes.get_mut(key) else {
            continue;
        };
        let more = (wish - *size).min(left);
        *size += more;
        left -= more;
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::id::EngineName;
    use chrono::TimeZone;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap()
    }

    fn key(engine: &'static str, features: &[&str]) -> PoolKey {
        PoolKey {
            engine: EngineName::of_engine(engine),
            features: features.iter().map(|f| (*f).to_owned()).collect(),
            seed: None,
        }
    }

    const WINDOW: Duration = Duration::from_secs(600);

    #[test]
    fn every_set_requested_in_the_window_gets_a_pool_the_busiest_more_within_the_bound() {
        let trgm = key("postgres", &["pg_trgm"]);
        let vector = key("postgres", &["vector"]);
        let search = key("redis", &["search"]);
        let plain = key("postgres", &[]);
        let old = key("postgres", &["postgis", "vector"]);
        let asks: Asks = BTreeMap::from([
            (trgm.clone(), vec![at(990), at(995), at(998), at(999)]),
            (vector.clone(), vec![at(900)]),
            (search.clone(), vec![at(500)]),
            (plain.clone(), vec![at(999)]),
            (old.clone(), vec![at(100)]),
        ]);
        let configured = BTreeMap::from([(plain.clone(), 2)]);
        let now = at(1000);
        type Case = (&'static str, usize, Vec<(PoolKey, usize)>);
        let table: Vec<Case> = vec![
            (
                "room for all: one each, the busy one to its burst",
                8,
                vec![(trgm.clone(), 4), (vector.clone(), 1), (search.clone(), 1)],
            ),
            (
                "tight: one each first, what is left to the busiest",
                4,
                vec![(trgm.clone(), 2), (vector.clone(), 1), (search.clone(), 1)],
            ),
            (
                "tighter: the most recently requested first",
                2,
                vec![(trgm.clone(), 1), (vector.clone(), 1)],
            ),
            ("off", 0, vec![]),
        ];
        for (case, max, want) in table {
            let got = sizes(&asks, now, WINDOW, max, &configured);
            assert_eq!(got, want.into_iter().collect(), "{case}");
            assert!(got.values().sum::<usize>() <= max, "{case}");
            assert!(
                !got.contains_key(&plain),
                "{case}: configured keeps its own size"
            );
            assert!(!got.contains_key(&old), "{case}: out of the window");
        }
    }
}
