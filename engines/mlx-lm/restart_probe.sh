#!/usr/bin/env bash
# Does mlx_lm.server keep its prompt cache across a restart? (issue #34: the restart move needs an
# engine whose cache outlives the process; mlx_lm.server's LRUPromptCache lives in memory only,
# server.py, and it has no load of a saved cache.) One prompt twice on a server (the positive
# control: the repeat reuses), then once on a new server with the same command (0 = nothing kept).
# Usage: engines/mlx-lm/restart_probe.sh [MODEL_DIR]   (PYTHON: this project's Python)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
MODEL="$(cd "${1:-$ROOT/fixtures/tiny-llama}" && pwd)"
WORK="$(mktemp -d)"
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
export HF_HUB_OFFLINE=1 HOME="$WORK/home" HF_HUB_CACHE="$WORK/home/hub" TMPDIR="$WORK"
mkdir -p "$HOME"
PORT="$("$PYTHON" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")"
BODY="{\"model\": \"$MODEL\", \"max_tokens\": 4, \"temperature\": 0, \"messages\": [{\"role\": \"user\", \"content\": \"Tell me about the history of the printing press in Europe, from Gutenberg onward, with dates and places.\"}]}"
start() {
  "$PYTHON" -m mlx_lm.server --model "$MODEL" --host 127.0.0.1 --port "$PORT" >"$WORK/server.log" 2>&1 &
  PID=$!
  for _ in $(seq 120); do curl -sf "127.0.0.1:$PORT/v1/models" >/dev/null && return; sleep 0.5; done
  echo "mlx_lm.server did not answer on 127.0.0.1:$PORT" >&2; cat "$WORK/server.log" >&2; exit 1
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""; }
ask() {
  curl -sf "127.0.0.1:$PORT/v1/chat/completions" -H 'content-type: application/json' -d "$BODY" |
    "$PYTHON" -c "import json, sys; u = json.load(sys.stdin)['usage']; print('$1: prompt', u['prompt_tokens'], 'cached', (u.get('prompt_tokens_details') or {}).get('cached_tokens', 0))"
}
start; ask "first"; ask "repeat (same server)"; stop
start; ask "after a restart"; stop
