"""Start-up hook of the SGLang CPU venv (engines/sglang/install.sh runs it from a .pth file;
written for this project, no SGLang or torchvision code).

torchvision's wheel on the package index is built against CUDA: next to the CPU build of
torch its C extension does not load, so the operators ``torchvision::nms`` and
``torchvision::qnms`` are never defined, and ``torchvision/_meta_registrations.py`` then fails
at import (``register_fake("torchvision::nms")``: "operator torchvision::nms does not exist").
SGLang imports torchvision through transformers' image utilities on every start, and its
Qwen-VL processor uses torchvision's transforms (which need no C extension).

This hook waits for that module's import (a ``sys.meta_path`` finder, so the interpreter's
start stays cheap: nothing is imported until torchvision is) and, when the C extension did
not load, defines the two operators' schemas first, without kernels: the import succeeds, and
a call of either operator still fails ("no kernel"), as it would have before.

The same for SGLang's own CPU operators: with the CPU engine on, a few model and layer modules
read ``torch.ops.sgl_kernel.NAME`` at import (``srt/models/qwen3_5.py``, which the Qwen-VL
processor imports; ``grok.py``; the linear-attention backends), and the CPU build of
sgl-kernel that registers them is not on the package index. Before the first
``sglang.srt.models`` or ``sglang.srt.layers`` module is imported, those names are defined
without kernels (see :data:`SGL_KERNEL_NAMES`): the modules import, and calling one fails
loudly. None is defined that SGLang probes with ``hasattr`` to choose a path
(``convert_weight_packed`` keeps its Intel AMX backend off).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

TARGET = "torchvision._meta_registrations"
#: The operators _meta_registrations registers fakes for without checking that they exist.
SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
#: ``torch.ops.sgl_kernel`` names SGLang 0.5.23 reads at import on the CPU engine outside its
#: Intel AMX paths (found by reading every module-level access in its source).
SGL_KERNEL_NAMES = (
    "fused_dual_residual_rmsnorm_cpu",
    "fused_gdn_gating_cpu",
    "fused_moe_router_cpu",
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
    "fused_sigmoid_gating_delta_rule_update_cpu",
    "fused_sigmoid_mul_cpu",
    "rmsnorm_cpu",
)
SGLANG_MODULES = ("sglang.srt.models", "sglang.srt.layers")
_LIBRARIES: list[Any] = []  # a torch Library deregisters its definitions when collected
_DONE: set[str] = set()


def define_missing_ops() -> None:
    import torch
    import torchvision.extension

    if torchvision.extension._has_ops() or "torchvision" in _DONE:
        return
    _DONE.add("torchvision")
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in SCHEMAS:
        lib.define(schema)
    _LIBRARIES.append(lib)


def define_sgl_kernel_names() -> None:
    import torch

    if "sgl_kernel" in _DONE:
        return
    _DONE.add("sgl_kernel")
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name in SGL_KERNEL_NAMES:
        if not hasattr(torch.ops.sgl_kernel, name):
            lib.define(f"{name}(Tensor x) -> Tensor")
    _LIBRARIES.append(lib)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == TARGET:
            define_missing_ops()
        elif fullname in SGLANG_MODULES:
            define_sgl_kernel_names()
        return None  # the normal finders import the module itself


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
