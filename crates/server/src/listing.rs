//! The stream listing: `GET /v1/stream/__ds/streams?prefix=P&after=CURSOR&limit=N`, an Oncelog
//! extension (docs/PROTOCOL-EXTENSIONS.md, "Listing streams").
//!
//! The streams whose path starts with `prefix` and that the caller may `read`, in path (byte)
//! order, `limit` at a time. The route needs valid credentials but no grant of its own
//! ([`crate::auth::scope::filtered_by_grants`]): the answer is filtered by the caller's grants
//! instead, so it names no path the caller could not read, whatever exists elsewhere. Reserved
//! `__ds/…` paths are never listed.
//!
//! Cost: [`Engine::list_streams`] has no cursor, so every page is cut from one scan of every
//! stream under `prefix` (the log engine copies them from memory and sorts them; PostgreSQL
//! returns them in one query), filtered here. Listing a prefix of `n` streams in pages of
//! `limit` costs about `n / limit` such scans: give the narrowest prefix you can, and large
//! pages.

use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use oncelog_storage::{Engine, Listed};
use oncelog_subscriptions::reserved;
use serde_json::{json, Value};

use crate::auth::scope::Op;
use crate::auth::Access;
use crate::error::ApiError;
use crate::reply;
use crate::request::ListQuery;
use crate::state::AppState;

/// One listed stream as the answer shows it (the fields `HEAD` shows as headers).
fn entry(l: &Listed) -> Value {
    json!({
        "path": l.path,
        "content_type": l.info.config.content_type,
        "next_offset": l.info.tail.to_string(),
        "earliest_offset": l.info.earliest.to_string(),
        "closed": l.info.closed,
    })
}

/// `GET __ds/streams`: `200` with `{"streams": [...], "next": CURSOR-or-null}`. `next` is the
/// last path of this page when more streams follow it (pass it as `after`), `null` on the
/// last page; a page may be shorter than `limit` only when it is the last.
pub async fn streams<E: Engine>(st: &AppState<E>, query: Option<&str>, access: &Access) -> Result<Response, ApiError> {
    let q = ListQuery::parse(query)?;
    let all = st.engine.list_streams(&q.prefix, st.clock.now_ms()).await?;
    let mut visible = all
        .iter()
        .filter(|l| q.after.as_deref().is_none_or(|after| l.path.as_str() > after))
        .filter(|l| !reserved(&l.path) && access.permits(&l.path, Op::Read));
    let page: Vec<&Listed> = visible.by_ref().take(q.limit).collect();
    // Whether one more readable stream follows decides `next`, so no client asks for an empty
    // last page.
    let next = match visible.next() {
        Some(_) => page.last().map(|l| l.path.clone()),
        None => None,
    };
    let body = json!({ "streams": page.iter().map(|l| entry(l)).collect::<Vec<_>>(), "next": next });
    let mut resp = reply::json(StatusCode::OK, &body);
    // A listing changes with every create and delete.
    resp.headers_mut().insert("cache-control", HeaderValue::from_static("no-store"));
    Ok(resp)
}
