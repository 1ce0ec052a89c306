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
_LIBRARIES: list[Any] = []  # a torch Library deregisters its definitions when collected


def define_missing_ops() -> None:
    import torch
    import torchvision.extension

    if torchvision.extension._has_ops() or _LIBRARIES:
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in SCHEMAS:
        lib.define(schema)
    _LIBRARIES.append(lib)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == TARGET:
            define_missing_ops()
        return None  # the normal finders import the module itself


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
