#!/usr/bin/env bash
# Stops `make` at once, with one line, when $PYTHON is older than pyproject.toml's requires-python (or
# missing): the agent would otherwise install and then fail at import. Runs on any Python.
#   PYTHON=python3 bash .ci/python-version.sh
set -euo pipefail
python=${PYTHON:-python3}
min=$(sed -n 's/^requires-python = ">=\([0-9][0-9.]*\)"$/\1/p' pyproject.toml)
if [ -z "$min" ]; then
  echo 'pyproject.toml: requires-python is not of the form ">=X.Y"' >&2
  exit 1
fi
if ! command -v "$python" >/dev/null 2>&1; then
  echo "icos-agent needs Python >= $min: $python is not found (make PYTHON=python$min)" >&2
  exit 1
fi
"$python" - "$min" <<'PY'
import sys
need = tuple(int(p) for p in sys.argv[1].split("."))
if tuple(sys.version_info[: len(need)]) < need:
    have = "%d.%d.%d" % tuple(sys.version_info[:3])
    sys.exit("icos-agent needs Python >= %s: %s is Python %s (make PYTHON=python%s)" % (sys.argv[1], sys.executable, have, sys.argv[1]))
PY
