"""Loaded by benchmarks/as_avx2.sh at every Python start: when charlm.runtime is imported, PyTorch's answer to
"does this CPU have native bf16?" becomes no, as on an AVX2-only CPU (so --precision auto picks fp32).
torch itself is not imported any earlier than charlm imports it (start-up tests stay meaningful)."""

import importlib.abc
import importlib.machinery
import sys


class _NoNativeBf16(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "charlm.runtime":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            import torch.cpu

            torch.cpu._is_avx512_bf16_supported = lambda: False
            torch.cpu._is_amx_tile_supported = lambda: False

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _NoNativeBf16())
