//! Integration tests that run the `sluice` binary (one test binary for all, to keep link
//! time and disk small).

mod admin;
mod bad_input;
mod bounded_state;
mod changelog;
mod checkpoints;
mod cluster;
mod crash;
mod delta;
mod docs;
mod examples;
mod golden;
mod harness;
mod kafka;
mod liveness;
mod netns;
mod new_user;
mod nexmark_oracle;
mod openapi;
mod oracle;
mod page;
mod pgwire;
mod postgres;
mod postgres_cdc;
mod query;
mod shared;
mod signals;
mod status;
mod updating;
mod updating_oracle;
