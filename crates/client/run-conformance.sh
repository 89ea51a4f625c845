#!/usr/bin/env bash
# Runs the official Durable Streams *client* conformance suite against this client, through the
# adapter binary `oncelog-client-conformance` (crates/client/src/bin/).
#
# The suite is not published on npm, so it is built from the upstream repository at a pinned
# commit, outside this repository (default /tmp/durable-streams-client-conformance). It starts its
# own reference server; the adapter talks to it over loopback.
#
# Usage: crates/client/run-conformance.sh [extra suite flags, e.g. --suite producer --verbose]
# Environment: CONFORMANCE_DIR (where the suite is built), DS_REPO (required: a local clone or
#              bare mirror of the public durable-streams/durable-streams repository).
# Needs: git, node >= 20, npm, cargo.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
commit=82f9963ae0b489566352393be9b4796c788c99c2
dir="${CONFORMANCE_DIR:-/tmp/durable-streams-client-conformance}"
pkg="$dir/packages/client-conformance-tests"

if [[ ! -d "$pkg/node_modules/@durable-streams/server" ]]; then
  rm -rf "$dir" && mkdir -p "$dir"
  repo="${DS_REPO:?set DS_REPO to a local clone or mirror of durable-streams/durable-streams}"
  git -C "$repo" archive "$commit" packages/client-conformance-tests | tar -x -C "$dir"
  # The package depends on its monorepo siblings; use their published releases instead.
  node -e '
    const fs = require("fs"); const p = process.argv[1]; const d = JSON.parse(fs.readFileSync(p, "utf8"));
    d.dependencies["@durable-streams/client"] = "0.2.7"; d.dependencies["@durable-streams/server"] = "0.3.7";
    d.devDependencies = {}; fs.writeFileSync(p, JSON.stringify(d, null, 2));
  ' "$pkg/package.json"
  (cd "$pkg" && npm install --no-audit --no-fund --loglevel=error)
fi

cargo build --manifest-path "$root/Cargo.toml" -p oncelog-client --bin oncelog-client-conformance
cd "$pkg"
exec npx tsx src/cli.ts --run "$root/target/debug/oncelog-client-conformance" "$@"
