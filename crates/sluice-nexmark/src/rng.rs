//! Per-event seeded randomness.
//!
//! Every event draws its random values from its own small generator, seeded
//! by hashing `(seed, event number)`. No state carries over from one event to
//! the next, so any event can be produced on its own: how the event stream is
//! split into lanes and batches cannot change a single generated value.
//!
//! The per-event generator is SplitMix64 started from a bijective 64-bit
//! finalizer of the event key; bounded integers use the multiply-shift
//! reduction (bias below 2^-40 for the small bounds used here).

/// Weyl increment of SplitMix64.
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// Odd multiplier spreading event numbers before hashing.
const EVENT_SPREAD: u64 = 0xD6E8_FEB8_6659_FD93;

/// A bijective 64-bit mixing function (the MurmurHash3 finalizer).
#[inline]
pub(crate) fn fmix64(mut z: u64) -> u64 {
    z ^= z >> 33;
    z = z.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    z ^= z >> 33;
    z = z.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    z ^ (z >> 33)
}

/// Derives a well-mixed key from a user seed and a domain tag, so that
/// different uses of one seed (events, string pools, ...) are independent.
pub(crate) fn derive_key(seed: u64, domain: u64) -> u64 {
    fmix64(fmix64(seed ^ domain).wrapping_add(GOLDEN_GAMMA))
}

/// A small, fast pseudo-random generator (SplitMix64).
#[derive(Clone, Debug)]
pub(crate) struct EventRng {
    state: u64,
}

impl EventRng {
    /// A generator seeded directly from a 64-bit value.
    pub(crate) fn from_seed(seed: u64) -> Self {
        EventRng { state: fmix64(seed) }
    }

    /// The generator for event `event_number` under the (derived) `key`.
    #[inline]
    pub(crate) fn for_event(key: u64, event_number: u64) -> Self {
        EventRng { state: fmix64(key ^ event_number.wrapping_mul(EVENT_SPREAD)) }
    }

    /// The next 64 random bits.
    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `[0, bound)`; returns 0 when `bound` is 0.
    #[inline]
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A uniform index into a slice of length `len`.
    #[inline]
    pub(crate) fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// A uniform double in `[0, 1)`.
    #[inline]
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_stream() {
        let mut a = EventRng::for_event(7, 12345);
        let mut b = EventRng::for_event(7, 12345);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut c = EventRng::for_event(7, 12346);
        let mut a = EventRng::for_event(7, 12345);
        assert_ne!(a.next_u64(), c.next_u64());
    }

    #[test]
    fn neighbouring_events_do_not_share_streams() {
        // Draw k of event n must not equal draw k-1 of event n+1.
        let mut a = EventRng::for_event(1, 10);
        let mut b = EventRng::for_event(1, 11);
        a.next_u64();
        assert_ne!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn bounded_values_are_in_range_and_cover_it() {
        let mut rng = EventRng::from_seed(3);
        let mut seen = [0u32; 13];
        for _ in 0..13_000 {
            let v = rng.below(13);
            assert!(v < 13);
            seen[v as usize] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
        assert_eq!(rng.below(0), 0);
        for _ in 0..1000 {
            let f = rng.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
    }

    #[test]
    fn derived_keys_differ_by_domain() {
        assert_ne!(derive_key(1, 1), derive_key(1, 2));
        assert_ne!(derive_key(1, 1), derive_key(2, 1));
    }
}
