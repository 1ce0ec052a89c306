"""The GGUF header reader behind llama-server's per-family tolerance rules: the architecture
after other keys of every value kind, and clear errors for what is not a GGUF."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from pytest_prefixcache import EngineError
from pytest_prefixcache.adapters.gguf_header import gguf_architecture


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf(pairs: list[bytes], version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, 0, len(pairs)) + b"".join(pairs)


def kv_string(key: str, value: str) -> bytes:
    return _s(key) + struct.pack("<I", 8) + _s(value)


OTHERS = [
    _s("general.alignment") + struct.pack("<II", 4, 32),  # u32
    _s("x.f64") + struct.pack("<Id", 12, 1.5),
    _s("x.names") + struct.pack("<IIQ", 9, 8, 2) + _s("a") + _s("bc"),  # array of strings
    _s("x.ids") + struct.pack("<IIQ", 9, 5, 3) + struct.pack("<3i", 1, 2, 3),  # array of i32
    kv_string("general.name", "tiny"),
]


def test_the_architecture_is_found_after_keys_of_every_kind(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf([*OTHERS, kv_string("general.architecture", "gemma3")]))
    assert gguf_architecture(path) == "gemma3"
    path.write_bytes(gguf([kv_string("general.architecture", "llama"), *OTHERS], version=2))
    assert gguf_architecture(path) == "llama"


@pytest.mark.parametrize(
    "raw, match",
    [
        (b"PK\x03\x04", "not a GGUF file"),
        (gguf(OTHERS), "no general.architecture key"),
        (gguf([kv_string("general.architecture", "llama")])[:-3], "truncated or corrupt"),
        (gguf([], version=1), "GGUF version 1"),
        (gguf([_s("x") + struct.pack("<I", 99)]), "unknown value type 99"),
    ],
    ids=["magic", "no-key", "truncated", "version", "bad-type"],
)
def test_what_is_not_a_readable_gguf_is_named(tmp_path: Path, raw: bytes, match: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(raw)
    with pytest.raises(EngineError, match=match) as caught:
        gguf_architecture(path)
    assert str(path) in str(caught.value)
    with pytest.raises(EngineError, match="cannot read"):
        gguf_architecture(tmp_path / "missing.gguf")
