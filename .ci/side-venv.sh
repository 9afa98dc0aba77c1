#!/usr/bin/env bash
# A virtual environment of its own for a tool some tests drive (it pins other versions than the
# agent's): build/NAME-venv from tests/NAME/requirements.lock, rebuilt only when the lock changes.
#   bash .ci/side-venv.sh NAME "what it is for" [minutes the first install takes]
set -euo pipefail
name=$1 why=$2 minutes=${3:-2}
lock=tests/$name/requirements.lock
venv=build/$name-venv
stamp=$venv/.installed-$(sha256sum "$lock" | cut -c1-12)
[ -f "$stamp" ] && exit 0
echo "==> installing $name ($why) into $venv (the first time takes about $minutes minutes)"
test -x "$venv/bin/python" || "${PYTHON:-python3}" -m venv "$venv"
set -o pipefail
"$venv/bin/python" -m pip install -r "$lock" \
  | { grep --line-buffered -E '^(Collecting|Installing collected|Successfully installed)' || true; } | cut -c1-110
rm -f "$venv"/.installed-*
touch "$stamp"
