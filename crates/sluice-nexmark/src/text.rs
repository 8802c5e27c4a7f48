//! String material of the generator: the standard word lists, the random
//! string rules, the `extra` padding rule, and precomputed seeded tables.
//!
//! Hot-path string fields never allocate: names, cities and states come from
//! static lists; channels and urls from a table built once per seed (the
//! standard's four hot channels plus `channel-0` .. `channel-9999`, each with
//! an `https://www.nexmark.com/...` url, 90% of them carrying a
//! `&channel_id=` suffix); `extra` is a slice of a seeded pool of random
//! lower-case letters whose length follows the standard padding rule.

use crate::rng::{EventRng, derive_key};

/// The standard first names.
pub(crate) const FIRST_NAMES: [&str; 11] =
    ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"];
/// The standard last names.
pub(crate) const LAST_NAMES: [&str; 9] =
    ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"];
/// The standard US cities.
pub(crate) const US_CITIES: [&str; 10] =
    ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"];
/// The standard US states.
pub(crate) const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
/// The standard hot channels.
pub(crate) const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
/// A bid uses a hot channel with probability `1 - 1/HOT_CHANNELS_RATIO`.
pub(crate) const HOT_CHANNELS_RATIO: u64 = 2;
/// Number of ordinary channels (`channel-0` .. `channel-9999`).
pub(crate) const CHANNELS_NUMBER: usize = 10_000;

/// Shortest random string before trimming.
const MIN_STRING_LENGTH: u64 = 3;
/// Random offsets into the `extra` pool are drawn below this.
const EXTRA_POOL_WINDOW: usize = 16 * 1024;
/// Domain tags separating the uses of one seed.
const DOMAIN_EXTRA_POOL: u64 = 0x6578_7472_615F_706F;
const DOMAIN_CHANNELS: u64 = 0x6368_616E_6E65_6C73;

/// Appends a random string with `3 ..= max_len - 1` characters, each a
/// random lower-case letter or (probability 1/13) `special`. With
/// `trim_spaces`, leading and trailing spaces of the appended part are
/// removed (the standard trims its space-separated strings).
pub(crate) fn push_random_string(rng: &mut EventRng, max_len: u64, special: char, trim_spaces: bool, out: &mut String) {
    let start = out.len();
    let len = MIN_STRING_LENGTH + rng.below(max_len.saturating_sub(MIN_STRING_LENGTH).max(1));
    for _ in 0..len {
        // One draw decides both "special?" (high half) and the letter (low half).
        let r = rng.next_u64();
        if ((r >> 32) * 13) >> 32 == 0 {
            out.push(special);
        } else {
            out.push(letter(r & 0xFFFF_FFFF));
        }
    }
    if trim_spaces {
        while out.len() > start && out.ends_with(' ') {
            out.pop();
        }
        let leading = out[start..].bytes().take_while(|b| *b == b' ').count();
        out.drain(start..start + leading);
    }
}

/// The letter for 32 random bits.
#[inline]
fn letter(bits32: u64) -> char {
    char::from(b'a' + ((bits32 * 26) >> 32) as u8)
}

/// The standard `extra` padding rule for events whose other fields account
/// for `current_size` bytes, so that sizes average `desired_average`: the
/// length is uniform in `[d - delta, d + delta)` with
/// `d = desired_average - current_size` and `delta = round(0.2 * d)`; empty
/// when the event is already large enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExtraRule {
    min: usize,
    span: usize,
}

impl ExtraRule {
    /// The rule for a given current and desired average size.
    pub(crate) fn new(current_size: usize, desired_average: usize) -> Self {
        if current_size > desired_average {
            return ExtraRule { min: 0, span: 0 };
        }
        let desired = desired_average - current_size;
        let delta = (desired as f64 * 0.2).round() as usize;
        ExtraRule { min: desired - delta, span: 2 * delta }
    }

    /// A random length following the rule.
    #[inline]
    pub(crate) fn sample(self, rng: &mut EventRng) -> usize {
        if self.span == 0 { self.min } else { self.min + rng.index(self.span) }
    }
}

/// A random `extra` length (see [`ExtraRule`]).
#[inline]
pub(crate) fn extra_len(rng: &mut EventRng, current_size: usize, desired_average: usize) -> usize {
    ExtraRule::new(current_size, desired_average).sample(rng)
}

/// Many strings stored back to back in one buffer.
#[derive(Debug, Default)]
pub(crate) struct StringTable {
    data: String,
    ends: Vec<usize>,
}

impl StringTable {
    /// Appends one entry written by `write`.
    fn push_with(&mut self, write: impl FnOnce(&mut String)) {
        write(&mut self.data);
        self.ends.push(self.data.len());
    }

    /// Entry `i` (all entries are ASCII).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.data[start..self.ends[i]]
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }
}

/// Seeded string tables shared by all lanes of one configuration.
#[derive(Debug)]
pub(crate) struct TextTables {
    extra_pool: String,
    channels: StringTable,
    urls: StringTable,
    hot_urls: StringTable,
}

impl TextTables {
    /// Builds the tables for `seed`; `max_extra_len` bounds `extra` lengths.
    pub(crate) fn new(seed: u64, max_extra_len: usize) -> Self {
        let mut rng = EventRng::from_seed(derive_key(seed, DOMAIN_EXTRA_POOL));
        let pool_len = EXTRA_POOL_WINDOW + max_extra_len;
        let extra_pool: String = (0..pool_len).map(|_| letter(rng.next_u64() >> 32)).collect();

        let mut rng = EventRng::from_seed(derive_key(seed, DOMAIN_CHANNELS));
        let mut hot_urls = StringTable::default();
        for _ in HOT_CHANNELS {
            hot_urls.push_with(|s| push_base_url(&mut rng, s));
        }
        let mut channels = StringTable::default();
        let mut urls = StringTable::default();
        for i in 0..CHANNELS_NUMBER {
            channels.push_with(|s| {
                s.push_str("channel-");
                s.push_str(&i.to_string());
            });
            urls.push_with(|s| {
                push_base_url(&mut rng, s);
                if rng.below(10) > 0 {
                    s.push_str("&channel_id=");
                    s.push_str(&channel_id(i).to_string());
                }
            });
        }
        TextTables { extra_pool, channels, urls, hot_urls }
    }

    /// A random channel and its url, as the standard picks them.
    #[inline]
    pub(crate) fn channel(&self, rng: &mut EventRng) -> (&str, &str) {
        if rng.below(HOT_CHANNELS_RATIO) > 0 {
            let i = rng.index(HOT_CHANNELS.len());
            (HOT_CHANNELS[i], self.hot_urls.get(i))
        } else {
            let i = rng.index(self.channels.len());
            (self.channels.get(i), self.urls.get(i))
        }
    }

    /// Random lower-case padding of exactly `len` bytes.
    #[inline]
    pub(crate) fn extra(&self, rng: &mut EventRng, len: usize) -> &str {
        assert!(len + EXTRA_POOL_WINDOW <= self.extra_pool.len(), "extra too long");
        let start = rng.index(EXTRA_POOL_WINDOW);
        &self.extra_pool[start..start + len]
    }
}

/// `https://www.nexmark.com/<a>/<b>/<c>/item.htm?query=1` with three short
/// random path segments (underscores instead of spaces, not trimmed).
fn push_base_url(rng: &mut EventRng, out: &mut String) {
    out.push_str("https://www.nexmark.com/");
    for _ in 0..3 {
        push_random_string(rng, 5, '_', false, out);
        out.push('/');
    }
    out.push_str("item.htm?query=1");
}

/// The standard channel id: the bit-reversed 32-bit channel number, made
/// non-negative with two's-complement `abs` semantics.
fn channel_id(channel: usize) -> i32 {
    (channel as i32).reverse_bits().wrapping_abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_strings_are_trimmed_and_bounded() {
        let mut rng = EventRng::from_seed(11);
        for _ in 0..2000 {
            let mut s = String::from("x");
            push_random_string(&mut rng, 20, ' ', true, &mut s);
            let part = &s[1..];
            assert!(part.len() <= 19);
            assert!(!part.starts_with(' ') && !part.ends_with(' '));
            assert!(part.bytes().all(|b| b == b' ' || b.is_ascii_lowercase()));
        }
        let mut s = String::new();
        push_random_string(&mut rng, 5, '_', false, &mut s);
        assert!((3..=4).contains(&s.len()));
    }

    #[test]
    fn extra_len_follows_standard_rule() {
        let mut rng = EventRng::from_seed(5);
        assert_eq!(extra_len(&mut rng, 120, 100), 0);
        assert_eq!(ExtraRule::new(95, 100), ExtraRule { min: 4, span: 2 });
        assert_eq!(ExtraRule::new(98, 100), ExtraRule { min: 2, span: 0 });
        let mut sum = 0usize;
        let n = 100_000;
        for _ in 0..n {
            let l = extra_len(&mut rng, 32, 100);
            // d = 68, delta = 14: uniform in [54, 82).
            assert!((54..82).contains(&l));
            sum += l;
        }
        let avg = sum as f64 / n as f64;
        assert!((avg - 67.5).abs() < 0.5, "{avg}");
    }

    #[test]
    fn tables_are_seeded_and_well_formed() {
        let a = TextTables::new(1, 600);
        let b = TextTables::new(1, 600);
        let c = TextTables::new(2, 600);
        assert_eq!(a.urls.get(17), b.urls.get(17));
        assert_eq!(a.extra_pool, b.extra_pool);
        assert_ne!(a.extra_pool, c.extra_pool);
        assert_eq!(a.channels.get(0), "channel-0");
        assert_eq!(a.channels.get(9999), "channel-9999");
        assert_eq!(a.channels.len(), CHANNELS_NUMBER);
        let with_id = (0..CHANNELS_NUMBER).filter(|&i| a.urls.get(i).contains("&channel_id=")).count();
        assert!((8_500..9_500).contains(&with_id), "{with_id}");
        for i in 0..CHANNELS_NUMBER {
            let url = a.urls.get(i);
            assert!(url.starts_with("https://www.nexmark.com/"));
            assert!(url.contains("/item.htm?query=1"));
        }
        assert!(a.extra_pool.bytes().all(|b| b.is_ascii_lowercase()));
    }

    #[test]
    fn channel_ids_match_bit_reversal() {
        assert_eq!(channel_id(0), 0);
        assert_eq!(channel_id(2), 1 << 30);
        assert_eq!(channel_id(1), i32::MIN);
        assert_eq!(channel_id(3), (0xC000_0000u32 as i32).wrapping_abs());
    }
}
