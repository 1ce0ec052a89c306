"""``tiny-llama-tuned.gguf``: tiny-llama.gguf with every norm weight scaled by 1.25, "another
fine-tune of the same shapes" (the reference engine's weights change at a restart,
reference_engine/persist.py), for the restart move's ``weights`` change on llama-server.

The draft model (fewer layers) has another KV layout, so llama-server refuses a slot saved by
tiny-llama (``llama_state_seq_load_file``); a fine-tune of the same shapes has the same
layout, and nothing in the slot file says which weights computed its KV. It also loads the
same LoRA (the draft does not: no ``blk.1``), so the changes combine in one stream.

``python engines/llama/tuned_gguf.py --gguf-py DIR SRC DST``: DIR is llama.cpp's ``gguf-py``
(the sdist's), SRC tiny-llama.gguf; deterministic (the same SRC gives the same bytes).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence

#: The factor on every ``*_norm.weight`` tensor (the reference engine's weights change).
FACTOR = 1.25


def tune(src: str, dst: str) -> int:
    """Copy ``src`` to ``dst`` and scale its norm weights in place; the tensors changed."""
    from gguf import GGUFReader  # llama.cpp's gguf-py (on sys.path from --gguf-py)

    shutil.copyfile(src, dst)
    reader = GGUFReader(dst, "r+")
    n = 0
    for tensor in reader.tensors:
        if tensor.name.endswith("_norm.weight"):
            tensor.data[...] = tensor.data * FACTOR
            n += 1
    reader.data.flush()
    return n


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py directory")
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args(argv)
    sys.path.insert(0, a.gguf_py)
    n = tune(a.src, a.dst)
    if n == 0:
        print(f"{a.src}: no *_norm.weight tensor to scale", file=sys.stderr)
        return 2
    print(f"{a.dst}: {n} norm tensors scaled by {FACTOR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
