#!/usr/bin/env bash
# Create (or refresh) .venv/ at the repo root with the OpenMMLab stack mmcirc runs on.
# Idempotent: a second run with nothing changed only checks and returns in seconds.
# See ../shared/docs/ENVIRONMENT.md for why each pin is there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MMCIRC_VENV:-$ROOT/.venv}"
CACHE="${MMCIRC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmcirc}"
PY="${PYTHON:-python3}"
TORCH_SPEC="torch==2.14.1 torchvision==0.29.1"
MMCV_VERSION=2.1.0

say()  { printf '[setup_env] %s\n' "$*"; }
fail() { printf '[setup_env] FAILED: %s\n[setup_env] try: %s\n' "$1" "$2" >&2; exit 1; }

# Everything installed into the venv is pinned by requirements.txt; a stamp of it plus
# the mmcv wheel lets a second run skip pip entirely.
STAMP="$VENV/.mmcirc-installed"
want_stamp="$(cat "$ROOT/requirements.txt" "$ROOT/pyproject.toml" "$0" | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ] \
   && "$VENV/bin/python" -c "import mmcirc, mmcv.ops, mmdet, mmseg, mmpretrain" 2>/dev/null; then
  say "environment is up to date ($VENV)"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment $VENV"
  "$PY" -m venv "$VENV" || fail "python -m venv $VENV" "install python3-venv (apt-get install python3-venv) or set PYTHON=/path/to/python3.11"
fi
PIP=(pip_quiet)
# pip, minus the warnings this machine's pip.conf prints for absent local index folders
pip_quiet() {
  "$VENV/bin/python" -m pip --disable-pip-version-check "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}
# Every install carries these pins: torch's own requirements would otherwise upgrade
# setuptools past 81 (no pkg_resources) or numpy to 2.x (mmcv/mmdet break).
PINS=('setuptools<82' 'numpy<2')

say "installing build tools (setuptools<82 keeps pkg_resources, which mmcv and mmengine need)"
"${PIP[@]}" install -q "${PINS[@]}" wheel ninja \
  || fail "installing setuptools/wheel/numpy" "check that PyPI is reachable (pip index versions setuptools)"

if "$VENV/bin/python" -c "import torch, torchvision" 2>/dev/null; then
  say "torch already present: $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
else
  say "installing $TORCH_SPEC (about 1.5 min, ~5.5 GB)"
  "${PIP[@]}" install -q $TORCH_SPEC "${PINS[@]}" \
    || fail "installing $TORCH_SPEC" "pip install $TORCH_SPEC inside $VENV and read pip's message"
fi

TORCH_VER="$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')"
TAG="$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
WHEELS="$CACHE/wheels/torch-$TORCH_VER-$TAG"
mkdir -p "$WHEELS"

if "$VENV/bin/python" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '$MMCV_VERSION'" 2>/dev/null; then
  say "mmcv $MMCV_VERSION with compiled ops already installed"
else
  WHEEL="$(ls "$WHEELS"/mmcv-$MMCV_VERSION-*.whl 2>/dev/null | head -n1 || true)"
  if [ -z "$WHEEL" ]; then
    say "building mmcv $MMCV_VERSION from source, about 10 min on 2 cores (once; cached in $WHEELS)"
    SRC="$CACHE/src"; mkdir -p "$SRC"
    if ! ls "$SRC"/mmcv-$MMCV_VERSION.tar.gz >/dev/null 2>&1; then
      "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation "mmcv==$MMCV_VERSION" -d "$SRC" \
        || fail "downloading the mmcv $MMCV_VERSION source archive" "pip download --no-binary :all: mmcv==$MMCV_VERSION"
    fi
    BUILD="$(mktemp -d)"; trap 'rm -rf "$BUILD"' EXIT
    tar -xzf "$SRC/mmcv-$MMCV_VERSION.tar.gz" -C "$BUILD"
    # torch >= 2.10 headers need C++20; mmcv 2.1.0 hard-codes -std=c++17.
    STD="$("$VENV/bin/python" -c "
v = tuple(int(x) for x in '$TORCH_VER'.split('.')[:2])
print('c++20' if v >= (2, 10) else 'c++17')")"
    say "compiling with -std=$STD for torch $TORCH_VER"
    sed -i "s/-std=c++17/-std=$STD/g" "$BUILD/mmcv-$MMCV_VERSION/setup.py"
    MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
      "${PIP[@]}" wheel -q --no-deps --no-build-isolation -w "$BUILD/out" "$BUILD/mmcv-$MMCV_VERSION" \
      || fail "building mmcv $MMCV_VERSION (see the compiler output above)" "check gcc/g++ >= 10 (g++ --version) and free disk space; delete $CACHE and rerun"
    mv "$BUILD"/out/mmcv-*.whl "$WHEELS/"
    WHEEL="$(ls "$WHEELS"/mmcv-$MMCV_VERSION-*.whl | head -n1)"
  else
    say "using cached mmcv wheel $WHEEL"
  fi
  "${PIP[@]}" install -q --no-deps "$WHEEL" || fail "installing $WHEEL" "delete $WHEELS and rerun to rebuild it"
fi

say "installing mmengine, mmdet, mmsegmentation, mmpretrain and mmcirc (editable)"
"${PIP[@]}" install -q -r "$ROOT/requirements.txt" "${PINS[@]}" \
  || fail "pip install -r requirements.txt" "read pip's resolver message above"
"${PIP[@]}" install -q --no-deps --no-build-isolation -e "$ROOT" \
  || fail "pip install -e ." "check pyproject.toml"

(cd / && "$VENV/bin/python" -c "import mmcirc, mmcv.ops, mmdet, mmseg, mmpretrain; from mmcv.ops import nms, roi_align") \
  || fail "importing the stack after install" "rerun with a clean venv: rm -rf $VENV && bash tools/setup_env.sh"
echo "$want_stamp" > "$STAMP"
say "done: activate with 'source $VENV/bin/activate'"
