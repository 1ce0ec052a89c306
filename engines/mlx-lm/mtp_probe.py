"""Can the Gemma 4 MTP fork of mlx-lm (mlx-lm-broomva 0.31.3) be verified? (issue #35 item 2)

Opt-in, not CI. Run with the fork first on the path, e.g.::

    pip install --no-deps --target .engines/mtp/site mlx_lm_broomva-0.31.3-py3-none-any.whl
    PYTHONPATH=.engines/mtp/site python engines/mlx-lm/mtp_probe.py [WORK_DIR]

1. Builds an MTP drafter for fixtures/tiny-gemma4-text offline: the fork's
   ``models/gemma4_assistant.py`` with random weights (2 layers, Q-only cross-attention to the
   target's K/V), the fixture's tokenizer; ``hidden_size_per_layer_input`` and
   ``vocab_size_per_layer_input`` are 0 (transformers' Gemma4Assistant config requires it).
2. The server: ``mlx_lm.server --draft-model DRAFTER`` on 127.0.0.1, one chat request; prints
   the HTTP status, the body's length and the server's last exception line.
3. The library: greedy ``stream_generate`` with the drafter (``mtp_speculative_generate_step``)
   against the same call without it, on prompts short and long against the fixture's sliding
   window (32). The fork's docstring promises the same tokens.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "tiny-gemma4-text"
TEXT_KEYS = (
    "hidden_size intermediate_size num_attention_heads num_key_value_heads head_dim "
    "global_head_dim rms_norm_eps sliding_window rope_parameters max_position_embeddings "
    "vocab_size hidden_activation final_logit_softcapping"
).split()


def make_drafter(out: Path) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    ga = importlib.import_module("mlx_lm.models.gemma4_assistant")  # the fork's module only

    target = json.loads((FIXTURE / "config.json").read_text())
    text = {key: target[key] for key in TEXT_KEYS}
    text.update(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    text.update(hidden_size_per_layer_input=0, vocab_size_per_layer_input=0)
    config = {
        "model_type": "gemma4_assistant",
        "backbone_hidden_size": target["hidden_size"],
        "num_centroids": 8,
        "centroid_intermediate_top_k": 4,
        "use_ordered_embeddings": False,
        "tie_word_embeddings": True,
        "vocab_size": target["vocab_size"],
        "text_config": text,
    }
    mx.random.seed(0)
    model = ga.Model(ga.ModelArgs.from_dict(config))
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(FIXTURE / name, out / name)
    return out


def probe_server(drafter: Path, work: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (work / "server.log").open("w")
    argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(FIXTURE), "--draft-model"]
    argv += [str(drafter), "--num-draft-tokens", "2", "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "HOME": str(work / "home"), "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        request = urllib.request.Request(
            f"{url}/v1/chat/completions",
            json.dumps({**body, "temperature": 0}).encode(),
            {"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                print(f"server: HTTP {reply.status}, body {len(reply.read())} bytes")
        except OSError as error:  # http.client's RemoteDisconnected is one
            print(f"server: the request failed: {error!r}")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    errors = [line for line in (work / "server.log").read_text().splitlines() if "Error" in line]
    print("server: last exception:", errors[-1] if errors else "none")


def probe_library(drafter: Path) -> None:
    import mlx_lm
    from mlx_lm.generate import stream_generate

    model, tokenizer = mlx_lm.load(str(FIXTURE))[:2]
    draft = mlx_lm.load(str(drafter))[0]
    for repeat in (1, 4, 6, 12):
        prompt = tokenizer.encode("hello world " * repeat)
        plain = [g.token for g in stream_generate(model, tokenizer, prompt, max_tokens=8)]
        for n in (1, 2):
            mtp = stream_generate(
                model, tokenizer, prompt, max_tokens=8, draft_model=draft, num_draft_tokens=n
            )
            tokens = [g.token for g in mtp]
            same = "same" if tokens == plain else f"DIFFERENT {tokens} vs {plain}"
            print(f"library: prompt {len(prompt)}, +8 tokens, {n} drafted: {same}")


def probe(work: Path) -> None:
    drafter = make_drafter(work / "drafter")
    probe_server(drafter, work)
    probe_library(drafter)


def main() -> None:
    if len(sys.argv) > 1:  # a directory to keep (the drafter, the server's log)
        probe(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as work:
        probe(Path(work))


if __name__ == "__main__":
    main()
