//! Listing streams: [`Client::list_streams`] follows the pages of Oncelog's stream listing,
//! `GET {base}/__ds/streams?prefix=P&after=CURSOR&limit=N` (an Oncelog extension,
//! docs/PROTOCOL-EXTENSIONS.md "Listing streams"); [`Client::list_streams_page`] asks for one.
//! With access control on, the server lists only the streams the client's credentials may read.

use futures_util::{Stream, TryStreamExt};
use reqwest::{Method, Url};
use serde::Deserialize;

use crate::client::Client;
use crate::error::Error;
use crate::http::{error_from_response, Op, Request};
use crate::offset::StreamOffset;

/// The largest page the server answers, and the page size [`Client::list_streams`] asks for:
/// each page costs the server a scan of the whole prefix, so fewer, larger pages are cheaper.
pub const MAX_PAGE_SIZE: usize = 1000;

/// One stream of a listing: what `HEAD` would show of it when the page was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedStream {
    /// The stream's path (relative to the base URL; [`Client::stream`] takes it).
    pub path: String,
    /// Its content type.
    pub content_type: String,
    /// Its tail.
    pub next_offset: StreamOffset,
    /// Where reads can start (after trims, retention and compaction).
    pub earliest_offset: StreamOffset,
    /// Whether it is closed.
    pub closed: bool,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPage {
    /// The streams, in path (byte) order.
    pub streams: Vec<ListedStream>,
    /// The cursor of the next page (pass it as `after`); `None` on the last page.
    pub next: Option<String>,
}

/// The answer as the server writes it.
#[derive(Deserialize)]
struct WirePage {
    streams: Vec<WireStream>,
    next: Option<String>,
}

#[derive(Deserialize)]
struct WireStream {
    path: String,
    content_type: String,
    next_offset: String,
    earliest_offset: String,
    closed: bool,
}

impl Client {
    fn listing_url(&self, prefix: &str, after: Option<&str>, limit: usize) -> Url {
        let mut url = self.base_url().clone();
        if let Ok(mut segs) = url.path_segments_mut() {
            segs.pop_if_empty().push("__ds").push("streams");
        }
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("prefix", prefix).append_pair("limit", &limit.to_string());
            if let Some(a) = after {
                q.append_pair("after", a);
            }
        }
        url
    }

    /// One page of the streams whose path starts with `prefix` and that the credentials may
    /// read: at most `limit` (1 to [`MAX_PAGE_SIZE`]) after the path `after` (the previous
    /// page's [`StreamPage::next`]; `None` for the first page). Retried like any idempotent
    /// request. A server without the listing answers [`Error::NotFound`].
    pub async fn list_streams_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<StreamPage, Error> {
        if !(1..=MAX_PAGE_SIZE).contains(&limit) {
            return Err(Error::invalid(format!("a listing page holds 1 to {MAX_PAGE_SIZE} streams, not {limit}")));
        }
        let req = Request::new(Method::GET, self.listing_url(prefix, after, limit), true, Some(self.request_timeout()));
        let resp = self.send(&req, self.retry_policy()).await?;
        if resp.status().as_u16() != 200 {
            return Err(error_from_response(resp, Op::Other, true).await);
        }
        let body = resp.bytes().await.map_err(|e| Error::transport(e, true))?;
        let wire: WirePage =
            serde_json::from_slice(&body).map_err(|e| Error::InvalidResponse(format!("stream listing: {e}")))?;
        // A cursor that does not move past `after` would make a caller that follows it loop
        // forever.
        if let (Some(next), Some(after)) = (&wire.next, after) {
            if next.as_str() <= after {
                return Err(Error::InvalidResponse(format!(
                    "stream listing: next cursor {next:?} does not move past {after:?}"
                )));
            }
        }
        let streams = wire
            .streams
            .into_iter()
            .map(|s| ListedStream {
                path: s.path,
                content_type: s.content_type,
                next_offset: StreamOffset::new(s.next_offset),
                earliest_offset: StreamOffset::new(s.earliest_offset),
                closed: s.closed,
            })
            .collect();
        Ok(StreamPage { streams, next: wire.next })
    }

    /// Every stream whose path starts with `prefix` (`""`: all) that the credentials may read,
    /// in path order, following the listing's pages ([`MAX_PAGE_SIZE`] each) until the last.
    /// Lazy: a page is asked for when the previous one is used up. Each page is a snapshot of
    /// its moment, so streams created or deleted meanwhile may be missed or shown; none is
    /// shown twice.
    pub fn list_streams(&self, prefix: &str) -> impl Stream<Item = Result<ListedStream, Error>> + Send + 'static {
        self.list_streams_in_pages(prefix, MAX_PAGE_SIZE)
    }

    /// [`Client::list_streams`] with pages of `page_size` (1 to [`MAX_PAGE_SIZE`]).
    pub fn list_streams_in_pages(
        &self,
        prefix: &str,
        page_size: usize,
    ) -> impl Stream<Item = Result<ListedStream, Error>> + Send + 'static {
        // The state between pages: `None` once the last page was fetched.
        let start = Some((self.clone(), prefix.to_owned(), None::<String>));
        futures_util::stream::try_unfold(start, move |state| async move {
            let Some((client, prefix, after)) = state else { return Ok::<_, Error>(None) };
            let page = client.list_streams_page(&prefix, after.as_deref(), page_size).await?;
            let rest = page.next.map(|next| (client, prefix, Some(next)));
            Ok(Some((futures_util::stream::iter(page.streams.into_iter().map(Ok)), rest)))
        })
        .try_flatten()
    }
}
