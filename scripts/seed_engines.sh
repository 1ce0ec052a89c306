#!/usr/bin/env bash
# Opt-in verification of the seed engines: vllm-mlx 0.6.0 and its fork rapid-mlx 0.16.10.
#
# NOT part of CI or the default install. Each engine gets its own virtual environment under
# $SEED_DIR (default: .seed-engines/ in the repository, git-ignored by its own .gitignore):
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
#   scripts/seed_engines.sh install [vllm-mlx|rapid-mlx]...   create the venvs (or reuse them)
#   scripts/seed_engines.sh verify  [vllm-mlx|rapid-mlx]...   run the checks (venvs must exist)
#   scripts/seed_engines.sh all     [vllm-mlx|rapid-mlx]...   both (default: both engines)
# Environment: SEED_DIR, PYTHON, SEED_EXAMPLES (plugin examples per property, default 100,
#   the plugin's own default),
#   SEED_MODES (space-separated subset of: simple mllm cb paged; default all of them for
#   vllm-mlx, "simple mllm paged" for rapid-mlx, whose only engine is the batched one),
#   SEED_CORPUS (a directory: each failure's shrunk counterexample is copied there as
#   <engine>-<mode>-<check>/, e.g. fixtures/corpus/third_party), SEED_REPORTS (default
#   $SEED_DIR/reports).
# Every mode runs the targeted checks (tests/test_adapters_seed.py) and the plugin's built-in
# suite (--prefixcache-verify, text-only streams except for --mllm), each against its own pair
# of servers started the same way (cached, and a cache-less cold baseline).
# Results, per mode in $SEED_DIR/reports/<engine>-<mode>/ (emptied first): checks.xml (JUnit
#   of a --runxfail run, so it holds what really failed),
#   checks.jsonl (reuse and worst logit difference per targeted pair), suite.json (the plugin's
#   report: requests, efficiency vs oracle, worst difference, failures and their saved streams
#   under .prefixcache/failures/), tap.jsonl (per request, the API's vs the tap's reuse),
#   suite.log, row.json; and $SEED_DIR/reports/findings.md, the table of every mode.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SEED_DIR="${SEED_DIR:-$ROOT/.seed-engines}"
PYTHON="${PYTHON:-python3}"
EXAMPLES="${SEED_EXAMPLES:-100}"
MODES="${SEED_MODES:-}"
REPORTS="${SEED_REPORTS:-$SEED_DIR/reports}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
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

verify() {
  local name="$1" req cli venv mode out version
  read -r req cli <<<"$(spec "$name")"
  venv="$SEED_DIR/$name"
  [ -x "$venv/bin/python" ] || { echo "no venv for $name: run '$0 install $name'" >&2; exit 2; }
  version="$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('${req%%==*}'))")"
  # the tap launcher runs in the server's interpreter: this checkout's, not an installed copy
  "$venv/bin/python" -c "import pytest_prefixcache.tap as t; assert t.__file__.startswith('$ROOT')"
  for mode in ${MODES:-$([ "$name" = rapid-mlx ] && echo "simple mllm paged" || echo "simple mllm cb paged")}; do
    echo "== $name $version: $mode"
    out="$REPORTS/$name-$mode"
    rm -rf "$out" && mkdir -p "$out"
    local -a seed_env=(SEED_ENGINE="$name" SEED_MODE="$mode" SEED_PYTHON="$venv/bin/python"
      SEED_CLI="$cli")
    # --runxfail: the findings need what really failed; seed_findings.py compares it with the
    # xfails the test module declares
    env "${seed_env[@]}" SEED_FINDINGS="$out/checks.jsonl" "$PYTHON" -m pytest -p no:randomly \
      -p no:cacheprovider -q -rfEs --runxfail "$ROOT/tests/test_adapters_seed.py" \
      --junitxml="$out/checks.xml" || true
    # the plugin's built-in suite against the same servers (from_env, configured by the test
    # module); run from $out, so its failures are saved under $out/.prefixcache/failures/
    (
      eval "$(env "${seed_env[@]}" "$PYTHON" -c 'import sys; sys.path.insert(0, sys.argv[1]);
import test_adapters_seed as s; print(s.exports())' "$ROOT/tests")"
      cd "$out" && PREFIXCACHE_TAP_LOG="$out/tap.jsonl" "$PYTHON" -m pytest -p no:randomly -q \
        -rfE --prefixcache-verify --prefixcache-engine=pytest_prefixcache.adapters.presets:from_env \
        --prefixcache-examples="$EXAMPLES" --prefixcache-seed=1 --prefixcache-timeout=300 \
        --prefixcache-report="$out/suite.json" 2>&1 | tee "$out/suite.log" | tail -n 25
    ) || true
    "$PYTHON" "$ROOT/scripts/seed_findings.py" row "$out" "$name" "$version" "$mode"
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
if [ "$action" != install ]; then
  [ -z "${SEED_CORPUS:-}" ] || "$PYTHON" "$ROOT/scripts/seed_findings.py" save "$REPORTS" "$SEED_CORPUS"
  "$PYTHON" "$ROOT/scripts/seed_findings.py" table "$REPORTS" | tee "$REPORTS/findings.md"
fi
