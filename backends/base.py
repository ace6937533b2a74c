"""What every kernel adapter is: declared capabilities (data) plus ``plan`` / ``run``.

EXTENDING: a new kernel is one file in ``backends/`` (or any module named by the
``pa_oracle.backends`` entry point) holding a ``Backend`` subclass decorated with ``@register``.
It converts the canonical case (CSR layout, NHD pages, natural-log LSE) to the kernel's own
conventions, and only there. The strategies draw only cases its ``Capabilities`` admit.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from pa_oracle.oracle.case import CAP_THEN_ALIBI, FP8_DTYPES, Q_DTYPES, ROPE_STYLES, SOFT_CAP_ALIBI_ORDERS, Case, storage_features
from pa_oracle.oracle.errors import BadInput
from pa_oracle.oracle.tensors import Tensors


class Unsupported(Exception):
    """Raised by an adapter for a case its kernel does not handle: a skip, never a finding."""


class ContractViolation(TypeError):
    """Raised by an adapter when the kernel broke its calling contract (e.g. returned something
    that is not ``out`` or ``(out, lse)``): a failing verdict, never a skip or a crash."""


class KernelOutput(NamedTuple):
    out: torch.Tensor  # [total_q, Hq, Dvo] in the case's q dtype
    lse: torch.Tensor | None  # [total_q, Hq], natural log, or None if the kernel returns none


RawOutput = tuple[torch.Tensor, "torch.Tensor | None"]  # a kernel's own (out, lse) buffers


def raw_lse(raw: RawOutput) -> torch.Tensor:
    """The LSE buffer of a raw output from a call that asked for the LSE (a kernel that returns none
    where it was asked breaks its contract: a failing verdict)."""
    lse = raw[1]
    if lse is None:
        raise ContractViolation("the kernel returned no LSE where the call asked for it")
    return lse



class BackendSpecError(BadInput):
    """A ``-b NAME`` that is not registered or not usable here (or of the other kind of kernel), or a
    ``--kernel MODULE:FUNCTION`` that cannot be loaded."""


def import_adapters(package: str, path: list[str], group: str, private: frozenset[str] = frozenset({"base", "user"})) -> None:
    """Import every module of ``package`` (its ``__path__``: ``path``) but the ``private`` and ``_``-named ones,
    then every entry point of ``group``: how a kind of kernel's registry fills (each module registers its own)."""
    import pkgutil
    from importlib.metadata import entry_points

    for module in pkgutil.iter_modules(path):
        if module.name not in private and not module.name.startswith("_"):
            importlib.import_module(f"{package}.{module.name}")
    for entry in entry_points(group=group):
        entry.load()

@dataclass
class GraphCall:
    """One kernel call over static buffers, captured in a CUDA graph (the serving-engine contract:
    inputs are copied into fixed buffers, then the graph is replayed).

    ``load`` copies a call's canonical tensors into the static inputs (outside the graph);
    ``launch`` makes the same call eagerly; ``replay`` replays the graph, which writes ``outputs``
    (the kernel's own buffers: layout, LSE base). ``rows`` reads raw buffers in canonical row
    order without converting values; ``finish`` converts them to the canonical ``KernelOutput``.
    """

    load: Callable[[Any], None]
    launch: Callable[[], RawOutput]
    replay: Callable[[], None]
    outputs: RawOutput
    rows: Callable[[RawOutput], RawOutput]
    finish: Callable[[RawOutput], KernelOutput]


def capture_cuda_graph(launch: Callable[[], RawOutput], warmup: int = 2) -> tuple[Callable[[], None], RawOutput]:
    """Warm ``launch`` up on a side stream, then capture it (torch's recipe); returns the replay
    function and the output buffers the graph writes."""
    if not torch.cuda.is_available():
        raise Unsupported("CUDA graphs need a CUDA device")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            launch()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = launch()
    torch.cuda.synchronize()
    return graph.replay, outputs


@dataclass(frozen=True)
class Capabilities:
    """What a kernel accepts. ``None`` means "any"; tuples list the accepted values."""

    devices: tuple[str, ...] = ("cpu", "cuda")
    q_dtypes: tuple[str, ...] = Q_DTYPES
    kv_dtypes: tuple[str, ...] | None = None  # KV dtypes besides q's own (fp8); None: only q's
    o_dtypes: tuple[str, ...] = ("float16", "bfloat16")  # the output dtypes of an fp8 q (``q_dtypes`` with fp8)
    head_dims: tuple[int, ...] | None = None  # head_dim_qk
    head_dim_vo_may_differ: bool = True
    page_sizes: tuple[int, ...] | None = None
    page_size_multiple: int = 1
    max_group_size: int | None = None
    min_qo_len: int = 0  # 1 for decode kernels: one query per request
    max_qo_len: int | None = None  # 1 for decode kernels
    uniform_qo_len: bool = False  # every request has the same qo_len (dense [B, seqlen_q] queries)
    mixed_batch: bool = False  # every batch holds a decode request (qo_len 1) and a longer one (fused prefill + decode)
    qo_len_above_kv_len: bool = True
    empty_requests: bool = True  # kv_len 0 and qo_len 0 requests
    causal: tuple[bool, ...] = (False, True)
    window_left: bool = True
    logits_soft_cap: bool = True
    alibi: bool = True
    sinks: bool = True
    custom_sm_scale: bool = True
    fp8_scales: bool = True  # k_scale / v_scale other than 1
    returns_lse: bool = True
    soft_cap_alibi_order: str = CAP_THEN_ALIBI  # the order of a case with both on (the library's; Contract)
    # the attention families (issue 14); off by default, so no existing kernel draws them
    custom_mask: tuple[bool, ...] = (False,)  # (False, True): optional; (True,): mask cases only
    mla: tuple[bool, ...] = (False,)  # the latent layout (``Heads.mla``); (True,): MLA only
    mla_dims: tuple[tuple[int, int], ...] | None = None  # (head_dim_qk, head_dim_vo) pairs; None: any
    # fused rotary embedding (issue 15); off by default, so no existing kernel draws it
    rope: tuple[bool, ...] = (False,)  # (False, True): optional; (True,): rope cases only
    rope_styles: tuple[str, ...] = ROPE_STYLES  # the pairings the kernel applies
    rope_partial: bool = True  # rotary_dim below head_dim_qk
    rope_positions: bool = False  # explicit RoPE positions (``Case.positions``: a draft tree's prefix + depth)
    # memory layouts the adapter hands its library (``oracle.case.STORAGE_FEATURES``): "contiguous" is the
    # default storage (always accepted; without it the strategies draw a storage for every case);
    # "combined", "HND", "fused_qkv", "pool_offset" the ``Storage`` features it accepts
    storages: tuple[str, ...] = ("contiguous",)

    def replace(self, **changes: Any) -> Capabilities:
        return dataclasses.replace(self, **changes)

    def accepted_kv_dtypes(self, q_dtype: str) -> tuple[str, ...]:
        """q's own dtype, then the fp8 dtypes listed in ``kv_dtypes`` (never a mixed 16-bit pair)."""
        extra = tuple(d for d in (self.kv_dtypes or ()) if d in FP8_DTYPES)
        return (q_dtype, *extra)

    def unsupported_reason(self, case: Case) -> str | None:
        """Why this kernel cannot run ``case``, or None if it can."""
        failed = self.failed_checks(case)
        return "unsupported: " + ", ".join(why for _, why in failed) if failed else None

    def failed_checks(self, case: Case) -> list[tuple[str, str]]:
        """The capability fields ``case`` needs and this kernel lacks, each with what the case has."""
        lay, heads, opts = case.layout, case.heads, case.options
        both = opts.logits_soft_cap > 0 and opts.alibi_slopes is not None
        checks = [
            ("q_dtypes", opts.q_dtype in self.q_dtypes, f"q dtype {opts.q_dtype} not in {self.q_dtypes}"),
            ("kv_dtypes", opts.kv_dtype in self.accepted_kv_dtypes(opts.q_dtype), f"kv dtype {opts.kv_dtype} with q {opts.q_dtype}"),
            ("o_dtypes", not opts.q_is_fp8 or opts.out_dtype in self.o_dtypes, f"o dtype {opts.out_dtype} not in {self.o_dtypes}"),
            ("head_dims", self.head_dims is None or heads.head_dim_qk in self.head_dims, f"head_dim {heads.head_dim_qk}"),
            ("head_dim_vo_may_differ", self.head_dim_vo_may_differ or heads.head_dim_qk == heads.head_dim_vo, "head_dim_vo != head_dim_qk"),
            ("page_sizes", self.page_sizes is None or lay.page_size in self.page_sizes, f"page_size {lay.page_size}"),
            ("page_size_multiple", lay.page_size % self.page_size_multiple == 0, f"page_size % {self.page_size_multiple} != 0"),
            ("max_group_size", self.max_group_size is None or heads.group_size <= self.max_group_size, f"group {heads.group_size}"),
            ("max_qo_len", self.max_qo_len is None or max(lay.qo_lens) <= self.max_qo_len, f"qo_len > {self.max_qo_len}"),
            ("min_qo_len", min(lay.qo_lens) >= self.min_qo_len, f"qo_len < {self.min_qo_len}"),
            ("uniform_qo_len", not self.uniform_qo_len or len(set(lay.qo_lens)) == 1, "qo_lens differ across requests"),
            ("qo_len_above_kv_len", self.qo_len_above_kv_len or all(q <= k for q, k in zip(lay.qo_lens, lay.kv_lens)), "qo_len > kv_len"),
            ("empty_requests", self.empty_requests or (min(lay.kv_lens) > 0 and min(lay.qo_lens) > 0), "empty request"),
            ("causal", opts.causal in self.causal, f"causal={opts.causal}"),
            ("window_left", self.window_left or opts.window_left < 0, "window_left"),
            ("logits_soft_cap", self.logits_soft_cap or opts.logits_soft_cap == 0, "logits_soft_cap"),
            ("alibi", self.alibi or opts.alibi_slopes is None, "alibi"),
            ("soft_cap_alibi_order", not both or opts.soft_cap_alibi_order == self.soft_cap_alibi_order,
             f"soft cap + ALiBi in order {opts.soft_cap_alibi_order} (the kernel's is {self.soft_cap_alibi_order})"),
            ("sinks", self.sinks or opts.sinks is None, "sinks"),
            ("custom_sm_scale", self.custom_sm_scale or opts.sm_scale is None, "custom sm_scale"),
            ("fp8_scales", self.fp8_scales or (opts.k_scale == 1 and opts.v_scale == 1), "fp8 scales != 1"),
            ("custom_mask", (case.custom_mask is not None) in self.custom_mask, f"custom_mask={case.custom_mask is not None}"),
            ("mla", heads.mla in self.mla, f"mla={heads.mla}"),
            ("mla_dims", not heads.mla or self.mla_dims is None or (heads.head_dim_qk, heads.head_dim_vo) in self.mla_dims,
             f"mla dims {heads.head_dim_qk}/{heads.head_dim_vo}"),
            ("rope", (opts.rope is not None) in self.rope, f"rope={opts.rope is not None}"),
            ("rope_styles", opts.rope is None or opts.rope.style in self.rope_styles, f"rope style {opts.rope and opts.rope.style}"),
            ("rope_partial", self.rope_partial or opts.rope is None or opts.rope.span(heads)[1] == heads.head_dim_qk,
             f"rotary_dim {opts.rope and opts.rope.rotary_dim} < {'d_kpe' if heads.mla else 'head_dim_qk'}"),
            ("rope_positions", self.rope_positions or case.positions is None, "RoPE positions other than the index ones"),
            # the default storage always runs ("contiguous" left out only keeps it from being drawn)
            ("storages", case.storage is None or set(case.storage.features) <= set(self.storages),
             f"storage {'+'.join(storage_features(case.storage))} not in {self.storages}"),
        ]
        return [(name, why) for name, ok, why in checks if not ok]


@dataclass(frozen=True)
class Precondition:
    """A case the kernel's library excludes by contract (not a bug when it fails there): the
    ``Capabilities`` field that keeps the strategies from drawing it, and the documented reason."""

    capability: str  # a Capabilities field, set to exclude the case
    reason: str  # where the library says so (a function, a comment, a maintainer's issue)


@dataclass(frozen=True)
class Contract:
    """The conventions of a kernel's library that differ from the oracle's (``pa_oracle.oracle.case``)
    and that its adapter converts, and the preconditions outside which the library promises nothing.
    Conventions are converted, never reported as findings; the failure report lists the ones applied.

    ``alibi_lse_shift`` describes the per-row LSE shift under ALiBi that the adapter undoes (the
    output is unaffected: softmax is shift invariant); ``empty_row_lse`` the LSE the library
    documents for a row with no key, mapped to ``-inf``; ``soft_cap_alibi_order`` the order the
    library applies soft cap and ALiBi in (``Capabilities.soft_cap_alibi_order`` admits only it).
    """

    lse_base: str = "e"  # "e" or "2": the base of the LSE the kernel returns
    empty_row_lse: str | None = None
    alibi_lse_shift: str | None = None
    soft_cap_alibi_order: str = CAP_THEN_ALIBI
    preconditions: tuple[Precondition, ...] = ()

    def __post_init__(self) -> None:
        if self.lse_base not in ("e", "2"):
            raise ValueError(f"lse_base must be 'e' or '2', got {self.lse_base!r}")
        if self.soft_cap_alibi_order not in SOFT_CAP_ALIBI_ORDERS:
            raise ValueError(f"soft_cap_alibi_order must be one of {SOFT_CAP_ALIBI_ORDERS}, got {self.soft_cap_alibi_order!r}")
        known = {f.name for f in dataclasses.fields(Capabilities)}
        for pre in self.preconditions:
            if pre.capability not in known or not pre.reason.strip():
                raise ValueError(f"precondition {pre!r}: name a Capabilities field and give a reason")

    def conversions(self, case: Case, *, returns_lse: bool, alibi_shifted: bool) -> tuple[str, ...]:
        """What the adapter converted for ``case`` (for the failure report)."""
        done = []
        if returns_lse and self.lse_base == "2":
            done.append("LSE base 2 -> natural log")
        if returns_lse and self.empty_row_lse:
            done.append(f"LSE {self.empty_row_lse} of a row with no key -> -inf")
        if returns_lse and self.alibi_lse_shift and alibi_shifted:
            done.append(f"ALiBi LSE shift undone ({self.alibi_lse_shift})")
        if case.options.logits_soft_cap > 0 and case.options.alibi_slopes is not None:
            done.append(f"soft cap and ALiBi judged in the library's order ({self.soft_cap_alibi_order})")
        return tuple(done)


class Part(NamedTuple):
    """One uncomposed kernel of a composed adapter (``Backend.parts``): ``backend`` (a registered
    name, or a user kernel's ``MODULE:FUNCTION``) run on the case's ``requests``: "all", "decode"
    (the qo_len 1 requests) or "prefill" (every other request). The parts of an adapter cover
    every request once; the ``composed-vs-parts`` check compares the two."""

    requests: str
    backend: str


class Backend:
    """A kernel under test. Subclasses set ``name`` and ``capabilities`` and implement ``run``.

    >>> backend = get_backend("sdpa-math")                      # doctest: +SKIP
    >>> out, lse = backend.run(backend.plan(case), make_tensors(case, backend.device))  # doctest: +SKIP
    """

    # set on the class by a registered adapter; per instance where one class wraps many kernels (``UserKernel``)
    # or an adapter learns its kernel's limits when made (the installed library's version)
    name: str
    capabilities: Capabilities = Capabilities()
    description: ClassVar[str] = ""
    kind: ClassVar[str] = "attention"  # the kind of kernel: "attention", or "write" (``pa_oracle.backends.writes.WriteBackend``)
    package: ClassVar[str | None] = None  # the kernel library's import name, if any
    extra: ClassVar[str | None] = None  # the pip extra that installs it
    cuda_graphs: ClassVar[bool] = False  # True: ``capture_graph`` is implemented
    contract: ClassVar[Contract] = Contract()  # the library's conventions this adapter converts
    family: ClassVar[str | None] = None  # the wrapped kernel family ledger entries match (None: the name)
    parts: ClassVar[tuple[Part, ...]] = ()  # a composed kernel: the uncomposed ones of its library it equals

    @property
    def kernel_family(self) -> str:
        """The kernel this adapter wraps (adapters of one family share their findings)."""
        return self.family or self.name

    def conversions(self, case: Case) -> tuple[str, ...]:
        """The conventions converted for ``case`` (the failure report's line)."""
        return self.contract.conversions(case, returns_lse=self.capabilities.returns_lse, alibi_shifted=self.alibi_lse_shifted(case))

    def alibi_lse_shifted(self, case: Case) -> bool:
        """True if the contract's ALiBi LSE shift applies to ``case`` (default: any ALiBi case)."""
        return self.contract.alibi_lse_shift is not None and case.options.alibi_slopes is not None

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run on this machine (missing package, no GPU), or None."""
        if self.package is not None:
            try:
                importlib.import_module(self.package)
            except ImportError as exc:
                hint = f"; pip install 'paged-attention-oracle[{self.extra}]'" if self.extra else ""
                return f"{self.package} is not installed ({exc}){hint}"
        if self.device is None:
            return f"needs one of devices {self.capabilities.devices}; this machine has " + (
                "cuda and cpu" if torch.cuda.is_available() else "cpu only"
            )
        return None

    @property
    def device(self) -> str | None:
        devices = self.capabilities.devices
        if "cuda" in devices and torch.cuda.is_available():
            return "cuda"
        return "cpu" if "cpu" in devices else None

    def versions(self) -> dict[str, str]:
        versions: dict[str, str] = {"torch": torch.__version__}
        if self.package is not None:
            versions[self.package] = getattr(importlib.import_module(self.package), "__version__", "?")
        return versions

    def unsupported_reason(self, case: Case) -> str | None:
        """The capability misses for ``case``; one that a contract precondition excludes says why."""
        failed = self.capabilities.failed_checks(case)
        if not failed:
            return None
        why = {pre.capability: pre.reason for pre in self.contract.preconditions}
        return "unsupported: " + ", ".join(f"{text} (outside the kernel's contract: {why[name]})" if name in why else text for name, text in failed)

    def plan(self, case: Case) -> Any:
        """Per-layout preparation (FlashInfer's ``plan``); the default keeps the case."""
        return case

    def run(self, plan: Any, tensors: Tensors) -> KernelOutput:
        raise NotImplementedError

    # plan tensors a kernel may write by design: FA3's scheduler metadata holds the tile semaphore
    plan_scratch: ClassVar[tuple[str, ...]] = ("scheduler_metadata",)

    def plan_inputs(self, plan: Any) -> dict[str, torch.Tensor]:
        """The tensors ``plan`` holds that the kernel reads (index tensors, block tables, ...):
        the judge checksums them with q and the caches, so a kernel that writes one fails. The
        default takes every tensor of a dict plan but those named in ``plan_scratch``; an adapter
        whose plan holds them elsewhere overrides this."""
        if not isinstance(plan, dict):
            return {}
        return {
            f"plan[{key!r}]": value for key, value in plan.items()
            if isinstance(value, torch.Tensor) and key not in self.plan_scratch
        }

    def merge_states(
        self, out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
    ) -> KernelOutput:
        """Combine two partial states over disjoint keys (natural-log LSE) with the kernel library's
        own merge; the default is the oracle's formula in float32, out in the inputs' dtype."""
        from pa_oracle.oracle.reference import merge_states

        out, lse = merge_states(out_a.float(), lse_a.float(), out_b.float(), lse_b.float())
        return KernelOutput(out.to(out_a.dtype), lse)

    def write_layout(self, plan: Any, case: Case) -> None:
        """Write ``case``'s layout, in place and without planning again, into the device buffers
        through which ``run`` reads ``plan``'s layout (what an engine does between steps). Raise
        ``Unsupported`` if ``case`` does not fit those buffers. Adapters whose plan holds the
        layout only as host data (the default: the plan is the case) have no such buffers."""
        raise NotImplementedError(f"{self.name}: the plan holds the layout as host data (no device layout buffers)")

    def capture_graph(self, case: Case, tensors: Tensors) -> GraphCall:
        """Capture one call of ``case`` in a CUDA graph over static copies of ``tensors``."""
        raise Unsupported(f"{self.name} declares no CUDA-graph path")

    def call_source(self, case: Case) -> str | None:
        """The kernel call exactly as ``run`` makes it, as standalone Python source for an upstream
        repro (``pa-oracle triage --upstream``), or None: this adapter has no upstream repro. The
        source may use only torch, math and the kernel's library, and the names the repro defines
        (``pa_oracle.fuzz.triage.upstream.PRELUDE_NAMES``); it must set ``out`` [total_q, Hq, Dvo]
        and ``lse`` (natural log [total_q, Hq], or None), converted as ``run`` converts them."""
        return None

    # --- compile keys: which compiled variant of the kernel a case needs (``pa_oracle.fuzz.campaign.variants``) ---
    # the case fields (names of ``VARIANT_FIELDS``) whose values select a compiled variant; () = nothing compiles
    compile_fields: ClassVar[tuple[str, ...]] = ()
    compile_seconds: ClassVar[float] = 10.0  # about what building one key costs (plans the compile budget)

    def compile_key(self, case: Case) -> CompileKey:
        """The compiled variant ``case`` runs on: its ``compile_fields`` values (``()``: one for all)."""
        return compile_key_of(case, self.compile_fields)

    def built_reason(self, key: CompileKey) -> str | None:
        """Why running ``key`` compiles nothing ("prebuilt", "cached", "nothing compiles"), or None
        if its first case pays a compile. Compiles made by this process are tracked by the caller."""
        return "nothing compiles" if not key else None

    def build_shared(self) -> bool:
        """Build what every key of this backend loads (a module no key names) if it is not built yet; True if
        something was built. The variant plan calls it once, before its first case, counting it as compiling."""
        return False

    def build_variants(self, keys: list[CompileKey]) -> list[CompileKey] | None:
        """Build ``keys`` ahead of any case (in parallel where the library allows) and return those
        built; None: this adapter has no ahead-of-time build (warm-up then runs one case per key)."""
        return None

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


CompileKey = tuple[tuple[str, Any], ...]  # ((field, value), ...) in ``compile_fields`` order

# the case fields a compile key may name: what each reads from a case. The strategies can draw a case
# inside any combination of these values (``pa_oracle.fuzz.draw.strategies.cases(..., pinned=)``).
VARIANT_FIELDS: dict[str, Callable[[Case], Any]] = {
    "q_dtype": lambda case: case.options.q_dtype,
    "kv_dtype": lambda case: case.options.kv_dtype,
    "o_dtype": lambda case: case.options.out_dtype,
    "head_dim_qk": lambda case: case.heads.head_dim_qk,
    "head_dim_vo": lambda case: case.heads.head_dim_vo,
    "num_kv_heads": lambda case: case.heads.num_kv_heads,
    "group_size": lambda case: case.heads.group_size,
    "causal": lambda case: case.options.causal,
    "alibi": lambda case: case.options.alibi_slopes is not None,
    "window": lambda case: case.options.window_left >= 0,
    "soft_cap": lambda case: case.options.logits_soft_cap > 0,
    "window_left": lambda case: case.options.window_left,  # the value: a Triton constexpr compiles per value
    "logits_soft_cap": lambda case: case.options.logits_soft_cap,  # likewise
    "sinks": lambda case: case.options.sinks is not None,
    "rope": lambda case: case.options.rope is not None,  # FlashInfer compiles per pos_encoding_mode
    "mla": lambda case: case.heads.mla,  # an MLA key's head dims are one of its ``mla_dims`` pairs
}


def compile_key_of(case: Case, fields: tuple[str, ...]) -> CompileKey:
    """``case``'s values of ``fields`` (each a ``VARIANT_FIELDS`` name), as a compile key."""
    return tuple((field, VARIANT_FIELDS[field](case)) for field in fields)


_REGISTRY: dict[str, type[Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: make a backend discoverable by name."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"backend name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def registered() -> dict[str, type[Backend]]:
    return dict(_REGISTRY)


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, even for an exception whose ``__str__`` raises or returns a non-string (a kernel's
    exception is the kernel's: describing it must not fail the judge)."""
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - whatever __str__ does, the exception is still reported
        return f"<{type(exc).__name__} whose __str__ raised>"
    return text if isinstance(text, str) else f"<{type(exc).__name__} whose __str__ returned {type(text).__name__}>"
