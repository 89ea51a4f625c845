//! The engine contract suite: everything the HTTP layer relies on from an [`Engine`], as
//! scenario functions generic over a [`Harness`]. Every engine runs all of them with one line:
//!
//! ```ignore
//! oncelog_storage::engine_contract_tests!(MyHarness);
//! ```
//!
//! A behaviour that is not in this suite is not part of the contract. Cases are grouped by
//! topic: [`writes`] (create and append verdicts, precedence, receipts, parking, closure,
//! `Stream-Seq`, incarnations and framing), [`forks`] (chains, sub-offsets, soft delete and
//! cascade, purge), [`lifecycle`] (reads and their alignment, trims, expiry, live waits,
//! persistence across reopen, readiness), [`retention`] (policies and the sweep that applies them),
//! [`compaction`] (State Protocol snapshots), [`txn`] (transactions over metadata and several
//! streams, stream listing). Subscription state kept through them has its cases in
//! `oncelog-subscriptions` (`subscription_contract_tests!`), over the same [`Harness`].

use std::future::Future;

use bytes::Bytes;
use oncelog_protocol::headers::ProducerHeaders;
use oncelog_protocol::Offset;

use crate::engine::*;

pub mod compaction;
pub mod forks;
pub mod lifecycle;
pub mod retention;
pub mod txn;
pub mod writes;

/// How the suite gets engines: fresh ones on empty storage, and the same storage reopened.
pub trait Harness: Sized + Send + Sync + 'static {
    /// Cheap to clone (clones share one engine), as both of Oncelog's engines are.
    type Engine: Engine + Clone;

    /// A fresh engine on fresh, empty storage.
    fn open() -> impl Future<Output = Self> + Send;

    fn engine(&self) -> &Self::Engine;

    /// Shuts the engine down cleanly and opens a new one on the same storage.
    fn reopen(&mut self) -> impl Future<Output = ()> + Send;
}

/// Runs one case on its own multi-threaded runtime (live waits and parking need real time).
pub fn run<F: Future<Output = ()>>(case: impl FnOnce() -> F) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("test runtime");
    rt.block_on(case());
}

/// Expands to one `#[test]` per contract case for the harness type given.
///
/// `engine_contract_tests!(Harness)` runs every case ([`ALL_CASES`]).
///
/// `@cases` is the subset entry: an engine that does not pass everything yet lists what it runs,
/// `engine_contract_tests!(@cases Harness; writes::create_verdicts, forks::fork_verdicts)`; it
/// should assert with `contract::check_subset(passing, not_yet)` ([`check_subset`]) that the two
/// lists cover [`ALL_CASES`] exactly, so a case added to the contract later cannot be forgotten
/// there. [`contract_case_names!`](crate::contract_case_names!) turns such a list into strings.
#[macro_export]
macro_rules! engine_contract_tests {
    (@cases $harness:ty; $($group:ident :: $case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::contract::run(|| $crate::contract::$group::$case::<$harness>());
            }
        )*
    };
    ($harness:ty) => {
        $crate::__contract_all_cases! { [$crate::engine_contract_tests] @cases $harness; }
    };
}

/// The contract's cases as `"group::case"` strings, e.g. for [`check_subset`]:
/// `contract_case_names!(writes::closure, forks::fork_verdicts)`.
#[macro_export]
macro_rules! contract_case_names {
    ($($group:ident :: $case:ident),* $(,)?) => {
        &[$(concat!(stringify!($group), "::", stringify!($case))),*]
    };
}

/// The one list of the contract's cases, in the order they run. Expands to
/// `CALLBACK! { PREFIX... group::case, ... }`, where the callback is a macro path given in
/// brackets; both [`engine_contract_tests!`] and [`ALL_CASES`] are built from it, so they cannot
/// drift apart. A new case is added here and nowhere else.
#[doc(hidden)]
#[macro_export]
macro_rules! __contract_all_cases {
    ([$($callback:tt)+] $($prefix:tt)*) => {
        $($callback)+! {
            $($prefix)*
            writes::create_verdicts,
            writes::shape_limits_are_the_same_on_every_engine,
            writes::append_precedence,
            writes::content_type_mismatches_name_both_types,
            writes::conditional_appends,
            writes::a_producer_retry_with_another_body_is_refused,
            writes::idle_producer_state_expires,
            writes::idempotency_keys,
            writes::idle_writer_state_is_pruned,
            writes::a_new_producer_beyond_the_stream_cap_is_refused,
            writes::duplicates_answer_with_their_original_offset,
            writes::out_of_order_producer_appends_wait_for_their_predecessors,
            writes::a_real_gap_is_answered_after_the_park_timeout,
            writes::parked_appends_are_counted,
            writes::closure,
            writes::stream_seq_must_increase,
            writes::appends_validated_against_a_replaced_stream_are_refused,
            writes::framing_must_match_the_stream_type,
            writes::expected_offset_is_a_strict_compare_and_append,
            forks::fork_chains_read_through_their_ancestors,
            forks::fork_sub_offsets_count_bytes_or_messages,
            forks::fork_verdicts,
            forks::soft_delete_keeps_data_for_forks_and_cascades,
            forks::purge_detaches_a_forked_source_from_its_path,
            lifecycle::reads_page_through_whole_appends,
            lifecycle::bounded_reads_may_end_inside_an_append,
            lifecycle::read_pieces_are_the_read_in_order,
            lifecycle::trims_move_the_earliest_offset_forward,
            retention::retention_policies_are_configuration,
            retention::retention_drops_whole_old_appends_by_size_and_age,
            compaction::compaction_replaces_the_history_with_a_snapshot,
            lifecycle::reads_say_whether_they_start_at_a_minted_offset,
            lifecycle::ttl_and_absolute_expiry,
            lifecycle::live_waits_wake_on_append_closure_and_delete,
            lifecycle::reads_after_a_wait_see_at_least_what_it_saw,
            lifecycle::state_survives_reopen,
            lifecycle::deleted_paths_start_fresh_with_new_ids,
            lifecycle::readiness_and_stats,
            txn::transactions_commit_metadata_and_appends_together,
            txn::a_refused_transaction_writes_nothing,
            txn::a_transaction_releases_the_appends_waiting_for_it,
            txn::listed_streams_are_the_visible_ones,
        }
    };
}

/// Every contract case, as `"group::case"` (e.g. `"writes::create_verdicts"`), in the order
/// [`engine_contract_tests!`] runs them.
pub const ALL_CASES: &[&str] = crate::__contract_all_cases! { [crate::contract_case_names] };

/// For an engine that runs a subset of the contract (the `@cases` entry of
/// [`engine_contract_tests!`]): panics, naming the cases at fault, unless `passing` (the cases it
/// runs) and `not_yet` (the ones it does not pass yet) together cover [`ALL_CASES`] exactly,
/// with no case in both and none listed twice.
#[track_caller]
pub fn check_subset(passing: &[&str], not_yet: &[&str]) {
    let listed = |c: &&str| passing.contains(c) || not_yet.contains(c);
    let missing: Vec<&str> = ALL_CASES.iter().copied().filter(|c| !listed(c)).collect();
    let unknown = uniq(passing.iter().chain(not_yet).copied().filter(|c| !ALL_CASES.contains(c)));
    let in_both = uniq(passing.iter().copied().filter(|c| not_yet.contains(c)));
    let repeated = |list: &[&str]| -> String {
        uniq(list.iter().copied().filter(|c| list.iter().filter(|d| *d == c).count() > 1)).join(", ")
    };
    let (twice_passing, twice_not_yet) = (repeated(passing), repeated(not_yet));

    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!("missing from both lists: {}", missing.join(", ")));
    }
    if !unknown.is_empty() {
        problems.push(format!("not contract cases (see contract::ALL_CASES): {}", unknown.join(", ")));
    }
    if !in_both.is_empty() {
        problems.push(format!("in both `passing` and `not_yet`: {}", in_both.join(", ")));
    }
    if !twice_passing.is_empty() {
        problems.push(format!("listed more than once in `passing`: {twice_passing}"));
    }
    if !twice_not_yet.is_empty() {
        problems.push(format!("listed more than once in `not_yet`: {twice_not_yet}"));
    }
    assert!(
        problems.is_empty(),
        "the contract subset does not cover contract::ALL_CASES exactly:\n  {}",
        problems.join("\n  ")
    );
}

/// The items of `it` in order, each once.
fn uniq<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out = Vec::new();
    for c in it {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

// --- request builders and helpers, shared by the cases and by engines' own tests ---

pub fn create_req(path: &str, ct: &str) -> CreateRequest {
    CreateRequest {
        path: path.into(),
        content_type: Some(ct.into()),
        expiry: None,
        fork: None,
        retention: Default::default(),
        compaction: false,
        closed: false,
        initial: Bytes::new(),
        json_framed: false,
        now_ms: 0,
    }
}

pub fn fork_req(path: &str, source: &str, offset: Option<u64>, sub_offset: u64) -> CreateRequest {
    CreateRequest {
        content_type: None,
        fork: Some(ForkRequest { source: source.into(), offset: offset.map(Offset), sub_offset }),
        ..create_req(path, "")
    }
}

pub fn append_req(path: &str, data: &str) -> AppendRequest {
    AppendRequest::plain(path, "text/plain", false, Bytes::from(data.to_owned()), 0)
}

/// An append of JSON messages (given as JSON texts) to a JSON stream.
pub fn json_req(path: &str, messages: &[&str]) -> AppendRequest {
    AppendRequest::plain(path, "application/json", true, json_framed(messages), 0)
}

pub fn produce(path: &str, data: &str, id: &str, epoch: u64, seq: u64) -> AppendRequest {
    AppendRequest { producer: Some(ProducerHeaders { id: id.into(), epoch, seq }), ..append_req(path, data) }
}

/// An append with an `Idempotency-Key`.
pub fn keyed(path: &str, data: &str, key: &str) -> AppendRequest {
    AppendRequest { idempotency_key: Some(oncelog_protocol::digest::KeyId::of(key)), ..append_req(path, data) }
}

pub fn close_req(path: &str) -> AppendRequest {
    AppendRequest { close: true, data: Bytes::new(), content_type: None, ..append_req(path, "") }
}

pub async fn create<E: Engine>(e: &E, req: CreateRequest) -> StreamInfo {
    match e.create(req).await.expect("create") {
        CreateOutcome::Created(i) | CreateOutcome::Existing(i) => i,
    }
}

pub async fn append<E: Engine>(e: &E, req: AppendRequest) -> AppendOutcome {
    e.append(req).await.expect("append")
}

/// A whole stream read in `page`-byte pages, so paging and segment boundaries are exercised.
pub async fn read_all<E: Engine>(e: &E, path: &str, page: usize) -> String {
    let mut out = Vec::new();
    // From the earliest offset: everything still readable.
    let mut at = e.head(path, 0).await.expect("head").earliest;
    loop {
        let c = e.read(ReadRequest::new(path, at, page, 0)).await.expect("read");
        assert!(c.next >= at, "reads never go backwards");
        out.extend_from_slice(&c.data);
        at = c.next;
        if c.up_to_date() {
            return String::from_utf8(out).expect("utf-8 test data");
        }
    }
}

/// The stored form of JSON messages (what a caller frames with `json::encode_body`).
pub fn json_framed(values: &[&str]) -> Bytes {
    Bytes::from(values.iter().map(|v| format!("{v},")).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::{check_subset, ALL_CASES};

    #[test]
    fn all_cases_are_listed_once_as_group_and_case() {
        assert!(!ALL_CASES.is_empty());
        for (i, c) in ALL_CASES.iter().enumerate() {
            assert!(!ALL_CASES[..i].contains(c), "{c} is listed twice in the contract");
            let (group, case) = c.split_once("::").expect("group::case");
            assert!(!group.is_empty() && !case.is_empty() && !case.contains(':'), "{c}");
        }
        assert_eq!(ALL_CASES[0], "writes::create_verdicts");
    }

    /// Whether `check_subset` panics, and its message.
    fn subset_panic(passing: &[&str], not_yet: &[&str]) -> Option<String> {
        let err = std::panic::catch_unwind(|| check_subset(passing, not_yet)).err()?;
        Some(err.downcast_ref::<String>().cloned().unwrap_or_default())
    }

    #[test]
    fn a_subset_must_cover_all_cases_exactly() {
        assert_eq!(subset_panic(ALL_CASES, &[]), None);
        assert_eq!(subset_panic(&[], ALL_CASES), None);
        assert_eq!(subset_panic(&ALL_CASES[1..], &ALL_CASES[..1]), None);
        let names = crate::contract_case_names!(writes::create_verdicts, forks::fork_verdicts,);
        assert_eq!(names, &["writes::create_verdicts", "forks::fork_verdicts"]);
        let rest: Vec<&str> = ALL_CASES.iter().copied().filter(|c| !names.contains(c)).collect();
        assert_eq!(subset_panic(names, &rest), None);

        let missing = subset_panic(&ALL_CASES[1..], &[]).expect("a missing case panics");
        assert!(missing.contains("missing from both lists: writes::create_verdicts"), "{missing}");
        let unknown = subset_panic(ALL_CASES, &["writes::no_such_case"]).expect("an unknown case panics");
        assert!(unknown.contains("not contract cases (see contract::ALL_CASES): writes::no_such_case"), "{unknown}");
        let both = subset_panic(ALL_CASES, &ALL_CASES[..1]).expect("a case in both lists panics");
        assert!(both.contains("in both `passing` and `not_yet`: writes::create_verdicts"), "{both}");
        let mut twice = ALL_CASES.to_vec();
        twice.push(ALL_CASES[2]);
        let twice = subset_panic(&twice, &[]).expect("a case listed twice panics");
        assert!(twice.contains(&format!("listed more than once in `passing`: {}", ALL_CASES[2])), "{twice}");
    }
}
