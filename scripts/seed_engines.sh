#!/usr/bin/env bash
# Opt-in verification of the seed engines: vllm-mlx 0.6.0 and its fork rapid-mlx 0.16.10.
#
# NOT part of CI or the default install. Each engine gets its own virtual environment under
# $SEED_DIR (default: .seed-engines/ in the repository, git-ignored by its own .gitignore):
# about 6.5 GB each, because torchvision pulls a CUDA build of torch, and each pins older
# mlx-lm/mlx-vlm than this project. pip's cache lives in $SEED_DIR too: nothing under ~/.cache.
#
# The servers run in the engine's venv, in-process under the logit tap
# (python -m pytest_prefixcache.tap), on 127.0.0.1 with ephemeral ports, each with a private
# HOME; the checks run from this project's Python ($PYTHON, default: python3 on PATH).
#
# Usage:
#   scripts/seed_engines.sh install [vllm-mlx|rapid-mlx]...   create/refresh the venvs
#   scripts/seed_engines.sh verify  [vllm-mlx|rapid-mlx]...   run the checks (venvs must exist)
#   scripts/seed_engines.sh all     [vllm-mlx|rapid-mlx]...   both (default: both engines)
# Environment: SEED_DIR, PYTHON, SEED_EXAMPLES (plugin examples per property, default 5),
#   SEED_MODES (space-separated subset of: simple mllm cb paged; default all of them for
#   vllm-mlx, "simple mllm paged" for rapid-mlx).
# Results: $SEED_DIR/reports/ (JUnit XML per mode, findings.jsonl with the reuse and worst
#   logit difference of every cached/uncached pair, the plugin's JSON report for mllm).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SEED_DIR="${SEED_DIR:-$ROOT/.seed-engines}"
PYTHON="${PYTHON:-python3}"
EXAMPLES="${SEED_EXAMPLES:-5}"
MODES="${SEED_MODES:-}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 APC_DISK_ENABLED=0
export RAPID_MLX_TELEMETRY=0 DO_NOT_TRACK=1 PIP_CACHE_DIR="$SEED_DIR/pip-cache"

action="${1:-all}"
shift || true
engines=("$@")
[ ${#engines[@]} -eq 0 ] && engines=(vllm-mlx rapid-mlx)

spec() {  # the pip requirement and the CLI function of an engine
  case "$1" in
    vllm-mlx) echo "vllm-mlx==0.6.0 vllm_mlx.cli:main" ;;
    rapid-mlx) echo "rapid-mlx==0.16.10 rapid_mlx.cli:main" ;;
    *) echo "unknown engine '$1' (vllm-mlx or rapid-mlx)" >&2; exit 2 ;;
  esac
}

install() {
  local name="$1" req venv
  read -r req _ <<<"$(spec "$name")"
  venv="$SEED_DIR/$name"
  mkdir -p "$SEED_DIR"
  [ -f "$SEED_DIR/.gitignore" ] || echo '*' >"$SEED_DIR/.gitignore"
  echo "== installing $req into $venv (about 6.5 GB)"
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "mlx[cpu]" "$req"
  # the tap launcher must be importable in the server's interpreter; its deps are already there
  "$venv/bin/python" -m pip install -q --no-deps -e "$ROOT"
  "$venv/bin/python" -c "import pytest_prefixcache.tap, mlx.core, mlx_lm, mlx_vlm; print('ok')"
  "$venv/bin/python" -m pip freeze >"$venv/freeze.txt"
}

verify() {
  local name="$1" cli venv mode
  read -r _ cli <<<"$(spec "$name")"
  venv="$SEED_DIR/$name"
  [ -x "$venv/bin/python" ] || { echo "no venv for $name: run '$0 install $name'" >&2; exit 2; }
  mkdir -p "$SEED_DIR/reports"
  # rapid-mlx has only its batched engine: its "simple" mode is that engine
  for mode in ${MODES:-$([ "$name" = rapid-mlx ] && echo "simple mllm paged" || echo "simple mllm cb paged")}; do
    echo "== $name: $mode"
    SEED_ENGINE="$name" SEED_MODE="$mode" SEED_PYTHON="$venv/bin/python" SEED_CLI="$cli" \
      SEED_FINDINGS="$SEED_DIR/reports/findings.jsonl" "$PYTHON" -m pytest -p no:randomly -q -rxXs "$ROOT/tests/test_adapters_seed.py" \
      --junitxml="$SEED_DIR/reports/$name-$mode-checks.xml" || true
    if [ "$mode" = mllm ]; then  # the plugin's full suite needs image support
      eval "$(SEED_ENGINE="$name" SEED_MODE="$mode" SEED_PYTHON="$venv/bin/python" \
        SEED_CLI="$cli" "$PYTHON" -c 'import sys; sys.path.insert(0, "'"$ROOT"'/tests"); \
import test_adapters_seed as s; print(s.exports())')"
      (cd "$SEED_DIR/reports" && "$PYTHON" -m pytest -p no:randomly -q --prefixcache-verify \
        --prefixcache-engine=pytest_prefixcache.adapters.presets:from_env \
        --prefixcache-examples="$EXAMPLES" --prefixcache-seed=1 --prefixcache-timeout=300 \
        --prefixcache-report="$name-$mode-suite.json") || true
    fi
  done
}

for name in "${engines[@]}"; do
  case "$action" in
    install) install "$name" ;;
    verify) verify "$name" ;;
    all) install "$name"; verify "$name" ;;
    *) echo "usage: $0 install|verify|all [vllm-mlx|rapid-mlx]..." >&2; exit 2 ;;
  esac
done
