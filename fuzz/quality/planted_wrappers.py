"""Planted bugs inside a real kernel's wrapper (issue 40): the user's glue code around FlashInfer is wrong, the
kernel itself is not. Proof that a gate or campaign routes attention through the kernel under test.

``flashinfer_decode_short_last_page`` is a user kernel (``MODULE:FUNCTION``) that hands FlashInfer's real
``BatchDecodeWithPagedKVCacheWrapper`` (tensor cores, NHD pages) a ``kv_last_page_len`` one short for every
request longer than one page, as an engine that computes ``seq_len % page_size`` where it needed
``(seq_len - 1) % page_size + 1`` would. FlashInfer then reads ``kv_len - 1`` keys: the newest token's own key
is dropped in every decode step of a request past its first page. Its twin ``flashinfer_decode_wrapped`` is the
same wrapper without the mistake (the control: it must pass wherever the bug is caught).

    pa-oracle fuzz --kernel pa_oracle.fuzz.quality.planted_wrappers:flashinfer_decode_short_last_page
    pa-oracle gate gsm8k -b pa_oracle.fuzz.quality.planted_wrappers:flashinfer_decode_short_last_page \\
        --prefill flashinfer-prefill-fa2 --model qwen05.gguf ...

Both need CUDA and ``flashinfer-python``. Only the options FlashInfer's prebuilt bf16 kernels cover are named in
the signature (no window, soft cap, ALiBi or fp8), so a campaign on a fresh install compiles nothing.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from pa_oracle.backends.user import declare
from pa_oracle.fuzz.quality.planted_user import _named

_WORKSPACE_BYTES = 128 << 20
_workspaces: dict[torch.device, torch.Tensor] = {}


def _workspace(device: torch.device) -> torch.Tensor:
    if device not in _workspaces:
        _workspaces[device] = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _workspaces[device]


def _decode(short_last_page: bool) -> Callable[..., Any]:
    """A decode kernel through FlashInfer's wrapper; ``short_last_page`` plants the wrapper bug."""

    @declare(devices=("cuda",), q_dtypes=("bfloat16", "float16"), head_dims=(64, 128), min_qo_len=1, max_qo_len=1,
             empty_requests=False, storages=("contiguous",))
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale):
        import flashinfer

        last_page_len = kv_last_page_len
        if short_last_page:  # the planted mistake, in the glue: one slot short past the first page
            pages = kv_indptr[1:] - kv_indptr[:-1]
            last_page_len = torch.where(pages > 1, kv_last_page_len - 1, kv_last_page_len).to(torch.int32)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_workspace(q.device), "NHD", use_tensor_cores=True)
        wrapper.plan(kv_indptr, kv_indices, last_page_len, q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1],
                     sm_scale=sm_scale, q_data_type=q.dtype, kv_data_type=k_cache.dtype)
        out, lse_base2 = wrapper.run(q, (k_cache, v_cache), return_lse=True)
        return out, lse_base2.float() * math.log(2.0)  # FlashInfer's LSE is base 2

    return kernel


flashinfer_decode_short_last_page = _named("flashinfer_decode_short_last_page", _decode(short_last_page=True))
flashinfer_decode_wrapped = _named("flashinfer_decode_wrapped", _decode(short_last_page=False))
