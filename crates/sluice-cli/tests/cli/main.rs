//! Integration tests that run the `sluice` binary (one test binary for all, to keep link
//! time and disk small). The modules of connectors behind cargo features are compiled
//! only with those features, which `scripts/test.sh` turns on (`--all-features`);
//! `features` checks what a build without them says.

mod admin;
mod bad_input;
mod bounded_state;
mod changelog;
mod checkpoints;
mod cluster;
mod crash;
// The Delta sink, also on S3.
#[cfg(all(feature = "delta", feature = "cloud"))]
mod delta;
// Every snippet of the manual, which names every connector.
#[cfg(all(feature = "kafka", feature = "postgres", feature = "delta", feature = "cloud", feature = "pgwire"))]
mod docs;
mod examples;
#[cfg(not(all(feature = "kafka", feature = "postgres", feature = "delta", feature = "cloud", feature = "pgwire")))]
mod features;
mod golden;
mod harness;
#[cfg(feature = "kafka")]
mod kafka;
mod liveness;
mod netns;
mod new_user;
mod nexmark_oracle;
mod openapi;
mod oracle;
mod page;
#[cfg(feature = "pgwire")]
mod pgwire;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
mod postgres_cdc;
#[cfg(feature = "postgres")]
mod postgres_tls;
mod query;
mod shared;
mod signals;
mod status;
mod updating;
mod updating_oracle;
