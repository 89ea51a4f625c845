// The test page's code, bundled by esbuild (browser/runner.mjs) with the official Durable Streams
// client and served from an origin other than the Oncelog server's, so every request to the server
// is cross-origin. Each check is a function on `window.checks` that the runner calls through
// Playwright; it returns { ok, detail, ...facts } and never waits without a bound.
import { DurableStream, IdempotentProducer, stream } from "@durable-streams/client";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Rejects with `what` if `promise` has not settled within `ms`. */
function within(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

/** Polls `cond` every 20 ms until it holds (true) or `ms` have passed (false). */
async function until(cond, ms) {
  const end = performance.now() + ms;
  while (!cond()) {
    if (performance.now() > end) return false;
    await sleep(20);
  }
  return true;
}

const auth = (token) => ({ Authorization: `Bearer ${token}` });
const streamUrl = (base, path) => `${base}/v1/stream/${path}`;
const describe = (e) => `${e?.name ?? "Error"}: ${e?.message ?? e}`;

/** Fetch with an abort deadline. */
async function fetchWithin(url, init, ms) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), ms);
  try {
    return await fetch(url, { ...init, signal: ctl.signal });
  } finally {
    clearTimeout(timer);
  }
}

/** The protocols of the page's finished requests to `base` (Resource Timing). */
function protocolsTo(base) {
  const seen = {};
  for (const e of performance.getEntriesByType("resource")) {
    if (!e.name.startsWith(base)) continue;
    const p = e.nextHopProtocol || "(empty)";
    seen[p] = (seen[p] ?? 0) + 1;
  }
  return seen;
}

// 1. Many live readers on one page at once: over HTTP/1.1 a browser opens at most 6
// connections per host, so 20 waiting reads would leave nothing for the appends (or for the
// readers beyond the 6th). Half use the client's long-poll mode, half its SSE mode.
async function liveReaders({ base, token, run, n = 20, deliverMs = 10000 }) {
  performance.clearResourceTimings();
  performance.setResourceTimingBufferSize(10000);
  const paths = Array.from({ length: n }, (_, i) => `browser/${run}/live-${i}`);
  const handles = await within(
    Promise.all(paths.map((p) => DurableStream.create({ url: streamUrl(base, p), headers: auth(token), contentType: "application/json" }))),
    10000,
    "creating the streams",
  );
  const got = new Array(n).fill(null);
  const extra = new Array(n).fill(0);
  const readers = [];
  const errors = [];
  try {
    const modes = paths.map((_, i) => (i % 2 === 0 ? "long-poll" : "sse"));
    const responses = await within(
      Promise.all(
        paths.map((p, i) =>
          stream({
            url: streamUrl(base, p),
            headers: auth(token),
            offset: "-1",
            live: modes[i],
            onError: (e) => {
              errors.push(`reader ${i}: ${describe(e)}`);
            },
          }),
        ),
      ),
      10000,
      "starting the live readers",
    );
    readers.push(...responses);
    let t0 = 0;
    responses.forEach((res, i) =>
      res.subscribeJson(async (batch) => {
        for (const item of batch.items) {
          if (item?.reader === i && got[i] === null) got[i] = performance.now() - t0;
          else extra[i]++;
        }
      }),
    );
    // Let every reader reach the tail and park its live request on the server.
    await sleep(1500);
    t0 = performance.now();
    await within(
      Promise.all(handles.map((h, i) => h.append(JSON.stringify({ reader: i })))),
      deliverMs,
      "the appends (over HTTP/1.1 they would queue behind the waiting readers)",
    );
    const all = await until(() => got.every((t) => t !== null), deliverMs);
    const missing = got.flatMap((t, i) => (t === null ? [`${i} (${modes[i]})`] : []));
    const latencies = got.filter((t) => t !== null);
    const maxMs = latencies.length ? Math.round(Math.max(...latencies)) : null;
    // Resource Timing hides nextHopProtocol ("") from a cross-origin page unless the server sends
    // Timing-Allow-Origin; the runner asserts h2 from the DevTools protocol instead.
    const protocols = protocolsTo(base);
    const unexpected = extra.reduce((a, b) => a + b, 0);
    const ok = all && unexpected === 0;
    const detail = [
      `${n - missing.length}/${n} readers got their message within ${deliverMs} ms (slowest ${maxMs} ms after the appends started)`,
      missing.length ? `missing: ${missing.join(", ")}` : null,
      unexpected ? `${unexpected} unexpected items` : null,
      `page's nextHopProtocol of finished requests: ${JSON.stringify(protocols)}`,
      errors.length ? `client errors: ${errors.slice(0, 3).join("; ")}` : null,
    ]
      .filter(Boolean)
      .join("; ");
    return { ok, detail };
  } finally {
    for (const r of readers) r.cancel("test over");
  }
}

// 2. The official IdempotentProducer writes 2,000 JSON messages; reading back must give each
// exactly once, in order.
async function producer({ base, token, run, count = 2000 }) {
  const url = streamUrl(base, `browser/${run}/producer`);
  const handle = await within(
    DurableStream.create({ url, headers: auth(token), contentType: "application/json" }),
    10000,
    "creating the stream",
  );
  const errors = [];
  // Small batches, so that the 2,000 appends travel in dozens of pipelined POSTs (up to 5 in
  // flight, the client's default) rather than in one request.
  const p = new IdempotentProducer(handle, `browser-producer-${run}`, {
    maxBatchBytes: 512,
    onError: (e) => errors.push(describe(e)),
  });
  const t0 = performance.now();
  for (let i = 0; i < count; i++) p.append(JSON.stringify({ i }));
  await within(p.flush(), 20000, "producer.flush()");
  await within(p.detach(), 5000, "producer.detach()");
  const writeMs = Math.round(performance.now() - t0);
  const res = await within(stream({ url, headers: auth(token), offset: "-1", live: false }), 10000, "starting the read-back");
  const items = await within(res.json(), 10000, "reading back");
  const seen = new Map();
  let outOfOrder = 0;
  items.forEach((item, k) => {
    seen.set(item?.i, (seen.get(item?.i) ?? 0) + 1);
    if (item?.i !== k) outOfOrder++;
  });
  let missing = 0;
  let duplicated = 0;
  for (let i = 0; i < count; i++) {
    const c = seen.get(i) ?? 0;
    if (c === 0) missing++;
    if (c > 1) duplicated++;
  }
  const ok = errors.length === 0 && items.length === count && missing === 0 && duplicated === 0 && outOfOrder === 0;
  const detail =
    `wrote ${count} in ${writeMs} ms, read back ${items.length}: ${missing} missing, ${duplicated} duplicated, ` +
    `${outOfOrder} out of place` +
    (errors.length ? `; producer errors: ${errors.slice(0, 3).join("; ")}` : "");
  return { ok, detail };
}

// 3. A native EventSource on a signed read URL (offset=-1) while the server ends each SSE
// response after a short time: the browser reconnects by itself, with the same URL plus
// Last-Event-ID (if the server sent ids). Every message must arrive exactly once.
async function eventSource({ base, token, path, signedUrl, messages = 16, intervalMs = 550, minReconnects = 2, settleMs = 1500, boundMs = 25000 }) {
  const url = streamUrl(base, path);
  const created = await fetchWithin(url, { method: "PUT", headers: { ...auth(token), "Content-Type": "application/json" } }, 10000);
  if (!created.ok) return { ok: false, detail: `creating the stream: HTTP ${created.status}` };
  const received = [];
  let opens = 0;
  let errors = 0;
  let controls = 0;
  let lastOpenAt = 0;
  const t0 = performance.now();
  const es = new EventSource(signedUrl);
  try {
    es.addEventListener("open", () => {
      opens++;
      lastOpenAt = performance.now();
    });
    es.addEventListener("error", () => errors++);
    es.addEventListener("control", () => controls++);
    es.addEventListener("data", (e) => {
      try {
        const batch = JSON.parse(e.data);
        for (const m of Array.isArray(batch) ? batch : [batch]) received.push(m?.n);
      } catch (err) {
        received.push(`unparsable: ${String(e.data).slice(0, 40)}`);
      }
    });
    if (!(await until(() => opens >= 1, 10000))) {
      return { ok: false, detail: `the EventSource never opened (readyState ${es.readyState}, ${errors} error events)` };
    }
    let appendErrors = 0;
    for (let n = 0; n < messages; n++) {
      const r = await fetchWithin(
        url,
        { method: "POST", headers: { ...auth(token), "Content-Type": "application/json" }, body: JSON.stringify({ n }) },
        5000,
      ).catch(() => null);
      if (!r?.ok) appendErrors++;
      await sleep(intervalMs);
    }
    const lastAppendAt = performance.now();
    // Keep listening until the browser has reconnected often enough and once more after the last
    // append (a reconnect is where a replay would show), then a little longer; all bounded.
    await until(
      () => opens >= minReconnects + 1 && lastOpenAt > lastAppendAt && performance.now() - lastOpenAt > settleMs,
      Math.max(0, boundMs - (performance.now() - t0)),
    );
    const counts = new Map();
    for (const n of received) counts.set(n, (counts.get(n) ?? 0) + 1);
    const missing = [];
    const duplicated = [];
    for (let n = 0; n < messages; n++) {
      const c = counts.get(n) ?? 0;
      if (c === 0) missing.push(n);
      if (c > 1) duplicated.push(`${n}x${c}`);
    }
    const foreign = received.filter((n) => !(Number.isInteger(n) && n >= 0 && n < messages));
    const reconnects = Math.max(0, opens - 1);
    const ok = appendErrors === 0 && missing.length === 0 && duplicated.length === 0 && foreign.length === 0 && reconnects >= minReconnects;
    const detail = [
      `${messages} messages appended over ${Math.round(lastAppendAt - t0)} ms, ${received.length} received`,
      `${reconnects} reconnects (${errors} error events, ${controls} control events)`,
      duplicated.length ? `duplicated: ${duplicated.join(" ")}` : "no duplicates",
      missing.length ? `missing: ${missing.join(" ")}` : null,
      foreign.length ? `unexpected: ${foreign.slice(0, 5).join(" ")}` : null,
      appendErrors ? `${appendErrors} appends failed` : null,
      reconnects < minReconnects ? `expected at least ${minReconnects} reconnects` : null,
    ]
      .filter(Boolean)
      .join("; ");
    return { ok, detail };
  } finally {
    es.close();
  }
}

// 4. A 429 from the rate limiter must show its Retry-After to the page (only if the server
// lists it in Access-Control-Expose-Headers). Also notes what the official client does on 429.
async function retryAfter({ base, token, run, attempts = 10 }) {
  const url = streamUrl(base, `browser/${run}/rate`);
  const created = await fetchWithin(url, { method: "PUT", headers: { ...auth(token), "Content-Type": "application/json" } }, 10000);
  if (!created.ok) return { ok: false, detail: `creating the stream: HTTP ${created.status}` };
  let limited = null;
  const statuses = [];
  for (let k = 0; k < attempts && !limited; k++) {
    const r = await fetchWithin(url, { method: "POST", headers: { ...auth(token), "Content-Type": "application/json" }, body: JSON.stringify({ k }) }, 5000);
    statuses.push(r.status);
    if (r.status === 429) limited = r;
  }
  if (!limited) return { ok: false, detail: `no 429 in ${attempts} quick appends (statuses ${statuses.join(",")})` };
  const shown = limited.headers.get("retry-after");
  // Informational: the official client on a 429 (it retries 429s with backoff, waiting at least
  // Retry-After when it can read it).
  let client;
  const handle = new DurableStream({ url, headers: auth(token), contentType: "application/json", batching: false });
  const t0 = performance.now();
  try {
    await within(handle.append(JSON.stringify({ client: true })), 8000, "the client's append");
    client = `official client's append after the 429 succeeded after ${Math.round(performance.now() - t0)} ms`;
  } catch (e) {
    client = `official client's append after the 429: ${describe(e)} after ${Math.round(performance.now() - t0)} ms`;
  }
  const ok = shown !== null;
  const detail =
    `got 429 after ${statuses.length} appends (statuses ${statuses.join(",")}); ` +
    `response.headers.get('retry-after') = ${JSON.stringify(shown)}` +
    (ok ? "" : " (the server does not list it in Access-Control-Expose-Headers)") +
    `; ${client}`;
  return { ok, detail };
}

// 5a. From an origin not in --cors-origins: both a preflighted request (with Authorization) and a
// simple one must be refused by the browser's CORS check (TypeError).
async function blockedFetches({ base, token, path }) {
  const outcomes = [];
  const tries = [
    ["preflighted GET with Authorization", streamUrl(base, `${path}?offset=-1`), { headers: auth(token) }],
    ["simple GET /healthz", `${base}/healthz`, {}],
  ];
  let ok = true;
  for (const [what, url, init] of tries) {
    try {
      const r = await fetchWithin(url, init, 10000);
      ok = false;
      outcomes.push(`${what}: NOT blocked (HTTP ${r.status})`);
    } catch (e) {
      const blocked = e instanceof TypeError;
      ok &&= blocked;
      outcomes.push(`${what}: ${blocked ? "blocked" : "unexpected"} (${describe(e)})`);
    }
  }
  return { ok, detail: outcomes.join("; ") };
}

// 5b. From the allowed origin, afterwards: the server is healthy and serves a normal read.
async function healthyAfter({ base, token, run }) {
  const health = await fetchWithin(`${base}/healthz`, {}, 10000);
  const url = streamUrl(base, `browser/${run}/after-blocked`);
  const handle = await within(DurableStream.create({ url, headers: auth(token), contentType: "application/json" }), 10000, "creating a stream");
  await within(handle.append(JSON.stringify({ still: "fine" })), 10000, "appending");
  const res = await within(stream({ url, headers: auth(token), offset: "-1", live: false }), 10000, "reading");
  const items = await within(res.json(), 10000, "reading");
  const ok = health.status === 200 && items.length === 1 && items[0]?.still === "fine";
  return { ok, detail: `/healthz ${health.status}; normal read returned ${JSON.stringify(items)}` };
}

// Every check reports instead of throwing, so the runner can name what failed.
const guard =
  (fn) =>
  async (...args) => {
    try {
      return await fn(...args);
    } catch (e) {
      return { ok: false, detail: `threw ${describe(e)}` };
    }
  };

window.checks = {
  liveReaders: guard(liveReaders),
  producer: guard(producer),
  eventSource: guard(eventSource),
  retryAfter: guard(retryAfter),
  blockedFetches: guard(blockedFetches),
  healthyAfter: guard(healthyAfter),
};
window.checksReady = true;
