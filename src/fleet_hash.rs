//! The hash maps of whole-fleet indexes (the relist hashes 100 000 ids
//! several times over): foldhash, several times faster than SipHash.
//! Randomly seeded in production; fixed where the test fakes are built, so
//! that a simulated world (`crate::testing::dst`) iterates them in the same
//! order every time its seed is replayed.

#[cfg(not(any(test, feature = "simulation")))]
type State = foldhash::fast::RandomState;
#[cfg(any(test, feature = "simulation"))]
type State = foldhash::fast::FixedState;

/// A map keyed by hashing with foldhash.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, State>;
/// A set hashed with foldhash.
pub(crate) type HashSet<T> = std::collections::HashSet<T, State>;
