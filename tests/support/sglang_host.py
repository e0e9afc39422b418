"""SGLang's own host KV pools (MHA and MLA), built on the CPU for the HiCache storage tests.

``sglang.srt.mem_cache.pool_host`` reaches ``sglang.srt.configs``, whose
``__init__`` imports every model config, and two of them (the InternVL and
DeepSeek-OCR image configs) import ``torchvision`` at module level for image
transforms they define.  No torchvision wheel works beside the CPU torch
2.13 this project tests with (PyPI's builds register their C++ operators
against another torch and fail at import, which is also why the Makefile
uninstalls the one vLLM pulls in).  So, when torchvision is absent,
:func:`import_host_pools` lets *only SGLang's modules* import an empty
stand-in for it while the pool modules load, then removes it from
``sys.modules``: no image transform is ever called, and nothing imported
later sees it.  With torchvision installed it does nothing special.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

__all__ = ["import_host_pools", "mamba_pool", "mha_pool", "mla_pool"]


class _Placeholder(type):
    """A class whose attributes are classes: ``T.InterpolationMode.BICUBIC`` resolves."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})


def _stand_in(name: str) -> types.ModuleType:
    module = types.ModuleType(name, "empty stand-in for torchvision (tests/support/sglang_host.py)")
    module.__path__ = []

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(attr, (), {})

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _stand_in(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _SGLangOnlyFinder(importlib.abc.MetaPathFinder):
    """Serves ``torchvision*`` to imports made from inside the ``sglang`` package only."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torchvision" and not name.startswith("torchvision."):
            return None
        frame = sys._getframe(1)
        while frame is not None and "importlib" in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is None or "/sglang/" not in frame.f_code.co_filename:
            return None
        return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)


def import_host_pools() -> tuple[Any, Any, Any]:
    """SGLang's ``MHATokenToKVPoolHost``, ``MLATokenToKVPoolHost`` and ``device_pool_info``."""
    if importlib.util.find_spec("torchvision") is not None:
        from sglang.srt.mem_cache import device_pool_info
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

        return MHATokenToKVPoolHost, MLATokenToKVPoolHost, device_pool_info
    import transformers  # noqa: F401  (decides torchvision is absent before the stand-in exists)

    finder = _SGLangOnlyFinder()
    sys.meta_path.insert(0, finder)
    try:
        from sglang.srt.mem_cache import device_pool_info
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
    return MHATokenToKVPoolHost, MLATokenToKVPoolHost, device_pool_info


def _pointer_table(tensors: tuple[Any, ...]) -> Any:
    import torch

    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.uint64)


def mha_pool(
    layout: str, *, layers: int = 2, heads: int = 2, head_dim: int = 16, page_size: int = 4,
    device_tokens: int = 64, dtype: Any = None,
) -> Any:
    """An ``MHATokenToKVPoolHost`` over CPU "device" buffers, holding twice their tokens."""
    import torch

    mha_cls, _, info = import_host_pools()
    dtype = dtype or torch.bfloat16
    k = tuple(torch.zeros(device_tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(device_tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    buffers = info.KVBuffers(
        k=k, v=v, k_data_ptrs=_pointer_table(k), v_data_ptrs=_pointer_table(v),
        layout=info.KVBufferLayout.NHD,
    )
    buffer_info = info.MHABufferInfo(
        buffers=buffers, page_size=page_size, head_num=heads, head_dim=head_dim,
        v_head_dim=head_dim, dtype=dtype, device=torch.device("cpu"),
    )
    return mha_cls(
        buffer_info, 2.0, 0, page_size, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=device_tokens, start_layer=0, end_layer=layers,
    )


def mla_pool(
    layout: str, *, layers: int = 2, lora_rank: int = 32, rope_dim: int = 16, page_size: int = 4,
    device_tokens: int = 64, dtype: Any = None,
) -> Any:
    """An ``MLATokenToKVPoolHost`` (one latent row per token and layer) over CPU buffers."""
    import torch

    _, mla_cls, info = import_host_pools()
    dtype = dtype or torch.bfloat16
    dim = lora_rank + rope_dim
    rows = tuple(torch.zeros(device_tokens, 1, dim, dtype=dtype) for _ in range(layers))
    buffer_info = info.MLABufferInfo(
        buffers=rows, data_ptrs=_pointer_table(rows), layer_indices=tuple(range(layers)),
        device_layer_num=layers, page_size=page_size, kv_lora_rank=lora_rank,
        qk_rope_head_dim=rope_dim, kv_cache_dim=dim, dtype=dtype, device=torch.device("cpu"),
    )
    return mla_cls(
        buffer_info, 2.0, 0, page_size, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=device_tokens, start_layer=0, end_layer=layers,
        target_layer_num=layers,
    )


def mamba_pool(*, layers: int = 2, slots: int = 8, state: int = 4) -> Any:
    """A ``MambaPoolHost`` (a hybrid model's per-request SSM and conv states) on the CPU."""
    import torch

    import_host_pools()
    from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

    info = MambaStateBufferInfo(
        temporal=torch.zeros(layers, slots, 2, state, dtype=torch.float32),
        conv=(torch.zeros(layers, slots, 3, state, dtype=torch.bfloat16),),
    )
    return MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False, device="cpu",
                         layout="page_first")
