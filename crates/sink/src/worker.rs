//! The worker: sets up the subscription and the target, then claims wakes and serves them, one
//! stream at a time (the `follow` module), until a fatal error.
//!
//! One pull-wake subscription holds one wake at a time, so the workers of a sink share its
//! streams by taking turns: whoever holds the claim applies every stream that has work; the
//! others wait for the claim and take over when a holder stops acking (its lease ends). Several
//! workers are for availability, not for parallelism.

use std::future::Future;
use std::time::Duration;

use oncelog_client::{Claim, Client, CreateOptions, SubscriptionConfig};

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
}

impl SinkOptions {
    pub fn new(subscription: impl Into<String>, pattern: impl Into<String>, wake_stream: impl Into<String>, worker: impl Into<String>) -> SinkOptions {
        SinkOptions {
            subscription: subscription.into(),
            pattern: pattern.into(),
            wake_stream: wake_stream.into(),
            worker: worker.into(),
            lease_ttl: Duration::from_secs(30),
            on_trimmed: OnTrimmed::Fail,
            on_refused: OnRefused::Stop,
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
const BACKOFF: Duration = Duration::from_millis(500);

impl<S: Sink> Worker<S> {
    pub fn new(client: Client, target: Target, sink: S, opts: SinkOptions) -> Worker<S> {
        Worker { client, target, sink, opts }
    }

    /// The target's tables and the subscription, waiting for either side while it is away.
    pub async fn setup(&self) -> Result<(), SinkError> {
        loop {
            match self.setup_once().await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_fatal() || matches!(&e, SinkError::Client(c) if !c.is_transient()) => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "setting up; retrying");
                    tokio::time::sleep(BACKOFF).await;
                }
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
        let subs = self.client.subscriptions();
        // A lease that ran out writes no wake event: poll the claim at least this often.
        let poll = (o.lease_ttl / 4).clamp(Duration::from_millis(250), Duration::from_secs(2));
        tracing::info!(subscription = %o.subscription, pattern = %o.pattern, worker = %o.worker, schema = self.target.schema(), "sink started");
        loop {
            let waited = tokio::select! {
                r = subs.wait_for_claim(&o.subscription, &o.worker, &o.wake_stream, poll, Duration::from_secs(10)) => r,
                () = &mut stop => return Ok(()),
            };
            let claim = match waited {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(e) => {
                    let e = SinkError::from(e);
                    if e.is_fatal() {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, "claim failed; retrying");
                    tokio::time::sleep(BACKOFF).await;
                    continue;
                }
            };
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
                Ok(()) => metrics::claim("done"),
                Err(e) if e.is_fenced() => {
                    tracing::info!(generation = claim.generation, "the claim passed to another worker");
                    metrics::claim("fenced");
                }
                Err(e) => {
                    metrics::claim("failed");
                    if let Err(r) = claim.release().await {
                        tracing::debug!(error = %r, "release failed (the lease ends by itself)");
                    }
                    if e.is_fatal() {
                        return Err(e);
                    }
                    if let SinkError::PositionMoved { .. } = e {
                        metrics::conflict();
                    }
                    tracing::warn!(error = %e, generation = claim.generation, "gave the claim back; claiming again");
                    tokio::time::sleep(BACKOFF).await;
                }
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
