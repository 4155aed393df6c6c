# Building mmcv 2.1.0's compiled ops from its source archive, with or without CUDA.
# A bash library, sourced by tools/setup_env.sh (the install) and
# tools/deployment/gpu_checks.sh (the lent GPU machine, offline); it defines functions only.
# Each function takes the Python that has torch as $1 and reports failure as one line
# through the caller's `fail WHAT TRY`.
#
# What mmcv 2.1.0 (Nov 2023) needs patched to build against today's torch and CUDA, applied
# with sed to the extracted sources (mmcv_patch_sources), never to an installed copy:
#   1. setup.py: -std=c++17 -> -std=c++20 (cxx and nvcc flags) for torch >= 2.10, whose
#      headers use C++20 (concepts, std::span); older torch keeps c++17.
#   2. CUDA builds: torch's CUDA headers include cusparse.h, cublas_v2.h, cusolverDn.h,
#      which a minimal CUDA toolkit (nvcc + cudart, e.g. /usr/local/cuda-13.0 here) lacks;
#      torch's own nvidia-* wheels ship them (site-packages/nvidia/cu13/include for CUDA 13,
#      nvidia/<lib>/include before), so those folders are added after the toolkit's own
#      (nvcc: MMCV_CUDA_ARGS, which mmcv's setup.py appends to the nvcc flags; g++: CPATH).
# A CUDA build resumes where it stopped: its build folder is kept until the wheel exists
# (pip --use-pep517: pip's legacy path runs `setup.py clean --all` after a failure, which
# deletes build/ and every compiled object), and ninja recompiles only what is missing.

# The CUDA version torch was built with (e.g. 13.0), or nothing for a CPU-only torch.
mmcv_torch_cuda() {
  "$1" -c 'import torch; print(torch.version.cuda or "")'
}

# TORCH_CUDA_ARCH_LIST for the build: the caller's if set; else the compute capabilities
# of the visible GPUs (e.g. "9.0" on an H100/H200, "8.6;9.0" for a mixed box); else 9.0,
# the H200 this project borrows (a build for 9.0 runs on sm_90 only; set
# TORCH_CUDA_ARCH_LIST="8.0;8.6;9.0+PTX" for a wheel that also runs on A100/RTX 30xx).
mmcv_cuda_arch() {
  if [ -n "${TORCH_CUDA_ARCH_LIST:-}" ]; then
    echo "$TORCH_CUDA_ARCH_LIST"
    return
  fi
  "$1" -c '
import torch
caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}) \
    if torch.cuda.is_available() else []
print(";".join(f"{a}.{b}" for a, b in caps) or "9.0")'
}

# A file-name-safe key for an arch list: "8.6;9.0+PTX" -> "sm86_90ptx".
mmcv_arch_key() {
  local k="${1//+PTX/ptx}"
  k="${k//./}"
  k="${k//[; ,]/_}"
  echo "sm$k"
}

# The CUDA toolkit root whose nvcc compiles the ops: $CUDA_HOME, else the nvcc on PATH
# (asked for its own TOP, since /usr/local/bin/nvcc may be a wrapper of
# /usr/local/cuda-X.Y/bin/nvcc). Prints nothing when there is neither.
mmcv_find_cuda_home() {
  if [ -n "${CUDA_HOME:-}" ]; then
    echo "$CUDA_HOME"
  elif command -v nvcc >/dev/null 2>&1; then
    local top
    top="$(nvcc -dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1)"
    (cd "${top:-$(dirname "$(command -v nvcc)")/..}" && pwd -P)
  fi
}

# The include folders of torch's nvidia-* wheels that hold the CUDA library headers torch's
# CUDA headers need, when CUDA_HOME=$2 lacks them; ':'-separated, possibly empty.
mmcv_torch_cuda_includes() {
  [ -f "$2/include/cusparse.h" ] && return 0
  "$1" -c '
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
dirs = {os.path.dirname(h) for p in nvidia.__path__ for h in glob.glob(os.path.join(p, "*", "include", "cusparse.h"))
        + glob.glob(os.path.join(p, "*", "include", "cublas_v2.h")) + glob.glob(os.path.join(p, "*", "include", "cusolverDn.h"))}
print(":".join(sorted(dirs)))'
}

# Checks that CUDA_HOME=$2 has an nvcc of torch's CUDA major.minor ($3); fails otherwise.
mmcv_check_nvcc() {
  local home="$2" want="$3" got
  [ -x "$home/bin/nvcc" ] \
    || fail "no nvcc at $home/bin/nvcc (CUDA_HOME=$home)" "point CUDA_HOME at a CUDA $want toolkit, or unset it"
  got="$("$home/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')"
  [ "$got" = "$want" ] \
    || fail "CUDA mismatch: nvcc in $home is CUDA ${got:-unknown}, torch was built with CUDA $want" \
      "set CUDA_HOME to a CUDA $want toolkit (or pip install 'nvidia-cuda-nvcc==$want.*')"
}

# Extracts the sdist $2 into $3 (once; an existing $3 is a build to resume) and patches it
# ($4 = 1 for a CUDA build).
mmcv_patch_sources() {
  local py="$1" sdist="$2" dir="$3" cuda="$4" torch_ver std
  if [ ! -f "$dir/setup.py" ]; then
    mkdir -p "$dir"
    tar -xzf "$sdist" -C "$dir" --strip-components=1
  fi
  # the patches below are idempotent: a resumed build re-applies them as a no-op
  torch_ver="$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')"
  # torch >= 2.10 headers need C++20; mmcv 2.1.0 hard-codes -std=c++17.
  std="$("$py" -c "
v = tuple(int(x) for x in '$torch_ver'.split('.')[:2])
print('c++20' if v >= (2, 10) else 'c++17')")"
  say "compiling with -std=$std for torch $torch_ver"
  sed -i "s/-std=c++17/-std=$std/g" "$dir/setup.py"
}

# pip as the caller runs it (setup_env.sh's pip_quiet when defined).
_mmcv_pip() {
  local py="$1"
  shift
  if declare -F pip_quiet >/dev/null; then pip_quiet "$@"; else "$py" -m pip --disable-pip-version-check "$@"; fi
}

# Builds the mmcv wheel from the patched sources in $3 into $4, with CUDA ops when $2 = 1
# (CUDA_HOME and TORCH_CUDA_ARCH_LIST must be exported by then; nvcc runs from CUDA_HOME).
mmcv_build_wheel() {
  local py="$1" cuda="$2" dir="$3" out="$4" inc
  if [ "$cuda" = 1 ]; then
    inc="$(mmcv_torch_cuda_includes "$py" "$CUDA_HOME")"
    if [[ "$inc" == *:* ]]; then  # one folder of links: MMCV_CUDA_ARGS is a single nvcc argument
      mkdir -p "$dir/cuda_lib_include"
      for d in ${inc//:/ }; do ln -sf "$d"/* "$dir/cuda_lib_include/"; done
      inc="$dir/cuda_lib_include"
    fi
    (
      export MMCV_WITH_OPS=1 FORCE_CUDA=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" PATH="$CUDA_HOME/bin:$PATH"
      if [ -n "$inc" ]; then
        say "CUDA library headers from torch's wheels: $inc"
        export MMCV_CUDA_ARGS="-I$inc" CPATH="$inc${CPATH:+:$CPATH}"
      fi
      _mmcv_pip "$py" wheel -q --no-deps --no-build-isolation --use-pep517 -w "$out" "$dir"
    )
  else
    MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
      _mmcv_pip "$py" wheel -q --no-deps --no-build-isolation -w "$out" "$dir"
  fi
}
