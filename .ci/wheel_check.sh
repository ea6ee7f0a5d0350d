#!/usr/bin/env bash
# Build a wheel of this checkout and prove it needs no compiler at run time:
#   1. `pip wheel <copy of the checkout> --no-deps` (a full Cython build, ~3 min on 2 cores);
#   2. a fresh venv (--system-site-packages: numpy/scipy come from the CI
#      python, nothing is downloaded) gets the wheel with `pip install`;
#   3. with PATH reduced to the venv's bin (no cc/gcc/clang anywhere) and
#      CC/CXX pointing nowhere, .ci/wheel_smoke.py imports spfuse from the
#      venv and runs SpMV, SDDMM, an off-catalogue program, an einsum and
#      show_config().
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SECONDS=0
WT=$(mktemp -d "${TMPDIR:-/tmp}/spfuse-wheel.XXXXXX")
trap 'rm -rf "$WT"' EXIT

# a copy without build products, so the wheel is built from sources only
mkdir "$WT/src"
tar -C "$ROOT" -cf - \
    --exclude=./.git --exclude=./build --exclude='*.egg-info' --exclude=__pycache__ \
    --exclude='*.so' --exclude='*.c' --exclude=.pytest_cache --exclude=.hypothesis --exclude=./dist . \
    | tar -C "$WT/src" -xf -
python -m pip wheel "$WT/src" -w "$WT/dist" --no-deps -q > "$WT/build.log" 2>&1 \
    || { tail -n 100 "$WT/build.log"; echo "wheel build failed" >&2; exit 1; }
wheel=$(ls "$WT"/dist/spfuse-*.whl)
echo "built $(basename "$wheel") in ${SECONDS} s"

python -m venv --system-site-packages "$WT/venv"
"$WT/venv/bin/python" -m pip install -q --no-build-isolation "$wheel"
cp "$ROOT/.ci/wheel_smoke.py" "$WT/smoke.py"
# run from an empty directory so the checkout is not on sys.path
(cd "$WT" && env -i HOME="$HOME" PATH="$WT/venv/bin" CC=/nonexistent/cc CXX=/nonexistent/c++ \
    OMP_NUM_THREADS=2 "$WT/venv/bin/python" smoke.py)
echo "== wheel check took ${SECONDS} s"
