// Oncelog's real-browser test: headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core; no browser is ever downloaded) loads a page from a local static server on one
// origin and runs the official Durable Streams TypeScript client (@durable-streams/client, bundled
// by esbuild from page.mjs) against Oncelog servers on another origin, over TLS with HTTP/2.
//
// Usage: node browser/runner.mjs SERVER_BIN   (normally through browser/run)
// Environment: ONCELOG_TEST_CHROMIUM (default /usr/bin/chromium), BROWSER_VERBOSE=1 (server logs,
// browser console and the protocol log on stderr), BROWSER_CHROMIUM_ARGS (extra Chromium flags).
//
// Prints one line per check and "browser: N passed, N failed" last. Exit 0 only if every check
// passed; 1 if any failed; 2 if the test could not run (no Chromium, no server, ...): never skips.
// Everything it starts (servers, Chromium, the static server) and its temporary directory are
// cleaned up however it ends; every step has a time bound.
import { spawn, execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync, accessSync, constants, mkdirSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import { tmpdir } from "node:os";
import path from "node:path";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const serverBin = process.argv[2];
const chromiumPath = process.env.ONCELOG_TEST_CHROMIUM || "/usr/bin/chromium";
const verbose = !!process.env.BROWSER_VERBOSE;
// Extra Chromium flags, for experiments: BROWSER_CHROMIUM_ARGS=--disable-http2 shows check 1 fail
// over HTTP/1.1.
const extraArgs = (process.env.BROWSER_CHROMIUM_ARGS ?? "").split(/\s+/).filter(Boolean);
const started = Date.now();
// The whole run stops by itself after this, whatever hangs (browser/run adds an outer bound).
const DEADLINE_MS = 100_000;

const CHECKS = [
  ["1 20 live readers on one page at once all receive their message over HTTP/2", 30_000],
  ["2 IdempotentProducer writes 2,000 appends, read back exactly once", 30_000],
  ["3 native EventSource on a signed URL across SSE response ends receives each message once", 35_000],
  ["4 a 429 shows its Retry-After to the page", 20_000],
  ["5 a disallowed origin is blocked while the server stays healthy", 20_000],
];

const log = (...a) => console.error(...a);
const vlog = (...a) => verbose && console.error(...a);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

// ---- cleanup: every child process, the browser, the static server, the temp dir ----
let workdir = null;
const children = new Set();
let browserContext = null;
let staticServers = [];
let cleaning = null;

async function cleanup() {
  if (cleaning) return cleaning;
  cleaning = (async () => {
    if (browserContext) {
      await withTimeout(browserContext.close(), 10_000, "closing Chromium").catch((e) => log(`browser: ${e.message}`));
      browserContext = null;
    }
    for (const s of staticServers) {
      s.closeAllConnections?.();
      s.close();
    }
    staticServers = [];
    await Promise.all([...children].map((c) => stopChild(c)));
    if (workdir) {
      try {
        rmSync(workdir, { recursive: true, force: true });
      } catch (e) {
        log(`browser: could not remove ${workdir}: ${e.message}`);
      }
      workdir = null;
    }
  })();
  return cleaning;
}

/** SIGTERM, then SIGKILL after 5 s; resolves once the child has exited. */
async function stopChild(child) {
  if (child.exitCode === null && child.signalCode === null) {
    const exited = new Promise((r) => child.once("exit", r));
    child.kill("SIGTERM");
    const done = await Promise.race([exited.then(() => true), sleep(5000).then(() => false)]);
    if (!done) {
      child.kill("SIGKILL");
      await Promise.race([exited, sleep(2000)]);
    }
  }
  children.delete(child);
}

let exiting = false;
async function finish(code) {
  if (exiting) return;
  exiting = true;
  await cleanup();
  process.exit(code);
}
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(sig, () => {
    if (exiting) return;
    failAll(`stopped by ${sig}`);
  });
}
process.on("uncaughtException", (e) => {
  failAll(`uncaught exception: ${e.stack ?? e}`, "the runner failed (reason above)");
});
process.on("unhandledRejection", (e) => {
  failAll(`unhandled rejection: ${e?.stack ?? e}`, "the runner failed (reason above)");
});
// Last resort: if even cleanup hangs, the children still get SIGKILL from a synchronous exit hook.
process.on("exit", () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  if (workdir) rmSync(workdir, { recursive: true, force: true });
});
const deadline = setTimeout(() => {
  failAll(`the run exceeded ${DEADLINE_MS} ms, stopped`);
}, DEADLINE_MS);
deadline.unref();

// ---- helpers ----
function run(cmd, args, ms = 15_000) {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { timeout: ms, killSignal: "SIGKILL" }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${path.basename(cmd)} ${args[0]}: ${err.message.trim()}${stderr ? `\n${stderr.trim()}` : ""}`));
      else resolve(stdout.trim());
    });
  });
}

/** Starts `oncelog serve` and resolves with its base URL once it prints "oncelog listening on". */
function startServer(name, args) {
  const child = spawn(serverBin, ["serve", "--addr", "127.0.0.1:0", ...args], { stdio: ["ignore", "pipe", "pipe"] });
  children.add(child);
  let out = "";
  let errText = "";
  child.stderr.on("data", (d) => {
    errText += d;
    if (errText.length > 200_000) errText = errText.slice(-100_000);
  });
  const url = new Promise((resolve, reject) => {
    child.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/^oncelog listening on (\S+)/m);
      if (m) resolve(m[1].replace(/\/$/, ""));
    });
    child.on("error", (e) => reject(new Error(`server ${name}: ${e.message}`)));
    child.on("exit", (code, sig) => reject(new Error(`server ${name} exited (${sig ?? code}) before listening:\n${errText.slice(-2000)}`)));
  });
  return { child, url: withTimeout(url, 20_000, `server ${name} to start`), logs: () => errText };
}

/** GET over TLS from node (not the browser): the server's health independent of CORS. */
function nodeGet(url) {
  return new Promise((resolve, reject) => {
    const req = https.get(url, { rejectUnauthorized: false, timeout: 5000 }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode));
    });
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", reject);
  });
}

function startStatic(files) {
  const server = http.createServer((req, res) => {
    const body = files[new URL(req.url, "http://x").pathname];
    if (!body) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "content-type": body.type, "cache-control": "no-store" }).end(body.data);
  });
  staticServers.push(server);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve(`http://127.0.0.1:${server.address().port}`));
  });
}

// ---- results ----
const results = new Map();
let summarized = false;
let allPassedAtSummary = false;
function record(name, ok, detail) {
  if (summarized) return; // stopped early: what is still running reports nothing more
  results.set(name, { ok, detail });
  console.log(`${ok ? "PASS" : "FAIL"} ${name}: ${detail}`);
}
function printSummary() {
  if (summarized) return allPassedAtSummary;
  summarized = true;
  for (const [name] of CHECKS) if (!results.has(name)) record(name, false, "not run");
  const passed = [...results.values()].filter((r) => r.ok).length;
  console.log(`browser: took ${((Date.now() - started) / 1000).toFixed(1)} s`);
  console.log(`browser: ${passed} passed, ${results.size - passed} failed`);
  allPassedAtSummary = passed === results.size;
  return allPassedAtSummary;
}
/** Fails every check not yet run: `reason` (may be long) once on stderr, `short` on each line. */
function failAll(reason, short = reason.split("\n")[0]) {
  log(`browser: ${reason}`);
  for (const [name] of CHECKS) if (!results.has(name)) record(name, false, short);
  printSummary();
  return finish(2);
}

// ---- main ----
async function main() {
  if (!serverBin) {
    log("usage: browser/run SERVER_BIN");
    return finish(2);
  }
  try {
    accessSync(serverBin, constants.X_OK);
  } catch {
    return failAll(`the server binary ${serverBin} is missing or not executable`);
  }
  try {
    accessSync(chromiumPath, constants.X_OK);
  } catch {
    return failAll(`Chromium not found at ${chromiumPath}: install the Debian package 'chromium' (.ci/run does so as root)`);
  }
  workdir = mkdtempSync(path.join(tmpdir(), "oncelog-browser-"));
  const runId = randomBytes(4).toString("hex");

  // A throwaway certificate for 127.0.0.1 / localhost; the browser context ignores that it is
  // self-signed, the connection is still real TLS (and HTTP/2 by ALPN).
  const cert = path.join(workdir, "cert.pem");
  const key = path.join(workdir, "key.pem");
  await run("openssl", [
    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
  ]);
  const secret = path.join(workdir, "secret");
  writeFileSync(secret, randomBytes(32).toString("hex"));

  // The page: esbuild bundles page.mjs with the official client.
  const { build } = await import("esbuild");
  const bundle = await withTimeout(
    build({ entryPoints: [path.join(here, "page.mjs")], bundle: true, format: "esm", platform: "browser", target: "chrome120", write: false, logLevel: "silent" }),
    30_000,
    "bundling the page",
  );
  const files = {
    "/": { type: "text/html; charset=utf-8", data: '<!doctype html><meta charset="utf-8"><title>oncelog browser test</title><script type="module" src="/page.js"></script>' },
    "/page.js": { type: "text/javascript; charset=utf-8", data: bundle.outputFiles[0].contents },
  };
  // Two page origins: the allowed one and one that is not in --cors-origins.
  const allowedOrigin = await startStatic(files);
  const blockedOrigin = await startStatic(files);

  const common = ["--tls-cert", cert, "--tls-key", key, "--auth-secret-file", secret, "--cors-origins", allowedOrigin];
  mkdirSync(path.join(workdir, "home"));
  mkdirSync(path.join(workdir, "main"));
  mkdirSync(path.join(workdir, "limited"));
  const main = startServer("main", [...common, "--data-dir", path.join(workdir, "main"), "--sse-max-duration-ms", "1000"]);
  const limited = startServer("limited", [...common, "--data-dir", path.join(workdir, "limited"), "--append-rate-limit", "1"]);
  let base, limitedBase;
  try {
    [base, limitedBase] = await Promise.all([main.url, limited.url]);
  } catch (e) {
    return failAll(`an Oncelog server did not start: ${e.message}`);
  }
  if (!base.startsWith("https://")) return failAll(`the server did not start with TLS: ${base}`);
  const token = await run(serverBin, ["token", "issue", "--secret-file", secret, "--prefix", "browser/", "--ops", "all", "--expires-in", "1h"]);
  const esPath = `browser/${runId}/eventsource`;
  const signedUrl = await run(serverBin, ["token", "sign-url", "--secret-file", secret, `${base}/v1/stream/${esPath}?offset=-1&live=sse`, "--expires-in", "10m"]);
  log(`browser: servers ${base} (auth, CORS ${allowedOrigin}, SSE 1 s) and ${limitedBase} (1 append/s); page origins ${allowedOrigin} (allowed), ${blockedOrigin} (not allowed)`);

  // Chromium: Debian's, headless, fresh empty profile, no background networking.
  const { chromium } = await import("playwright-core");
  try {
    browserContext = await chromium.launchPersistentContext(path.join(workdir, "profile"), {
      executablePath: chromiumPath,
      headless: true,
      ignoreHTTPSErrors: true,
      timeout: 30_000,
      // Chromium's own files (crash database, caches, NSS store) go into the temporary
      // directory too, not into the user's home.
      env: { ...process.env, HOME: path.join(workdir, "home"), XDG_CONFIG_HOME: path.join(workdir, "home/.config"), XDG_CACHE_HOME: path.join(workdir, "home/.cache"), XDG_DATA_HOME: path.join(workdir, "home/.local/share") },
      args: [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        ...extraArgs,
      ],
    });
  } catch (e) {
    // Playwright's message, less the line listing every launch flag.
    const why = e.message.replace(/\x1b\[[0-9;]*m/g, "").split("\n").filter((l) => !l.includes("<launching>") && l.trim()).slice(0, 30).join("\n  ");
    return failAll(`Chromium (${chromiumPath}) could not start:\n  ${why}`, `Chromium (${chromiumPath}) could not start (reason above)`);
  }
  const version = browserContext.browser()?.version() ?? "?";
  log(`browser: Chromium ${version} (${chromiumPath})`);

  // Every request the pages make to the servers, from the DevTools protocol: method, protocol,
  // status, and the request headers actually sent (Last-Event-ID), preflights included.
  const wire = [];
  async function openPage(origin) {
    const page = browserContext.pages().find((p) => p.url() === "about:blank") ?? (await browserContext.newPage());
    page.on("console", (m) => vlog(`[page ${origin}] ${m.type()}: ${m.text()}`));
    page.on("pageerror", (e) => log(`[page ${origin}] error: ${e.message}`));
    const cdp = await browserContext.newCDPSession(page);
    const byId = new Map();
    const entry = (id) => {
      if (!byId.has(id)) {
        const e = { origin, id };
        byId.set(id, e);
        wire.push(e);
      }
      return byId.get(id);
    };
    // The headers actually sent come in a separate event, which may arrive before or after
    // requestWillBeSent.
    const extraHeaders = new Map();
    cdp.on("Network.requestWillBeSent", (ev) => {
      if (!ev.request.url.startsWith(base) && !ev.request.url.startsWith(limitedBase)) return;
      const e = Object.assign(entry(ev.requestId), { method: ev.request.method, url: ev.request.url, type: ev.type, at: Date.now() - started });
      if (extraHeaders.has(ev.requestId)) e.headers = extraHeaders.get(ev.requestId);
    });
    cdp.on("Network.requestWillBeSentExtraInfo", (ev) => {
      if (byId.has(ev.requestId)) entry(ev.requestId).headers = ev.headers;
      else extraHeaders.set(ev.requestId, ev.headers);
    });
    cdp.on("Network.responseReceived", (ev) => {
      if (byId.has(ev.requestId)) Object.assign(entry(ev.requestId), { status: ev.response.status, protocol: ev.response.protocol });
    });
    cdp.on("Network.loadingFinished", (ev) => {
      if (byId.has(ev.requestId)) entry(ev.requestId).done = Date.now() - started;
    });
    cdp.on("Network.loadingFailed", (ev) => {
      if (byId.has(ev.requestId)) {
        Object.assign(entry(ev.requestId), { done: Date.now() - started, failed: ev.errorText, cors: ev.corsErrorStatus?.corsError });
      }
    });
    await cdp.send("Network.enable");
    await withTimeout(page.goto(`${origin}/`), 15_000, `loading the page from ${origin}`);
    await withTimeout(page.waitForFunction(() => window.checksReady === true, null, { timeout: 10_000 }), 12_000, "the page's script");
    return page;
  }
  let page, blockedPage;
  try {
    page = await openPage(allowedOrigin);
    blockedPage = await openPage(blockedOrigin);
  } catch (e) {
    return failAll(`the test page did not load: ${e.message}`);
  }

  const call = async (p, name, args, ms) => {
    try {
      return await withTimeout(
        p.evaluate(([n, a]) => window.checks[n](a), [name, args]),
        ms,
        name,
      );
    } catch (e) {
      return { ok: false, detail: e.message.split("\n")[0] };
    }
  };
  const health = async () => {
    const codes = await Promise.all([base, limitedBase].map((b) => nodeGet(`${b}/healthz`).catch((e) => e.message)));
    return codes;
  };

  // 1
  {
    const [name, ms] = CHECKS[0];
    const r = await call(page, "liveReaders", { base, token, run: runId }, ms);
    // The protocol each response came over, from DevTools (authoritative, and visible even where
    // Resource Timing hides it from the page), and how many reads were open at once.
    const live = wire.filter((w) => w.url?.includes(`/browser/${runId}/live-`) && w.method !== "OPTIONS");
    const protos = [...new Set(live.map((w) => w.protocol).filter(Boolean))];
    const h2 = protos.length === 1 && protos[0] === "h2";
    const reads = live.filter((w) => w.method === "GET" && w.at !== undefined && /[?&]live=/.test(w.url));
    let maxOpen = 0;
    for (const w of reads) {
      const open = reads.filter((o) => o.at <= w.at && (o.done === undefined || o.done > w.at)).length;
      maxOpen = Math.max(maxOpen, open);
    }
    const ok = r.ok && h2 && maxOpen >= 20;
    record(
      name,
      ok,
      `${r.detail}; DevTools: protocols ${JSON.stringify(protos)}${h2 ? "" : " (expected only h2)"}, ` +
        `${maxOpen} live reads open at once${maxOpen >= 20 ? "" : " (expected 20)"}`,
    );
  }
  // 2
  {
    const [name, ms] = CHECKS[1];
    const r = await call(page, "producer", { base, token, run: runId }, ms);
    const posts = wire.filter((w) => w.url === `${base}/v1/stream/browser/${runId}/producer` && w.method === "POST");
    record(name, r.ok, `${r.detail}; wire: the producer sent them in ${posts.length} POSTs (${[...new Set(posts.map((w) => w.protocol))].join(",")})`);
  }
  // 3
  {
    const [name, ms] = CHECKS[2];
    const r = await call(page, "eventSource", { base, token, path: esPath, signedUrl }, ms);
    const gets = wire.filter((w) => w.url?.startsWith(`${base}/v1/stream/${esPath}?`) && w.method === "GET");
    const preflights = wire.filter((w) => w.url?.startsWith(`${base}/v1/stream/${esPath}?`) && (w.method === "OPTIONS" || w.type === "Preflight"));
    const withId = gets.filter((w) => w.headers && Object.keys(w.headers).some((h) => h.toLowerCase() === "last-event-id"));
    const ids = withId.map((w) => Object.entries(w.headers).find(([h]) => h.toLowerCase() === "last-event-id")[1]);
    const protos = [...new Set(gets.map((w) => w.protocol).filter(Boolean))];
    record(
      name,
      r.ok,
      `${r.detail}; wire: ${gets.length} EventSource GETs (${JSON.stringify(protos)}), ${withId.length} with Last-Event-ID${ids.length ? ` ${JSON.stringify(ids.slice(0, 4))}` : ""}, ${preflights.length} preflights`,
    );
  }
  // 4
  {
    const [name, ms] = CHECKS[3];
    const r = await call(page, "retryAfter", { base: limitedBase, token, run: runId }, ms);
    const posts = wire.filter((w) => w.url?.startsWith(`${limitedBase}/v1/stream/browser/${runId}/rate`) && w.method === "POST");
    const limitedCount = posts.filter((w) => w.status === 429).length;
    record(name, r.ok, `${r.detail}; wire: ${posts.length} POSTs in all, ${limitedCount} answered 429`);
  }
  // 5
  {
    const [name, ms] = CHECKS[4];
    const blocked = await call(blockedPage, "blockedFetches", { base, token, path: esPath }, ms);
    const after = await call(page, "healthyAfter", { base, token, run: runId }, ms);
    const nodeHealth = await health();
    const ok = blocked.ok && after.ok && nodeHealth.every((c) => c === 200);
    record(name, ok, `from ${blockedOrigin}: ${blocked.detail}; afterwards from ${allowedOrigin}: ${after.detail}; /healthz from outside the browser: ${nodeHealth.join(", ")}`);
  }

  if (summarized) return; // stopped meanwhile (signal or deadline): already reported
  if (verbose) {
    log("---- protocol log (DevTools) ----");
    for (const w of wire) {
      const lei = w.headers && Object.entries(w.headers).find(([h]) => h.toLowerCase() === "last-event-id");
      log(`${w.at}ms ${w.origin} ${w.method} ${w.url} -> ${w.status ?? "-"} ${w.protocol ?? ""}${w.type ? ` [${w.type}]` : ""}${lei ? ` Last-Event-ID: ${lei[1]}` : ""}${w.failed ? ` FAILED ${w.failed} ${w.cors ?? ""}` : ""}`);
    }
  }
  const serversAlive = [main, limited].every((s) => s.child.exitCode === null && s.child.signalCode === null);
  if (!serversAlive) log("browser: an Oncelog server exited during the run");
  const failed = [...results.values()].some((r) => !r.ok);
  if (failed || verbose) {
    for (const [n, s] of [["main", main], ["limited", limited]]) {
      const tail = s.logs().trim().split("\n").slice(-15).join("\n");
      if (tail) log(`---- server ${n} stderr (last lines) ----\n${tail}`);
    }
  }
  const allPassed = printSummary();
  return finish(allPassed && serversAlive ? 0 : 1);
}

main().catch((e) => failAll(`the test could not run: ${e.stack ?? e.message ?? e}`));
