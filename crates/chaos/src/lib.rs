//! Oncelog's fault suite (docs/design/issue-24-plan.md): what a run under faults did, and
//! whether it kept exactly-once.
//!
//! Modules:
//! - [`history`]: every operation of a run (invocation, completion, outcome, what it returned),
//!   as JSON lines, and the streams' final contents;
//! - [`check`]: the properties, each a pure function over a history and the final contents
//!   answering the violations it finds (appends, reads, `If-Match`);
//! - [`report`]: the timeline of a run as an SVG;
//! - [`run`]: one seeded run — the cluster (so far the log engine's node, SIGKILLed and
//!   restarted), the workloads, the nemesis — producing a history and its check.
//!
//! PostgreSQL clusters, network faults, pauses and clock skew come next (plan steps 4-5).

pub mod check;
pub mod history;
pub mod report;
pub mod run;
