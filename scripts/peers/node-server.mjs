#!/usr/bin/env node
// Starts the reference Node server (npm @durable-streams/server) with file-backed storage, for
// scripts/bench-peers. Our own launcher: the package only exports a class, no CLI.
//
//   node scripts/peers/node-server.mjs --prefix DIR --data-dir DIR [--host 127.0.0.1]
//        [--port 0] [--long-poll-timeout-ms 30000]
//
// --prefix is the `npm install --prefix` directory holding node_modules/@durable-streams/server.
// Prints one line `node-server listening on http://HOST:PORT` on stdout once it accepts
// connections. SIGTERM / SIGINT stop it through the server's own stop(); SIGKILL is what the
// recovery benchmarks use.

import path from "node:path"
import process from "node:process"
import { pathToFileURL } from "node:url"

function parseArgs(argv) {
  const opts = {
    prefix: null,
    dataDir: null,
    host: "127.0.0.1",
    port: 0,
    longPollTimeoutMs: 30000,
  }
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i]
    const value = argv[i + 1]
    if (value === undefined) {
      throw new Error(`${flag} needs a value`)
    }
    switch (flag) {
      case "--prefix":
        opts.prefix = value
        break
      case "--data-dir":
        opts.dataDir = value
        break
      case "--host":
        opts.host = value
        break
      case "--port":
        opts.port = Number.parseInt(value, 10)
        break
      case "--long-poll-timeout-ms":
        opts.longPollTimeoutMs = Number.parseInt(value, 10)
        break
      default:
        throw new Error(`unknown argument ${flag}`)
    }
    i++
  }
  if (!opts.prefix || !opts.dataDir) {
    throw new Error("--prefix and --data-dir are required")
  }
  if (!Number.isInteger(opts.port) || opts.port < 0 || opts.port > 65535) {
    throw new Error("--port must be an integer in 0..65535")
  }
  if (!Number.isInteger(opts.longPollTimeoutMs) || opts.longPollTimeoutMs <= 0) {
    throw new Error("--long-poll-timeout-ms must be a positive integer")
  }
  return opts
}

async function main() {
  const opts = parseArgs(process.argv.slice(2))
  const entry = path.resolve(
    opts.prefix,
    "node_modules/@durable-streams/server/dist/index.js"
  )
  const { DurableStreamTestServer } = await import(pathToFileURL(entry).href)
  const server = new DurableStreamTestServer({
    host: opts.host,
    port: opts.port,
    // A data directory selects the file-backed store (log file per stream + LMDB metadata).
    dataDir: path.resolve(opts.dataDir),
    longPollTimeout: opts.longPollTimeoutMs,
  })
  const url = await server.start()
  process.stdout.write(`node-server listening on ${url}\n`)

  let stopping = false
  const stop = async (signal) => {
    if (stopping) return
    stopping = true
    process.stderr.write(`node-server: ${signal}, stopping\n`)
    // Live readers (SSE, long-poll) can hold stop() open; do not wait for them forever.
    const force = setTimeout(() => process.exit(0), 3000)
    force.unref()
    try {
      await server.stop()
    } finally {
      process.exit(0)
    }
  }
  process.on("SIGTERM", () => void stop("SIGTERM"))
  process.on("SIGINT", () => void stop("SIGINT"))
}

main().catch((err) => {
  process.stderr.write(`node-server: ${err?.stack ?? err}\n`)
  process.exit(1)
})
