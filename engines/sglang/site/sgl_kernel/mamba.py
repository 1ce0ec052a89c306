"""``sgl_kernel.mamba``'s CPU names (SGLang's linear-attention backends import them on CPU);
each raises when called (see the package's docstring)."""

from __future__ import annotations

from . import missing

__all__ = ["causal_conv1d_fn_cpu", "causal_conv1d_update_cpu", "chunk_gated_delta_rule_cpu"]

causal_conv1d_fn_cpu = missing("causal_conv1d_fn_cpu")
causal_conv1d_update_cpu = missing("causal_conv1d_update_cpu")
chunk_gated_delta_rule_cpu = missing("chunk_gated_delta_rule_cpu")
