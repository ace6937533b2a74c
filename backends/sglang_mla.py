"""SGLang's Triton decode and extend kernels on MLA shapes (``Lq = 576``: 512 latent + 64 rope
dims, split inside the kernels as ``BLOCK_DMODEL`` + ``BLOCK_DPE``; ``Lv = 512``).

The latent cache is handed over as SGLang's MLA pool does: ``k_buffer`` the flat latent
``[tokens, 1, 576]`` and ``v_buffer`` its first 512 dims (``k_buffer[..., :512]``, the same
memory: ``MLATokenToKVPool.get_value_buffer``). Everything else is the GQA adapters'
(``sglang_triton``, ``sglang_extend``) with one KV head and the whole qo-head group on it. No fp8
(one latent cache, one scale: not mapped yet).

Checked against SGLang's source (``python/sglang/srt/layers/attention/triton_ops/``):
``decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale, logit_cap=, sinks=)`` takes the
grouped path (``kv_group_num = Hq // v_buffer.shape[1]`` > 1) with the 576 = 512 + 64 split,
reads V through ``v_buffer``'s own strides, ``Lv = v_buffer.shape[-1]`` sizes ``o`` and
``attn_logits [B, Hq, splits, Lv]`` (contiguous: stage 1 addresses ``attn_lse`` as offset //
Lv); ``extend_attention_fwd`` splits ``Lq`` 576 (and 288, 192) the same way, with ``kv_group_num
= Hq // k_extend.shape[1]`` and ``Lv = v_extend.shape[-1]``. ``tests/test_sglang_mla.py`` runs
both adapters through stand-ins that assert that convention.
"""

from __future__ import annotations

from pa_oracle.backends.base import register
from pa_oracle.backends.sglang_extend import SglangExtend
from pa_oracle.backends.sglang_triton import _SGLANG, _SglangDecode

# storages: the default only (the flat-buffer reads of the GQA adapters have not been run on the latent cache)
_MLA = {"mla": (True,), "mla_dims": ((576, 512),), "head_dims": None, "kv_dtypes": None, "fp8_scales": False,
        "storages": ("contiguous",)}


@register
class SglangDecodeMLA(_SglangDecode):
    name = "sglang-decode-mla"
    description = "SGLang Triton decode_attention_fwd on the MLA latent cache (576/512), four KV splits"
    num_kv_splits = 4
    capabilities = _SGLANG.replace(**_MLA)
    compile_fields = ("q_dtype", "group_size", "logits_soft_cap", "sinks")  # one latent head, the one dims pair


@register
class SglangExtendMLA(SglangExtend):
    name = "sglang-extend-mla"
    description = "SGLang Triton extend_attention_fwd on the MLA latent cache (576/512)"
    compile_fields = ("q_dtype", "causal", "window_left", "logits_soft_cap", "sinks")  # the one dims pair

    def __init__(self) -> None:
        super().__init__()
        self.capabilities = self.capabilities.replace(**_MLA)
