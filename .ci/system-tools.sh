#!/usr/bin/env bash
# Install the Debian packages some tests use, when we can (root) and they are missing.
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# npm: installs @grafana/schema + typescript (deploy/grafana/typecheck) to type-check the dashboard.
command -v npm >/dev/null 2>&1 || need+=(npm)
# chromium: headless rendering of the demo report (tests/e2e/test_demo_report_chromium.py).
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
# postgresql: a throwaway server for the shared prediction store's tests (tests/support/postgres.py).
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1 || need+=(postgresql)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  case "${CI:-}" in
    1|true|TRUE|True|yes)
      # under CI a test that needs them cannot skip: stop here, where the remedy is clear
      echo "error: missing ${need[*]} and cannot install them (not root, or no apt-get): sudo apt-get install ${need[*]}" >&2
      exit 1 ;;
  esac
  echo "note: missing ${need[*]} (install with: sudo apt-get install ${need[*]}); tests that need them will skip" >&2
  exit 0
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
# One retry: a mirror hiccup should not fail the whole test run.
for attempt in 1 2; do
  if apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; then
    break
  fi
  [ "$attempt" = 2 ] && { echo "error: could not install ${need[*]} with apt-get" >&2; exit 1; }
  echo "apt-get failed; retrying in 10 s" >&2
  sleep 10
done
# The Debian package starts a server on :9090 where an init system runs; the tests start their own.
if command -v systemctl >/dev/null 2>&1; then systemctl stop prometheus >/dev/null 2>&1 || true; fi
# Likewise the postgresql package's cluster on :5432; the tests start their own in a temporary directory.
if command -v systemctl >/dev/null 2>&1; then systemctl stop postgresql >/dev/null 2>&1 || true; fi
