//! A claim while a worker serves it: acks that follow the positions committed to the target.
//!
//! Acks are not what makes the sink exactly once (the target's positions are); they keep the
//! subscription's cursors near the truth, so the server wakes the sink only for streams with
//! work, and each one extends the lease, so a long backlog does not lose the claim. An ack that
//! comes back `FENCED` is how a paused worker learns the claim is gone. A stream applied outside
//! any wake ([`Lease::outside`]: what it held when the worker started) sends no acks at all.

use std::collections::HashMap;

use oncelog_client::{Claim, StreamOffset};

use crate::error::SinkError;

pub struct Lease<'a> {
    /// `None` while catching up outside any wake (the `backlog` module): no lease to extend,
    /// and nothing to ack, the cursors being at the tails as the worker saw them.
    claim: Option<&'a Claim>,
    /// The subscription's cursor per stream, as this worker last set or saw it.
    acked: HashMap<String, StreamOffset>,
}

impl<'a> Lease<'a> {
    pub fn new(claim: &'a Claim) -> Lease<'a> {
        Lease {
            claim: Some(claim),
            acked: claim.streams.iter().map(|l| (l.path.clone(), l.acked_offset.clone())).collect(),
        }
    }

    /// For a stream applied outside any wake: every ack is left out.
    pub fn outside() -> Lease<'static> {
        Lease { claim: None, acked: HashMap::new() }
    }

    /// `stream` is applied up to `to` (committed in the target): ack it there, extending the
    /// lease. A cursor already at or past `to` (a subscription made after the stream had data
    /// starts at its tail; the target's position starts at its beginning) is left alone: cursors
    /// never move back.
    pub async fn progress(&mut self, stream: &str, to: &StreamOffset) -> Result<(), SinkError> {
        let Some(claim) = self.claim else { return Ok(()) };
        let ahead = self.acked.get(stream).is_none_or(|a| to > a);
        let acks: Vec<(&str, &StreamOffset)> = if ahead { vec![(stream, to)] } else { Vec::new() };
        match claim.ack(&acks, false).await {
            Ok(_) => {
                if ahead {
                    self.acked.insert(stream.to_owned(), to.clone());
                }
                Ok(())
            }
            // The target has it; the next ack (or the next worker) moves the cursor.
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, stream, "ack failed; going on (the target's position is what counts)");
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Acks `stream` at `to` if that moves its cursor (no request otherwise).
    pub async fn settle(&mut self, stream: &str, to: &StreamOffset) -> Result<(), SinkError> {
        if self.acked.get(stream).is_none_or(|a| to > a) {
            self.progress(stream, to).await?;
        }
        Ok(())
    }

    /// Ends the wake (`done`); answers whether more work came in meanwhile.
    pub async fn finish(&self) -> Result<bool, SinkError> {
        let Some(claim) = self.claim else { return Ok(false) };
        Ok(claim.ack(&[], true).await?.next_wake)
    }
}
