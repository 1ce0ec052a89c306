"""The reference engine's HTTP server, wrapped to corrupt ONE cached result (a negative control).

The first time a request restores cached KV blocks, their keys are perturbed by +0.05 inside
the engine's restore step; every other request is served correctly. Run as
``python tests/corrupt_reference_server.py --port P``.
"""

from __future__ import annotations

import argparse
from typing import Any

from reference_engine import Engine, default_model_path
from reference_engine.server import make_server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    engine = Engine.from_pretrained(default_model_path())
    restore = engine.model.restore
    corrupted: list[bool] = []

    def corrupt_once(blocks: Any, *args: Any, **kwargs: Any) -> Any:
        cache = restore(blocks, *args, **kwargs)
        if blocks and not corrupted:
            corrupted.append(True)
            for c in cache:
                c.keys = c.keys + 0.05
        return cache

    engine.model.restore = corrupt_once  # type: ignore[method-assign]
    make_server(engine, "127.0.0.1", args.port).serve_forever()


if __name__ == "__main__":
    main()
