//! Where sandboxd's randomness comes from: the operating system's CSPRNG,
//! except inside a simulated world (`crate::testing::dst`), where the
//! world's seed decides every password, token and uuid so that a seed
//! replays byte for byte. Only builds with the test fakes have the seam.

use rand::distr::{Alphanumeric, SampleString};

#[cfg(any(test, feature = "simulation"))]
thread_local! {
    /// The world's generator while a simulated world runs on this thread.
    static SEEDED: std::cell::RefCell<Option<rand::rngs::StdRng>> =
        const { std::cell::RefCell::new(None) };
}

/// `len` random characters from `[A-Za-z0-9]`.
pub(crate) fn alphanumeric(len: usize) -> String {
    #[cfg(any(test, feature = "simulation"))]
    if let Some(s) =
        SEEDED.with_borrow_mut(|r| r.as_mut().map(|r| Alphanumeric.sample_string(r, len)))
    {
        return s;
    }
    Alphanumeric.sample_string(&mut rand::rng(), len)
}

/// A random 64-bit number (a jitter's seed, say).
pub(crate) fn u64() -> u64 {
    #[cfg(any(test, feature = "simulation"))]
    if let Some(n) = SEEDED.with_borrow_mut(|r| r.as_mut().map(rand::Rng::random)) {
        return n;
    }
    rand::random()
}

/// A random 128-bit number.
#[cfg(any(test, feature = "simulation"))]
pub(crate) fn u128() -> u128 {
    u128::from(u64()) << 64 | u128::from(u64())
}

/// Runs `f` with this thread's randomness drawn from `seed`; the OS's
/// generator again afterwards, even if `f` panics.
#[cfg(any(test, feature = "simulation"))]
pub(crate) fn seeded<T>(seed: u64, f: impl FnOnce() -> T) -> T {
    use rand::SeedableRng;
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            SEEDED.with_borrow_mut(|r| *r = None);
        }
    }
    SEEDED.with_borrow_mut(|r| *r = Some(rand::rngs::StdRng::seed_from_u64(seed)));
    let _restore = Restore;
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_decides_every_draw_and_the_os_decides_outside_it() {
        let a = seeded(7, || (alphanumeric(16), u128()));
        let b = seeded(7, || (alphanumeric(16), u128()));
        assert_eq!(a, b);
        assert_ne!(a, seeded(8, || (alphanumeric(16), u128())));
        assert_ne!(alphanumeric(32), alphanumeric(32));
    }
}
