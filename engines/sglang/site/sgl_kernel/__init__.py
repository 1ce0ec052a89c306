"""A stand-in for sgl-kernel on CPU (written for this project; no SGLang code).

SGLang 0.5.23 imports a few names from ``sgl_kernel`` unconditionally when its device is the
CPU (``kernels/ops/kvcache/cache_move.py``, ``srt/mem_cache/allocation.py``, the speculative
decoding kernels' modules; ``sgl_kernel.mamba`` for hybrid recurrent models), but the CPU build
of sgl-kernel is not on the package index. This module defines those names so the imports
succeed. It registers no ``torch.ops.sgl_kernel`` operator, so SGLang's Intel AMX backend stays
off (``_is_intel_amx_backend_available`` looks for ``convert_weight_packed``) and every layer
runs its plain torch path.

``assign_req_to_token_pool_cpu`` is implemented in torch from the Triton kernel it stands in
for (``assign_req_to_token_pool`` in allocation.py); the others raise, so a path that needs a
real kernel fails loudly instead of computing something wrong. Which of them a run called is
appended to ``$SGL_KERNEL_STUB_LOG`` when set.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]


def _called(name: str) -> None:
    log = os.environ.get("SGL_KERNEL_STUB_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(name + "\n")


def assign_req_to_token_pool_cpu(
    req_pool_indices: Any,
    req_to_token: Any,
    start_offset: Any,
    end_offset: Any,
    out_cache_loc: Any,
    pool_len: int,
) -> None:
    """``req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]`` = the next
    ``end_offset[i] - start_offset[i]`` entries of ``out_cache_loc`` (requests in order)."""
    _called("assign_req_to_token_pool_cpu")
    done = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()
    ):
        n = int(end) - int(start)
        req_to_token[int(row), int(start) : int(end)] = out_cache_loc[done : done + n]
        done += n


def missing(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        _called(name)
        raise NotImplementedError(
            f"sgl_kernel.{name}: the CPU kernel is not available (engines/sglang stub)"
        )

    kernel.__name__ = name
    return kernel


# speculative decoding (not run here) and the cache's layer-wise KV copy
assign_draft_cache_locs_contiguous_cpu = missing("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = missing("assign_extend_cache_locs_cpu")
build_tree_kernel_efficient_cpu = missing("build_tree_kernel_efficient_cpu")
copy_all_layer_kv_cache_cpu = missing("copy_all_layer_kv_cache_cpu")
fill_accept_out_cache_loc_cpu = missing("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = missing("fill_bonus_tokens_cpu")
rotate_input_ids_cpu = missing("rotate_input_ids_cpu")
verify_tree_greedy_cpu = missing("verify_tree_greedy_cpu")
