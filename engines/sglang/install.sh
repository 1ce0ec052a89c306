#!/usr/bin/env bash
# Opt-in install of SGLang 0.5.23 for CPU into $ENGINES_DIR/sglang/venv (default ENGINES_DIR: the
# .engines/ folder of the main checkout, git-ignored, shared by its worktrees). NOT part of CI.
#
# SGLang's wheel requires the CUDA stack (flashinfer, sglang-kernel, flash-attn-4, nvidia-*,
# torch==2.14.1 with its CUDA libraries). None of it runs here, so the wheel is installed with
# --no-deps and its CPU-usable requirements are installed explicitly, next to the CPU build of
# torch (this machine's wheel folder holds torch 2.13.0+cpu; SGLang pins 2.14.1, and the
# difference has not mattered for the CPU paths used here; SGLANG_TORCH overrides the pin).
# Then engines/sglang/site/ (our own stubs, see its README) is linked into the venv with a .pth
# file: a stand-in `sgl_kernel` module (cache_move.py imports it unconditionally; the CPU build
# of sgl-kernel is not on the package index) and an `sglang_cpu_stubs` startup hook that gives
# the Qwen-VL path the torch op names it reads at import.
#
# Idempotent: an existing venv that already holds sglang 0.5.23 is reused (SGLANG_REINSTALL=1
# reinstalls into it); the .pth link is rewritten each run. pip's cache lives in
# $ENGINES_DIR/sglang/pip-cache, nothing under ~/.cache. First install: a few minutes.
#
# Usage: engines/sglang/install.sh
set -euo pipefail

HERE_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE_SRC/../.." && pwd)"
COMMON="$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
MAIN_CHECKOUT="$([ -n "$COMMON" ] && dirname "$COMMON" || echo "$ROOT")"
ENGINES_DIR="${ENGINES_DIR:-$MAIN_CHECKOUT/.engines}"
HERE="$ENGINES_DIR/sglang"
VENV="$HERE/venv"
PYTHON="${PYTHON:-python3}"
VERSION=0.5.23
TORCH="${SGLANG_TORCH:-torch==2.13.0}"
export PIP_CACHE_DIR="$HERE/pip-cache" HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# SGLang 0.5.23's requirements that its CPU server imports (its METADATA, less the CUDA-only
# ones: cuda-python, flashinfer, flash-attn-4, sglang-kernel, sgl-deep-*, sgl-flash-mla,
# nvidia-*, nvshmem4py, humming-kernels, quack-kernels, tilelang, torch_memory_saver, kernels,
# torchaudio, torchcodec, deepseek-recipe, tml-renderers, py-spy, smg-grpc-servicer)
DEPS=(
  "transformers==5.19.0" "tokenizers==0.23.2" "torchvision" "timm==1.0.25"
  "fastapi" "uvicorn>=0.51" "uvloop" "orjson" "pyzmq>=25.1.2" "psutil" "requests" "aiohttp"
  "pydantic" "python-multipart" "pillow" "numpy" "scipy" "sentencepiece==0.2.1" "tiktoken"
  "msgspec" "partial_json_parser" "xgrammar==0.2.7" "llguidance>=1.7.6,<2.0.0" "interegular"
  "outlines==0.1.11" "openai==2.8.0" "openai-harmony==0.0.4" "anthropic>=0.20.0" "setproctitle"
  "prometheus-client>=0.20.0" "pybase64" "einops" "xxhash" "zstandard" "blobfile==3.0.0"
  "compressed-tensors==0.18.0" "gguf" "watchfiles" "tqdm" "packaging" "distro"
  "python-dateutil<3" "easydict" "ninja" "soundfile==0.13.1" "mistral_common>=1.11.5"
  "modelscope" "IPython" "datasets" "numba==0.65.1" "apache-tvm-ffi==0.1.11" "build"
  "nvidia-ml-py"
)

installed() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import importlib.metadata as m; \
assert m.version('sglang') == '$VERSION'" 2>/dev/null
}

mkdir -p "$HERE"
if [ "${SGLANG_REINSTALL:-0}" != 1 ] && installed; then
  echo "== reusing $VENV (sglang $VERSION is installed; SGLANG_REINSTALL=1 reinstalls)"
else
  echo "== installing sglang==$VERSION (CPU) into $VENV"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  # every later resolve keeps the CPU torch: the constraint file pins it
  "$VENV/bin/python" -m pip install -q "$TORCH"
  "$VENV/bin/python" -m pip freeze | grep -i '^torch==' >"$HERE/constraints.txt"
  nice -n 10 "$VENV/bin/python" -m pip install -q -c "$HERE/constraints.txt" "${DEPS[@]}"
  nice -n 10 "$VENV/bin/python" -m pip install -q --no-deps "sglang==$VERSION"
fi

# our stubs: a .pth line puts engines/sglang/site on the path, a second one runs the startup hook
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf '%s\nimport sglang_cpu_stubs\n' "$HERE_SRC/site" >"$SITE/prefixcache_sglang_stubs.pth"
"$VENV/bin/python" -c "import sgl_kernel, sglang, torch; print('sglang', sglang.__version__, \
'torch', torch.__version__)"
"$VENV/bin/python" -m pip freeze >"$HERE/freeze.txt"
