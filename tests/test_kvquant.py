"""The reference engine's quantized-KV mode (``reference_engine/kvquant.py``): bit-exact cold
vs warm, the setting in the cache key, its configuration (engine, environment, server flags),
and the class-18 mutants that break it (``kv_bits_not_keyed`` under a switch of the bits,
``kv_start_off_by_one_block``), each caught and shrunk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from pytest_prefixcache import Message, Request, Verifier  # noqa: E402
from pytest_prefixcache.errors import EngineError, VerificationFailure  # noqa: E402
from pytest_prefixcache.types import ReplyOf  # noqa: E402
from pytest_prefixcache.verify.verifier import VerifyOptions  # noqa: E402
from reference_engine import Engine, default_engine  # noqa: E402
from reference_engine.blocks import namespace_root  # noqa: E402
from reference_engine.kvquant import (  # noqa: E402
    KV_ENV,
    KVQuant,
    fake_quantize,
    kv_quant_from_env,
    quantize_from,
)
from reference_engine.model import LoadedModel  # noqa: E402
from reference_engine.mutants import MUTANTS  # noqa: E402
from reference_engine.mutants.kvquant import SwitchingKV  # noqa: E402
from reference_engine.mutants.table import detect  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = Message("system", ("You are a careful assistant. Describe what you are shown precisely.",))
FIRST = Request((SYSTEM, Message("user", ("describe the image, thanks",))), "", 4)


def conversation() -> list[Request]:
    out = [FIRST]
    for i, text in enumerate(("and now", "compare them with the first one")):
        prev = out[-1]
        msgs = (*prev.messages, Message("assistant", (ReplyOf(i),)), Message("user", (text,)))
        out.append(Request(msgs, "", 4))
    return out


def diff(a: Any, b: Any) -> float:
    return float(np.abs(np.asarray(a.logits) - np.asarray(b.logits)).max())


# -- the scheme -----------------------------------------------------------------------------
def test_fake_quantize_is_row_local_and_on_the_grid() -> None:
    x = mx.random.normal((1, 2, 9, 16), key=mx.random.key(0))
    whole = fake_quantize(x, 4, 16)
    parts = mx.concatenate(
        [fake_quantize(x[:, :, :4], 4, 16), fake_quantize(x[:, :, 4:], 4, 16)], 2
    )
    assert mx.array_equal(whole, parts)  # a row's value never depends on its neighbours
    levels = [np.unique(np.asarray(whole[0, h, r])).size for h in range(2) for r in range(9)]
    assert max(levels) <= 16 and not mx.array_equal(whole, x)
    assert float(mx.abs(fake_quantize(x, 8, 16) - x).max()) < float(mx.abs(whole - x).max())
    # by position: rows before the start untouched, the rest quantized as if alone
    s = KVQuant(4, 16, 5)
    y = quantize_from(x, 3, s)
    assert mx.array_equal(y[:, :, :2], x[:, :, :2]) and mx.array_equal(y[:, :, 2:], whole[:, :, 2:])
    assert quantize_from(x, 0, KVQuant(4, 16, 9)) is x


@pytest.mark.parametrize(
    "setting",
    [KVQuant(4), KVQuant(8, 0, 20), KVQuant(2, 0, 33)],
    ids=lambda s: s.label,
)
def test_quantized_kv_is_bit_exact_cold_vs_warm(
    model: LoadedModel, setting: KVQuant, tmp_path: Path
) -> None:
    """A closed-loop conversation: every turn reuses the last, exactly, and quantization is
    really on (the cold logits move away from the unquantized engine's)."""
    engine = Engine(model, kv_quant=setting)
    steps = Verifier(engine, options=VerifyOptions(failures_dir=tmp_path)).run(conversation())
    assert all(s.comparison.worst_diff == 0.0 for s in steps)
    assert all(s.cached.cached_tokens for s in steps[1:])
    plain = Engine(model).run(steps[-1].request, use_cache=False)
    assert diff(plain, engine.run(steps[-1].request, use_cache=False)) > 1e-3


@pytest.mark.parametrize("fixture", ["tiny-gemma3", "tiny-qwen3.5-vl"])
def test_quantized_kv_is_bit_exact_on_windows_and_recurrent_layers(
    models: Any, fixture: str
) -> None:
    engine = Engine(models(fixture), kv_quant=KVQuant(4, 0, 8))
    engine.run(FIRST)
    nxt = conversation()[1]
    warm, cold = engine.run(nxt), engine.run(nxt, use_cache=False)
    assert warm.cached_tokens and diff(warm, cold) == 0.0 and warm.tokens == cold.tokens


# -- the key --------------------------------------------------------------------------------
def test_the_setting_is_in_the_root_and_off_leaves_the_keys_alone(model: LoadedModel) -> None:
    plain = Engine(model)
    assert plain.root("ns") == namespace_root(plain.identity.digest, "ns")
    roots = {
        Engine(model, kv_quant=q).root("ns")
        for q in (KVQuant(4), KVQuant(8), KVQuant(4, 0, 16), KVQuant(4, 16))
    }
    assert len(roots) == 3  # 4 bits with group 0 is group 16 on a head dim of 16
    assert plain.root("ns") not in roots


def test_a_switch_of_bits_reuses_nothing_stored_under_the_other(model: LoadedModel) -> None:
    engine = Engine(model, kv_quant=KVQuant(8))
    engine.run(FIRST)
    engine.set_kv_quant(KVQuant(4))
    warm, cold = engine.run(FIRST), engine.run(FIRST, use_cache=False)
    assert warm.cached_tokens == 0 and diff(warm, cold) == 0.0
    again = engine.run(FIRST)
    assert again.cached_tokens and diff(again, cold) == 0.0
    engine.set_kv_quant(KVQuant(8))  # the 8-bit blocks are still there, under their key
    assert engine.run(FIRST).cached_tokens == again.cached_tokens


# -- configuration --------------------------------------------------------------------------
def test_the_environment_selects_the_mode(model: LoadedModel, monkeypatch: Any) -> None:
    bits, group, start = KV_ENV
    for name in KV_ENV:
        monkeypatch.delenv(name, raising=False)
    assert kv_quant_from_env() is None and Engine(model).kv_quant is None
    monkeypatch.setenv(bits, "4")
    monkeypatch.setenv(start, "32")
    assert Engine(model).kv_quant == KVQuant(4, 16, 32)
    assert default_engine().kv_quant == KVQuant(4, 16, 32)  # the plugin's default engine
    assert Engine(model, kv_quant=KVQuant(8)).kv_quant == KVQuant(8, 16, 0)
    monkeypatch.setenv(group, "32")
    with pytest.raises(EngineError, match=r"group size 32 does not divide .* head dimension 16"):
        Engine(model)
    monkeypatch.setenv(bits, "7")
    with pytest.raises(EngineError, match=r"PREFIXCACHE_REFERENCE_KV_BITS.*bits 7 is not one of"):
        kv_quant_from_env()
    monkeypatch.setenv(bits, "four")
    with pytest.raises(
        EngineError, match=r"PREFIXCACHE_REFERENCE_KV_BITS='four' is not an integer"
    ):
        kv_quant_from_env()
    monkeypatch.setenv(bits, "4")
    monkeypatch.setenv(start, "-1")
    with pytest.raises(EngineError, match="start -1 is not an int >= 0"):
        kv_quant_from_env()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kv-bits", "7"], "KV bits 7 is not one of"),
        (["--kv-bits", "4", "--quantized-kv-start", "-2"], "start -2 is not an int >= 0"),
    ],
)
def test_server_flags_are_checked(flags: list[str], message: str, capsys: Any) -> None:
    from reference_engine.server import main

    with pytest.raises(SystemExit) as info:
        main(["--port", "0", *flags])
    assert info.value.code == 2 and message in capsys.readouterr().err


# -- the mutants ----------------------------------------------------------------------------
def test_kv_bits_not_keyed_is_caught_after_a_switch_and_shrunk(
    model: LoadedModel, tmp_path: Path
) -> None:
    """Served at 8 bits, then at 4: the mutant hands the 4-bit request the 8-bit rows and the
    verifier sees the logits differ; Hypothesis shrinks it to one short request. The
    unmodified engine under the same switch passes."""
    mutant = SwitchingKV(MUTANTS["kv_bits_not_keyed"].build(model), KVQuant(4))
    row = detect(mutant, name="kv_bits_not_keyed", examples=5, seed_value=0, shrink=True)
    assert row.detected and row.check == "equivalence", row.headline
    assert row.size is not None and row.size[0] == 1, row.size
    clean = SwitchingKV(Engine(model, kv_quant=KVQuant(8)), KVQuant(4))
    assert not detect(clean, examples=5, seed_value=0, shrink=False).detected
    Verifier(clean, options=VerifyOptions(failures_dir=tmp_path)).run(row.stream)


def test_kv_start_off_by_one_block_fails_where_the_engine_passes(
    model: LoadedModel, tmp_path: Path
) -> None:
    mutant = MUTANTS["kv_start_off_by_one_block"]
    stream = [FIRST, FIRST]
    options = VerifyOptions(failures_dir=tmp_path)
    with pytest.raises(VerificationFailure) as info:
        Verifier(mutant.build(model), options=options).run(stream)
    assert info.value.check == "equivalence"
    Verifier(Engine(model, **mutant.options), options=options).run(stream)
    # a start of 0: the block "before" it is block 0 too, so the mutant is exact there
    Verifier(mutant.build(model, kv_quant=KVQuant(4)), options=options).run(stream)


# -- the default run ------------------------------------------------------------------------
def _verify(tmp_path: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    cmd = [sys.executable, "-m", "pytest", "--prefixcache-verify", "--prefixcache-examples=3"]
    cmd += ["--prefixcache-seed=1", "-p", "no:cacheprovider", "-q", *extra]
    return subprocess.run(
        cmd, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_the_default_run_passes_with_quantized_kv_and_catches_the_start_mutant(
    tmp_path: Path,
) -> None:
    """``PREFIXCACHE_REFERENCE_KV_BITS=4`` turns the mode on for the plugin's default engine:
    the default verification passes bit-exact; the same run against the mutant fails."""
    env = {KV_ENV[0]: "4", KV_ENV[2]: "16"}
    res = _verify(tmp_path, **env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    bad = _verify(
        tmp_path, "--prefixcache-engine=reference_engine.mutants:kv_start_off_by_one_block", **env
    )
    assert bad.returncode == 1 and "equivalence" in bad.stdout, bad.stdout[-3000:]


def test_the_audits_fresh_instance_quantizes_as_the_engine_runs_now(model: LoadedModel) -> None:
    engine = Engine(model, kv_quant=KVQuant(8))  # given as an argument, not by the environment
    assert engine.fresh_instance().kv_quant == engine.kv_quant
    engine.set_kv_quant(KVQuant(4, 0, 16))  # switched since
    assert engine.fresh_instance().kv_quant == engine.kv_quant
    # negative control: the configuration the engine was built with alone would build a fresh
    # instance that does not quantize, and its cold runs differ from the engine's
    plain = Engine(model, **{**engine._config, "cache_dir": None})
    assert plain.kv_quant != engine.kv_quant
