#!/usr/bin/env bash
# Opt-in verification of the seed engines: vllm-mlx 0.6.0 and its fork rapid-mlx 0.16.10.
#
# NOT part of CI or the default install. Each engine gets its own virtual environment under
# $SEED_DIR (default: .engines/seed/ of the main checkout, git-ignored, shared by its worktrees):
# about 6.5 GB each, because torchvision pulls a CUDA build of torch, and each pins older
# mlx-lm/mlx-vlm than this project. pip's cache lives in $SEED_DIR too: nothing under ~/.cache.
# An existing venv that already holds the pinned engine is reused as it is
# (SEED_REINSTALL=1 reinstalls into it).
#
# The servers run in the engine's venv, in-process under the logit tap
# (python -m pytest_prefixcache.tap), on 127.0.0.1 with ephemeral ports, each with a private
# HOME; the checks run from this project's Python ($PYTHON, default: python3 on PATH). Both
# import pytest_prefixcache from this checkout (PYTHONPATH), whatever the venvs installed.
#
# Usage:
#   engines/seed/run.sh install [vllm-mlx|rapid-mlx]...   create the venvs (or reuse them)
#   engines/seed/run.sh verify  [vllm-mlx|rapid-mlx]...   run the checks (venvs must exist)
#   engines/seed/run.sh all     [vllm-mlx|rapid-mlx]...   both (default: both engines)
# Environment: SEED_DIR, PYTHON, SEED_EXAMPLES (plugin examples per property and combination,
#   default 100, the plugin's own default), SEED_MATRIX (default engines/seed/matrix.toml: the
#   flag combinations of both engines), SEED_CHECKS=0 (skip the targeted checks),
#   SEED_CORPUS (a directory: each failure's shrunk counterexample is copied there as
#   <engine>-<labels>-<check>/, e.g. fixtures/corpus/third_party), SEED_REPORTS (default
#   $SEED_DIR/reports), SEED_CONFIGS (space-separated combination names of the matrix file:
#   only these, e.g. 'vllm-mlx[cb,mllm,memory,whole,full]'), SEED_RUN (the run directory's
#   name, default the engines'), SEED_SELECT (a pytest -k expression for the suite, e.g.
#   'test_waves or test_request_streams': the waves and the (half closed-loop) streams only),
#   SEED_SEED (the suite's --prefixcache-seed, default 1), SEED_PYTEST_ARGS (more words for that pytest, e.g. --tb=native: Python 3.11.7's ast.parse
#   raised 'AST constructor recursion depth mismatch' inside pytest's traceback formatting
#   after a failed waves property, an INTERNALERROR that lost the report).
# The waves property runs on the combinations whose args declare concurrency above 1 (the
#   *-waves configs of matrix.toml; PREFIXCACHE_CONCURRENCY for from_env).
# verify runs, for every combination of the matrix file that belongs to the engines named:
# the targeted checks (engines/seed/test_seed_engines.py, test_seed_paged_dedup.py (paged store
# only), and test_seed_waves.py: the saved
# waves' replays; under --runxfail, so the JUnit file holds what really failed) against its own pair of servers, then the plugin's built-in suite over all
# of them in one matrix run (--prefixcache-matrix; each combination is its own set of tests,
# engine, cold baseline and verdict row; claims and per-step alignment on; text-only streams
# except for --mllm). Each combination's servers are adapters.seed.seed_server's: the engine
# under the tap with the combination's flags, and a cache-less cold server.
# Results in $SEED_REPORTS: run-<engines>/ (suite.json: the matrix report, one configs row per
# combination; suite.log; tap/<slug>.jsonl: per request, the API's vs the tap's reuse;
# .prefixcache/failures/: the failures' saved streams), <engine>-<labels>/{checks.xml,
# checks.jsonl,row.json}, and findings.md, the table of every combination.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
source "$ROOT/engines/lab/run_functions.sh"
# adapters.seed finds the venvs there
export SEED_DIR="${SEED_DIR:-$(lab_main_checkout)/.engines/seed}"
EXAMPLES="${SEED_EXAMPLES:-100}"
MATRIX="${SEED_MATRIX:-$ROOT/engines/seed/matrix.toml}"
REPORTS="${SEED_REPORTS:-$SEED_DIR/reports}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 APC_DISK_ENABLED=0
export RAPID_MLX_TELEMETRY=0 DO_NOT_TRACK=1 PIP_CACHE_DIR="$SEED_DIR/pip-cache"

action="${1:-all}"
shift || true
engines=("$@")
[ ${#engines[@]} -eq 0 ] && engines=(vllm-mlx rapid-mlx)

spec() {  # the pip requirement of an engine (its CLI: adapters/seed.py, ENGINES)
  case "$1" in
    vllm-mlx) echo "vllm-mlx==0.6.0" ;;
    rapid-mlx) echo "rapid-mlx==0.16.10" ;;
    *) echo "unknown engine '$1' (vllm-mlx or rapid-mlx)" >&2; exit 2 ;;
  esac
}

install() {
  local name="$1" req venv
  read -r req _ <<<"$(spec "$name")"
  venv="$SEED_DIR/$name"
  mkdir -p "$SEED_DIR"
  [ -f "$SEED_DIR/.gitignore" ] || echo '*' >"$SEED_DIR/.gitignore"
  if [ "${SEED_REINSTALL:-0}" != 1 ] && [ -x "$venv/bin/python" ] && "$venv/bin/python" -c \
    "import importlib.metadata as m, mlx.core, mlx_lm, mlx_vlm; \
assert m.version('${req%%==*}') == '${req##*==}'" 2>/dev/null; then
    echo "== reusing $venv (${req} is installed; SEED_REINSTALL=1 reinstalls)"
    return
  fi
  echo "== installing $req into $venv (about 6.5 GB)"
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "mlx[cpu]" "$req"
  "$venv/bin/python" -c "import mlx.core, mlx_lm, mlx_vlm; print('ok')"
  "$venv/bin/python" -m pip freeze >"$venv/freeze.txt"
}

version() {  # the installed version of an engine
  local req venv
  read -r req _ <<<"$(spec "$1")"
  venv="$SEED_DIR/$1"
  [ -x "$venv/bin/python" ] || { echo "no venv for $1: run '$0 install $1'" >&2; exit 2; }
  "$venv/bin/python" -c "import importlib.metadata as m; print(m.version('${req%%==*}'))"
}

combos() {  # "engine|labels|flags" per combination of the matrix file, for the engines named
  "$PYTHON" - "$MATRIX" "$@" <<'PY'
import shlex, sys
from pathlib import Path
from pytest_prefixcache.session.matrix_file import read_matrix
for t in read_matrix(Path(sys.argv[1])):
    if t.args.get("engine") in sys.argv[2:]:
        print(t.args["engine"], t.name.partition("[")[2].rstrip("]"), shlex.join(t.flags), sep="|")
PY
}

verify() {  # verify ENGINE...: the targeted checks per combination, then one matrix run
  local engine mode flags out
  local -a configs=() versions=()
  for engine in "$@"; do
    versions+=("$engine=$(version "$engine")")
    [ -n "${SEED_CONFIGS:-}" ] || configs+=("--prefixcache-config=$engine")
    # the tap launcher runs in the server's interpreter: this checkout's, not an installed copy
    "$SEED_DIR/$engine/bin/python" -c \
      "import pytest_prefixcache.tap as t; assert t.__file__.startswith('$ROOT')"
  done
  mkdir -p "$REPORTS"
  while IFS='|' read -r engine mode flags; do
    out="$REPORTS/$engine-$mode"
    [ "${SEED_CHECKS:-1}" = 0 ] && continue
    rm -rf "$out" && mkdir -p "$out"
    echo "== $engine [$mode] $flags: targeted checks"
    SEED_ENGINE="$engine" SEED_MODE="$mode" SEED_FLAGS="$flags" SEED_FINDINGS="$out/checks.jsonl" \
      "$PYTHON" -m pytest -p no:randomly -p no:cacheprovider -q -rfEs --runxfail \
      "$ROOT/engines/seed/test_seed_engines.py" "$ROOT/engines/seed/test_seed_waves.py" \
      "$ROOT/engines/seed/test_seed_paged_dedup.py" --junitxml="$out/checks.xml" | tail -n 5 || true
  done < <(combos "$@")
  echo "== the built-in suite over every combination (--prefixcache-matrix)"
  local -a names=()
  read -r -a names <<<"${SEED_CONFIGS:-}"  # no globbing: the names hold [...]
  for name in "${names[@]}"; do configs+=("--prefixcache-config=$name"); done
  local run="$REPORTS/run-${SEED_RUN:-$(IFS=+; echo "$*")}"  # a later run keeps this one
  rm -rf "$run" && mkdir -p "$run/tap"
  local -a select=()
  [ -z "${SEED_SELECT:-}" ] || select=(-k "$SEED_SELECT")
  local -a more=()
  read -r -a more <<<"${SEED_PYTEST_ARGS:-}"
  (cd "$run" && SEED_TAP_LOGS="$run/tap" "$PYTHON" -m pytest -p no:randomly -q -rfE "${select[@]}" "${more[@]}" \
    --prefixcache-verify --prefixcache-matrix="$MATRIX" "${configs[@]}" --prefixcache-allow-partial \
    --prefixcache-examples="$EXAMPLES" --prefixcache-seed="${SEED_SEED:-1}" --prefixcache-timeout=300 \
    --prefixcache-report="$run/suite.json" 2>&1 | tee "$run/suite.log" | tail -n 40) || true
  "$PYTHON" "$ROOT/engines/seed/findings.py" matrix "$REPORTS" "$run" "$MATRIX" "${versions[@]}"
}

case "$action" in
  install) for name in "${engines[@]}"; do install "$name"; done ;;
  verify) verify "${engines[@]}" ;;
  all) for name in "${engines[@]}"; do install "$name"; done; verify "${engines[@]}" ;;
  *) echo "usage: $0 install|verify|all [vllm-mlx|rapid-mlx]..." >&2; exit 2 ;;
esac
if [ "$action" != install ]; then
  [ -z "${SEED_CORPUS:-}" ] || "$PYTHON" "$ROOT/engines/seed/findings.py" save "$REPORTS" "$SEED_CORPUS"
  "$PYTHON" "$ROOT/engines/seed/findings.py" table "$REPORTS" | tee "$REPORTS/findings.md"
fi
