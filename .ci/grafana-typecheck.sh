#!/usr/bin/env bash
# npm ci in deploy/grafana/typecheck (@grafana/schema and TypeScript, pinned by its package-lock.json)
# for the dashboard type-check test; again only when the lock changed.
# Without npm: a note (the test skips naming `make system-tools`), an error under CI=true.
set -euo pipefail
cd "$(dirname "$0")/../deploy/grafana/typecheck"
stamp=node_modules/.installed-$(sha256sum package-lock.json | cut -c1-12)
[ -f "$stamp" ] && [ -x node_modules/.bin/tsc ] && exit 0
if ! command -v npm >/dev/null 2>&1; then
  case "${CI:-}" in
    1|true|TRUE|True|yes)
      echo "error: npm not found (make system-tools installs it as root); the dashboard type-check needs it" >&2
      exit 1 ;;
  esac
  echo "note: npm not found; the dashboard type-check test skips (make system-tools installs npm as root)" >&2
  exit 0
fi
echo "==> npm ci in deploy/grafana/typecheck (@grafana/schema, typescript)"
npm ci --no-audit --no-fund --loglevel=error
rm -f node_modules/.installed-*
touch "$stamp"
