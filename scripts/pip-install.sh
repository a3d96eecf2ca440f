#!/usr/bin/env bash
# pip install ./python as a user would (Debian's pip, nothing from PyPI: the
# build backend needs only Python's standard library), into a temporary
# directory, then the package's tests against what was installed: no
# VRAM_LIBRARY, the library found beside the package. Exits 2, saying why,
# when there is no pip to run; run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=/usr/bin/python3
if ! "$py" -m pip --version >/dev/null 2>&1; then
	echo "pip-install: no pip for $py (Debian: apt-get install python3-pip)" >&2
	exit 2
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$py" -m pip install --no-build-isolation --no-cache-dir --target "$dir/site" ./python
cd "$dir"
export PYTHONPATH="$dir/site" PYTHONDONTWRITEBYTECODE=1 VRAM_DEVICE=
unset VRAM_LIBRARY VRAM_TORCH_LIBRARY
"$py" -c 'import sys, vram, vram._lib as l; l.lib(); assert l.path == sys.argv[1] + "/site/vram/libvram.so", l.path; print("pip-install: vram loads", l.path)' "$dir"
"$py" -m unittest discover -s "$root/python/tests"
