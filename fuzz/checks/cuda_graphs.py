"""CUDA-graph capture and replay, the way serving engines call kernels (ANCHORS bug 17).

The case (real requests drawn with a key for every query row) is padded with
``PADDING_REQUESTS`` requests that own no page (kv_len 0; one query row each, or the batch's
uniform qo_len), as an engine pads a batch to a captured size. One call is
captured over static buffers (``Backend.capture_graph``). Then ``REPLAYS`` times new tensor
contents (other seeds) are copied into the static inputs, the output buffers are filled with
``SENTINEL`` and the call is made eagerly, then again and the graph is replayed:

- replay == the eager call on the same buffers, bit for bit (the same kernels and launch);
- the padding requests' output rows are untouched (still the sentinel) or exactly 0 (the answer
  of a row with no key, which a kernel may write); anything else, NaN included, is a finding.
  Their LSE may be anything but NaN (the empty-row LSE itself is the fuzzer's to judge);
- the real rows pass the oracle on the unpadded case;
- whether replay equals the adapter's plain (non-graph) run bit for bit is reported, not
  required: a graph-mode wrapper may split the work otherwise (FlashInfer fixes its grid).
"""

from __future__ import annotations

import torch
from pa_oracle.backends.base import Backend, Capabilities, GraphCall, KernelOutput, RawOutput, Unsupported
from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.fuzz.checks.base import Check, check_outcome, tensors_for
from pa_oracle.oracle.tensors import same_bits
from pa_oracle.fuzz.run.runner import judge
from pa_oracle.oracle.case import Case, Layout
from pa_oracle.oracle.tensors import Tensors
from pa_oracle.oracle.tolerance import Tolerance

PADDING_REQUESTS = 2
REPLAYS = 2
SENTINEL = -4224.0  # exact in fp16, bf16 and fp32, and no attention output or LSE of our data


def padded(case: Case, requests: int, uniform_qo_len: bool) -> Case:
    """``case`` with ``requests`` more requests at the end that own no page (kv_len 0)."""
    lay = case.layout
    qo = lay.qo_lens[0] if uniform_qo_len else 1
    qo_indptr = list(lay.qo_indptr)
    for _ in range(requests):
        qo_indptr.append(qo_indptr[-1] + qo)
    layout = Layout(
        tuple(qo_indptr), lay.kv_indptr + (lay.kv_indptr[-1],) * requests, lay.kv_indices,
        lay.kv_last_page_len + (0,) * requests, lay.page_size, lay.num_pages,
    )
    return case.replace(layout=layout, tensors_file=None, meta={})


def _sync(t: torch.Tensor) -> None:
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


def _fill(outputs: RawOutput) -> None:
    for buffer in outputs:
        if buffer is not None:
            buffer.fill_(SENTINEL)


def _snapshot(call: GraphCall, raw: RawOutput) -> tuple[KernelOutput, RawOutput]:
    """(canonical output, raw rows) copied out of the static buffers."""
    result = call.finish(raw)
    out_rows, lse_rows = call.rows(raw)
    return (
        KernelOutput(result.out.clone(), None if result.lse is None else result.lse.clone()),
        (out_rows.clone(), None if lse_rows is None else lse_rows.clone()),
    )


def padding_problems(rows: RawOutput, first_padding_row: int) -> list[str]:
    """What a call wrote into the padding requests' rows that it must not have."""
    out, lse = rows
    problems = []
    pad_out = out[first_padding_row:]
    untouched = (pad_out == SENTINEL).flatten(1).all(-1)
    zero = (pad_out == 0).flatten(1).all(-1)
    bad = ~(untouched | zero)
    if bad.any():
        sample = pad_out[bad][0].flatten()[:4].tolist()
        problems.append(f"{int(bad.sum())} padding rows' output overwritten with values other than 0 (e.g. {sample})")
    if lse is not None and torch.isnan(lse[first_padding_row:]).any():
        problems.append(f"{int(torch.isnan(lse[first_padding_row:]).sum())} padding LSE values are NaN")
    return problems


def _cuda_graph(backend: Backend, case: Case, tolerance: Tolerance) -> Outcome:
    reason = backend.unsupported_reason(case)
    if reason:
        raise Unsupported(reason)
    big = padded(case, PADDING_REQUESTS, backend.capabilities.uniform_qo_len)
    reason = backend.unsupported_reason(big)
    if reason:
        raise Unsupported(f"the padded case: {reason}")
    real = case.layout.total_q
    call = backend.capture_graph(big, tensors_for(backend, big))
    notes = []
    for replay in range(REPLAYS):
        variant = big.replace(seed=big.seed + 1 + replay)
        tensors = tensors_for(backend, variant)
        unpadded = Tensors(tensors.q[:real], tensors.k_cache, tensors.v_cache)
        cases = [("original", case.replace(tensors_file=None, meta={}), unpadded), ("padded", variant, tensors)]
        call.load(tensors)
        _fill(call.outputs)
        eager_raw = call.launch()
        eager, eager_rows = _snapshot(call, eager_raw)
        _fill(call.outputs)
        call.replay()
        _sync(call.outputs[0])
        graphed, graphed_rows = _snapshot(call, call.outputs)
        problems = [f"replay: {p}" for p in padding_problems(graphed_rows, real)]
        if eager_raw[0].data_ptr() == call.outputs[0].data_ptr():  # an eager call that allocates has no sentinel
            problems += [f"eager call: {p}" for p in padding_problems(eager_rows, real)]
        if not same_bits(graphed.out, eager.out) or (
            graphed.lse is not None and eager.lse is not None and not same_bits(graphed.lse, eager.lse)
        ):
            diff = float((graphed.out.double() - eager.out.double()).abs().nan_to_num(float("inf")).max())
            problems.append(f"replay differs from the eager call on the same buffers (max |out diff| {diff:.3g})")
        result = KernelOutput(graphed.out[:real], None if graphed.lse is None else graphed.lse[:real])
        verdict = judge(case, unpadded, result, tolerance)
        if not verdict.passed:
            problems.append(f"replayed rows against the oracle: {verdict.headline()}")
        if problems:
            message = f"replay {replay + 1} of {REPLAYS} (padded with {PADDING_REQUESTS} empty requests): " + "; ".join(problems)
            return check_outcome("cuda-graph", backend.name, "fail", message, cases, exact=False)
        plain = backend.run(backend.plan(variant), tensors)
        notes.append("bit-exact" if same_bits(plain.out[:real], graphed.out[:real]) else "not bit-exact")
    message = f"{REPLAYS} replays == eager, padding rows clean, oracle passes; replay vs plain run: {', '.join(notes)}"
    return check_outcome("cuda-graph", backend.name, "pass", message, cases, exact=True)


def _declares_graphs(backend: Backend) -> Capabilities | str:
    """Real requests are drawn with a key for every query row: the padding brings the kv_len-0
    requests, and the edges of empty and fully masked rows are the fuzzer's (and its ledger's)."""
    caps = backend.capabilities
    if not backend.cuda_graphs:
        return f"{backend.name} declares no CUDA-graph path"
    if not (caps.empty_requests and caps.qo_len_above_kv_len):
        return "the padding requests have kv_len 0 and a query, which the kernel does not accept (is --only narrowing empty_requests or qo_len_above_kv_len?)"
    return caps.replace(empty_requests=False, qo_len_above_kv_len=False)


GRAPH_CHECK = Check(
    "cuda-graph", "bit-exact", "replay runs the captured kernels on the same buffers; real rows also pass the oracle",
    _cuda_graph, _declares_graphs,
)
