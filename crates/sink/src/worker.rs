//! The worker: sets up the subscription and the target, then claims wakes and serves them, one
//! stream at a time (the `follow` module), until a fatal error.
//!
//! One pull-wake subscription holds one wake at a time, so the workers of a sink share its
//! streams by taking turns: whoever holds the claim applies every stream that has work; the
//! others wait for the claim (saying so, and who holds it) and take over when a holder stops
//! acking (its lease ends). Several workers are for availability, not for parallelism.
//!
//! The server wakes a subscription only for data that arrived after it linked a stream, so what
//! the streams already held when the worker starts (the `backlog` module) is applied between
//! claims, one stream at a time, outside any wake.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use oncelog_client::{Claim, Client, CreateOptions, NoClaim, SubscriptionConfig};

use crate::error::SinkError;
use crate::lease::Lease;
use crate::metrics;
use crate::sink::Sink;
use crate::target::Target;

/// What to do when a stream's history from the stored position on was dropped (trimmed, by
/// request or retention). State Protocol streams restart from their snapshot either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnTrimmed {
    /// Stop with [`SinkError::Trimmed`]: nothing is skipped silently.
    #[default]
    Fail,
    /// Go on from the earliest offset, counting what was skipped (`lost_bytes` in the positions
    /// table, `oncelog_sink_lost_bytes_total`).
    Skip,
}

/// What to do when the target refuses a message and would on every try (a value `jsonb`
/// refuses, any SQLSTATE class 22 data exception, a message that is not a State Protocol message
/// in a State Protocol stream: [`crate::ApplyError::is_refusal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnRefused {
    /// Stop with [`SinkError::Refused`] (the stream, the refused message's offset, the
    /// database's reason): nothing goes on until an operator has looked.
    #[default]
    Stop,
    /// Set the stream aside where the read holding the refused message starts (its reason in
    /// the positions table, `oncelog_sink_streams_set_aside_total`); the other streams go on. A
    /// set-aside stream is not read again until an operator clears its reason.
    SkipStream,
}

/// Which table (which [`crate::StreamKind`]) a stream's data goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// From the stream's metadata: `Stream-Compaction: state` → State Protocol, any other
    /// `application/json` stream → messages, anything else → bytes.
    #[default]
    Auto,
    /// Every JSON stream's messages are State Protocol changes, however the stream was created
    /// (a plain `application/json` stream written by `@durable-streams/state`, say). A stream
    /// that is not JSON is refused as a message would be (see [`OnRefused`]).
    State,
    /// Every JSON stream's messages are rows of their own, State Protocol streams' too. A stream
    /// that is not JSON is refused.
    Messages,
    /// Every stream's reads are byte chunks; a JSON stream's chunk holds the read as a reader
    /// gets it (a JSON array of its messages).
    Chunks,
}

/// How a worker follows its streams.
#[derive(Debug, Clone)]
pub struct SinkOptions {
    /// The pull-wake subscription (created if missing; every worker of a sink names the same
    /// one with the same configuration).
    pub subscription: String,
    /// The streams to apply (`*` one path segment, `**` any number).
    pub pattern: String,
    /// The subscription's wake stream (created if missing, as a JSON stream).
    pub wake_stream: String,
    /// This worker's name: a restarted worker with the same name takes its claim back at once.
    pub worker: String,
    /// How long a claim lasts without an ack (every batch acks).
    pub lease_ttl: Duration,
    pub on_trimmed: OnTrimmed,
    pub on_refused: OnRefused,
    /// Which table each stream goes to.
    pub mode: Mode,
    /// At start, a stream with no position in the target starts at its tail (its history is
    /// skipped, the position recorded) instead of its first byte.
    pub from_now: bool,
}

impl SinkOptions {
    pub fn new(
        subscription: impl Into<String>,
        pattern: impl Into<String>,
        wake_stream: impl Into<String>,
        worker: impl Into<String>,
    ) -> SinkOptions {
        SinkOptions {
            subscription: subscription.into(),
            pattern: pattern.into(),
            wake_stream: wake_stream.into(),
            worker: worker.into(),
            lease_ttl: Duration::from_secs(30),
            on_trimmed: OnTrimmed::Fail,
            on_refused: OnRefused::Stop,
            mode: Mode::Auto,
            from_now: false,
        }
    }
}

/// A sink worker: one Oncelog server, one target, one [`Sink`].
pub struct Worker<S: Sink> {
    pub(crate) client: Client,
    pub(crate) target: Target,
    pub(crate) sink: S,
    pub(crate) opts: SinkOptions,
}

/// Pause after a failure before claiming again.
pub(crate) const BACKOFF: Duration = Duration::from_millis(500);

impl<S: Sink> Worker<S> {
    pub fn new(client: Client, target: Target, sink: S, opts: SinkOptions) -> Worker<S> {
        Worker { client, target, sink, opts }
    }

    /// The target's tables and the subscription, waiting for either side while it is away.
    pub async fn setup(&self) -> Result<(), SinkError> {
        loop {
            match self.setup_once().await {
                Ok(()) => return Ok(()),
                Err(e) if matches!(&e, SinkError::Client(c) if !c.is_transient()) => return Err(e),
                Err(e) => self.retry_or_stop(e, "setting up; retrying").await?,
            }
        }
    }

    async fn setup_once(&self) -> Result<(), SinkError> {
        self.target.prepare(&self.sink).await?;
        let o = &self.opts;
        self.client.stream(&o.wake_stream).create(CreateOptions::content_type("application/json")).await?;
        let config = SubscriptionConfig::pull_wake(&o.wake_stream).pattern(&o.pattern).lease_ttl(o.lease_ttl);
        self.client.subscriptions().put(&o.subscription, &config).await?;
        Ok(())
    }

    /// Sets up, then serves claims until a fatal error (which it returns).
    pub async fn run(&self) -> Result<(), SinkError> {
        self.run_until(std::future::pending()).await
    }

    /// [`Worker::run`] until `stop` completes: then a claim being served is given back at once
    /// (its open transaction, if any, is dropped and so rolled back), so another worker need
    /// not wait for its lease to end.
    pub async fn run_until(&self, stop: impl Future<Output = ()>) -> Result<(), SinkError> {
        tokio::pin!(stop);
        tokio::select! {
            r = self.setup() => r?,
            () = &mut stop => return Ok(()),
        }
        let o = &self.opts;
        tracing::info!(subscription = %o.subscription, pattern = %o.pattern, worker = %o.worker, schema = self.target.schema(), "sink started");
        let mut backlog = tokio::select! {
            r = self.backlog_patiently() => r?,
            () = &mut stop => return Ok(()),
        };
        let subs = self.client.subscriptions();
        // A lease that ran out writes no wake event: poll the claim at least this often.
        let poll = (o.lease_ttl / 4).clamp(Duration::from_millis(250), Duration::from_secs(2));
        // The other worker this one last said it waits for (said once per holder, not per poll).
        let mut waiting_for: Option<String> = None;
        loop {
            // New data first: a wake to be had now is served before the next backlog stream.
            let attempt = tokio::select! {
                r = subs.claim(&o.subscription, &o.worker) => r,
                () = &mut stop => return Ok(()),
            };
            let claim = match attempt {
                Ok(Ok(c)) => Some(c),
                Ok(Err(NoClaim::Claimed { holder })) => {
                    if waiting_for.as_deref() != Some(holder.as_str()) {
                        tracing::info!(
                            %holder,
                            lease_ttl = ?o.lease_ttl,
                            "waiting for the claim: another worker holds it, until its lease ends (at most --lease-ttl after its last ack) or it gives it back"
                        );
                        waiting_for = Some(holder);
                    }
                    None
                }
                Ok(Err(NoClaim::NoPendingWork)) => None,
                Err(e) => {
                    self.retry_or_stop(e.into(), "claim failed; retrying").await?;
                    continue;
                }
            };
            let claim = match claim {
                Some(c) => c,
                None if !backlog.is_empty() => {
                    tokio::select! {
                        r = self.catch_up(&mut backlog) => r?,
                        () = &mut stop => return Ok(()),
                    }
                    continue;
                }
                None => {
                    let waited = tokio::select! {
                        r = subs.wait_for_claim(&o.subscription, &o.worker, &o.wake_stream, poll, Duration::from_secs(10)) => r,
                        () = &mut stop => return Ok(()),
                    };
                    match waited {
                        Ok(Some(c)) => c,
                        Ok(None) => continue,
                        Err(e) => {
                            self.retry_or_stop(e.into(), "claim failed; retrying").await?;
                            continue;
                        }
                    }
                }
            };
            waiting_for = None;
            tracing::info!(generation = claim.generation, streams = claim.streams.len(), "claimed");
            let served = tokio::select! {
                r = self.serve(&claim) => r,
                () = &mut stop => {
                    let _ = claim.release().await;
                    tracing::info!(generation = claim.generation, "stopped; the claim was given back");
                    return Ok(());
                }
            };
            match served {
                Ok(()) => {
                    metrics::claim("done");
                    // The claim read these from their stored positions to their tails: nothing of
                    // what they held at start is left.
                    backlog.retain(|p| claim.streams.iter().all(|l| l.path != *p));
                }
                Err(e) if e.is_fenced() => {
                    tracing::info!(generation = claim.generation, "the claim passed to another worker");
                    metrics::claim("fenced");
                }
                Err(e) => {
                    metrics::claim("failed");
                    if let Err(r) = claim.release().await {
                        tracing::debug!(error = %r, "release failed (the lease ends by itself)");
                    }
                    if let SinkError::PositionMoved { .. } = e {
                        metrics::conflict();
                    }
                    self.retry_or_stop(e, "gave the claim back; claiming again").await?;
                }
            }
        }
    }

    /// A fatal `e` stops the worker; any other is logged (with its cause: `what` alone would not
    /// say why) and waited out.
    pub(crate) async fn retry_or_stop(&self, e: SinkError, what: &str) -> Result<(), SinkError> {
        if e.is_fatal() {
            return Err(e);
        }
        tracing::warn!(error = %e, "{what}");
        tokio::time::sleep(BACKOFF).await;
        Ok(())
    }

    /// [`Worker::backlog`], waiting for the server and the target while they are away.
    async fn backlog_patiently(&self) -> Result<VecDeque<String>, SinkError> {
        loop {
            match self.backlog().await {
                Ok(b) => return Ok(b),
                Err(e) => self.retry_or_stop(e, "looking for what the streams hold; retrying").await?,
            }
        }
    }

    /// Applies every stream the claim names, then ends the wake.
    async fn serve(&self, claim: &Claim) -> Result<(), SinkError> {
        let mut lease = Lease::new(claim);
        let mut rows = 0;
        for link in &claim.streams {
            rows += self.follow(&mut lease, &link.path).await?;
        }
        let more = lease.finish().await?;
        tracing::info!(generation = claim.generation, streams = claim.streams.len(), rows, more, "claim done");
        Ok(())
    }
}
