#!/usr/bin/env bash
# Build the WebGPU worker of web/ (npm ci && npm run build), or say plainly why it is not built.
#
# usage: bash scripts/build-web.sh [WEB_DIR]      (default: web/ of this checkout)
#
# The npm registry is asked first (`npm ping`, no retries): a machine that cannot reach
# it gets a refusal at once, and then this script prints
#     web/ is not built: the npm registry cannot be reached
# and exits 0, so the rest of the set-up goes on; the web/ tests skip with that reason
# (tests/npm_registry.py asks the registry the same way).  Where the registry answers,
# any failure of `npm ci` or of the build fails this script, and a missing build fails
# the tests.  `npm_config_registry` chooses the registry, as for npm itself.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
web="${1:-$here/web}"

if [ ! -f "$web/package.json" ]; then
  echo "build-web: no package.json in $web: nothing to build"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "build-web: npm is not on PATH: install Node.js 20 with npm (Debian: apt-get install nodejs npm)" >&2
  exit 1
fi
registry="$(npm config get registry 2>/dev/null || echo '?')"
# --fetch-timeout bounds a registry that never answers (a dropped packet); a refusal is immediate.
if ! answer="$(cd "$web" && timeout 30 npm ping --fetch-retries=0 --fetch-timeout=15000 2>&1)"; then
  why="$(printf '%s\n' "$answer" | grep -m1 -E 'npm error (code|errno|network)' || true)"
  echo "install-toolchains: web/ is not built: the npm registry cannot be reached ($registry${why:+; $why})"
  exit 0
fi
echo "install-toolchains: npm ci && npm run build in $web (registry $registry answers)"
cd "$web"
npm ci --no-audit --no-fund
npm run build
