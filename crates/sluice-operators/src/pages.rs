//! Fixed-size entries numbered from 0, in pages of [`PAGE_ENTRIES`], for state that holds
//! millions of them (a join's rows, a TopN's partitions).
//!
//! The last page grows as a vector does (a small state holds no more than its entries),
//! every earlier one is full. So growing never copies the entries already held nor holds
//! them twice: one vector doubling from 2 to 4 million 56-byte entries allocates 224 MB
//! and copies 112 MB into it while both are held (NEXMark q18's and q20's peaks).

/// Entries per page (a page of 48-byte entries is 3 MiB).
pub(crate) const PAGE_ENTRIES: usize = 1 << 16;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Pages<T> {
    pages: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Pages<T> {
    fn default() -> Pages<T> {
        Pages { pages: Vec::new(), len: 0 }
    }
}

impl<T> Pages<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn push(&mut self, entry: T) {
        if self.pages.last().is_none_or(|page| page.len() == PAGE_ENTRIES) {
            // The first page grows from nothing; a later one is reserved whole (its
            // memory is faulted in only as entries are written).
            let page = if self.pages.is_empty() { Vec::new() } else { Vec::with_capacity(PAGE_ENTRIES) };
            self.pages.push(page);
        }
        self.pages.last_mut().expect("a page with room").push(entry);
        self.len += 1;
    }

    /// Removes entry `index` and puts the last entry in its place.
    pub(crate) fn swap_remove(&mut self, index: usize) -> T {
        assert!(index < self.len, "entry {index} of {}", self.len);
        let last_page = self.pages.last_mut().expect("a page holds the last entry");
        let mut removed = last_page.pop().expect("the last page is never empty");
        if last_page.is_empty() {
            self.pages.pop();
        }
        self.len -= 1;
        if index < self.len {
            std::mem::swap(&mut self[index], &mut removed);
        }
        removed
    }

    /// The pages, for tests of how entries are laid out.
    #[cfg(test)]
    pub(crate) fn pages(&self) -> &[Vec<T>] {
        &self.pages
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.pages.iter().flatten()
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.pages.iter_mut().flatten()
    }
}

impl<T> std::ops::Index<usize> for Pages<T> {
    type Output = T;

    fn index(&self, index: usize) -> &T {
        &self.pages[index / PAGE_ENTRIES][index % PAGE_ENTRIES]
    }
}

impl<T> std::ops::IndexMut<usize> for Pages<T> {
    fn index_mut(&mut self, index: usize) -> &mut T {
        &mut self.pages[index / PAGE_ENTRIES][index % PAGE_ENTRIES]
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Pushes and swap-removes across page boundaries hold what a vector holds.
        #[test]
        fn pages_hold_what_a_vector_holds(
            steps in prop::collection::vec((any::<bool>(), any::<usize>()), 0..400),
            start in 0usize..3,
        ) {
            let mut pages = Pages::default();
            let mut reference = Vec::new();
            // Start near a page boundary so that removals cross it.
            for i in 0..start * PAGE_ENTRIES - start.min(1) * 100 {
                pages.push(i);
                reference.push(i);
            }
            for (i, (push, pick)) in steps.into_iter().enumerate() {
                if push || reference.is_empty() {
                    pages.push(i);
                    reference.push(i);
                } else {
                    let index = pick % reference.len();
                    prop_assert_eq!(pages.swap_remove(index), reference.swap_remove(index));
                }
                prop_assert_eq!(pages.len(), reference.len());
            }
            prop_assert!(pages.iter().eq(reference.iter()));
            prop_assert!(pages.iter_mut().map(|e| *e).eq(reference.iter().copied()));
        }
    }
}
