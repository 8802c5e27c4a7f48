//! A small seeded random number generator (SplitMix64): the simulation's only source of
//! choices, so one seed replays one run exactly. Not for anything but tests.

/// SplitMix64 (Steele, Lea, Flood 2014): one 64-bit state, full period, good enough to
/// pick delays and faults.
#[derive(Debug, Clone)]
pub(super) struct Rng {
    state: u64,
}

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `low..=high`.
    pub(super) fn between(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high, "an empty range {low}..={high}");
        low + self.next_u64() % (high - low + 1)
    }

    /// True with probability `percent` / 100.
    pub(super) fn percent(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// One of `choices`.
    pub(super) fn pick<T: Copy>(&mut self, choices: &[T]) -> T {
        choices[self.between(0, choices.len() as u64 - 1) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn one_seed_gives_one_sequence() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let first: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(first, (0..5).map(|_| Rng::new(8).next_u64()).collect::<Vec<_>>());
        assert!((0..1000).map(|_| a.between(3, 5)).all(|v| (3..=5).contains(&v)));
    }
}
