#!/usr/bin/env bash
# Create (or refresh) .venv/ at the repo root with the OpenMMLab stack mmcirc runs on.
# Idempotent: a second run with nothing changed only checks and returns in seconds.
# See ../shared/docs/ENVIRONMENT.md for why each pin is there.
# On a machine with a GPU (nvidia-smi, and torch sees it), or with MMCIRC_CUDA=1, mmcv is
# built with its CUDA ops (FORCE_CUDA=1; MMCIRC_CUDA=0: CPU ops only); the build steps and
# the patches mmcv 2.1.0 needs are in tools/mmcv_build.sh. MMCIRC_VENV / MMCIRC_CACHE move
# the venv / the cache (wheels, sources, a resumable CUDA build folder, timm's own tests),
# MAX_JOBS the compile.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MMCIRC_VENV:-$ROOT/.venv}"
CACHE="${MMCIRC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmcirc}"
PY="${PYTHON:-python3}"
TORCH_SPEC="torch==2.14.1 torchvision==0.29.1"
MMCV_VERSION=2.1.0

say()  { printf '[setup_env] %s\n' "$*"; }
fail() { printf '[setup_env] FAILED: %s\n[setup_env] try: %s\n' "$1" "$2" >&2; exit 1; }
# shellcheck source=mmcv_build.sh
. "$ROOT/tools/mmcv_build.sh"

# 0 (true) when mmcv is to be built with CUDA ops: MMCIRC_CUDA=1, or MMCIRC_CUDA unset on a
# machine with nvidia-smi whose torch sees a GPU. Costs nothing where nvidia-smi is absent.
cuda_wanted() {
  case "${MMCIRC_CUDA:-}" in
    1) return 0 ;;
    0) return 1 ;;
    '') command -v nvidia-smi >/dev/null 2>&1 && [ -x "$VENV/bin/python" ] \
          && "$VENV/bin/python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null ;;
    *) fail "MMCIRC_CUDA=$MMCIRC_CUDA (allowed: 1, 0 or unset)" "MMCIRC_CUDA=1 bash tools/setup_env.sh" ;;
  esac
}
has_cuda_ops() {
  "$VENV/bin/python" -c "import sys; from mmcv.ops import get_compiling_cuda_version as v; sys.exit(v() == 'not available')" 2>/dev/null
}
# Exports CUDA_HOME for the build: $CUDA_HOME, else the nvcc on PATH, else PyPI's
# nvidia-cuda-nvcc (+ crt headers, cccl's thrust/cub, cudart) of torch's CUDA X.Y in the venv.
use_nvcc() {
  CUDA_HOME="$(mmcv_find_cuda_home)"
  if [ -z "$CUDA_HOME" ]; then
    local major="${TORCH_CUDA%%.*}"
    say "no CUDA_HOME and no nvcc on PATH: installing nvidia-cuda-nvcc==$TORCH_CUDA.* into $VENV"
    # nvcc's driver, its front end cicc (nvidia-nvvm), the crt headers and thrust/cub (cccl);
    # cuda_runtime.h, cublas_v2.h, cusparse.h, ... come with torch's own nvidia-* wheels.
    "${PIP[@]}" install -q --no-deps "nvidia-cuda-nvcc==$TORCH_CUDA.*" "nvidia-nvvm==$TORCH_CUDA.*" \
      "nvidia-cuda-crt==$TORCH_CUDA.*" "nvidia-cuda-cccl==$TORCH_CUDA.*" "nvidia-cuda-runtime==$TORCH_CUDA.*" \
      || fail "installing nvidia-cuda-nvcc==$TORCH_CUDA.* (no nvcc otherwise)" "install the CUDA $TORCH_CUDA toolkit and set CUDA_HOME"
    CUDA_HOME="$("$VENV/bin/python" -c "import nvidia, os; print(os.path.join(nvidia.__path__[0], 'cu$major'))")"
    # torch links -lcudart from CUDA_HOME/lib64 (else lib); the wheels ship lib/libcudart.so.X only
    [ -e "$CUDA_HOME/lib64" ] || ln -s lib "$CUDA_HOME/lib64"
    [ -e "$CUDA_HOME/lib/libcudart.so" ] || ln -s "libcudart.so.$major" "$CUDA_HOME/lib/libcudart.so"
  fi
  mmcv_check_nvcc "$VENV/bin/python" "$CUDA_HOME" "$TORCH_CUDA"
  export CUDA_HOME
}

# timm's own model tests (tests/test_models.py of the installed timm's sdist on PyPI), run
# on mmcirc's models by tests/timm/test_timm_contract.py: fetched once into $CACHE/timm-tests/timm-VER/,
# never committed, never downloaded by a test.
fetch_timm_tests() {
  local ver dest tmp
  ver="$("$VENV/bin/python" -c 'import timm; print(timm.__version__)')" \
    || fail "reading the installed timm version" "rm -rf $VENV && bash tools/setup_env.sh"
  dest="$CACHE/timm-tests/timm-$ver"
  [ -f "$dest/tests/test_models.py" ] && return 0
  say "fetching the tests of timm $ver (its PyPI sdist) into $dest"
  tmp="$(mktemp -d)"
  if ! "$VENV/bin/python" -m pip --disable-pip-version-check download -q --no-deps --no-binary :all: \
      "timm==$ver" -d "$tmp" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) \
     || ! tar -xzf "$tmp/timm-$ver.tar.gz" -C "$tmp" "timm-$ver/tests"; then
    rm -rf "$tmp"
    fail "fetching the sdist of timm $ver (for its tests)" "pip download --no-deps --no-binary :all: timm==$ver"
  fi
  mkdir -p "$CACHE/timm-tests" && rm -rf "$dest" && mv "$tmp/timm-$ver" "$dest" && rm -rf "$tmp"
}

# Everything installed into the venv is pinned by requirements.txt; a stamp of it plus
# the mmcv wheel lets a second run skip pip entirely.
STAMP="$VENV/.mmcirc-installed"
want_stamp="$(cat "$ROOT/requirements.txt" "$ROOT/pyproject.toml" "$0" "$ROOT/tools/mmcv_build.sh" | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ] \
   && "$VENV/bin/python" -c "import mmcirc, mmcv.ops, mmdet, mmseg, mmpretrain" 2>/dev/null \
   && { ! cuda_wanted || has_cuda_ops; }; then
  fetch_timm_tests
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
# mmcv's CUDA ops: built when asked (MMCIRC_CUDA=1, e.g. to build on a machine without a
# GPU) or when nvidia-smi exists and torch sees a GPU (MMCIRC_CUDA=0 turns that off).
CUDA_OPS=0
if cuda_wanted; then
  CUDA_OPS=1
  TORCH_CUDA="$(mmcv_torch_cuda "$VENV/bin/python")"
  [ -n "$TORCH_CUDA" ] || fail "torch $TORCH_VER in $VENV is a CPU-only build (torch.version.cuda is None), no CUDA ops can be built" \
    "install a CUDA build of torch in $VENV, or unset MMCIRC_CUDA"
  TORCH_CUDA_ARCH_LIST="$(mmcv_cuda_arch "$VENV/bin/python")"
  export TORCH_CUDA_ARCH_LIST
  # CUDA wheels are cached apart from the CPU one, per CUDA version and arch list.
  WHEELS="$WHEELS-cu$TORCH_CUDA-$(mmcv_arch_key "$TORCH_CUDA_ARCH_LIST")"
fi
mkdir -p "$WHEELS"

if "$VENV/bin/python" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '$MMCV_VERSION'" 2>/dev/null \
   && { [ "$CUDA_OPS" = 0 ] || has_cuda_ops; }; then
  say "mmcv $MMCV_VERSION with compiled ops already installed"
else
  WHEEL="$(ls "$WHEELS"/mmcv-$MMCV_VERSION-*.whl 2>/dev/null | head -n1 || true)"
  if [ -z "$WHEEL" ]; then
    if [ "$CUDA_OPS" = 1 ]; then
      use_nvcc
      say "building mmcv $MMCV_VERSION with CUDA ops (CUDA $TORCH_CUDA, arch $TORCH_CUDA_ARCH_LIST, nvcc from $CUDA_HOME), about 70 min on 2 cores (once; cached in $WHEELS)"
    else
      say "building mmcv $MMCV_VERSION from source, about 10 min on 2 cores (once; cached in $WHEELS)"
    fi
    SRC="$CACHE/src"; mkdir -p "$SRC"
    if ! ls "$SRC"/mmcv-$MMCV_VERSION.tar.gz >/dev/null 2>&1; then
      "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation "mmcv==$MMCV_VERSION" -d "$SRC" \
        || fail "downloading the mmcv $MMCV_VERSION source archive" "pip download --no-binary :all: mmcv==$MMCV_VERSION"
    fi
    if [ "$CUDA_OPS" = 1 ]; then
      # kept until the wheel exists: a rerun after an interruption resumes the compile
      BUILD="$CACHE/build/mmcv-$MMCV_VERSION-torch-$TORCH_VER-$TAG-cu$TORCH_CUDA-$(mmcv_arch_key "$TORCH_CUDA_ARCH_LIST")"
      mmcv_patch_sources "$VENV/bin/python" "$SRC/mmcv-$MMCV_VERSION.tar.gz" "$BUILD/mmcv-$MMCV_VERSION" 1
    else
      BUILD="$(mktemp -d)"; trap 'rm -rf "$BUILD"' EXIT
      mmcv_patch_sources "$VENV/bin/python" "$SRC/mmcv-$MMCV_VERSION.tar.gz" "$BUILD/mmcv-$MMCV_VERSION" 0
    fi
    HINT="check gcc/g++ >= 10 (g++ --version) and free disk space; delete $CACHE and rerun"
    if [ "$CUDA_OPS" = 1 ]; then HINT="fix the first error above and rerun: the compile resumes from $BUILD"; fi
    mmcv_build_wheel "$VENV/bin/python" "$CUDA_OPS" "$BUILD/mmcv-$MMCV_VERSION" "$BUILD/out" \
      || fail "building mmcv $MMCV_VERSION (see the compiler output above)" "$HINT"
    mv "$BUILD"/out/mmcv-*.whl "$WHEELS/"
    if [ "$CUDA_OPS" = 1 ]; then rm -rf "$BUILD"; fi
    WHEEL="$(ls "$WHEELS"/mmcv-$MMCV_VERSION-*.whl | head -n1)"
  else
    say "using cached mmcv wheel $WHEEL"
  fi
  REINSTALL=()  # a CUDA wheel replaces an installed CPU-only mmcv of the same version
  if [ "$CUDA_OPS" = 1 ]; then REINSTALL=(--force-reinstall); fi
  "${PIP[@]}" install -q --no-deps "${REINSTALL[@]}" "$WHEEL" || fail "installing $WHEEL" "delete $WHEELS and rerun to rebuild it"
fi

say "installing mmengine, mmdet, mmsegmentation, mmpretrain and mmcirc (editable)"
"${PIP[@]}" install -q -r "$ROOT/requirements.txt" "${PINS[@]}" \
  || fail "pip install -r requirements.txt" "read pip's resolver message above"
"${PIP[@]}" install -q --no-deps --no-build-isolation -e "$ROOT" \
  || fail "pip install -e ." "check pyproject.toml"

(cd / && "$VENV/bin/python" -c "import mmcirc, mmcv.ops, mmdet, mmseg, mmpretrain; from mmcv.ops import nms, roi_align") \
  || fail "importing the stack after install" "rerun with a clean venv: rm -rf $VENV && bash tools/setup_env.sh"
if [ "$CUDA_OPS" = 1 ]; then
  if "$VENV/bin/python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    say "checking mmcv's CUDA kernels (nms, roi_align, sigmoid_focal_loss) against the CPU"
    "$VENV/bin/python" "$ROOT/tools/misc/check_mmcv_cuda.py" \
      || fail "mmcv's CUDA ops disagree with the CPU or do not run (line above)" "delete $WHEELS and rerun to rebuild"
  else
    say "mmcv built with CUDA $TORCH_CUDA ops for arch $TORCH_CUDA_ARCH_LIST; no GPU here, so they are checked on the first GPU run (python tools/misc/check_mmcv_cuda.py)"
  fi
fi
fetch_timm_tests
echo "$want_stamp" > "$STAMP"
say "done: activate with 'source $VENV/bin/activate'"
