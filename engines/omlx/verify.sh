#!/usr/bin/env bash
# Opt-in verification of oMLX (flyto-mlx 0.7.0) over its flag matrix (engines/omlx/matrix.toml).
#
# NOT part of CI. Needs the environment engines/omlx/install.sh makes (.engines/omlx/venv of the
# main checkout, or
# $OMLX_DIR/venv). The servers run there, under the logit tap, on 127.0.0.1 with ephemeral
# ports, each with a private HOME (oMLX's base path, its SSD cache and logs go there and are
# removed with it); the checks run from this project's Python ($PYTHON, default python3). The
# tap launcher imports pytest_prefixcache from this checkout (PYTHONPATH).
#
# Usage: engines/omlx/verify.sh [CONFIG...]   (default: every combination of the matrix file;
#   CONFIG: a configuration or combination name, e.g. omlx-llama or 'omlx-llama[ssd,b32]')
# Environment: OMLX_DIR, PYTHON, OMLX_EXAMPLES (per property and combination, default 3), OMLX_SEED
#   (Hypothesis' seed, default 1),
#   OMLX_MATRIX (default engines/omlx/matrix.toml), OMLX_RUN (the run directory's name, default
#   "all"), OMLX_CHECKS=0 (skip the targeted checks, engines/omlx/test_omlx_engine.py),
#   OMLX_CORPUS (a directory: each failure's shrunk counterexample is copied there as
#   <combination>-<check>/, e.g. fixtures/corpus/third_party), OMLX_REPORTS (default
#   $OMLX_DIR/reports), OMLX_SELECT (a pytest -k expression for the suite, e.g. 'test_waves or
#   test_request_streams'), OMLX_PYTEST_ARGS (more words for it, e.g. --tb=native).
# The waves property runs on the combinations whose args declare concurrency above 1 (the
#   *-waves configs of matrix.toml).
# Results in $OMLX_DIR/reports/run-<name>/: <combination>/suite.json and suite.log (one run
#   each; a combination with a suite.json is not run again unless OMLX_AGAIN=1),
#   tap/<slug>.jsonl (per request: the API's vs the tap's reuse), checks.xml (the targeted
#   checks), findings.md (the table of every combination).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
source "$ROOT/engines/lab/run_functions.sh"
# the main checkout's, shared by its worktrees like the other engines'; adapters.omlx finds
# the venv there
export OMLX_DIR="${OMLX_DIR:-$(lab_main_checkout)/.engines/omlx}"
EXAMPLES="${OMLX_EXAMPLES:-3}"
MATRIX="${OMLX_MATRIX:-$ROOT/engines/omlx/matrix.toml}"
RUN="${OMLX_REPORTS:-$OMLX_DIR/reports}/run-${OMLX_RUN:-all}"
select=()
[ -z "${OMLX_SELECT:-}" ] || select=(-k "$OMLX_SELECT")
more=()
read -r -a more <<<"${OMLX_PYTEST_ARGS:-}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

venv_python="$OMLX_DIR/venv/bin/python"
[ -x "$venv_python" ] || { echo "no oMLX environment at $OMLX_DIR/venv: run engines/omlx/install.sh" >&2; exit 2; }
version="$("$venv_python" -c "import importlib.metadata as m; print(m.version('flyto-mlx'))")"
# the tap launcher runs in the server's interpreter: this checkout's, not an installed copy
"$venv_python" -c "import pytest_prefixcache.tap as t; assert t.__file__.startswith('$ROOT')"

mkdir -p "$RUN/tap"
if [ "${OMLX_CHECKS:-1}" != 0 ]; then
  echo "== flyto-mlx $version: targeted checks (engines/omlx/test_omlx_engine.py)"
  (cd "$RUN" && nice -n 10 "$PYTHON" -m pytest -p no:randomly -p no:cacheprovider -q -rfEsxX \
    "$ROOT/engines/omlx/test_omlx_engine.py" "$ROOT/engines/omlx/test_omlx_padded_decode.py" --junitxml="$RUN/checks.xml" | tail -n 8) || true
fi
# one pytest run per combination (--prefixcache-matrix with one --prefixcache-config): each
# writes its own report as soon as it ends, so a long run keeps what it has done
while read -r combo; do
  out="$RUN/$(echo "$combo" | tr -c 'A-Za-z0-9.\n-' '_')"
  [ -f "$out/suite.json" ] && [ "${OMLX_AGAIN:-0}" != 1 ] && { echo "== $combo: done before"; continue; }
  rm -rf "$out" && mkdir -p "$out"
  echo "== flyto-mlx $version: $combo (the built-in suite, $EXAMPLES examples)"
  (cd "$out" && OMLX_TAP_LOGS="$RUN/tap" nice -n 10 "$PYTHON" -m pytest -p no:randomly \
    -p no:cacheprovider -q -rfE "${select[@]}" "${more[@]}" --prefixcache-verify \
    --pyargs pytest_prefixcache.suite \
    --prefixcache-matrix="$MATRIX" "--prefixcache-config=$combo" --prefixcache-allow-partial \
    --prefixcache-examples="$EXAMPLES" --prefixcache-seed="${OMLX_SEED:-1}" --prefixcache-timeout=300 \
    --prefixcache-report="$out/suite.json" >"$out/suite.log" 2>&1; tail -n 3 "$out/suite.log") || true
done < <(lab_combos "$MATRIX" "$@")
[ -z "${OMLX_CORPUS:-}" ] || "$PYTHON" "$ROOT/engines/omlx/findings.py" save "$RUN" "$MATRIX" "$OMLX_CORPUS"
"$PYTHON" "$ROOT/engines/omlx/findings.py" table "$RUN" "$MATRIX" "flyto-mlx $version" | tee "$RUN/findings.md"
