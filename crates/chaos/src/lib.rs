//! Oncelog's fault suite (docs/design/issue-24-plan.md): what a run under faults did, and
//! whether it kept exactly-once.
//!
//! Modules:
//! - [`history`]: every operation of a run (invocation, completion, outcome, what it returned),
//!   as JSON lines, and the streams' final contents;
//! - [`check`]: the properties, each a pure function over a history and the final contents
//!   answering the violations it finds (appends, reads, `If-Match`, subscriptions);
//! - [`report`]: the timeline of a run as an SVG;
//! - [`run`]: one seeded run — the system (a log-engine node on a small disk, the same node
//!   keeping its log in a bucket behind a fault proxy, or two nodes on a PostgreSQL primary and
//!   synchronous standby in network namespaces of the run's own), the workloads, the nemesis —
//!   producing a history and its check.

pub mod check;
pub mod history;
pub mod report;
pub mod run;
