//! Server tunables. Defaults are what a production deployment should start from; the binary
//! exposes each as a flag and an environment variable.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// How long a long-poll waits for data before answering 204.
    pub long_poll_timeout: Duration,
    /// How long one SSE response lives before the server ends it so CDNs can collapse
    /// reconnections (section 10.2 suggests about 60 s).
    pub sse_max_duration: Duration,
    /// Largest request body accepted by append and create; larger gets 413.
    pub max_append_bytes: usize,
    /// Soft cap on one read response (whole appends are never split, so one large append can
    /// exceed it).
    pub max_read_bytes: usize,
    /// How often the sweeper looks for expired streams. Expiry is also checked on every access,
    /// so this only bounds how long expired data occupies disk.
    pub sweep_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            long_poll_timeout: Duration::from_secs(20),
            sse_max_duration: Duration::from_secs(60),
            max_append_bytes: 16 << 20,
            max_read_bytes: 1 << 20,
            sweep_interval: Duration::from_secs(5),
        }
    }
}
