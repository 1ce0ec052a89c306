#!/usr/bin/env bash
# Verify SGLang 0.5.23 on CPU: the targeted checks (engines/sglang/test_sglang_server.py) and the
# plugin's built-in suite over engines/sglang/matrix.toml. Opt-in, NOT part of CI; needs
# engines/sglang/install.sh first (this script builds the tiny HF models if they are missing).
#
# Usage:
#   engines/sglang/verify.sh checks            the targeted checks (one server, ~5 min)
#   engines/sglang/verify.sh suite [CONFIG]... the suite per matrix configuration (default: the
#                                              plain combination), one report each; "all":
#                                              every combination, one after another
#   engines/sglang/verify.sh list              the matrix's configuration names
# Environment: ENGINES_DIR (default: the main checkout's .engines/), PYTHON (this project's
#   interpreter, default .venv/bin/python of this checkout, else python3), SGLANG_EXAMPLES
#   (examples per property, default 3: SGLang on 2 shared cores is slow), SGLANG_REPORTS
#   (default $ENGINES_DIR/sglang/reports). Servers run niced on 127.0.0.1 with kernel-chosen
#   ports, each in a private HOME; everything they write goes with it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
COMMON="$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
MAIN_CHECKOUT="$([ -n "$COMMON" ] && dirname "$COMMON" || echo "$ROOT")"
export ENGINES_DIR="${ENGINES_DIR:-$MAIN_CHECKOUT/.engines}"
VENV="$ENGINES_DIR/sglang/venv"
DEFAULT_PYTHON="$ROOT/.venv/bin/python"
[ -x "$DEFAULT_PYTHON" ] || DEFAULT_PYTHON=python3
PYTHON="${PYTHON:-$DEFAULT_PYTHON}"
EXAMPLES="${SGLANG_EXAMPLES:-3}"
REPORTS="${SGLANG_REPORTS:-$ENGINES_DIR/sglang/reports}"
export SGLANG_MODELS="${SGLANG_MODELS:-$ENGINES_DIR/sglang/models}"
export SGLANG_LAB=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$HERE:$ROOT/tests:$ROOT${PYTHONPATH:+:$PYTHONPATH}"

[ -x "$VENV/bin/python" ] || { echo "no SGLang venv at $VENV: run engines/sglang/install.sh" >&2; exit 2; }
if [ ! -f "$SGLANG_MODELS/tiny-llama-hf/config.json" ]; then
  scratch="$(mktemp -d)"
  HOME="$scratch" XDG_CACHE_HOME="$scratch/.cache" HF_HOME="$scratch/hf" \
    nice -n 10 "$VENV/bin/python" "$HERE/build_models.py" --out "$SGLANG_MODELS"
  rm -rf "$scratch"
fi

action="${1:-checks}"
shift || true
case "$action" in
  list)
    "$PYTHON" - "$HERE/matrix.toml" <<'EOF'
import sys
from pathlib import Path
from pytest_prefixcache.session.matrix_file import read_matrix
for target in read_matrix(Path(sys.argv[1])):
    print(target.name)
EOF
    ;;
  checks)
    mkdir -p "$REPORTS"
    nice -n 10 "$PYTHON" -m pytest -p no:randomly -q -rfEsx "$ROOT/engines/sglang/test_sglang_server.py" \
      --junitxml="$REPORTS/checks.xml" 2>&1 | tail -n 20
    ;;
  suite)
    configs=("$@")
    [ ${#configs[@]} -eq 0 ] && configs=("sglang[radix,whole,p1,report]")
    [ "${configs[0]}" = all ] && mapfile -t configs < <("$0" list)
    for config in "${configs[@]}"; do
      slug="$(echo "$config" | tr -c 'A-Za-z0-9_.-' '_')"
      out="$REPORTS/$slug"
      rm -rf "$out" && mkdir -p "$out"
      echo "== $config -> $out"
      (
        cd "$out" && nice -n 10 "$PYTHON" -m pytest -p no:randomly -q -rfE --prefixcache-verify \
          --pyargs pytest_prefixcache.suite --prefixcache-matrix="$HERE/matrix.toml" \
          --prefixcache-config="$config" --prefixcache-allow-partial \
          --prefixcache-examples="$EXAMPLES" --prefixcache-seed=1 --prefixcache-timeout=900 \
          --prefixcache-report="$out/suite.json" 2>&1 | tee "$out/suite.log" | tail -n 25
      ) || true
    done
    ;;
  *) echo "usage: $0 checks|suite [CONFIG]...|list" >&2; exit 2 ;;
esac
