"""SGLang's Triton decode and extend kernels on MLA shapes (``Lq = 576``: 512 latent + 64 rope
dims, split inside the kernels as ``BLOCK_DMODEL`` + ``BLOCK_DPE``; ``Lv = 512``).

The latent cache is handed over as SGLang's MLA pool does: ``k_buffer`` the flat latent
``[tokens, 1, 576]`` and ``v_buffer`` its first 512 dims (``k_buffer[..., :512]``, the same
memory). Everything else is the GQA adapters' (``sglang_triton``, ``sglang_extend``) with one
KV head and the whole qo-head group on it. No fp8 (one latent cache, one scale: not mapped yet).
"""

from __future__ import annotations

from pa_oracle.backends.base import register
from pa_oracle.backends.sglang_extend import SglangExtend
from pa_oracle.backends.sglang_triton import _SGLANG, _SglangDecode

_MLA = {"mla": (True,), "mla_dims": ((576, 512),), "head_dims": None, "kv_dtypes": None, "fp8_scales": False}


@register
class SglangDecodeMLA(_SglangDecode):
    name = "sglang-decode-mla"
    description = "SGLang Triton decode_attention_fwd on the MLA latent cache (576/512), four KV splits"
    num_kv_splits = 4
    capabilities = _SGLANG.replace(**_MLA)


@register
class SglangExtendMLA(SglangExtend):
    name = "sglang-extend-mla"
    description = "SGLang Triton extend_attention_fwd on the MLA latent cache (576/512)"

    def __init__(self) -> None:
        super().__init__()
        self.capabilities = self.capabilities.replace(**_MLA)  # type: ignore[misc]
