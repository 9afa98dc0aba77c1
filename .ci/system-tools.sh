#!/usr/bin/env bash
# Install the Debian packages some tests use, and the en_US.UTF-8 locale, when we can (root) and they are missing.
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# victoria-metrics: the fleet evaluator's second query backend (tests/support/victoria.py).
command -v victoria-metrics >/dev/null 2>&1 || need+=(victoria-metrics)
# npm: installs @grafana/schema + typescript (deploy/grafana/typecheck) to type-check the dashboard.
command -v npm >/dev/null 2>&1 || need+=(npm)
# chromium: headless rendering of the demo report (tests/e2e/test_demo_report_chromium.py).
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
# java: Spark's local mode for icos_agent.spark (tests/integration/test_spark_estimate.py) runs on the JVM.
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
# postgresql: a throwaway server for the shared prediction store's tests (tests/support/postgres.py).
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1 || need+=(postgresql)
# The en_US.UTF-8 locale: onnxruntime's StringNormalizer, in every text pipeline skl2onnx exports, does not load
# without it (bench/zoo/string_locale.py). Debian's `locales` holds the sources localedef compiles it from.
need_locale=0
locale -a 2>/dev/null | grep -ix 'en_US\.utf-\?8' >/dev/null || need_locale=1
if [ "$need_locale" = 1 ] && [ ! -e /usr/share/i18n/locales/en_US ]; then
  need+=(locales)
fi
if [ ${#need[@]} -eq 0 ] && [ "$need_locale" = 0 ]; then
  exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  case "${CI:-}" in
    1|true|TRUE|True|yes)
      # under CI a test that needs them cannot skip: stop here, where the remedy is clear
      missing="${need[*]}"
      [ "$need_locale" = 1 ] && missing="$missing the en_US.UTF-8 locale"
      echo "error: missing $missing and cannot install them (not root, or no apt-get): run make system-tools as root" >&2
      exit 1 ;;
  esac
  if [ ${#need[@]} -gt 0 ]; then
    echo "note: missing ${need[*]} (install with: sudo apt-get install ${need[*]}); tests that need them will skip" >&2
  fi
  if [ "$need_locale" = 1 ]; then
    echo "note: the en_US.UTF-8 locale is missing (sudo localedef -i en_US -c -f UTF-8 en_US.UTF-8, or sudo locale-gen en_US.UTF-8); string-model tests will skip" >&2
  fi
  exit 0
fi
if [ ${#need[@]} -gt 0 ]; then
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
  # Likewise victoria-metrics on :8428.
  if command -v systemctl >/dev/null 2>&1; then systemctl stop victoria-metrics >/dev/null 2>&1 || true; fi
  # Likewise the postgresql package's cluster on :5432; the tests start their own in a temporary directory.
  if command -v systemctl >/dev/null 2>&1; then systemctl stop postgresql >/dev/null 2>&1 || true; fi
fi
if [ "$need_locale" = 1 ]; then
  echo "generating the en_US.UTF-8 locale"
  # Listed in /etc/locale.gen too, so that a later locale-gen (an upgrade of locales runs it) keeps it.
  if [ -f /etc/locale.gen ] && ! grep -q '^en_US.UTF-8 UTF-8' /etc/locale.gen; then
    echo 'en_US.UTF-8 UTF-8' >> /etc/locale.gen
  fi
  localedef -i en_US -c -f UTF-8 -A /usr/share/locale/locale.alias en_US.UTF-8
fi
