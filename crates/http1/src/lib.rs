//! Oncelog's HTTP/1.1 server engine: bytes in, requests out, responses back. It knows nothing of
//! streams, so it can be read, fuzzed and replaced on its own (docs/design/issue-47-plan.md).
//!
//! Written by hand on `httparse` rather than taken from hyper: the serving core is where the
//! server spends its CPU per request (issue 33's profiles: hyper's layers, a timer per request,
//! header map copies), and a stream server needs things a general engine does not give — a
//! response head and a small body in one write, file ranges sent with `sendfile`, deadlines
//! checked by one sweeper instead of a timer per request.
//!
//! Module map:
//! - [`head`]: a request head parsed and its framing decided; every refusal (smuggling rules
//!   among them) a variant of [`head::HeadError`] with the status it is answered with.
//! - [`chunked`]: the chunked request-body decoder, resumable at any split of its input.
//! - [`body`]: the request body a handler reads ([`RequestBody`]), fed by the connection as the
//!   handler asks for it.
//! - [`conn`]: the connection loop ([`serve`]): keep-alive, pipelining, `Expect: 100-continue`,
//!   half-close, one timer per connection, answers written with as few writes as they allow.
//! - [`park`]: an answer's body written from outside the connection's task while it waits (a
//!   live reader's events, without a wake of its task).
//! - [`response`]: a response head encoded into one buffer, its framing decided from the body;
//!   chunk framing for bodies of unknown length.
//! - [`date`]: the `Date` header's text, formatted once a second per thread.

pub mod body;
pub mod chunked;
pub mod conn;
pub mod date;
pub mod head;
pub mod park;
pub mod response;

pub use body::{BodyError, RequestBody};
pub use chunked::{Chunk, ChunkedDecoder, ChunkedError};
pub use conn::{serve, serve_parked, BoxError, Config, ConnError, Shutdown};
pub use head::{Framing, Head, HeadError, HeadLimits};
pub use park::{Park, Sent};
pub use response::{BodyFraming, ResponseHead};
