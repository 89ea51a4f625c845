//! Webhook delivery: a task that asks the subscriptions what is due, sends each wake as a
//! signed `POST`, and reports the outcome back (`done` acks the wake's snapshot; a failure
//! schedules a retry, stored so that a restart keeps to it).
//!
//! Each pass also rotates the webhook signing key once it is older than
//! `--webhook-key-max-age` ([`keys::KeyRing::rotate_if_due`]).
//!
//! With several nodes on one engine every node runs this task, but only the one holding the
//! dispatcher lease ([`oncelog_subscriptions::Subscriptions::due`]) delivers and rotates; the
//! others reload the keys each pass, so their key set (JWKS) follows the holder's rotations.
//!
//! Retries back off exponentially from 1 s to 60 s with ±20 % jitter. Deliveries run
//! concurrently, at most one per subscription at a time.

use std::sync::Arc;
use std::time::Duration;

use oncelog_storage::Engine;
use oncelog_subscriptions::WakeNotice;

use super::{ssrf, wire};
use crate::signing as keys;
use crate::state::AppState;

/// What JavaScript's `encodeURIComponent` escapes: everything but letters, digits and
/// `-_.!~*'()`, so the callback URL is the one clients build themselves.
const URI_COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// Longest sleep between two looks at what is due (a wake from another path, a lease that ends).
const MAX_IDLE: Duration = Duration::from_secs(1);

/// The wait before the next attempt after `failures` failed ones (this one included), with
/// `unit` in `[0, 1)` choosing the jitter.
pub fn backoff_ms(failures: u32, unit: f64) -> i64 {
    let base = 1_000f64 * 2f64.powi(failures.saturating_sub(1).min(6) as i32);
    let capped = base.min(60_000.0);
    (capped * (0.8 + 0.4 * unit.clamp(0.0, 1.0))) as i64
}

/// A number in `[0, 1)` from the time and a counter: jitter needs spread, not secrecy.
fn unit(seed: i64) -> f64 {
    let mut z = (seed as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

/// The HTTP client for webhooks: no redirects, no proxies, addresses filtered ([`ssrf`]).
fn client(dev: bool, timeout: Duration) -> Option<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(timeout)
        .dns_resolver(Arc::new(ssrf::Resolver { dev }))
        .build()
        .map_err(|e| tracing::error!(error = %e, "webhook client could not be built; webhooks are not delivered"))
        .ok()
}

/// Starts the dispatcher; it runs until aborted.
pub fn spawn<E: Engine>(state: &AppState<E>) -> tokio::task::JoinHandle<()> {
    let st = state.clone();
    tokio::spawn(async move {
        let Some(http) = client(st.config.dev_webhooks, st.config.webhook_timeout) else { return };
        loop {
            let next = run_once(&st, &http).await;
            let now = st.clock.now_ms();
            let wait =
                next.map_or(MAX_IDLE, |t| Duration::from_millis(u64::try_from(t - now).unwrap_or(0)).min(MAX_IDLE));
            tokio::select! {
                _ = st.subs.notify.notified() => {}
                _ = tokio::time::sleep(wait.max(Duration::from_millis(5))) => {}
            }
        }
    })
}

/// One pass: issues due wakes and starts their deliveries; returns the next deadline.
pub async fn run_once<E: Engine>(st: &AppState<E>, http: &reqwest::Client) -> Option<i64> {
    let now = st.clock.now_ms();
    // As of the last pass: rotation needs no fresher answer (a holder that lost the lease
    // meanwhile rotates at most once more; both keys are stored and published).
    if st.subs.is_dispatcher() {
        let max_age = i64::try_from(st.config.webhook_key_max_age.as_millis()).unwrap_or(i64::MAX);
        match st.sub_keys.rotate_if_due(st.engine.as_ref(), now, max_age).await {
            Ok(true) => tracing::info!("webhook signing key rotated"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "webhook signing key rotation failed; retrying on the next pass"),
        }
    }
    let next = match st.subs.due(now).await {
        Ok(due) => {
            for notice in due.deliveries {
                let (st, http) = (st.clone(), http.clone());
                tokio::spawn(async move { deliver(&st, &http, notice).await });
            }
            due.next_deadline_ms
        }
        // The engine closed under a pass at shutdown: nothing failed, nothing to warn about.
        Err(oncelog_subscriptions::SubError::Storage(oncelog_storage::StorageError::ShuttingDown)) => None,
        Err(e) => {
            tracing::warn!(error = %e, "subscription dispatch pass failed");
            None
        }
    };
    if st.subs.is_shared() {
        if let Err(e) = st.sub_keys.reload(st.engine.as_ref()).await {
            tracing::warn!(error = %e, "webhook signing keys not reloaded; retrying on the next pass");
        }
    }
    next
}

/// Sends one wake and reports the outcome.
async fn deliver<E: Engine>(st: &AppState<E>, http: &reqwest::Client, notice: WakeNotice) {
    let (id, generation) = (notice.id.clone(), notice.generation);
    let result = send(st, http, &notice).await;
    let now = st.clock.now_ms();
    crate::metrics::webhook_delivery(result.is_ok());
    let reported = match result {
        Ok(done) => st.subs.delivered(&id, generation, done, now).await,
        Err(why) => {
            tracing::info!(subscription = %id, generation, %why, "webhook delivery failed; retrying later");
            let wait = backoff_ms(notice.failures + 1, unit(now ^ generation as i64));
            st.subs.delivery_failed(&id, generation, wait, now).await
        }
    };
    if let Err(e) = reported {
        tracing::warn!(subscription = %id, error = %e, "webhook outcome not recorded");
    }
    // The outcome may make more work due (a next wake, a retry time).
    st.subs.notify.notify_one();
}

/// Why one delivery failed.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("the URL is not allowed: {0}")]
    Url(#[from] ssrf::Rejected),
    #[error("signing key unavailable: {0}")]
    Keys(#[from] oncelog_subscriptions::SubError),
    #[error("request failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("receiver answered {0}")]
    Status(reqwest::StatusCode),
}

/// Posts the wake; `Ok(done)` on a 2xx answer, `done` when its JSON body says `"done": true`.
async fn send<E: Engine>(st: &AppState<E>, http: &reqwest::Client, n: &WakeNotice) -> Result<bool, SendError> {
    let url = ssrf::check(n.url.as_deref().unwrap_or(""), st.config.dev_webhooks)?;
    let now = st.clock.now_ms();
    let k: std::sync::Arc<keys::Keys> = st.sub_keys.get(st.engine.as_ref(), now).await?;
    let base = st.config.public_url.clone().or_else(|| st.base_url.get().cloned()).unwrap_or_default();
    let id_enc = percent_encoding::utf8_percent_encode(&n.id, URI_COMPONENT).to_string();
    let callback = format!("{}/v1/stream/__ds/subscriptions/{id_enc}/callback", base.trim_end_matches('/'));
    let token = k.mint(&n.id, n.uid, n.generation, now);
    let body = wire::notice(n, &token, Some(&callback)).to_string();
    let signature = k.sign(now.div_euclid(1000), body.as_bytes());
    let resp = http
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await?;
    if !resp.status().is_success() {
        return Err(SendError::Status(resp.status()));
    }
    Ok(says_done(resp).await)
}

/// Most of a receiver's answer read: enough for `{"done": true}` with room to spare. The status
/// is what matters; a longer body is not read further (dropping the response closes its
/// connection), so a receiver cannot make the server hold its answer in memory.
pub const MAX_ANSWER_BYTES: usize = 16 << 10;

/// Whether a 2xx answer's body is JSON saying `"done": true`. Reads at most
/// [`MAX_ANSWER_BYTES`]; a longer or broken body says nothing (not done).
pub async fn says_done(mut resp: reqwest::Response) -> bool {
    let mut answer = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) if answer.len() + chunk.len() <= MAX_ANSWER_BYTES => answer.extend_from_slice(&chunk),
            Ok(None) => break,
            Ok(Some(_)) | Err(_) => return false,
        }
    }
    serde_json::from_slice::<serde_json::Value>(&answer)
        .ok()
        .and_then(|v| v.get("done").and_then(|d| d.as_bool()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A receiver on the loopback that answers `200` with `head_body` and then, if `endless`,
    /// an endless chunked body; returns its URL and a counter of the body bytes it wrote.
    async fn raw_receiver(first: &'static [u8], endless: bool) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let w = written.clone();
        tokio::spawn(async move {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            let mut req = [0u8; 4096];
            let _ = sock.read(&mut req).await;
            let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
            if sock.write_all(head).await.is_err() {
                return;
            }
            let chunk =
                |data: &[u8]| [format!("{:x}\r\n", data.len()).into_bytes(), data.to_vec(), b"\r\n".to_vec()].concat();
            if sock.write_all(&chunk(first)).await.is_err() {
                return;
            }
            if !endless {
                let _ = sock.write_all(b"0\r\n\r\n").await;
                return;
            }
            let spaces = chunk(&[b' '; 64 << 10]);
            while sock.write_all(&spaces).await.is_ok() {
                w.fetch_add(64 << 10, std::sync::atomic::Ordering::Relaxed);
            }
        });
        (url, written)
    }

    /// A receiver answering an endless body: the answer is read up to the bound and dropped
    /// (before the fix the whole body was read into memory, here: never finishing).
    #[tokio::test]
    async fn a_receivers_answer_is_read_up_to_a_bound() {
        let http = reqwest::Client::new();
        let (url, _) = raw_receiver(br#"{"done":true}"#, false).await;
        let resp = http.post(&url).send().await.expect("post");
        assert!(says_done(resp).await, "a short done answer is read");

        let (url, written) = raw_receiver(br#"{"done":true}"#, true).await;
        let resp = http.post(&url).send().await.expect("post");
        let done = tokio::time::timeout(std::time::Duration::from_secs(20), says_done(resp))
            .await
            .expect("reading the answer did not stop");
        assert!(!done, "an answer past the bound says nothing");
        // The connection was dropped: the receiver's writes stop.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let before = written.load(std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let after = written.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(before, after, "the receiver could still write after the answer was dropped");
        assert!(after < 64 << 20, "{after} bytes written: the answer was not cut at the bound");
    }

    #[test]
    fn backoff_doubles_to_a_minute_with_bounded_jitter() {
        assert_eq!(backoff_ms(1, 0.5), 1_000);
        assert_eq!(backoff_ms(2, 0.5), 2_000);
        assert_eq!(backoff_ms(7, 0.5), 60_000);
        assert_eq!(backoff_ms(40, 0.5), 60_000);
        assert_eq!((backoff_ms(3, 0.0), backoff_ms(3, 0.999_999)), (3_200, 4_799));
        for s in 0..1000 {
            let u = unit(s);
            assert!((0.0..1.0).contains(&u));
        }
    }
}
