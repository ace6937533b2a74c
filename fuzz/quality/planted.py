"""Planted-bug kernels (the user-kernel signature, torch, any device): one per bug class of
ANCHORS.md section 6 that a kernel can show, plus correct kernels rounded differently from the
oracle that must *not* be flagged. ``pa-oracle selftest`` measures the suite's detection power
on them.

Every kernel is ``_paged_attention(..., bug=NAME)``: a plain per-request float32 computation
(safe softmax, like real kernels) with one planted mistake.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from pa_oracle.backends._dense import Dense
from pa_oracle.backends.sdpa import SdpaMath
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import upload
from torch.nn.attention import SDPBackend, sdpa_kernel

BUGS = {
    "wrong_gqa_map": "qo head h reads kv head h % num_kv_heads instead of h // group (flashinfer#1148)",
    "top_left_causal": "causal mask aligned top-left: query i sees keys <= i (flash-attention#951)",
    "window_off_by_one": "the window covers window_left tokens instead of window_left + 1 (vllm#3385)",
    "soft_cap_after_masking": "the soft cap is applied after masking, so masked keys get weight exp(-cap) (flashinfer#350)",
    "last_page_off_by_one": "kv_len = (pages - 1) * page_size + last_page_len - 1 (flashinfer#320)",
    "reads_past_last_page": "reads one slot past kv_last_page_len (poison) (flashinfer#3717)",
    "only_first_request_offsets": "every request's pages are found with request 0's page count (vllm-flash-attention#176)",
    "nan_on_empty": "a row with no key to attend divides 0 by 0 (flashinfer#4051)",
    "lse_base_two": "returns the base-2 LSE where natural log is declared (FlashInfer's convention leaking)",
    "fp8_scale_ignored": "k_scale and v_scale are accepted and ignored (flashinfer#1416)",
    "split_merge_nan": "split-KV in two halves merged with a formula that makes NaN of two empty halves (vllm#39148)",
    "finite_lse_sentinel": "an empty row returns LSE -5e4 instead of -inf (flashinfer#4401)",
    # the attention families (issue 14)
    "mask_bit_order_reversed": "the packed custom mask is read big-endian within each byte (FlashInfer packs little-endian)",
    "sinks_ignored_for_prefill": "the sink is applied for q_len 1 only, ignored for q_len > 1 (vllm#52148)",
    "sink_by_kv_head": "the sink is indexed by the kv head, not the qo head (Modular#6198)",
    "nope_pe_swapped": "MLA: q read as [q_pe | q_nope] against a [ckv | kpe] cache",
    "mla_log2e_missing": "MLA: exp2 softmax without log2(e) folded into sm_scale (flashinfer#787)",
}
CORRECT = ("correct_attention", "correct_float64", "correct_split_kv", "correct_masked_sinks", "correct_mla")


def _paged_attention(
    q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale, window_left,
    logits_soft_cap, k_scale=1.0, v_scale=1.0, bug: str = "", compute_dtype=torch.float32, split: bool = False,
    sinks=None, custom_mask=None, mask_indptr=None, mla: bool = False,
):
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_qo_heads = q.shape[1]
    group = num_qo_heads // num_kv_heads
    out = torch.zeros(q.shape[0], num_qo_heads, v_cache.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[0], num_qo_heads), float("-inf"), device=q.device)
    heads = torch.arange(num_qo_heads, device=q.device)
    kv_head_of = heads % num_kv_heads if bug == "wrong_gqa_map" else heads // group
    if bug == "fp8_scale_ignored":
        k_scale = v_scale = 1.0
    first_request_pages = int(kv_indptr[1] - kv_indptr[0])
    for b in range(len(qo_indptr) - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        if q1 == q0:
            continue
        start, end = int(kv_indptr[b]), int(kv_indptr[b + 1])
        if bug == "only_first_request_offsets":
            start, end = b * first_request_pages, b * first_request_pages + (end - start)
        pages = kv_indices[start:end].long()
        kv_len = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(kv_last_page_len[b])
        if bug == "last_page_off_by_one" and kv_len:
            kv_len -= 1
        if bug == "reads_past_last_page" and kv_len:
            kv_len += 1
        qo_len = q1 - q0
        flat_k = k_cache[pages].flatten(0, 1) if len(pages) else k_cache.new_zeros(0, *k_cache.shape[2:])
        flat_v = v_cache[pages].flatten(0, 1) if len(pages) else v_cache.new_zeros(0, *v_cache.shape[2:])
        k = flat_k[:kv_len].to(compute_dtype)[:, kv_head_of] * k_scale
        v = flat_v[:kv_len].to(compute_dtype)[:, kv_head_of] * v_scale
        kv_len = k.shape[0]
        qb = q[q0:q1].to(compute_dtype)
        if mla:  # the latent row is [ckv | kpe]: two dot products, as MLA kernels take q_nope and q_pe
            d_ckv = v_cache.shape[-1]
            if bug == "nope_pe_swapped":
                qb = torch.roll(qb, -(qb.shape[-1] - d_ckv), dims=-1)
            s = torch.einsum("qhd,khd->hqk", qb[..., :d_ckv], k[..., :d_ckv]) + torch.einsum("qhd,khd->hqk", qb[..., d_ckv:], k[..., d_ckv:])
            s = s * (sm_scale * math.log(2.0) if bug == "mla_log2e_missing" else sm_scale)
        else:
            s = torch.einsum("qhd,khd->hqk", qb, k) * sm_scale
        if logits_soft_cap > 0 and bug != "soft_cap_after_masking":
            s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
        offset = 0 if bug == "top_left_causal" else kv_len - qo_len
        q_pos = torch.arange(qo_len, device=q.device)[:, None] + offset
        k_pos = torch.arange(kv_len, device=q.device)[None, :]
        keep = torch.ones(qo_len, kv_len, dtype=torch.bool, device=q.device)
        if causal:
            keep &= k_pos <= q_pos
        if window_left >= 0:
            keep &= k_pos >= q_pos - window_left + (1 if bug == "window_off_by_one" else 0)
        if custom_mask is not None:
            keep &= _unpack_mask(custom_mask[int(mask_indptr[b]) : int(mask_indptr[b + 1])], qo_len, kv_len, bug == "mask_bit_order_reversed")
        s = s.masked_fill(~keep, float("-inf"))
        if logits_soft_cap > 0 and bug == "soft_cap_after_masking":
            s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
        if split:
            o, row_lse = _split_in_two(s, v, nan_on_empty_pair=bug == "split_merge_nan")
        else:
            o, row_lse = _softmax_weighted(s, v)
        if sinks is not None and not (bug == "sinks_ignored_for_prefill" and qo_len > 1):
            sink = sinks[kv_head_of] if bug == "sink_by_kv_head" else sinks  # [Hq]
            o = o * torch.sigmoid(row_lse - sink.to(row_lse.dtype)[:, None]).T[..., None]
        if bug == "nan_on_empty":
            o = torch.where(torch.isinf(row_lse).T[..., None], float("nan"), o)
        if bug == "finite_lse_sentinel":
            row_lse = torch.where(torch.isinf(row_lse), -5e4, row_lse)
        out[q0:q1] = o.to(q.dtype)
        lse[q0:q1] = row_lse.T.float()
    if bug == "lse_base_two":
        lse = lse / math.log(2.0)
    return out, lse


def _unpack_mask(packed: torch.Tensor, qo_len: int, kv_len: int, big_endian: bool) -> torch.Tensor:
    """One request's [qo_len, kv_len] mask from FlashInfer's packed bytes (bit t: bit t % 8 of byte t // 8)."""
    shifts = torch.arange(8, device=packed.device)
    if big_endian:
        shifts = 7 - shifts
    bits = (packed.long()[:, None] >> shifts) & 1
    return bits.flatten()[: qo_len * kv_len].view(qo_len, kv_len).bool()


def _softmax_weighted(s: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Safe softmax of s [H, q, k] times v [k, H, D] -> (out [q, H, D], lse [H, q]); empty rows 0 / -inf."""
    row_max = s.amax(-1, keepdim=True) if s.shape[-1] else s.new_full((*s.shape[:-1], 1), float("-inf"))
    empty = torch.isinf(row_max[..., 0])
    p = torch.exp(s - torch.where(torch.isinf(row_max), 0.0, row_max))
    denom = p.sum(-1)
    lse = torch.where(empty, float("-inf"), row_max[..., 0] + torch.log(torch.where(empty, 1.0, denom)))
    out = torch.einsum("hqk,khd->qhd", p / torch.where(empty, 1.0, denom)[..., None], v)
    return out, lse


def _split_in_two(s: torch.Tensor, v: torch.Tensor, *, nan_on_empty_pair: bool) -> tuple[torch.Tensor, torch.Tensor]:
    half = s.shape[-1] // 2
    (o1, l1), (o2, l2) = _softmax_weighted(s[..., :half], v[:half]), _softmax_weighted(s[..., half:], v[half:])
    m = torch.maximum(l1, l2)
    if nan_on_empty_pair:
        w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)  # -inf - -inf = NaN
    else:
        m_safe = torch.where(torch.isinf(m), 0.0, m)
        w1, w2 = torch.exp(l1 - m_safe), torch.exp(l2 - m_safe)
    total = w1 + w2
    safe = torch.where(total == 0, 1.0, total) if not nan_on_empty_pair else total
    out = (w1.T[..., None] * o1 + w2.T[..., None] * o2) / safe.T[..., None]
    lse = torch.where(total == 0, float("-inf"), m + torch.log(safe)) if not nan_on_empty_pair else m + torch.log(total)
    return out, lse


def _planted(bug: str, **extra):  # type: ignore[no-untyped-def]
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap):
        return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                                window_left=window_left, logits_soft_cap=logits_soft_cap, bug=bug, **extra)

    kernel.__name__ = kernel.__qualname__ = bug
    return kernel


def _planted_fp8(bug: str):  # type: ignore[no-untyped-def]
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap, k_scale, v_scale):
        return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                                window_left=window_left, logits_soft_cap=logits_soft_cap, k_scale=k_scale,
                                v_scale=v_scale, bug=bug)

    kernel.__name__ = kernel.__qualname__ = bug
    return kernel


def _planted_family(bug: str, *, mla: bool = False):  # type: ignore[no-untyped-def]
    """A kernel taking sinks and FlashInfer's packed custom mask (``mla``: MLA cases only)."""
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap, sinks, custom_mask, mask_indptr):
        return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                                window_left=window_left, logits_soft_cap=logits_soft_cap, bug=bug, sinks=sinks,
                                custom_mask=custom_mask, mask_indptr=mask_indptr, mla=mla)

    kernel.__name__ = kernel.__qualname__ = bug or ("correct_mla" if mla else "correct_masked_sinks")
    if mla:  # small latent dims keep the CPU selftest fast
        kernel.pa_oracle_capabilities = {"mla": (True,), "mla_dims": ((12, 8), (24, 16))}  # type: ignore[attr-defined]
    return kernel


wrong_gqa_map = _planted("wrong_gqa_map")
top_left_causal = _planted("top_left_causal")
window_off_by_one = _planted("window_off_by_one")
soft_cap_after_masking = _planted("soft_cap_after_masking")
last_page_off_by_one = _planted("last_page_off_by_one")
reads_past_last_page = _planted("reads_past_last_page")
only_first_request_offsets = _planted("only_first_request_offsets")
nan_on_empty = _planted("nan_on_empty")
lse_base_two = _planted("lse_base_two")
fp8_scale_ignored = _planted_fp8("fp8_scale_ignored")
split_merge_nan = _planted("split_merge_nan", split=True)
finite_lse_sentinel = _planted("finite_lse_sentinel")
mask_bit_order_reversed = _planted_family("mask_bit_order_reversed")
sinks_ignored_for_prefill = _planted_family("sinks_ignored_for_prefill")
sink_by_kv_head = _planted_family("sink_by_kv_head")
nope_pe_swapped = _planted_family("nope_pe_swapped", mla=True)
mla_log2e_missing = _planted_family("mla_log2e_missing", mla=True)
correct_masked_sinks = _planted_family("")
correct_mla = _planted_family("", mla=True)

correct_attention = _planted("")
correct_attention.__name__ = correct_attention.__qualname__ = "correct_attention"
correct_float64 = _planted("", compute_dtype=torch.float64)
correct_float64.__name__ = correct_float64.__qualname__ = "correct_float64"
correct_split_kv = _planted("", split=True)
correct_split_kv.__name__ = correct_split_kv.__qualname__ = "correct_split_kv"

PLANTED = tuple(BUGS)


# ---------------------------------------------------------------- a subtle bug for the model-level gates
class DropsLastKeyOfLongRequests(SdpaMath):
    """A correct dense SDPA backend (CUDA's memory-efficient kernel, CPU's math one) with one planted
    mistake: in a request with more than ``min_kv_len`` keys, no query attends its last key (the last
    slot of the last page), as a kernel whose last-page bound is off by one only past some length
    would. Only that request's last query can see that key (causal), so in a prefill just the last row
    changes, and in a decode step the new token misses its own key: subtle enough that a model keeps
    answering, but its generations drift on long prompts (GSM8k 5-shot prompts are ~610-1600 tokens,
    median ~980 with Qwen2.5's tokenizer). Seen on CPU (Qwen2.5-Coder-0.5B, float32, 8 questions, the
    512-key variant, which fires on every question): all 8 greedy generations left the reference's
    within a few characters and stayed fluent. Not in ``BUGS``: the selftest's cases are too short for it."""

    min_kv_len: ClassVar[int] = 1024
    name = "planted-drops-last-key-past-1024"
    description = "sdpa, but requests longer than min_kv_len keys drop their last key"
    capabilities = SdpaMath.capabilities.replace(devices=("cpu", "cuda"))

    def _mask(self, case: Case, dense: Dense) -> torch.Tensor:
        keep = super()._mask(case, dense)
        long = [b for b, n in enumerate(case.layout.kv_lens) if n > self.min_kv_len]
        if long:  # host lists: the layout is on the host, so no device sync
            batch = upload(torch.tensor(long), keep.device)
            last = upload(torch.tensor([case.layout.kv_lens[b] - 1 for b in long]), keep.device)
            keep = keep.clone()
            keep[batch, :, :, last] = False if keep.dtype == torch.bool else float("-inf")
        return keep

    def _sdpa(self, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        kernel = SDPBackend.EFFICIENT_ATTENTION if q.is_cuda else SDPBackend.MATH
        if q.is_cuda:  # the efficient kernel takes no enable_gqa (as sdpa-efficient)
            k, v = (x.repeat_interleave(case.heads.group_size, dim=1) for x in (k, v))
        with sdpa_kernel(kernel):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case.sm_scale, enable_gqa=not q.is_cuda)


class DropsLastKeyPast512(DropsLastKeyOfLongRequests):
    """The same bug firing earlier: every GSM8k 5-shot request (a stronger bug)."""

    min_kv_len = 512
    name = "planted-drops-last-key-past-512"


drops_last_key_past_1024 = DropsLastKeyOfLongRequests
drops_last_key_past_512 = DropsLastKeyPast512
