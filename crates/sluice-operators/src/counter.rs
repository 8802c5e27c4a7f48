//! A named run counter registered on first use.
//!
//! Counters such as `view NAME: rows outside the window range` count rare events. The
//! run report lists every registered counter, so registering them when the operator is
//! built would print a zero line per operator instance kind; [`LazyCounter`] registers
//! its name with [`Metrics::counter`] only when it is first incremented. Instances on
//! every thread share the one counter of that name.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_runtime::Metrics;

/// A counter of the run's [`Metrics`], registered when first incremented.
pub struct LazyCounter {
    metrics: Arc<Metrics>,
    name: String,
    counter: Option<Arc<AtomicU64>>,
}

impl std::fmt::Debug for LazyCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyCounter").field("name", &self.name).finish()
    }
}

impl LazyCounter {
    /// The counter `name` (e.g. `view hot_items: rows failing an expression`) of `metrics`.
    pub fn new(metrics: Arc<Metrics>, name: impl Into<String>) -> LazyCounter {
        LazyCounter { metrics, name: name.into(), counter: None }
    }

    /// Adds `count` and returns the total before it (over every instance sharing the name).
    pub fn add(&mut self, count: u64) -> u64 {
        let counter = self.counter.get_or_insert_with(|| self.metrics.counter(&self.name));
        counter.fetch_add(count, Ordering::Relaxed)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Another handle on the same counter (its name, of the same metrics).
    pub(crate) fn again(&self) -> LazyCounter {
        LazyCounter::new(Arc::clone(&self.metrics), self.name.clone())
    }
}
