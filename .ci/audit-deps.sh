#!/usr/bin/env bash
# Audit the installed Python dependencies of .venv for known vulnerabilities with pip-audit.
#
# Exit status: 1 when pip-audit reports a vulnerability; 0 otherwise. When the vulnerability service
# cannot be reached (no network, or a package index mirror that has no vulnerability data, so every
# package is skipped), the audit is reported as UNAVAILABLE and does not fail the build.
# Report: build/pip-audit/pip-audit.json (pip-audit's JSON) and a one-line summary on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
OUT="${PIP_AUDIT_REPORT_DIR:-build/pip-audit}"
mkdir -p "$OUT"
if ! "$VENV/bin/python" -m pip_audit --version >/dev/null 2>&1; then
  echo "pip-audit: UNAVAILABLE (not installed: $VENV/bin/pip install 'pip-audit>=2.7')"
  exit 0
fi
# --local: only the packages installed in this environment; the project itself is skipped (not on PyPI).
timeout "${PIP_AUDIT_TIMEOUT:-300}" "$VENV/bin/python" -m pip_audit --local --progress-spinner off \
  --format json --output "$OUT/pip-audit.json" ${PIP_AUDIT_ARGS:-} 2>"$OUT/pip-audit.err"
status=$?
"$VENV/bin/python" - "$OUT/pip-audit.json" "$status" "$OUT/pip-audit.err" <<'PY'
import json
import sys

path, status, err = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    deps = json.load(open(path))["dependencies"]
except (OSError, ValueError, KeyError):
    tail = open(err).read().strip().splitlines()[-1:] if status else []
    print(f"pip-audit: UNAVAILABLE (the vulnerability service could not be reached: {' '.join(tail)[:200]})")
    sys.exit(0)
audited = [d for d in deps if "skip_reason" not in d]
vulnerable = [d for d in audited if d.get("vulns")]
if not audited:
    print(f"pip-audit: UNAVAILABLE (all {len(deps)} packages skipped: the index has no vulnerability data)")
    sys.exit(0)
skipped = len(deps) - len(audited)
for d in vulnerable:
    ids = ", ".join(v["id"] + (f" (fixed in {', '.join(v['fix_versions'])})" if v.get("fix_versions") else "")
                    for v in d["vulns"])
    print(f"  {d['name']} {d['version']}: {ids}")
print(f"pip-audit: {len(audited)} packages audited, {skipped} skipped, {len(vulnerable)} with known vulnerabilities")
sys.exit(1 if vulnerable else 0)
PY
