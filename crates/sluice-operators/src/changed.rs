//! The entries of an operator changed since its previous snapshot, for a delta: one bit
//! per entry id (so an entry is listed once however often it changes) and the list of
//! the ids marked, in the order first marked (so a snapshot takes them without scanning
//! every entry). A join's slots kept by row, the group aggregate's groups, OVER's and
//! TopN's partitions use it; an id freed and taken again is unmarked, so a snapshot takes
//! each id at most once. (The window aggregate keeps its own bits, sized to its window's
//! groups at each snapshot, so that marking on its hot path never checks for room.)

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct ChangedIds {
    bits: Vec<u64>,
    /// Every id marked since the last [`ChangedIds::clear`] (or `take`); one unmarked
    /// and marked again may be listed twice, and one unmarked is listed still.
    ids: Vec<u32>,
}

impl ChangedIds {
    /// Whether `id` is marked.
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.bits.get(id as usize / 64).is_some_and(|word| word & (1 << (id % 64)) != 0)
    }

    /// Marks `id` (once).
    pub(crate) fn mark(&mut self, id: u32) {
        let (word, bit) = (id as usize / 64, 1u64 << (id % 64));
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        if self.bits[word] & bit == 0 {
            self.bits[word] |= bit;
            self.ids.push(id);
        }
    }

    /// Unmarks `id` (its entry was freed: a snapshot no longer takes it).
    pub(crate) fn unmark(&mut self, id: u32) {
        if let Some(word) = self.bits.get_mut(id as usize / 64) {
            *word &= !(1 << (id % 64));
        }
    }

    /// How many ids are listed: at least as many as are marked.
    pub(crate) fn listed(&self) -> usize {
        self.ids.len()
    }

    /// The ids marked, each once, in the order first marked; none is marked afterwards.
    pub(crate) fn take(&mut self) -> Vec<u32> {
        let mut taken = Vec::with_capacity(self.ids.len());
        for id in std::mem::take(&mut self.ids) {
            if self.contains(id) {
                self.unmark(id);
                taken.push(id);
            }
        }
        taken
    }

    /// Unmarks every id.
    pub(crate) fn clear(&mut self) {
        for id in self.ids.drain(..) {
            self.bits[id as usize / 64] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_taken_once_in_the_order_first_marked_and_unmarked_ones_are_not() {
        let mut changed = ChangedIds::default();
        for id in [130, 3, 130, 64, 3, 7] {
            changed.mark(id);
        }
        changed.unmark(64);
        changed.unmark(7);
        changed.mark(7);
        assert!(changed.contains(130) && !changed.contains(64) && !changed.contains(1000));
        assert_eq!(changed.take(), [130, 3, 7]);
        assert!(!changed.contains(130) && changed.take().is_empty());
        changed.mark(5);
        changed.clear();
        assert!(!changed.contains(5) && changed.listed() == 0);
    }
}
