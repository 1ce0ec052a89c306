"""A stub llama-server with slot files and LoRA scales (tests/stub_openai.py's llama flavour,
plus what ``adapters.llama_slots`` drives), so CI needs no llama-server.

Its identity is the model file, the K/V cache types and the ``--lora`` files; a request's is
the server's and its LoRA scales (its ``lora`` field: each loaded adapter's scale, unlisted
ones 0; without the field the server's own: 1, or 0 with ``--lora-init-without-apply``). The
identity is part of every prompt token's key and of the logits (the stub's toy model reads
it), so KV of one identity served to another changes the answer, as in llama-server.

``POST /slots/N?action=save|restore`` with ``{"filename": F}`` in ``--slot-save-path``: slot
0's file carries the whole cache and the server identity that computed it, the others none.
A restore into a server of another identity is refused (400, llama-server's "Unable to restore
slot"). Faults (``--fault`` or ``$STUB_FAULT``): ``restore_any_identity`` restores the file
into any identity, its KV re-keyed under the running one (what llama-server does with a file
saved without ``--lora``); ``restore_fails`` refuses every restore; ``restore_corrupt``
restores other KV than was saved (the tokens right, the rows not); ``lora_not_in_key`` keys the
cache without the request's LoRA scales (the numerics keep them: vLLM #44250's bug).

Run as ``python stub_llama_slots.py -m MODEL [llama-server's flags] --port P``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import urllib.parse
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import stub_openai
from stub_openai import Handler, Stub

_local = threading.local()
_render = stub_openai.render


def _render_with_identity(messages: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """The stub's render with the request's identity in every token's extra key."""
    ident = getattr(_local, "identity", "")
    return [(t, f"{extra}|{ident}") for t, extra in _render(messages)]


stub_openai.render = _render_with_identity  # the base Stub renders through the module's name


class SlotStub(Stub):
    """The llama flavour's cache, with an identity, LoRA scales and slot files."""

    def __init__(self, args: argparse.Namespace, fault: str) -> None:
        super().__init__("llama", fault, cache=not args.no_cache_prompt)
        self.server_identity = f"{Path(args.model).name}|{args.ctk}|{args.ctv}|{args.lora}"
        self.default_scales = [0.0 if args.lora_init_without_apply else 1.0] * len(args.lora)
        self.slot_dir = args.slot_save_path
        self.prefixes: dict[str, tuple[str, list[tuple[int, str]]]] = {}

    def identity(self, body: dict[str, Any]) -> str:
        scales = list(self.default_scales)
        if body.get("lora"):
            scales = [0.0] * len(scales)
            for entry in body["lora"]:
                scales[int(entry["id"])] = float(entry["scale"])
        return f"{self.server_identity}#lora={scales}"

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        _local.identity = self.identity(body)
        try:
            return super().complete(body)
        finally:
            _local.identity = ""

    def _key(self, salt: str, ext: list[tuple[int, str]]) -> str:
        if self.fault == "lora_not_in_key":
            ext = [(t, e.partition("#lora=")[0]) for t, e in ext]
        return super()._key(salt, ext)

    def _store(self, salt: str, ext: list[tuple[int, str]]) -> None:
        super()._store(salt, ext)
        for end in range(stub_openai.BLOCK, len(ext) + 1, stub_openai.BLOCK):
            self.prefixes[self._key(salt, ext[:end])] = (salt, ext[:end])

    def slot_action(self, slot: int, action: str, filename: str) -> tuple[int, Any]:
        if not self.slot_dir:
            return 501, {"error": {"code": 501, "message": "Start it with `--slot-save-path`"}}
        path = os.path.join(self.slot_dir, filename)
        if action == "save":
            entries = []
            if slot == 0:
                for key, (salt, prefix) in self.prefixes.items():
                    if key in self.index:
                        entries.append([salt, prefix, self.slots[self.index[key]]])
            saved = {"identity": self.server_identity, "entries": entries}
            Path(path).write_text(json.dumps(saved), encoding="utf-8")
            return 200, {"id_slot": slot, "n_saved": len(entries) * stub_openai.BLOCK}
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
        foreign = saved["identity"] != self.server_identity
        if self.fault == "restore_fails" or (foreign and self.fault != "restore_any_identity"):
            message = "Unable to restore slot: No available space in KV cache or invalid slot save"
            return 400, {"error": {"code": 400, "message": message}}
        with self.lock:
            for salt, prefix, block in saved["entries"]:
                prefix = [(t, e) for t, e in prefix]
                if foreign:  # the tokens match; the KV is the old identity's
                    ident = f"{self.server_identity}#lora={self.default_scales}"
                    prefix = [(t, e.split("|", 1)[0] + "|" + ident) for t, e in prefix]
                key = self._key(salt, prefix)
                torn = self.fault == "restore_corrupt"  # the rows read back are not the saved
                self.slots.append([(t, e + "~" if torn else e) for t, e in block])
                self.index[key] = self.lru[key] = len(self.slots) - 1
                self.prefixes[key] = (salt, prefix)
        return 200, {"id_slot": slot, "n_restored": len(saved["entries"]) * stub_openai.BLOCK}

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        url = urllib.parse.urlsplit(path)
        if url.path.startswith("/slots/"):
            action = urllib.parse.parse_qs(url.query).get("action", [""])[0]
            return self.slot_action(int(url.path.rsplit("/", 1)[1]), action, body["filename"])
        return super().post(url.path, body)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-ctk", "--cache-type-k", dest="ctk", default="f16")
    ap.add_argument("-ctv", "--cache-type-v", dest="ctv", default="f16")
    ap.add_argument("--lora", action="append", default=[])
    ap.add_argument("--lora-init-without-apply", action="store_true")
    ap.add_argument("--slot-save-path", default="")
    ap.add_argument("--no-cache-prompt", action="store_true")
    ap.add_argument("--fault", default=os.environ.get("STUB_FAULT", ""))
    ap.add_argument("--port", type=int, required=True)
    return ap.parse_known_args(argv)[0]


if __name__ == "__main__":  # llama-server's other arguments are ignored
    a = parse()
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.stub = SlotStub(a, a.fault)  # type: ignore[attr-defined]
    srv.serve_forever()
