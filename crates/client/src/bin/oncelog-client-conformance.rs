//! Adapter between the official Durable Streams client conformance suite
//! (`@durable-streams/client-conformance-tests`) and this client.
//!
//! The suite starts this program, writes one JSON command per line on stdin and expects one
//! JSON result per line on stdout; each command is carried out with the public API of
//! `oncelog-client` only. Commands are handled one at a time, as the suite sends them.
//! See docs/CLIENT.md for how to run the suite.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures_util::StreamExt;
use oncelog_client::{
    AppendOptions, Chunk, Client, CreateOptions, Error, LiveMode, Producer, ReadFrom, ReadOptions, RetryPolicy,
    StreamHandle,
};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Map, Value};

/// A header or query value the suite asks to compute per command.
#[derive(Debug, Clone)]
enum Dynamic {
    /// 1, 2, 3, ... one step per command.
    Counter(u64),
    /// Milliseconds since the Unix epoch.
    Timestamp,
    /// A fixed value (a token the suite rotates by setting it again).
    Token(String),
}

impl Dynamic {
    fn next(&mut self) -> String {
        match self {
            Dynamic::Counter(n) => {
                *n += 1;
                n.to_string()
            }
            Dynamic::Timestamp => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis().to_string())
                .unwrap_or_default(),
            Dynamic::Token(t) => t.clone(),
        }
    }
}

/// The values the client's header and query providers apply during the current command.
#[derive(Debug, Default)]
struct Current {
    /// Headers added to every request of the command.
    headers: Vec<(String, String)>,
    /// Query parameters added to every request of the command.
    params: Vec<(String, String)>,
}

/// Adapter state across commands.
struct Adapter {
    /// The client, created at `init`.
    client: Option<Client>,
    /// Content type of each stream this adapter created or looked at.
    content_types: HashMap<String, String>,
    /// Producers kept across `idempotent-*` commands, by (path, producer id, epoch).
    producers: HashMap<(String, String, u64), Producer>,
    /// Configured dynamic headers (`set-dynamic-header`).
    dyn_headers: Vec<(String, Dynamic)>,
    /// Configured dynamic query parameters (`set-dynamic-param`).
    dyn_params: Vec<(String, Dynamic)>,
    /// Shared with the client's providers.
    current: Arc<Mutex<Current>>,
}

type Outcome = Result<Value, Error>;

fn main() {
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let mut adapter = Adapter {
        client: None,
        content_types: HashMap::new(),
        producers: HashMap::new(),
        dyn_headers: Vec::new(),
        dyn_params: Vec::new(),
        current: Arc::new(Mutex::new(Current::default())),
    };
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let (result, stop) = match serde_json::from_str::<Value>(&line) {
            Ok(cmd) => {
                let kind = cmd.get("type").and_then(Value::as_str).unwrap_or("").to_owned();
                let result = runtime.block_on(adapter.handle(&kind, &cmd));
                (result, kind == "shutdown")
            }
            Err(e) => (error_json("init", None, "PARSE_ERROR", &format!("cannot parse command: {e}")), false),
        };
        let text = result.to_string().replace('\u{2028}', "\\u2028").replace('\u{2029}', "\\u2029");
        if writeln!(stdout, "{text}").and_then(|()| stdout.flush()).is_err() || stop {
            break;
        }
    }
}

fn s<'a>(cmd: &'a Value, key: &str) -> Option<&'a str> {
    cmd.get(key).and_then(Value::as_str)
}

fn error_json(command: &str, status: Option<u16>, code: &str, message: &str) -> Value {
    let mut v =
        json!({ "type": "error", "success": false, "commandType": command, "errorCode": code, "message": message });
    if let Some(st) = status {
        v["status"] = json!(st);
    }
    v
}

/// The suite's error code (and status) for a client error.
fn error_result(command: &str, err: &Error) -> Value {
    let inner = match err {
        Error::ProducerFailed(e) => e.as_ref(),
        e => e,
    };
    let (code, status) = match inner {
        Error::NotFound { .. } => ("NOT_FOUND", Some(404)),
        Error::ConfigMismatch { .. } | Error::Conflict { .. } => ("CONFLICT", Some(409)),
        Error::StreamSeqConflict { .. } | Error::SequenceGap { .. } => ("SEQUENCE_CONFLICT", Some(409)),
        Error::StreamClosed { .. } => ("STREAM_CLOSED", Some(409)),
        Error::BadRequest { .. } => ("INVALID_OFFSET", Some(400)),
        Error::Fenced { .. } => ("UNEXPECTED_STATUS", Some(403)),
        Error::InvalidResponse(_) | Error::Json(_) => ("PARSE_ERROR", None),
        Error::Transport { .. } => ("NETWORK_ERROR", None),
        Error::InvalidArgument(_) => ("INVALID_ARGUMENT", None),
        e => match e.status() {
            Some(st) => ("UNEXPECTED_STATUS", Some(st)),
            None => ("INTERNAL_ERROR", None),
        },
    };
    error_json(command, status, code, &err.to_string())
}

/// Removes insignificant whitespace from valid JSON, keeping key order (what `JSON.stringify`
/// of a parsed value prints, for the texts the suite uses).
fn minify_json(text: &[u8]) -> String {
    let mut out = Vec::with_capacity(text.len());
    let (mut in_str, mut escaped) = (false, false);
    for &b in text {
        if in_str {
            out.push(b);
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
        } else if b == b'"' {
            in_str = true;
            out.push(b);
        } else if !b.is_ascii_whitespace() {
            out.push(b);
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn headers_of(cmd: &Value) -> Result<HeaderMap, Error> {
    let mut h = HeaderMap::new();
    if let Some(obj) = cmd.get("headers").and_then(Value::as_object) {
        for (k, v) in obj {
            let name =
                HeaderName::from_bytes(k.as_bytes()).map_err(|_| Error::InvalidArgument(format!("header {k}")))?;
            let value = HeaderValue::from_str(v.as_str().unwrap_or_default())
                .map_err(|_| Error::InvalidArgument(format!("header {k}")))?;
            h.insert(name, value);
        }
    }
    Ok(h)
}

impl Adapter {
    async fn handle(&mut self, kind: &str, cmd: &Value) -> Value {
        let outcome = match kind {
            "init" => self.init(cmd),
            "shutdown" => {
                for p in self.producers.values() {
                    let _ = p.close().await;
                }
                Ok(json!({ "type": "shutdown", "success": true }))
            }
            "set-dynamic-header" | "set-dynamic-param" => self.set_dynamic(kind, cmd),
            "clear-dynamic" => {
                self.dyn_headers.clear();
                self.dyn_params.clear();
                Ok(json!({ "type": "clear-dynamic", "success": true }))
            }
            "validate" => return self.validate(cmd),
            "benchmark" => {
                return error_json(kind, None, "NOT_SUPPORTED", "benchmarks are not implemented by this adapter")
            }
            _ => {
                let Some(client) = self.client.clone() else {
                    return error_json(kind, None, "INTERNAL_ERROR", "init was not sent");
                };
                let (headers_sent, params_sent) = self.begin_command();
                let path = s(cmd, "path").unwrap_or("").to_owned();
                let stream = client.stream(&path);
                let r = match kind {
                    "create" => self.create(&stream, &path, cmd).await,
                    "connect" => self.connect(&stream, &path, cmd).await,
                    "append" => self.append(&stream, &path, cmd).await,
                    "read" => self.read(&stream, &path, cmd).await,
                    "head" => self.head(&stream, &path, cmd).await,
                    "delete" => self.delete(&stream, &path, cmd).await,
                    "close" => self.close(&stream, &path, cmd).await,
                    "idempotent-append" => self.idempotent_append(&stream, &path, cmd).await,
                    "idempotent-append-batch" => self.idempotent_append_batch(&stream, &path, cmd).await,
                    "idempotent-close" => self.idempotent_close(&stream, &path, cmd).await,
                    "idempotent-detach" => self.idempotent_detach(&stream, &path, cmd).await,
                    other => return error_json(other, None, "NOT_SUPPORTED", &format!("unknown command {other}")),
                };
                r.map(|mut v| {
                    if matches!(kind, "append" | "read") {
                        if !headers_sent.is_empty() {
                            v["headersSent"] = Value::Object(headers_sent);
                        }
                        if !params_sent.is_empty() {
                            v["paramsSent"] = Value::Object(params_sent);
                        }
                    }
                    v
                })
            }
        };
        outcome.unwrap_or_else(|e| error_result(kind, &e))
    }

    fn init(&mut self, cmd: &Value) -> Outcome {
        let url = s(cmd, "serverUrl").ok_or_else(|| Error::InvalidArgument("serverUrl".into()))?;
        let (h, q) = (self.current.clone(), self.current.clone());
        let client = Client::builder(url)
            .header_provider(move |headers| {
                if let Ok(cur) = h.lock() {
                    for (k, v) in &cur.headers {
                        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v))
                        {
                            headers.insert(name, value);
                        }
                    }
                }
            })
            .query_provider(move |params| {
                if let Ok(cur) = q.lock() {
                    params.extend(cur.params.iter().cloned());
                }
            })
            .build()?;
        self.client = Some(client);
        self.content_types.clear();
        self.producers.clear();
        self.dyn_headers.clear();
        self.dyn_params.clear();
        Ok(json!({
            "type": "init", "success": true, "clientName": "oncelog-client", "clientVersion": env!("CARGO_PKG_VERSION"),
            "features": {
                "batching": true, "sse": true, "longPoll": true, "auto": true, "streaming": true,
                "dynamicHeaders": true, "retryOptions": true, "batchItems": true, "strictZeroValidation": true
            }
        }))
    }

    fn set_dynamic(&mut self, kind: &str, cmd: &Value) -> Outcome {
        let name = s(cmd, "name").unwrap_or("").to_owned();
        let value = match s(cmd, "valueType") {
            Some("counter") => Dynamic::Counter(0),
            Some("timestamp") => Dynamic::Timestamp,
            _ => Dynamic::Token(s(cmd, "initialValue").unwrap_or("").to_owned()),
        };
        let list = if kind == "set-dynamic-header" { &mut self.dyn_headers } else { &mut self.dyn_params };
        list.retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
        list.push((name, value));
        Ok(json!({ "type": kind, "success": true }))
    }

    /// Computes this command's dynamic values once (as the reference adapter does) and hands
    /// them to the client's providers; returns them for `headersSent` / `paramsSent`.
    fn begin_command(&mut self) -> (Map<String, Value>, Map<String, Value>) {
        let mut cur = Current::default();
        let (mut hs, mut ps) = (Map::new(), Map::new());
        for (name, d) in &mut self.dyn_headers {
            let v = d.next();
            hs.insert(name.clone(), json!(v));
            cur.headers.push((name.clone(), v));
        }
        for (name, d) in &mut self.dyn_params {
            let v = d.next();
            ps.insert(name.clone(), json!(v));
            cur.params.push((name.clone(), v));
        }
        if let Ok(mut g) = self.current.lock() {
            *g = cur;
        }
        (hs, ps)
    }

    fn content_type(&self, path: &str) -> String {
        self.content_types.get(path).cloned().unwrap_or_else(|| "application/octet-stream".into())
    }

    async fn create(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Outcome {
        let ct = s(cmd, "contentType").unwrap_or("application/octet-stream").to_owned();
        let opts = CreateOptions {
            content_type: Some(ct.clone()),
            ttl_seconds: cmd.get("ttlSeconds").and_then(Value::as_u64),
            expires_at: s(cmd, "expiresAt").map(str::to_owned),
            closed: cmd.get("closed").and_then(Value::as_bool).unwrap_or(false),
            body: Bytes::from(s(cmd, "data").unwrap_or("").to_owned()),
            headers: headers_of(cmd)?,
            ..CreateOptions::default()
        };
        let created = stream.create(opts).await?;
        self.content_types.insert(path.to_owned(), ct);
        Ok(
            json!({ "type": "create", "success": true, "status": if created.created { 201 } else { 200 }, "offset": created.next_offset.as_str() }),
        )
    }

    async fn connect(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Outcome {
        let info = stream.head_with_headers(headers_of(cmd)?).await?;
        self.content_types.insert(path.to_owned(), info.content_type);
        Ok(json!({ "type": "connect", "success": true, "status": 200, "offset": info.next_offset.as_str() }))
    }

    async fn append(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Outcome {
        let data = s(cmd, "data").unwrap_or("");
        let body = if cmd.get("binary").and_then(Value::as_bool).unwrap_or(false) {
            Bytes::from(
                base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|e| Error::InvalidArgument(format!("binary data: {e}")))?,
            )
        } else {
            Bytes::from(data.to_owned())
        };
        let opts = AppendOptions {
            content_type: Some(self.content_type(path)),
            stream_seq: cmd
                .get("seq")
                .and_then(|v| v.as_i64().map(|n| n.to_string()).or_else(|| v.as_str().map(str::to_owned))),
            headers: headers_of(cmd)?,
            if_match: None,
            expected_offset: None,
            idempotency_key: None,
            // The client's default: an automatic Idempotency-Key, so the append is retried
            // after 5xx and network errors (a server that ignores the key simply takes the retry).
            auto_idempotency_key: None,
        };
        let appended = stream.append(body, opts).await?;
        Ok(json!({ "type": "append", "success": true, "status": 200, "offset": appended.next_offset.as_str() }))
    }

    async fn head(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Outcome {
        let info = stream.head_with_headers(headers_of(cmd)?).await?;
        self.content_types.insert(path.to_owned(), info.content_type.clone());
        let mut v = json!({
            "type": "head", "success": true, "status": 200, "offset": info.next_offset.as_str(),
            "contentType": info.content_type, "streamClosed": info.closed
        });
        if let Some(ttl) = info.ttl_seconds {
            v["ttlSeconds"] = json!(ttl);
        }
        if let Some(at) = info.expires_at {
            v["expiresAt"] = json!(at);
        }
        Ok(v)
    }

    async fn delete(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Outcome {
        stream.delete_with_headers(headers_of(cmd)?).await?;
        self.content_types.remove(path);
        Ok(json!({ "type": "delete", "success": true, "status": 200 }))
    }

    async fn close(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Outcome {
        let final_offset = match s(cmd, "data") {
            Some(data) if !data.is_empty() => {
                let ct = s(cmd, "contentType").map(str::to_owned).unwrap_or_else(|| self.content_type(path));
                let opts = AppendOptions { content_type: Some(ct), ..AppendOptions::default() };
                stream.append_and_close(data.to_owned(), opts).await?.next_offset
            }
            _ => stream.close().await?,
        };
        Ok(json!({ "type": "close", "success": true, "finalOffset": final_offset.as_str() }))
    }

    async fn read(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Outcome {
        let live = match cmd.get("live") {
            Some(Value::String(m)) if m == "long-poll" => LiveMode::LongPoll,
            Some(Value::String(m)) if m == "sse" => LiveMode::Sse,
            Some(Value::Bool(true)) => LiveMode::Auto,
            _ => LiveMode::CatchUp,
        };
        let from = s(cmd, "offset").map(ReadFrom::parse).unwrap_or_default();
        let timeout = Duration::from_millis(cmd.get("timeoutMs").and_then(Value::as_u64).unwrap_or(5000));
        let max_chunks = cmd.get("maxChunks").and_then(Value::as_u64).unwrap_or(100) as usize;
        let wait_up_to_date = cmd.get("waitForUpToDate").and_then(Value::as_bool).unwrap_or(false);
        let json_stream = oncelog_protocol::content_type::is_json(&self.content_type(path));
        let mut opts = ReadOptions::new(from.clone(), live);
        opts.headers = headers_of(cmd)?;
        let stream = match self.content_types.get(path) {
            Some(ct) => stream.clone().with_content_type(ct.clone()),
            None => stream.clone(),
        };
        let mut chunks = stream.read(opts);
        let mut out: Vec<Chunk> = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut timed_out = false;
        loop {
            match tokio::time::timeout_at(deadline, chunks.next()).await {
                Err(_) => {
                    timed_out = true;
                    break;
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(e),
                Ok(Some(Ok(c))) => {
                    let up_to_date = c.up_to_date;
                    if !c.data.is_empty() {
                        out.push(c);
                    }
                    if live != LiveMode::CatchUp && (out.len() >= max_chunks || (wait_up_to_date && up_to_date)) {
                        break;
                    }
                }
            }
        }
        let status = chunks.status();
        let render = |c: &Chunk| {
            if json_stream || c.json {
                minify_json(&c.data)
            } else {
                String::from_utf8_lossy(&c.data).into_owned()
            }
        };
        let chunk_json: Vec<Value> = if live == LiveMode::CatchUp {
            // One chunk with everything, as a catch-up body.
            if out.is_empty() {
                vec![]
            } else if json_stream {
                let items: Vec<String> = out
                    .iter()
                    .map(&render)
                    .map(|a| a[1..a.len().saturating_sub(1)].to_owned())
                    .filter(|i| !i.is_empty())
                    .collect();
                vec![
                    json!({ "data": format!("[{}]", items.join(",")), "offset": status.offset.as_ref().map(|o| o.as_str().to_owned()) }),
                ]
            } else {
                let data: String = out.iter().map(&render).collect();
                vec![json!({ "data": data, "offset": status.offset.as_ref().map(|o| o.as_str().to_owned()) })]
            }
        } else {
            out.iter().map(|c| json!({ "data": render(c), "offset": c.next_offset.as_str() })).collect()
        };
        let offset = status.offset.map(|o| o.as_str().to_owned()).unwrap_or_else(|| from.as_query().to_owned());
        let mut v = json!({
            "type": "read", "success": true, "status": status.last_status.unwrap_or(200), "chunks": chunk_json, "offset": offset,
            "upToDate": status.up_to_date || timed_out, "streamClosed": status.closed
        });
        if let Some(c) = status.cursor {
            v["cursor"] = json!(c);
        }
        Ok(v)
    }

    async fn producer(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Result<Producer, Error> {
        let id = s(cmd, "producerId").unwrap_or("").to_owned();
        let epoch = cmd.get("epoch").and_then(Value::as_u64).unwrap_or(0);
        let key = (path.to_owned(), id.clone(), epoch);
        if let Some(p) = self.producers.get(&key) {
            return Ok(p.clone());
        }
        let p = stream
            .producer(id)
            .epoch(epoch)
            .auto_claim(cmd.get("autoClaim").and_then(Value::as_bool).unwrap_or(false))
            .content_type(self.content_type(path))
            .max_in_flight(1)
            .linger(Duration::ZERO)
            .start()
            .await?;
        self.producers.insert(key, p.clone());
        Ok(p)
    }

    async fn idempotent_append(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Outcome {
        let p = self.producer(stream, path, cmd).await?;
        let receipt = p.append(s(cmd, "data").unwrap_or("").to_owned()).await?;
        p.flush().await?;
        let ack = receipt.await?;
        Ok(json!({
            "type": "idempotent-append", "success": true, "status": 200, "offset": ack.next_offset.as_str(),
            "duplicate": ack.duplicate, "producerSeq": ack.seq
        }))
    }

    async fn idempotent_append_batch(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Outcome {
        let max_in_flight = cmd.get("maxInFlight").and_then(Value::as_u64).unwrap_or(1).max(1) as usize;
        let concurrent = max_in_flight > 1;
        let p = stream
            .producer(s(cmd, "producerId").unwrap_or("").to_owned())
            .epoch(cmd.get("epoch").and_then(Value::as_u64).unwrap_or(0))
            .auto_claim(cmd.get("autoClaim").and_then(Value::as_bool).unwrap_or(false))
            .content_type(self.content_type(path))
            .max_in_flight(max_in_flight)
            .linger(if concurrent { Duration::ZERO } else { Duration::from_secs(1) })
            .max_batch_bytes(if concurrent { 1 } else { 1 << 20 })
            .start()
            .await?;
        let items: Vec<String> = cmd
            .get("items")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let mut result = Ok(());
        for item in items {
            if let Err(e) = p.append(item).await {
                result = Err(e);
                break;
            }
        }
        let flushed = p.flush().await;
        let _ = p.close().await;
        result?;
        flushed?;
        Ok(json!({ "type": "idempotent-append-batch", "success": true, "status": 200 }))
    }

    async fn idempotent_close(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Outcome {
        let p = self.producer(stream, path, cmd).await?;
        let last = s(cmd, "data").map(|d| Bytes::from(d.to_owned()));
        let end = p.close_stream(last).await?;
        Ok(json!({ "type": "idempotent-close", "success": true, "status": 200, "finalOffset": end.as_str() }))
    }

    async fn idempotent_detach(&mut self, stream: &StreamHandle, path: &str, cmd: &Value) -> Outcome {
        let p = self.producer(stream, path, cmd).await?;
        p.close().await?;
        let epoch = cmd.get("epoch").and_then(Value::as_u64).unwrap_or(0);
        self.producers.remove(&(path.to_owned(), s(cmd, "producerId").unwrap_or("").to_owned(), epoch));
        Ok(json!({ "type": "idempotent-detach", "success": true, "status": 200 }))
    }

    fn validate(&self, cmd: &Value) -> Value {
        let t = cmd.get("target").cloned().unwrap_or(Value::Null);
        let int = |k: &str| t.get(k).and_then(Value::as_i64);
        let result = match s(&t, "target") {
            Some("retry-options") => (|| {
                if int("maxRetries").is_some_and(|n| n < 0) {
                    return Err(Error::InvalidArgument("maxRetries must not be negative".into()));
                }
                let initial = int("initialDelayMs").unwrap_or(100);
                if initial <= 0 {
                    return Err(Error::InvalidArgument("initialDelayMs must be greater than zero".into()));
                }
                let max = int("maxDelayMs").unwrap_or(initial.max(5000));
                if max < 0 {
                    return Err(Error::InvalidArgument("maxDelayMs must not be negative".into()));
                }
                let multiplier = t.get("multiplier").and_then(Value::as_f64).unwrap_or(2.0);
                let policy = RetryPolicy::new(
                    Duration::from_millis(initial as u64),
                    Duration::from_millis(max as u64),
                    multiplier,
                )?;
                let retries = int("maxRetries").map(|n| u32::try_from(n.saturating_add(1)).unwrap_or(u32::MAX));
                policy.with_max_attempts(retries).map(|_| ())
            })(),
            Some("idempotent-producer") => (|| {
                if int("epoch").is_some_and(|n| n < 0) {
                    return Err(Error::InvalidArgument("epoch must not be negative".into()));
                }
                for k in ["maxBatchBytes", "maxBatchItems"] {
                    if int(k).is_some_and(|n| n < 0) {
                        return Err(Error::InvalidArgument(format!("{k} must be greater than zero")));
                    }
                }
                let client = self.client.clone().map_or_else(|| Client::new("http://127.0.0.1:1/"), Ok)?;
                let mut b =
                    client.stream("validate").producer(s(&t, "producerId").unwrap_or("test-producer").to_owned());
                if let Some(e) = int("epoch") {
                    b = b.epoch(e as u64);
                }
                if let Some(n) = int("maxBatchBytes") {
                    b = b.max_batch_bytes(n as usize);
                }
                if let Some(n) = int("maxBatchItems") {
                    b = b.max_batch_items(n as usize);
                }
                b.validate()
            })(),
            other => {
                return error_json("validate", None, "NOT_SUPPORTED", &format!("unknown validation target {other:?}"))
            }
        };
        match result {
            Ok(()) => json!({ "type": "validate", "success": true }),
            Err(e) => error_json("validate", None, "INVALID_ARGUMENT", &e.to_string()),
        }
    }
}
