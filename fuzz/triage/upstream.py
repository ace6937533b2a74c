"""Upstream-ready reports: ``DIR/repro.py``, a script that needs only torch, numpy and the kernel's own
library (never this project), and ``DIR/ISSUE.md``.

The script holds the case's exact tensors (raw bits, compressed, base64 inside it; an
``inputs.npz`` beside it when they are too large), the kernel call as the adapter makes it
(``Backend.call_source``), a short float64 reference and the allowed error this project's
tolerance model derives for the case. It exits 1 when the problem reproduces, 0 when it does not,
2 when it could not run the kernel for another reason.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import sys
import textwrap
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pa_oracle.backends.base import Backend, KernelOutput
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.finding_record import FindingMeta, FoundBy
from pa_oracle.fuzz.campaign.findings import ratio_words
from pa_oracle.fuzz.campaign.strength import QUANTITIES, limits, strengths
from pa_oracle.oracle.case import Case, Options
from pa_oracle.oracle.reference import plain_attention, reference
from pa_oracle.oracle.report import locate
from pa_oracle.oracle.tensors import Tensors, make_tensors, raw_bits, token_slots
from pa_oracle.oracle.tolerance import Tolerance, Verdict, compare

EMBED_LIMIT = 96 << 10  # compressed tensor bytes embedded in repro.py; more go to inputs.npz beside it

# names the repro defines before the kernel call (``Backend.call_source`` may use these)
PRELUDE_NAMES = (
    "device", "q", "k_cache", "v_cache", "B", "qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len",
    "qo_lens", "kv_lens", "page_size", "num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo",
    "sm_scale", "causal", "window_left", "logits_soft_cap", "alibi_slopes", "sinks", "k_scale", "v_scale",
    "block_table", "token_slots", "index",
)


# the first docstring line of a repro.py written by hand for a golden case (``golden report`` keeps it)
HAND_WRITTEN = "Written for paged-attention-oracle's golden case"


class NoUpstreamRepro(Exception):
    """The adapter provides no call source: no standalone repro can be written for it."""


@dataclass(frozen=True)
class Element:
    """One wrong element of the output or the LSE, as ISSUE.md shows it."""

    tensor: str  # "out" or "lse"
    where: str  # "request 0, token 1 (position 4), qo head 2, dim 7"
    expected: float  # the float64 reference
    got: float  # the kernel's


@dataclass
class Seen:
    """What the finding showed where it was found (the numbers ISSUE.md quotes). Triage gives the judge's
    ``verdict`` on the case (its limits are what repro.py checks, its failing quantities make the title), a few
    wrong ``elements``, the options the failure ``needs`` and what the case it was minimized from showed
    (``before``); a golden case's record gives none of them (the limits are then derived from the case)."""

    status: str  # fail or crash
    message: str
    versions: dict[str, str] = field(default_factory=dict)
    gpu: str = ""
    verdict: Verdict | None = None
    elements: tuple[Element, ...] = ()
    needs: tuple[str, ...] = ()
    before: str = ""

    @property
    def headline(self) -> str:
        return self.message.splitlines()[0] if self.message else self.status


def allowed_errors(case: Case, tensors: Tensors, tolerance: Tolerance = Tolerance()) -> dict[str, float]:
    """The case's error limits (they depend on the case only: the reference and the controls)."""
    ref = reference(case, tensors)
    dtype = getattr(torch, case.options.q_dtype)
    controls = [plain_attention(case, tensors, dtype, reorder_ops=r) for r in (False, True)]
    verdict: Verdict = compare(case, out=ref.out.to(dtype), lse=ref.lse.float(), ref=ref, controls=controls, tolerance=tolerance)
    assert verdict.out is not None and verdict.lse is not None
    return {"out_max": verdict.out.limit_max, "out_mean": verdict.out.limit_mean, "lse_max": verdict.lse.limit_max}


def wrong_elements(case: Case, output: KernelOutput, verdict: Verdict, tensors: Tensors | None = None,
                   count: int = 3) -> tuple[Element, ...]:
    """The ``count`` largest errors of each quantity ``verdict`` fails (out, then LSE): where, expected, got."""
    ref = reference(case, tensors if tensors is not None else make_tensors(case, "cpu"))
    found: list[Element] = []
    for failing in strengths(verdict):
        error = verdict.error if failing.quantity == "out" else verdict.lse_error
        got = output.out if failing.quantity == "out" else output.lse
        if error is None or got is None:
            continue
        expected = ref.out if failing.quantity == "out" else ref.lse
        for flat in error.reshape(-1).cpu().topk(min(count, error.numel())).indices.tolist():
            index = tuple(int(i) for i in np.unravel_index(flat, tuple(error.shape)))
            found.append(Element(failing.quantity, _where(case, index), float(expected[index]), float(got[index])))
    return tuple(found)


def _where(case: Case, index: tuple[int, ...]) -> str:
    """``request 0, token 1 (position 4), qo head 2[, dim 7]`` of an (row, head[, dim]) index."""
    row, head, *dim = index
    at = locate(case, row, head, dim[0] if dim else 0, 0.0)
    return f"request {at.request}, token {at.token} (position {at.position}), qo head {head}" + (f", dim {dim[0]}" if dim else "")


def issue_title(backend: str, seen: Seen) -> str:
    """``BACKEND: output wrong by 1,804x the allowed error when soft cap and ALiBi are both on``: the failing
    quantities of the verdict and their ratios, and the options the failure needs; the verdict line without one."""
    failing = strengths(seen.verdict) if seen.verdict is not None else ()
    if not failing:
        return f"{backend}: {seen.headline}"
    first, *rest = failing
    wrong = f"{QUANTITIES[first.quantity]} wrong by {ratio_words(first.ratio)}x"
    wrong += "".join(f" and {QUANTITIES[s.quantity]} by {ratio_words(s.ratio)}x" for s in rest)
    mean = " mean" if first.statistic == "mean" and not rest else ""
    return f"{backend}: {wrong} the allowed{mean} error{_when(seen.needs)}"


def _when(needs: tuple[str, ...]) -> str:
    if not needs:
        return ""
    if len(needs) == 1:
        return f" when {needs[0]} is on"
    both = "both" if len(needs) == 2 else "all"
    return f" when {', '.join(needs[:-1])} and {needs[-1]} are {both} on"


def _tensor_bits(tensors: Tensors) -> tuple[bytes, dict[str, str]]:
    """The tensors as an npz of raw bits (fp8 and bf16 have no numpy dtype) and their torch dtypes."""
    arrays: dict[str, Any] = {}  # np.savez's keywords: arrays by name
    dtypes: dict[str, str] = {}
    for name, t in tensors.as_dict().items():
        t = t.detach().cpu()
        arrays[name] = raw_bits(t).numpy()
        dtypes[name] = str(t.dtype).removeprefix("torch.")
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue(), dtypes


def _literal(value: Any) -> str:
    return json.dumps(value).replace("true", "True").replace("false", "False").replace("null", "None")


def _prelude(case: Case) -> str:
    lay, heads, opts = case.layout, case.heads, case.options
    values = {
        "qo_indptr": list(lay.qo_indptr), "kv_indptr": list(lay.kv_indptr), "kv_indices": list(lay.kv_indices),
        "kv_last_page_len": list(lay.kv_last_page_len), "page_size": lay.page_size,
        "num_qo_heads": heads.num_qo_heads, "num_kv_heads": heads.num_kv_heads,
        "head_dim_qk": heads.head_dim_qk, "head_dim_vo": heads.head_dim_vo,
        "sm_scale": case.sm_scale, "causal": opts.causal, "window_left": opts.window_left,
        "logits_soft_cap": opts.logits_soft_cap,
        "alibi_slopes": None if opts.alibi_slopes is None else list(opts.alibi_slopes),
        "sinks": None if opts.sinks is None else list(opts.sinks),
        "k_scale": opts.k_scale, "v_scale": opts.v_scale,
    }
    lines = [f"{name} = {_literal(value)}" for name, value in values.items()]
    lines += [
        "qo_lens = [b - a for a, b in zip(qo_indptr, qo_indptr[1:])]",
        "kv_lens = [0 if b == a else (b - a - 1) * page_size + n for a, b, n in zip(kv_indptr, kv_indptr[1:], kv_last_page_len)]",
        "B = len(qo_lens)",
        f"block_table = {_literal(lay.block_table(pad=0))}  # per request its pages, padded with page 0",
        f"token_slots = {_literal(token_slots(case).tolist())}  # page * page_size + slot of every key, request-major",
    ]
    return "\n".join(lines)


_TEMPLATE = '''\
#!/usr/bin/env python3
"""{title}

Standalone reproducer: needs only torch, numpy{library}. Exit 1: the problem reproduces;
0: it does not (fixed?); 2: the kernel could not be run for another reason.
Generated by `pa-oracle triage --upstream` (paged-attention-oracle) from case {case_id}.
"""
import base64
import io
import math
import sys
import traceback
import zlib
from pathlib import Path

import numpy as np
import torch
{path_setup}
# ---- the case: a paged KV pool [num_pages, page_size, num_kv_heads, head_dim] (NHD), CSR page table
{prelude}
# what was seen where it was found ({seen_where})
SEEN_STATUS = {seen_status!r}
SEEN = {seen_message!r}
# the largest errors this case allows (paged-attention-oracle's tolerance model: 3x the error of a plain
# computation in the same dtype, plus twice the rounding bound; mean: 2x the plain mean error)
ALLOWED = {allowed}

device = "cuda" if torch.cuda.is_available() and {cuda_ok} else "cpu"
DTYPES = {dtypes}
TENSORS = {tensors}  # zlib-compressed npz of the raw bits, base64 (None: inputs.npz beside this script)


def index(xs):
    return torch.tensor(xs, dtype=torch.int32, device=device)


def load_tensors():
    raw = zlib.decompress(base64.b64decode(TENSORS)) if TENSORS else Path(__file__).with_name("inputs.npz").read_bytes()
    arrays = np.load(io.BytesIO(raw))
    return [torch.from_numpy(arrays[n]).view(getattr(torch, DTYPES[n])).to(device) for n in ("q", "k_cache", "v_cache")]


def reference(q, k_cache, v_cache):
    """float64: s = sm_scale * q.k; s = cap * tanh(s / cap); s -= slope * |p - j|; query i of a request
    sits at p = kv_len - qo_len + i (bottom-right); causal keeps j <= p, a window keeps j >= p - window_left;
    a sink adds exp(sink) to the denominator only; a row with no key has out 0 and lse -inf."""
    group = num_qo_heads // num_kv_heads
    out = torch.zeros(q.shape[0], num_qo_heads, head_dim_vo, dtype=torch.float64)
    lse = torch.full((q.shape[0], num_qo_heads), -math.inf, dtype=torch.float64)
    slots = torch.tensor(token_slots, dtype=torch.long)
    keys = k_cache.cpu().flatten(0, 1)[slots].double() * k_scale
    values = v_cache.cpu().flatten(0, 1)[slots].double() * v_scale
    first = 0
    for b in range(B):
        rows, n = slice(qo_indptr[b], qo_indptr[b + 1]), kv_lens[b]
        k, v = keys[first : first + n], values[first : first + n]
        first += n
        p = torch.arange(qo_lens[b])[:, None] + n - qo_lens[b]
        j = torch.arange(n)[None, :]
        for h in range(num_qo_heads):
            s = sm_scale * q[rows, h].cpu().double() @ k[:, h // group].T
            if logits_soft_cap > 0:
                s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
            if alibi_slopes is not None:
                s = s - alibi_slopes[h] * (p - j).abs()
            keep = torch.ones_like(s, dtype=torch.bool)
            if causal:
                keep &= j <= p
            if window_left >= 0:
                keep &= j >= p - window_left
            s = s.masked_fill(~keep, -math.inf)
            m = s.amax(-1, keepdim=True).clamp(min=-1e300) if n else torch.zeros(s.shape[0], 1, dtype=torch.float64)
            w = torch.exp(s - m)
            z = w.sum(-1, keepdim=True)
            lse[rows, h] = torch.where(z[:, 0] > 0, (m + torch.log(z))[:, 0], -math.inf)
            if sinks is not None:
                z = z + torch.exp(sinks[h] - m)
            out[rows, h] = torch.where(keep.any(-1, keepdim=True), (w @ v[:, h // group]) / z, 0.0)
    return out, lse


def call_kernel(q, k_cache, v_cache):
    # ---- the kernel call, exactly as paged-attention-oracle's {backend!r} adapter makes it
{call}
    return out, lse


def judge(out, lse, ref_out, ref_lse):
    problems = []
    out = out.detach().cpu().double()
    if tuple(out.shape) != tuple(ref_out.shape):
        return [f"out has shape {{tuple(out.shape)}}, expected {{tuple(ref_out.shape)}}"]
    empty = torch.isinf(ref_lse)
    err = (out - ref_out).abs().nan_to_num(nan=math.inf)
    if not torch.isfinite(out).all():
        problems.append(f"out has {{int((~torch.isfinite(out)).sum())}} non-finite elements")
    if ((out != 0).any(-1) & empty).any():
        problems.append(f"{{int(((out != 0).any(-1) & empty).sum())}} rows with no key to attend are not exactly 0")
    live = err[~empty]
    if live.numel() and live.max() > ALLOWED["out_max"]:
        row, head, d = (int(i) for i in torch.unravel_index(torch.argmax(err.masked_fill(empty[..., None], 0.0)), err.shape))
        problems.append(f"out max error {{float(live.max()):.4g}} > {{ALLOWED['out_max']:.4g}} allowed: out[{{row}}, {{head}}, {{d}}] "
                        f"expected {{float(ref_out[row, head, d]):.6g}}, got {{float(out[row, head, d]):.6g}}")
    elif live.numel() and live.mean() > ALLOWED["out_mean"]:
        problems.append(f"out mean error {{float(live.mean()):.4g}} > {{ALLOWED['out_mean']:.4g}} allowed "
                        f"(max error {{float(live.max()):.4g}}, {{ALLOWED['out_max']:.4g}} allowed)")
    if lse is not None:
        lse = lse.detach().cpu().double()
        wrong_empty = empty & (lse != -math.inf)
        if wrong_empty.any():
            problems.append(f"{{int(wrong_empty.sum())}} rows with no key have lse {{lse[wrong_empty][:3].tolist()}}, expected -inf")
        lse_err = (lse - ref_lse).abs().nan_to_num(nan=math.inf).masked_fill(empty, 0.0)
        if lse_err.max() > ALLOWED["lse_max"]:
            row, head = (int(i) for i in torch.unravel_index(torch.argmax(lse_err), lse_err.shape))
            wrong = int((lse_err > ALLOWED["lse_max"]).sum())
            problems.append(f"lse wrong on {{wrong}} of {{lse_err.numel()}} (row, head): lse[{{row}}, {{head}}] expected "
                            f"{{float(ref_lse[row, head]):.6g}}, got {{float(lse[row, head]):.6g}} ({{ALLOWED['lse_max']:.3g}} allowed)")
    return problems


def main():
    print(f"torch {{torch.__version__}}, device {{torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}}")
    print(f"seen where found: {{SEEN}}")
    q, k_cache, v_cache = load_tensors()
    ref_out, ref_lse = reference(q, k_cache, v_cache)
    try:
        out, lse = call_kernel(q, k_cache, v_cache)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc(){import_check}
        if SEEN_STATUS == "crash":
            print(f"REPRODUCED: the call raises {{type(exc).__name__}}: {{exc}}")
            return 1
        print(f"COULD NOT RUN the kernel: {{type(exc).__name__}}: {{exc}}")
        return 2
    same_shape = tuple(out.shape) == tuple(ref_out.shape)
    err = (out.detach().cpu().double() - ref_out).abs() if same_shape else None
    stats = f"out error: max {{float(err.max()):.4g}}, mean {{float(err.mean()):.4g}}" if same_shape and err.numel() else "no comparable output"
    if lse is not None and tuple(lse.shape) == tuple(ref_lse.shape):
        live = ~torch.isinf(ref_lse)
        if live.any():
            stats += f"; lse error max {{float((lse.detach().cpu().double() - ref_lse).abs()[live].max()):.4g}}"
    print(stats)
    problems = judge(out, lse, ref_out, ref_lse)
    for line in problems:
        print("  " + line)
    if problems:
        print("REPRODUCED")
        return 1
    print("NOT REPRODUCED: the kernel agrees with the float64 reference" + (" (it raised where found)" if SEEN_STATUS == "crash" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


# a user kernel's module is importable from the folder it is run in (``python repro.py`` from the kernel's
# folder, as ISSUE.md says): Python puts only the script's own folder on the path
_PATH_SETUP = """
import os
if os.getcwd() not in sys.path:  # {module} is imported from the current folder
    sys.path.insert(0, os.getcwd())
"""
# ... and its module not importing (run elsewhere) is no reproduction of a crash: exit 2, saying where to run it
# (a registry adapter's repro, whose library is installed, has neither: golden reports regenerate identically)
_IMPORT_CHECK = """
        if isinstance(exc, ImportError) and not SEEN.startswith(type(exc).__name__):
            print(f"COULD NOT RUN the kernel: {{type(exc).__name__}}: {{exc}}")
            print({hint!r})
            return 2"""


def kernel_library(backend: Backend, call: str) -> str:
    """The import name of the library the call needs: the adapter's ``package``, else the call's first import."""
    if backend.package:
        return backend.package
    found = [m for m in re.findall(r"^(?:from|import)\s+([A-Za-z_]\w*)", call, re.MULTILINE)
             if m not in sys.stdlib_module_names and m not in ("torch", "numpy")]
    return found[0] if found else "the kernel's module"


def repro_script(case: Case, backend: Backend, seen: Seen, tensors: Tensors | None = None,
                 tolerance: Tolerance = Tolerance()) -> tuple[str, bytes | None]:
    """(repro.py source, inputs.npz bytes when the tensors are too large to embed, else None)."""
    call = backend.call_source(case)
    if call is None:
        raise NoUpstreamRepro(f"no upstream repro for this adapter: {backend.name} provides no call source (Backend.call_source)")
    if case.storage is not None:
        raise NoUpstreamRepro(
            f"no upstream repro for a case in storage {case.storage.label()}: the standalone script hands the kernel "
            "contiguous NHD caches and a contiguous q, so a failure that needs this memory layout would not reproduce "
            "there. Triage's 'options needed' says whether it does; the same case with \"storage\": null, if it still "
            "fails, gets a repro")
    tensors = tensors if tensors is not None else make_tensors(case, "cpu")
    npz, dtypes = _tensor_bits(tensors)
    packed = zlib.compress(npz, 9)
    embedded = len(packed) <= EMBED_LIMIT
    library = f" and {kernel_library(backend, call)}"
    source = _TEMPLATE.format(
        title=issue_title(backend.name, seen),
        library=library, case_id=case.case_id, prelude=_prelude(case),
        seen_where=", ".join(f"{k} {v}" for k, v in seen.versions.items()) + (f", {seen.gpu}" if seen.gpu else ""),
        seen_status=seen.status, seen_message=seen.message.splitlines()[0] if seen.message else "",
        allowed=_literal(_allowed(case, tensors, seen, tolerance)),
        cuda_ok=repr("cuda" in backend.capabilities.devices), dtypes=_literal(dtypes),
        tensors=repr(base64.b64encode(packed).decode()) if embedded else "None",
        backend=backend.name, call=textwrap.indent(call.strip("\n"), "    "),
        path_setup=_PATH_SETUP.format(module=module) if (module := _runs_from_cwd(backend)) else "",
        import_check=_IMPORT_CHECK.format(hint=import_hint(module, seen)) if module else "",
    )
    return source, None if embedded else npz


def _allowed(case: Case, tensors: Tensors, seen: Seen, tolerance: Tolerance) -> dict[str, float]:
    """The limits repro.py checks: the judge's, from its verdict on this case; derived from the case without one."""
    judged = limits(seen.verdict) if seen.verdict is not None else None
    return judged if judged is not None else allowed_errors(case, tensors, tolerance)


ALWAYS_SHOWN = ("q_dtype", "kv_dtype")  # never "off": a reader needs them even at their defaults


def options_line(opts: Options) -> str:
    """Every option of ``opts`` that is not its ``Options`` default, by value: ``window_left=0`` and
    ``logits_soft_cap=0`` (an int, not the default 0.0) included (``0 == 0.0`` and ``0 == False`` hide them
    from ``==``), the dtypes always; in field order."""
    shown = []
    for f in fields(Options):
        value = getattr(opts, f.name)
        if f.name in ALWAYS_SHOWN or not _same(value, f.default):
            shown.append(f"{f.name}={value}")
    return ", ".join(shown)


def _same(value: Any, default: Any) -> bool:
    return type(value) is type(default) and repr(value) == repr(default)


def _runs_from_cwd(backend: Backend) -> str | None:
    """The module a user kernel's repro imports (the repro puts the current folder on ``sys.path`` for
    it); None for a registry adapter, whose library is installed."""
    if not isinstance(backend, UserKernel):
        return None
    spec = backend.import_spec()
    return spec[0] if spec else None


def import_root(module: str, module_file: str) -> str | None:
    """The folder to run a user kernel's repro from (or to put on ``PYTHONPATH``) so that ``import module`` finds
    ``module_file``: ``/p`` for ``mykern`` in ``/p/mykern.py``, ``my_pkg.my_mod`` in ``/p/my_pkg/my_mod.py`` and
    ``my_pkg`` in ``/p/my_pkg/__init__.py``; None when the file is unknown or does not fit the name."""
    path = Path(module_file)
    if not path.is_absolute() or path.suffix != ".py":
        return None
    up = module.count(".") + (path.name == "__init__.py")
    return str(path.parents[up]) if up < len(path.parents) else None


def import_hint(module: str, seen: Seen) -> str:
    """What a user kernel's repro.py says when ``module`` does not import where it is run: the folder to run it
    from (where it was found) or to put on ``PYTHONPATH``."""
    root = import_root(module, seen.versions.get("module_file", ""))
    where = f" (where it was found: {root})" if root else ""
    return (f"Run this script from the folder that {module} is imported from{where}, or put that folder on "
            f"PYTHONPATH: PYTHONPATH=FOLDER python repro.py")


def issue_markdown(case: Case, backend: Backend, seen: Seen, findings: list[str] | None = None,
                   explanation: str | None = None, title: str | None = None) -> str:
    """ISSUE.md: versions and GPU, the minimal case, the call, what is wrong, and (``explanation``) why."""
    lay, heads, opts = case.layout, case.heads, case.options
    runs = _runs_from_cwd(backend)
    lines = [
        f"# {title or issue_title(backend.name, seen)}", "",
        "## Environment", "",
        *[f"- {k}: {v}" for k, v in seen.versions.items()],
        f"- GPU: {seen.gpu or 'not recorded'}", "",
        "## Minimal case", "",
        f"- batch {lay.batch_size}: qo_lens {list(lay.qo_lens)}, kv_lens {list(lay.kv_lens)}, page size {lay.page_size}",
        f"- heads: {heads.num_qo_heads} query / {heads.num_kv_heads} kv, head dim {heads.head_dim_qk}"
        + (f" / {heads.head_dim_vo}" if heads.head_dim_vo != heads.head_dim_qk else ""),
        f"- options: {options_line(opts)}; sm_scale {case.sm_scale:.6g}",
        "", "`python repro.py` runs it (torch, numpy and the kernel's library only); it prints the expected and the",
        "actual numbers and exits 1 while the problem reproduces.", *([
            f"Run it from the folder `{runs}` is imported from (the script puts the current folder on `sys.path`),",
            "or with that folder on `PYTHONPATH`."] if runs else []), "",
        "## The call", "", "Runnable beside `repro.py` (it loads the case's exact tensors from it):", "",
        "```python", call_snippet(case, backend), "```", "",
        "## What is wrong", "", *_wrong_lines(seen),
        *[f"- {line}" for line in findings or ()], "",
    ]
    if explanation:
        lines += ["## Why", "", explanation.strip("\n"), ""]
    return "\n".join(lines)


def call_snippet(case: Case, backend: Backend) -> str:
    """The kernel call with every name it uses defined: the case's values the call reads (``_prelude``'s lines it
    needs), the tensors and helpers from ``repro.py`` beside it."""
    call = (backend.call_source(case) or "").strip("\n")
    needed = set(_NAME.findall(call))
    kept: list[str] = []
    for line in reversed(_prelude(case).splitlines()):
        name, _, value = line.partition(" = ")
        if name in needed:
            kept.insert(0, line)
            needed |= set(_NAME.findall(value.split("  #")[0]))
    return "\n".join([
        "import math", "", "import torch", "from repro import device, index, load_tensors  # repro.py, beside this file", "",
        *kept, "q, k_cache, v_cache = load_tensors()", "", call,
    ])


_NAME = re.compile(r"[A-Za-z_]\w*")


def _wrong_lines(seen: Seen) -> list[str]:
    """What is wrong: each failing quantity's error, allowed error and ratio (the verdict's), a few wrong elements
    (expected, got, where), and what the case it was minimized from showed."""
    if seen.verdict is None or not seen.verdict.failures:
        lines = [f"- {seen.headline}"]
    else:
        ratios = {f"{s.quantity} {s.statistic} error ": ratio_words(s.ratio) for s in strengths(seen.verdict)}
        lines = [f"- {line}" + next((f": {r}x the allowed error" for start, r in ratios.items() if line.startswith(start)), "")
                 for line in seen.verdict.failures]
    if seen.elements:
        lines += ["", "| tensor | element | expected (float64) | got | error |", "|---|---|---|---|---|"]
        lines += [f"| {e.tensor} | {e.where} | {e.expected:.6g} | {e.got:.6g} | {abs(e.got - e.expected):.3g} |"
                  for e in seen.elements]
        lines.append("")
    if seen.before:
        lines.append(f"- {seen.before}")
    return lines


RECORD = ".pa-oracle-upstream.json"  # what write_upstream wrote in a folder: each file's sha256
GENERATED = "Generated by `pa-oracle triage --upstream`"  # in the docstring of every repro.py it writes


class UpstreamFileKept(NoUpstreamRepro):
    """A file of the --upstream folder that this tool did not write, or that was edited since it did:
    kept, and nothing was written."""


def write_upstream(out_dir: Path, case: Case, backend: Backend, seen: Seen, *, findings: list[str] | None = None,
                   explanation: str | None = None, title: str | None = None, tensors: Tensors | None = None) -> dict[str, Path]:
    """Write DIR/repro.py (+ inputs.npz if large) and DIR/ISSUE.md; raises NoUpstreamRepro.

    It never replaces a file it did not write (the rule of ``--out``): a file is replaced only when
    ``DIR/.pa-oracle-upstream.json`` records it as written here and unchanged since, or when it holds
    what would be written anyway. An ISSUE.md with a hand-written ``## Why`` keeps its title and its Why
    (``golden report``'s rule: the rest is written anew); a repro.py this tool generated before it kept
    records (its ``GENERATED`` line, none ``HAND_WRITTEN``) may be replaced. An ISSUE.md of this tool's with
    other sections written by hand (an ``## Analysis``: a heading it does not write) keeps them, before its Why.
    Anything else, a repro.py marked ``HAND_WRITTEN`` first, raises ``UpstreamFileKept`` before any file is written."""
    out_dir = Path(out_dir)
    issue_path = out_dir / "ISSUE.md"
    if explanation is None and issue_path.is_file():
        text = issue_path.read_text(errors="replace")
        if "\n## Why\n" in text:  # hand-written: its title and its Why are kept
            explanation, title = text.split("\n## Why\n", 1)[1], title or text.splitlines()[0].removeprefix("# ")
    source, npz = repro_script(case, backend, seen, tensors)
    issue = issue_markdown(case, backend, seen, findings, explanation, title)
    hand = _hand_sections(issue_path.read_text(errors="replace") if issue_path.is_file() else "", issue)
    contents = {"repro.py": source.encode(), "ISSUE.md": _with_sections(issue, hand).encode()}
    if npz is not None:
        contents["inputs.npz"] = npz
    record = _record(out_dir)
    kept = [why for name, content in contents.items()
            if (why := _kept(out_dir / name, content, record, explanation, bool(hand))) is not None]
    if kept:
        raise UpstreamFileKept(f"{out_dir}: not written, to keep {'; '.join(kept)}. Move them away or give another --upstream folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, content in contents.items():
        path = out_dir / name
        partial = out_dir / f".{name}.partial"
        partial.write_bytes(content)
        if name == "repro.py":
            partial.chmod(0o755)
        partial.replace(path)
        written[{"repro.py": "repro", "ISSUE.md": "issue", "inputs.npz": "inputs"}[name]] = path
        record[name] = hashlib.sha256(content).hexdigest()
    (out_dir / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return written


def _record(out_dir: Path) -> dict[str, str]:
    """The sha256 of each file write_upstream wrote in ``out_dir`` (empty when none, or unreadable)."""
    try:
        record = json.loads((out_dir / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in record.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(record, dict) else {}


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, text) of each ``## `` section of a markdown ``text`` (a ``## `` line in a code block is none)."""
    sections: list[tuple[str, str]] = []
    fenced = False
    for line in text.splitlines(keepends=True):
        fenced ^= line.startswith("```")
        if line.startswith("## ") and not fenced:
            sections.append((line[3:].strip(), ""))
        if sections:
            sections[-1] = (sections[-1][0], sections[-1][1] + line)
    return sections


def _hand_sections(old: str, new: str) -> list[str]:
    """The sections of an ISSUE.md ``old`` that ``new`` (this tool's) has no heading of: written by hand (an
    ``## Analysis``), when ``old`` is this tool's ISSUE.md (a heading of ``new`` is in it); else none."""
    ours = {heading for heading, _ in _sections(new)}
    old_sections = _sections(old)
    if not any(heading in ours for heading, _ in old_sections):
        return []
    return [text.rstrip("\n") + "\n" for heading, text in old_sections if heading not in ours]


def _with_sections(issue: str, sections: list[str]) -> str:
    """``issue`` with ``sections`` (carried from the ISSUE.md it replaces) before its ``## Why``, else at its end."""
    if not sections:
        return issue
    head, why, tail = issue.partition("\n## Why\n")
    return f"{head.rstrip(chr(10))}\n\n{chr(10).join(sections)}{why}{tail}"


def _kept(path: Path, content: bytes, record: Mapping[str, str], explanation: str | None, carried: bool = False) -> str | None:
    """Why ``path`` must not be replaced by ``content``, or None when it may (``carried``: an ISSUE.md's sections
    written by hand are carried into ``content``)."""
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file() or path.is_symlink():
        return f"{path.name} (not a plain file)"
    old = path.read_bytes()
    if old == content or record.get(path.name) == hashlib.sha256(old).hexdigest():
        return None
    text = old.decode(errors="replace")
    if path.name == "repro.py":
        if HAND_WRITTEN in text:
            return f"{path.name} (written by hand for the maintainers)"
        if GENERATED in text and not record:  # written here before records were kept
            return None
    if path.name == "ISSUE.md" and "\n## Why\n" in text and explanation is not None and \
            text.split("\n## Why\n", 1)[1].strip("\n") == explanation.strip("\n"):
        return None  # its hand-written part is carried into the new one
    if path.name == "ISSUE.md" and carried:
        return None  # (so are its other hand-written sections)
    return f"{path.name} (not written by pa-oracle, or edited since it was)"


def seen_from_record(meta: FindingMeta, gpu: str = "") -> Seen:
    """The Seen of a golden case or a finding: what its record's ``found_by`` says (status, message, versions);
    a case that records no verdict (a seed-generated regression case) as a failure."""
    found = meta.found_by or FoundBy()
    return Seen(found.status or "fail", found.message, dict(found.versions), gpu)
