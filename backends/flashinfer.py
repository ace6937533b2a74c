"""FlashInfer's batch wrappers: paged decode (CUDA-core and tensor-core paths), paged prefill
(``fa2`` and, on sm90, ``fa3``) and ragged prefill.

Conventions converted here: FlashInfer's LSE is base 2 (returned in natural log); its ALiBi uses
its own slopes (the paper's, the same as ``pa_oracle.fuzz.draw.strategies.alibi_slopes``) with bias
``slope * (kv_idx - qo_idx)`` counted from the request's first query, so it equals the oracle's
``-slope * |p - j|`` plus ``slope * (kv_len - qo_len)`` when every key is at or before the query:
the output is the same, the LSE is shifted by that constant (undone here), and non-causal prefill
ALiBi differs outright (not declared). ``window_left`` is
FlashInfer's own convention (the oracle's). Sinks are not declared: their scaling is unverified.
The paged wrappers also run in CUDA-graph mode (``capture_graph``: ``use_cuda_graph=True`` with
fixed-size index buffers) and let the stale-plan check rewrite the layout buffers their run reads
(``write_layout``).

Memory layouts (``Storage``): decode (both paths) and the paged fa2/fa3 prefill declare every one.
The wrapper is built with the case's ``kv_layout`` ("NHD" or "HND": ``BatchDecodeWithPagedKVCacheWrapper
(workspace, kv_layout)``); ``run`` gets a combined storage's one ``[pages, 2, ...]`` tensor as its
``paged_kv_cache`` (``_unpack_paged_kv_cache`` unbinds dim 1: documented), else the ``(k, v)`` tuple of
(possibly strided) views, and q as it lies (a strided view of a fused QKV buffer). 0.6.18's
``batch_decode.cu`` / ``batch_prefill.cu`` / ``batch_prefill_sm90.cu`` read the caches' page, slot and
head strides and q's row and head strides from the tensors (``paged_kv_t`` with custom strides; the
CUDA-core decode needs K and V of equal strides, which every storage gives); the last dim is contiguous
in every storage and every offset is 16-byte aligned. The ``-hnd`` adapters keep their own HND copy
(no storage drawn). The strided pools (``STRIDE_STORAGES``) are not declared, so these adapters draw what
they drew: ``paged_kv_t`` takes the page stride as ``kv_strides[0]`` (padded pages and a layer of a
cross-layer pool are read right, ``tests/test_strided_pools.py`` hands them through a stand-in) but never
reads the head dim's stride (an interleaved head dim would be read wrong: ``dim_stride`` never applies).
"""

from __future__ import annotations

import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import torch
from pa_oracle.backends.base import (
    Backend,
    Capabilities,
    Contract,
    CompileKey,
    GraphCall,
    KernelOutput,
    RawOutput,
    Unsupported,
    capture_cuda_graph,
    raw_lse,
    register,
)
from pa_oracle.oracle.case import ALIBI_THEN_CAP, FP8_DTYPES, STORAGE_FEATURES, Case
from pa_oracle.oracle.tensors import Tensors, token_addresses

LN_2 = math.log(2.0)
_WORKSPACE_BYTES = 256 << 20

_FLASHINFER = Capabilities(
    devices=("cuda",),
    q_dtypes=("float16", "bfloat16"),
    kv_dtypes=FP8_DTYPES,
    head_dims=(64, 128, 256),
    head_dim_vo_may_differ=False,
    sinks=False,
    soft_cap_alibi_order=ALIBI_THEN_CAP,
)
# fa2 prefill and decode dispatch head_dim 512 too (utils.cuh DISPATCH_HEAD_DIM; FA2DetermineCtaTileQ's
# "VO >= 512" split; tests/attention/test_batch_{decode,prefill}_kernels.py run 512 on sm80+ with 16-bit KV,
# fp8 KV above 256 only on sm100+); fa3 takes 64, 128, 256 (utils.py is_fa3_prefill_head_dim_supported).
# Not the default draws: the strategies' head dims stop at 128 (``--only head_dims=256,512`` draws them).
_FA2_HEAD_DIMS = (64, 128, 256, 512)
_FP8_MAX_HEAD_DIM = 256
# variants.cuh (DefaultAttention::LogitsTransform): logits * sm_scale + slope * (kv_idx - qo_idx), then
# tanh(logits * soft_cap_pre_tanh_scale): ALiBi first, then the cap; LSE base 2 (math::log2e scaling)
_FLASHINFER_CONTRACT = Contract(
    lse_base="2",
    alibi_lse_shift="bias slope * (kv_idx - qo_idx) with qo_idx counted from the request's first query: LSE larger by slope * (kv_len - qo_len)",
    soft_cap_alibi_order=ALIBI_THEN_CAP,
)


@functools.cache
def _workspace(device: str) -> torch.Tensor:
    return torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)


# FlashInfer 0.6.18.post1 JIT-builds one module per (dtype_q, dtype_kv, dtype_o, dtype_idx, head dims,
# pos encoding (ALiBi here; RoPE in flashinfer_rope), sliding window on/off, soft cap on/off[, fp16 qk reduction][, fa3]): see
# flashinfer/jit/attention/modules.py get_batch_{decode,prefill}_uri. The mask mode (causal) is a runtime
# dispatch inside one module, and a prefill module holds both the paged and the ragged run.
_COMPILE_FIELDS: tuple[str, ...] = ("q_dtype", "kv_dtype", "head_dim_qk", "alibi", "window", "soft_cap")
_URI_DTYPE = {"float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def module_uri(kind: str, key: CompileKey, backend: str = "fa2") -> str:
    """The name FlashInfer gives the module a ``_COMPILE_FIELDS`` key runs on: ``kind`` "decode"
    (CUDA-core decode) or "prefill" (``backend`` fa2 or fa3; also tensor-core decode); o is q's
    dtype and indices int32, as the adapters plan them."""
    v = dict(key)
    q, kv = _URI_DTYPE[v["q_dtype"]], _URI_DTYPE[v["kv_dtype"]]
    dim = v["head_dim_qk"]
    uri = (
        f"batch_{kind}_with_kv_cache_dtype_q_{q}_dtype_kv_{kv}_dtype_o_{q}_dtype_idx_i32_head_dim_qk_{dim}_"
        f"head_dim_vo_{dim}_posenc_{pos_encoding(key)}_use_swa_{bool(v['window'])}_use_logits_cap_{bool(v['soft_cap'])}"
    )
    if kind == "prefill":
        uri += "_f16qk_False" + ("_sm90" if backend == "fa3" else "")
    return uri


def pos_encoding(key: CompileKey) -> int:
    """FlashInfer's ``PosEncodingMode`` of a key: 0 none, 1 ``ROPE_LLAMA`` (a ``rope`` key), 2 ALiBi."""
    v = dict(key)
    return 2 if v["alibi"] else 1 if v.get("rope") else 0


def auto_prefill_backend(key: CompileKey) -> str:
    """What ``backend="auto"`` picks (FlashInfer's ``determine_attention_backend``): fa3 on sm90 unless
    ALiBi or an fp8 KV with a 16-bit q (every q here), else fa2."""
    v = dict(key)
    sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    return "fa3" if sm90 and not v["alibi"] and v["kv_dtype"] not in FP8_DTYPES else "fa2"


def built_module(uri: str) -> str | None:
    """"prebuilt" if FlashInfer's AOT folder (the wheel's data/aot, or flashinfer-jit-cache) holds the
    module, "cached" if its JIT cache does, else None (also when flashinfer is not importable)."""
    try:
        from flashinfer.jit import env
    except Exception:  # noqa: BLE001 - no flashinfer here: nothing is known to be built
        return None
    if (env.FLASHINFER_AOT_DIR / uri / f"{uri}.so").exists():
        return "prebuilt"
    return "cached" if (env.FLASHINFER_JIT_DIR / uri / f"{uri}.so").exists() else None


def build_modules(specs: list[Any]) -> None:
    """Build FlashInfer JIT modules (``JitSpec``s), each by its own ``build()``: its ninja file and
    build log in its own folder. Prebuilt (AOT) ones are skipped; several are built side by side,
    the ``MAX_JOBS`` compiler jobs (default: the cores) shared between them.

    Not ``flashinfer.jit.build_jit_specs``: that runs one ninja from the JIT folder over ``subninja``
    files, so the build log is written there, while a later process's ``build_and_load`` runs ninja
    in the module's folder, finds no log entry for the outputs ("command line not found in log")
    and compiles the module again. On the H200 (0.6.18.post1) the fa3 fp8 module, built by
    ``pa-oracle warmup`` in 208 s, was built again by the campaign's first ``plan`` (121 s, counted as
    judging)."""
    todo = [spec for spec in specs if not spec.aot_path.exists()]
    if len(todo) <= 1:
        for spec in todo:
            spec.build(need_lock=True)
        return
    total = os.environ.get("MAX_JOBS", "")
    jobs = int(total) if total.isdigit() and int(total) > 0 else (os.cpu_count() or 1)
    workers = min(len(todo), jobs)  # never more compiler jobs at once than MAX_JOBS (nvcc takes GBs each)
    os.environ["MAX_JOBS"] = str(max(1, jobs // workers))  # read by each ninja run (flashinfer.jit.cpp_ext)
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pa-oracle-build") as pool:
            futures = [(spec, pool.submit(spec.build, need_lock=True)) for spec in todo]
        failed = [(spec, future.exception()) for spec, future in futures if future.exception() is not None]
        if failed:  # every build has ended (the pool waited): name each failure, raise the first
            names = ", ".join(getattr(spec, "name", "?") for spec, _ in failed)
            raise RuntimeError(f"{len(failed)} of {len(todo)} FlashInfer module builds failed ({names})") from failed[0][1]
    finally:
        if total:
            os.environ["MAX_JOBS"] = total
        else:
            os.environ.pop("MAX_JOBS", None)


CASCADE_MODULE = "cascade"  # merge_state's module: one for every dtype and key, JIT-built (not in the prebuilt set)


def module_spec(uri: str, key: CompileKey) -> Any:
    """FlashInfer's ``JitSpec`` for a ``module_uri`` (for ``build_modules``)."""
    from flashinfer.jit import gen_batch_decode_module, gen_batch_prefill_module

    v = dict(key)
    args = (
        getattr(torch, v["q_dtype"]), getattr(torch, v["kv_dtype"]), getattr(torch, v["q_dtype"]), torch.int32,
        v["head_dim_qk"], v["head_dim_qk"], pos_encoding(key), bool(v["window"]), bool(v["soft_cap"]),
    )
    if uri.startswith("batch_decode"):
        return gen_batch_decode_module(*args)
    return gen_batch_prefill_module("fa3" if uri.endswith("_sm90") else "fa2", *args, False)


def _standard_alibi(case: Case) -> bool:
    from pa_oracle.oracle.case import alibi_slopes

    slopes = case.options.alibi_slopes
    return slopes is None or all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(slopes, alibi_slopes(len(slopes))))


# the conversions of ``_FlashInferBackend._finish``, as repro source
_FINISH_SOURCE = """\
lse = lse_base2.float() * math.log(2.0)  # FlashInfer's LSE is base 2
if alibi_slopes is not None:  # FlashInfer's ALiBi bias is slope * (j - i) from the first query: a per-row constant
    offset = torch.tensor([k - n for n, k in zip(qo_lens, kv_lens) for _ in range(n)], device=device)
    lse = lse - offset[:, None] * torch.tensor(alibi_slopes, device=device)
"""


def _copy_kv(target: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
             source: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> None:
    """Copy paged K/V ``source`` into ``target`` of the same form: one combined tensor or a (k, v) pair."""
    if isinstance(target, torch.Tensor) and isinstance(source, torch.Tensor):
        target.copy_(source)
    elif isinstance(target, tuple) and isinstance(source, tuple):
        for into, part in zip(target, source):
            into.copy_(part)
    else:
        raise TypeError("the paged K/V changed form (combined tensor or (k, v) pair) since the graph was captured")


class _FlashInferBackend(Backend):
    """Shared plan/run plumbing; subclasses build and plan their wrapper."""

    kv_layout: ClassVar[str] = "NHD"  # "HND": the adapter hands the kernel [pages, heads, slots, dim]

    package = "flashinfer"
    extra = "flashinfer"
    contract = _FLASHINFER_CONTRACT
    compile_fields = _COMPILE_FIELDS

    def modules(self, key: CompileKey) -> list[str]:
        """The FlashInfer modules (``module_uri``) a case of ``key`` loads."""
        raise NotImplementedError

    def built_reason(self, key: CompileKey) -> str | None:
        reasons = [built_module(uri) for uri in self.modules(key)]
        if any(r is None for r in reasons):
            return None
        return "prebuilt" if all(r == "prebuilt" for r in reasons) else "cached"

    def build_variants(self, keys: list[CompileKey]) -> list[CompileKey] | None:
        """Every module of ``keys`` (``build_modules``: prebuilt ones are skipped)."""
        specs = {uri: module_spec(uri, key) for key in keys for uri in self.modules(key)}
        build_modules(list(specs.values()))
        return [key for key in keys if self.built_reason(key) is not None]

    def unsupported_reason(self, case: Case) -> str | None:
        reason = super().unsupported_reason(case)
        if reason is None and not _standard_alibi(case):
            return "unsupported: FlashInfer computes its own ALiBi slopes; custom slopes cannot be passed"
        if reason is None and case.options.is_fp8 and case.heads.head_dim_qk > _FP8_MAX_HEAD_DIM:
            return f"unsupported: head_dim > {_FP8_MAX_HEAD_DIM} with fp8 KV (FlashInfer validates it on sm100+ only)"
        return reason

    def _common_plan_kwargs(self, case: Case) -> dict[str, Any]:
        opts = case.options
        return {
            "pos_encoding_mode": "ALIBI" if opts.alibi_slopes is not None else "NONE",
            "window_left": opts.window_left,
            "logits_soft_cap": opts.logits_soft_cap or None,
            "sm_scale": case.sm_scale,
            "q_data_type": getattr(torch, opts.q_dtype),
            "kv_data_type": getattr(torch, opts.kv_dtype),
        }

    @staticmethod
    def _index(values: tuple[int, ...] | list[int], device: str) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    def _finish(self, case: Case, out: torch.Tensor, lse: torch.Tensor) -> KernelOutput:
        lse = lse.float() * LN_2
        slopes = case.options.alibi_slopes
        if slopes is not None:  # FlashInfer's bias is offset by slope * (kv_len - qo_len) per row
            lay = case.layout
            offset = [k - q for q, k in zip(lay.qo_lens, lay.kv_lens) for _ in range(q)]
            lse = lse - torch.tensor(offset, device=lse.device)[:, None] * torch.tensor(slopes, device=lse.device)
        return KernelOutput(out, lse)

    def _scales(self, case: Case) -> dict[str, float]:
        opts = case.options
        return {"k_scale": opts.k_scale, "v_scale": opts.v_scale} if opts.is_fp8 else {}

    def _layout(self, case: Case) -> str:
        """The ``kv_layout`` the wrapper is built with: the case's storage's, else the adapter's."""
        return case.storage.kv_layout if case.storage is not None else self.kv_layout

    def _paged_kv(self, tensors: Tensors, kv_layout: str | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``paged_kv_cache`` as the library takes it in ``kv_layout`` (default: the adapter's): the
        tensors as they lie (``Tensors.paged_kv``), or, where they are stored otherwise (the ``-hnd``
        adapters on NHD tensors), a copy in that layout."""
        kv_layout = kv_layout or self.kv_layout
        kv = tensors.paged_kv(kv_layout)
        if kv_layout != tensors.kv_layout and isinstance(kv, tuple):  # another layout: always a (k, v) pair
            k, v = kv
            return k.contiguous(), v.contiguous()
        return kv

    def merge_states(
        self, out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
    ) -> KernelOutput:
        """FlashInfer's ``merge_state`` (base-2 LSE in and out)."""
        import flashinfer

        out, lse = flashinfer.merge_state(out_a, (lse_a / LN_2).float(), out_b, (lse_b / LN_2).float())
        return KernelOutput(out, lse.float() * LN_2)


class _PagedWrapper(_FlashInferBackend):
    """A paged wrapper (decode or prefill): its run reads the layout from device buffers, and it
    has a CUDA-graph mode with fixed-size buffers."""

    cuda_graphs = True

    # the wrapper attributes through which ``run`` reads the planned layout, and the layout field of each
    _layout_buffers: ClassVar[tuple[tuple[str, str], ...]] = (
        ("_paged_kv_indptr_buf", "kv_indptr"),
        ("_paged_kv_indices_buf", "kv_indices"),
        ("_paged_kv_last_page_len_buf", "kv_last_page_len"),
    )

    def run(self, plan: tuple[Case, Any], tensors: Tensors) -> KernelOutput:
        """Run a planned paged wrapper (decode and paged prefill share this)."""
        case, wrapper = plan
        out, lse = wrapper.run(tensors.q, self._paged_kv(tensors, self._layout(case)), return_lse=True, **self._scales(case))
        return self._finish(case, out, lse)

    def write_layout(self, plan: tuple[Case, Any], case: Case) -> None:
        """Overwrite the wrapper's layout buffers in place (``plan`` keeps its host-side schedule)."""
        _, wrapper = plan
        for attribute, field in self._layout_buffers:
            buffer = getattr(wrapper, attribute, None)
            if buffer is None:
                raise Unsupported(f"this FlashInfer wrapper keeps no {attribute}: its layout cannot be rewritten")
            values = torch.tensor(getattr(case.layout, field), dtype=buffer.dtype, device=buffer.device)
            if values.numel() > buffer.numel():
                raise Unsupported(f"{field} of layout B ({values.numel()}) does not fit {attribute} ({buffer.numel()})")
            buffer[: values.numel()].copy_(values)

    def _graph_buffers(self, case: Case, device: str) -> dict[str, torch.Tensor]:
        """Fixed-size index buffers of a CUDA-graph wrapper, holding ``case``'s layout."""
        lay = case.layout
        indices = torch.zeros(max(len(lay.kv_indices), 1), dtype=torch.int32, device=device)
        indices[: len(lay.kv_indices)] = self._index(lay.kv_indices, device)
        return {
            "qo_indptr": self._index(lay.qo_indptr, device),
            "kv_indptr": self._index(lay.kv_indptr, device),
            "kv_indices": indices,
            "kv_last_page_len": self._index(lay.kv_last_page_len, device),
        }

    def _graph_call(self, case: Case, tensors: Tensors, wrapper: Any) -> GraphCall:
        """Capture ``wrapper.run`` (planned with ``use_cuda_graph=True``) over static buffers."""
        layout = self._layout(case)
        q = tensors.q.clone()
        kv = self._paged_kv(tensors, layout)
        static = kv.clone() if isinstance(kv, torch.Tensor) else (kv[0].clone(), kv[1].clone())
        out = torch.empty(*q.shape[:2], case.heads.head_dim_vo, dtype=q.dtype, device=q.device)
        lse = torch.empty(*q.shape[:2], dtype=torch.float32, device=q.device)
        scales = self._scales(case)

        def load(new: Tensors) -> None:
            q.copy_(new.q)
            _copy_kv(static, self._paged_kv(new, layout))

        def launch() -> RawOutput:
            wrapper.run(q, static, out=out, lse=lse, return_lse=True, **scales)
            return out, lse

        replay, outputs = capture_cuda_graph(launch)
        return GraphCall(
            load=load, launch=launch, replay=replay, outputs=outputs, rows=lambda raw: raw,
            finish=lambda raw: self._finish(case, raw[0].clone(), raw_lse(raw)),
        )


class _PagedDecode(_PagedWrapper):
    use_tensor_cores: ClassVar[bool]
    capabilities = _FLASHINFER.replace(min_qo_len=1, max_qo_len=1, head_dims=_FA2_HEAD_DIMS)

    def call_source(self, case: Case) -> str | None:
        hnd = self.kv_layout == "HND"
        caches = "(k_cache.transpose(1, 2).contiguous(), v_cache.transpose(1, 2).contiguous())" if hnd else "(k_cache, v_cache)"
        return f"""\
import flashinfer

workspace = torch.empty(256 << 20, dtype=torch.uint8, device=device)
wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, {self.kv_layout!r}, use_tensor_cores={self.use_tensor_cores})
wrapper.plan(
    index(kv_indptr), index(kv_indices), index(kv_last_page_len), num_qo_heads, num_kv_heads, head_dim_qk, page_size,
    pos_encoding_mode="ALIBI" if alibi_slopes is not None else "NONE", window_left=window_left,
    logits_soft_cap=logits_soft_cap or None, sm_scale=sm_scale, q_data_type=q.dtype, kv_data_type=k_cache.dtype,
)
fp8 = k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
out, lse_base2 = wrapper.run(q, {caches}, return_lse=True, **({{"k_scale": k_scale, "v_scale": v_scale}} if fp8 else {{}}))
{_FINISH_SOURCE}"""

    compile_seconds = 15.0  # a decode module with 16 cores (the fa2 prefill module for tensor cores: 60)

    def modules(self, key: CompileKey) -> list[str]:
        # tensor cores: the fa2 prefill module (backend "auto" picks fa3 only for an fp8 q)
        return [module_uri("prefill", key, "fa2") if self.use_tensor_cores else module_uri("decode", key)]

    def plan(self, case: Case) -> tuple[Case, Any]:
        import flashinfer

        device = self.device or "cuda"
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            _workspace(device), self._layout(case), use_tensor_cores=self.use_tensor_cores
        )
        return case, self._planned(wrapper, case, device)

    def _planned(self, wrapper: Any, case: Case, device: str) -> Any:
        lay = case.layout
        wrapper.plan(
            self._index(lay.kv_indptr, device), self._index(lay.kv_indices, device),
            self._index(lay.kv_last_page_len, device), case.heads.num_qo_heads, case.heads.num_kv_heads,
            case.heads.head_dim_qk, lay.page_size, **self._common_plan_kwargs(case),
        )
        return wrapper

    def capture_graph(self, case: Case, tensors: Tensors) -> GraphCall:
        import flashinfer

        device = str(tensors.q.device)
        buffers = self._graph_buffers(case, device)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=device), self._layout(case), use_cuda_graph=True,
            use_tensor_cores=self.use_tensor_cores, paged_kv_indptr_buffer=buffers["kv_indptr"],
            paged_kv_indices_buffer=buffers["kv_indices"], paged_kv_last_page_len_buffer=buffers["kv_last_page_len"],
        )
        return self._graph_call(case, tensors, self._planned(wrapper, case, device))


@register
class FlashInferDecode(_PagedDecode):
    name = "flashinfer-decode"
    description = "FlashInfer BatchDecodeWithPagedKVCacheWrapper, CUDA-core path"
    family = "flashinfer-decode-cuda-core"  # also -hnd: the same kernel on HND pages
    use_tensor_cores = False
    capabilities = _PagedDecode.capabilities.replace(storages=STORAGE_FEATURES)


@register
class FlashInferDecodeTensorCores(_PagedDecode):
    name = "flashinfer-decode-tc"
    description = "FlashInfer BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)"
    family = "flashinfer-decode-tensor-core"
    use_tensor_cores = True
    capabilities = _PagedDecode.capabilities.replace(storages=STORAGE_FEATURES)
    compile_seconds = 60.0


class _Prefill(_FlashInferBackend):
    backend: ClassVar[str]
    capabilities = _FLASHINFER

    compile_seconds = 60.0  # an fa2 prefill module with 16 cores (fa3: 220)

    def modules(self, key: CompileKey) -> list[str]:
        return [module_uri("prefill", key, self.backend)]

    def unsupported_reason(self, case: Case) -> str | None:
        reason = super().unsupported_reason(case)
        if reason is None and case.options.alibi_slopes is not None and not case.options.causal:
            return "unsupported: FlashInfer's non-causal ALiBi is signed (kv - q), not -|p - j|"
        return reason


class _PagedPrefill(_Prefill, _PagedWrapper):
    _layout_buffers = (("_qo_indptr_buf", "qo_indptr"), *_PagedWrapper._layout_buffers)

    def plan(self, case: Case) -> tuple[Case, Any]:
        import flashinfer

        device = self.device or "cuda"
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace(device), self._layout(case), backend=self.backend)
        return case, self._planned(wrapper, case, device)

    def _planned(self, wrapper: Any, case: Case, device: str) -> Any:
        lay = case.layout
        wrapper.plan(
            self._index(lay.qo_indptr, device), self._index(lay.kv_indptr, device),
            self._index(lay.kv_indices, device), self._index(lay.kv_last_page_len, device),
            case.heads.num_qo_heads, case.heads.num_kv_heads, case.heads.head_dim_qk, lay.page_size,
            causal=case.options.causal, **self._common_plan_kwargs(case),
        )
        return wrapper

    def capture_graph(self, case: Case, tensors: Tensors) -> GraphCall:
        import flashinfer

        device = str(tensors.q.device)
        buffers = self._graph_buffers(case, device)
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=device), self._layout(case), use_cuda_graph=True,
            qo_indptr_buf=buffers["qo_indptr"], paged_kv_indptr_buf=buffers["kv_indptr"],
            paged_kv_indices_buf=buffers["kv_indices"], paged_kv_last_page_len_buf=buffers["kv_last_page_len"],
            backend=self.backend,
        )
        return self._graph_call(case, tensors, self._planned(wrapper, case, device))


@register
class FlashInferPrefillFA2(_PagedPrefill):
    name = "flashinfer-prefill-fa2"
    description = "FlashInfer BatchPrefillWithPagedKVCacheWrapper(backend='fa2')"
    family = "flashinfer-prefill-fa2"  # also -hnd and the cascade (two fa2 prefills merged)
    backend = "fa2"
    capabilities = _FLASHINFER.replace(head_dims=_FA2_HEAD_DIMS, storages=STORAGE_FEATURES)


@register
class FlashInferDecodeHND(FlashInferDecode):
    name = "flashinfer-decode-hnd"
    description = "FlashInfer BatchDecodeWithPagedKVCacheWrapper, CUDA-core path, HND pages"
    kv_layout = "HND"
    capabilities = _PagedDecode.capabilities  # its own HND copy of the pages: no storage drawn


@register
class FlashInferPrefillFA2HND(FlashInferPrefillFA2):
    name = "flashinfer-prefill-fa2-hnd"
    description = "FlashInfer BatchPrefillWithPagedKVCacheWrapper(backend='fa2'), HND pages"
    kv_layout = "HND"
    capabilities = _FLASHINFER.replace(head_dims=_FA2_HEAD_DIMS)  # its own HND copy of the pages: no storage drawn


@register
class FlashInferPrefillFA3(_PagedPrefill):
    name = "flashinfer-prefill-fa3"
    description = "FlashInfer BatchPrefillWithPagedKVCacheWrapper(backend='fa3'), sm90"
    family = "flashinfer-prefill-fa3"
    backend = "fa3"
    compile_seconds = 220.0
    # no ALiBi: the sm90 attention is DefaultAttention<use_logits_soft_cap> (jit/attention/modules.py), and
    # utils.is_fa3_backend_supported refuses any pos_encoding_mode but NONE (backend="auto" then takes fa2); an
    # explicit backend="fa3" plans and runs ALiBi without the bias (golden case flash-attn-kvcache-alibi-lse)
    # and no fp8 KV with a 16-bit q: is_fa3_backend_supported refuses it (fp8 KV needs an fp8 q there; flashinfer-prefill-
    # fa3-fp8), and the sm90 module of such a key does not compile (ninja failed on the H100, 0.6.18.post1)
    capabilities = _FLASHINFER.replace(storages=STORAGE_FEATURES, alibi=False, kv_dtypes=None)

    def unavailable_reason(self) -> str | None:
        reason = super().unavailable_reason()
        if reason is None and torch.cuda.get_device_capability()[0] != 9:
            return "the fa3 backend needs sm_90 (Hopper)"
        return reason


@register
class FlashInferRaggedFA2(_Prefill):
    name = "flashinfer-ragged-fa2"
    description = "FlashInfer BatchPrefillWithRaggedKVCacheWrapper(backend='fa2') on K/V gathered from the pages"
    family = "flashinfer-ragged-fa2"
    backend = "fa2"
    capabilities = _FLASHINFER.replace(kv_dtypes=None, fp8_scales=False, head_dims=_FA2_HEAD_DIMS)

    def plan(self, case: Case) -> tuple[Case, Any]:
        import flashinfer

        lay, device = case.layout, self.device or "cuda"
        kv_indptr = [0]
        for n in lay.kv_lens:
            kv_indptr.append(kv_indptr[-1] + n)
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_workspace(device), "NHD", backend=self.backend)
        wrapper.plan(
            self._index(lay.qo_indptr, device), self._index(kv_indptr, device),
            case.heads.num_qo_heads, case.heads.num_kv_heads, case.heads.head_dim_qk,
            causal=case.options.causal, **self._common_plan_kwargs(case),
        )
        return case, wrapper

    def run(self, plan: tuple[Case, Any], tensors: Tensors) -> KernelOutput:
        case, wrapper = plan
        if sum(case.layout.kv_lens) == 0:
            raise Unsupported("ragged prefill needs at least one key token in the batch")
        pages, slots = (t.to(tensors.q.device) for t in token_addresses(case))
        keys, values = tensors.k_cache[pages, slots], tensors.v_cache[pages, slots]
        out, lse = wrapper.run(tensors.q, keys, values, return_lse=True)
        return self._finish(case, out, lse)
