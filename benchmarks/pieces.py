"""Memory of the engine's remembered prompt pieces when full (``tokens.PieceTokenizer``).

    python benchmarks/pieces.py

Fills a ``PieceTokenizer`` on the tiny fixture's tokenizer with distinct pieces of
English-like text (the lines of the fixture tokenizer's training corpus, numbered) until it
holds ``MAX_CHARS`` characters, and prints the Python memory it keeps (tracemalloc: the
pieces and their token ids as Python ints), against the characters held.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc

from transformers import AutoTokenizer

from reference_engine import default_model_path
from reference_engine.fixtures.tokenizer import CORPUS
from reference_engine.tokens import MAX_CHARS, PieceTokenizer


def main() -> int:
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    lines = [line for line in CORPUS.splitlines() if line.strip()]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    pieces = PieceTokenizer.for_tokenizer(tokenizer)
    if pieces is None:
        raise SystemExit("the fixture's tokenizer cannot be cut at its added tokens")
    chars = i = 0
    while chars < MAX_CHARS:
        piece = f"{lines[i % len(lines)]} ({i})"
        pieces.encode(piece)
        chars += len(piece)
        i += 1
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    print(f"{i:,} pieces, {MAX_CHARS:,} characters at most: {held / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
