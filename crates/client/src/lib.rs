//! Rust client for Durable Streams servers (Oncelog or any other), built around an exactly-once
//! producer.
//!
//! A [`Client`] holds the connection pool, the base URL, default and per-request headers (auth),
//! timeouts and the retry policy. [`Client::stream`] gives a [`StreamHandle`] with the plain
//! operations (create, append, close, delete, head), [readers](read) that follow a stream as a
//! [`futures_util::Stream`] of [`Chunk`]s, and the [`Producer`], which batches, pipelines and
//! retries appends without ever writing one twice.
//!
//! Module map, from the top down; each module builds only on those below it:
//! - [`webhook`]: checking webhook signatures against the server's JWKS; a delivery's wake as a
//!   [`Claim`].
//! - [`subscription`]: subscriptions, pull-wake claims and transactional commits (outputs and
//!   acks in one atomic step, fenced by the wake's generation).
//! - [`producer`]: the exactly-once [`Producer`]: batching, pipelining, retries, fencing, epoch
//!   persistence; [`StreamHandle::producer`] starts one.
//! - [`read`]: catch-up, long-poll and SSE readers as a `Stream` of chunks, and typed JSON
//!   messages on top; [`StreamHandle::read`] starts one.
//! - [`list`]: listing the streams the credentials may read ([`Client::list_streams`], an
//!   Oncelog extension), page by page.
//! - [`stream`]: [`StreamHandle`] (from [`Client::stream`]) and the plain operations' options and
//!   results.
//! - [`client`]: [`Client`] and its builder; the one place requests are sent and retried.
//! - `http` (crate-private): a request kept whole for resending, reading an answer's headers,
//!   and mapping a failed answer to its typed error.
//! - [`sse`]: an incremental Server-Sent-Events parser and the control-event payload.
//! - [`retry`]: exponential backoff with jitter; randomness behind the [`retry::Jitter`] trait.
//! - [`error`]: [`Error`], which says whether a failure is transient and whether a retry is safe.
//! - [`key`]: idempotency keys: time-ordered ones for writers without a sequence counter, and the
//!   random one a plain append carries.
//! - [`offset`]: opaque offset tokens and read start positions, convertible to and from the
//!   protocol crate's [`oncelog_protocol::Offset`].
//!
//! # Producing, exactly once
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let engine = oncelog_log::LogEngine::open(oncelog_log::LogOptions::new(dir.path()))?;
//! # let state = oncelog_server::AppState::new(std::sync::Arc::new(engine), Default::default());
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let base_url = format!("http://{}/v1/stream", listener.local_addr()?);
//! # tokio::spawn(oncelog_server::serve(listener, state, std::future::pending()));
//! use oncelog_client::{Client, CreateOptions, FileEpochStore};
//!
//! let client = Client::new(base_url)?; // e.g. "http://127.0.0.1:4437/v1/stream"
//! let orders = client.stream("orders");
//! orders.create(CreateOptions::content_type("application/json")).await?;
//!
//! // The epoch store makes every start use a higher epoch, so a zombie of an earlier run of
//! // this process is fenced off instead of writing after us.
//! let producer = orders
//!     .producer("order-service-1")
//!     .epoch_store(FileEpochStore::new(dir.path().join("order-service-1.epoch")))
//!     .start()
//!     .await?;
//!
//! // Fire and forget: items are batched (one JSON array per request) and pipelined.
//! let mut receipts = Vec::new();
//! for id in 0..100 {
//!     receipts.push(producer.append_json(&serde_json::json!({ "order": id })).await?);
//! }
//! producer.flush().await?; // the first error, if any
//! let last = receipts.pop().expect("one receipt per item").await?;
//! println!("stored up to offset {}", last.next_offset);
//! producer.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Tailing
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let engine = oncelog_log::LogEngine::open(oncelog_log::LogOptions::new(dir.path()))?;
//! # let state = oncelog_server::AppState::new(std::sync::Arc::new(engine), Default::default());
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let base_url = format!("http://{}/v1/stream", listener.local_addr()?);
//! # tokio::spawn(oncelog_server::serve(listener, state, std::future::pending()));
//! use futures_util::StreamExt;
//! use oncelog_client::{Client, CreateOptions, LiveMode, ReadFrom, ReadOptions};
//!
//! let client = Client::new(base_url)?;
//! let log = client.stream("log");
//! log.create(CreateOptions::content_type("text/plain")).await?;
//!
//! // A writer that appends three lines and then closes the stream (EOF for readers).
//! let writer = log.clone();
//! tokio::spawn(async move {
//!     let producer = writer.producer("writer").start().await?;
//!     for line in ["one\n", "two\n", "three\n"] {
//!         producer.append(line).await?;
//!     }
//!     producer.close_stream(None).await
//! });
//!
//! // Follow the stream live over SSE from the beginning; the reader ends at EOF. Remember
//! // `chunk.next_offset` to resume later with `ReadFrom::Offset`.
//! let mut text = String::new();
//! let mut tail = log.read(ReadOptions::new(ReadFrom::Beginning, LiveMode::Sse));
//! while let Some(chunk) = tail.next().await {
//!     let chunk = chunk?;
//!     text.push_str(std::str::from_utf8(&chunk.data)?);
//! }
//! assert_eq!(text, "one\ntwo\nthree\n");
//! # Ok(())
//! # }
//! ```

pub mod client;
pub mod error;
mod http;
pub mod key;
pub mod list;
pub mod offset;
pub mod producer;
pub mod read;
pub mod retry;
pub mod sse;
pub mod stream;
pub mod subscription;
pub mod webhook;

pub use client::{Client, ClientBuilder};
pub use error::Error;
pub use key::new_idempotency_key;
pub use list::{ListedStream, StreamPage};
pub use offset::{ReadFrom, StreamOffset};
pub use producer::{Ack, EpochStore, FileEpochStore, Producer, ProducerBuilder, ProducerStats, Receipt};
pub use read::{Chunk, ChunkStream, JsonBatch, LiveMode, OnTrimmed, ReadOptions, ReadStatus};
pub use retry::RetryPolicy;
pub use stream::{
    AppendOptions, Appended, CreateOptions, Created, DeleteOptions, Limit, StreamHandle, StreamInfo, Trimmed,
};
pub use subscription::{
    Claim, Commit, Committed, LinkInfo, NoClaim, SubscriptionConfig, SubscriptionInfo, SubscriptionKind, Subscriptions,
};
