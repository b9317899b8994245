//! gavel's integration suite, one test binary: the real runtime, the real
//! router and binary on port 0, real SQLite, PostgreSQL and Redis servers
//! started by the harness, a real browser for the moderator console. (The
//! runaway-rule and memory tests measure the whole process, so they have
//! binaries of their own; so does the fault suite, which would otherwise
//! share two cores with everything else.)
//!
//! Each module is one area; the matrix of setups it runs on is at its end.

mod api;
mod appeals;
mod backtest;
mod config;
mod console;
mod coordinator;
mod delivery;
mod exports;
mod kill;
mod lists;
mod metrics;
mod providers;
mod reload;
mod review;
mod rules;
mod schema;
mod signals;
mod standard_webhooks;
mod standing;
mod store;
mod worker;
