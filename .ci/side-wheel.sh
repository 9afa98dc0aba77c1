#!/usr/bin/env bash
# A package's wheel, downloaded without its dependencies, for the data files some tests read from it (installing it
# would pull versions that conflict with the agent's): build/NAME-wheel from tests/NAME/requirements.lock (exact
# versions and hashes), fetched again only when the lock changes.
#   bash .ci/side-wheel.sh NAME "what it is for"
set -euo pipefail
name=$1 why=$2
lock=tests/$name/requirements.lock
dir=build/$name-wheel
stamp=$dir/.downloaded-$(sha256sum "$lock" | cut -c1-12)
[ -f "$stamp" ] && exit 0
echo "==> downloading the $name wheel ($why) into $dir"
rm -rf "$dir"
mkdir -p "$dir"
"${PYTHON:-python3}" -m pip download --quiet --no-deps --require-hashes -r "$lock" -d "$dir"
touch "$stamp"
