"""Where a failing kernel is wrong and what the error follows, as checks with evidence.

Wrong (row, qo head) pairs are those whose error exceeds the verdict's allowed maximum (out or
LSE). Per pair, two probes explain the kernel's value with terms read off the oracle itself
(``pa_oracle.oracle.reference``: no attention semantics are restated here): *one key toggled* (the oracle with key ``j`` dropped, or a masked
key added: an off-by-one at the last page, the window edge or the causal diagonal) and *another
kv head* (a wrong GQA map). Checks then test row sets against page alignment, the causal diagonal,
the window edge, empty rows, declared KV splits and the LSE's base, and say "no pattern" when
none fits. Heuristics: a check that finds no pattern proves nothing either way.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import torch
from pa_oracle.backends.base import Backend
from pa_oracle.fuzz.run.runner import Outcome, check_case
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.reference import LOG2_E, Reference, reference
from pa_oracle.oracle.report import Location, worst_elements
from pa_oracle.oracle.tensors import Tensors, gather_kv, make_tensors, token_addresses
from pa_oracle.oracle.tolerance import ErrorStats, Tolerance, Verdict

MAX_PROBED_PAIRS = 48  # wrong (row, head) pairs probed, worst first

CheckResult = Literal["pattern", "ambiguous", "no pattern", "n/a"]

# which check a key label speaks for: one key can carry labels of several (at kv_len 1 the last key is the
# first key and the window's edge), and then no check may claim it alone
_FAMILY = {
    "the last key": "page boundary", "first slot of a page": "page boundary", "last slot of a full page": "page boundary",
    "the first key": "first key",
    "the causal diagonal": "causal diagonal", "one past the causal diagonal": "causal diagonal", "a future key": "causal diagonal",
    "the window's left edge": "window edge", "one outside the window": "window edge",
}


@dataclass(frozen=True)
class Clue:
    """One localization test on the wrong elements: its name, whether it found a pattern, and why."""

    name: str
    result: CheckResult
    finding: str
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class Toggle:
    """The oracle with one key toggled matches the kernel on (row, head)."""

    row: int
    head: int
    key: int  # position of the key within its request
    dropped: bool  # True: an attended key dropped; False: a masked key added
    labels: tuple[str, ...]
    page: int
    slot: int

    def describe(self) -> str:
        what = "without" if self.dropped else "with the masked"
        where = ", ".join(self.labels) or "no special position"
        return f"row {self.row} head {self.head}: the oracle {what} key {self.key} ({where}; page {self.page} slot {self.slot})"


@dataclass
class Capture:
    """A case run on a backend: the verdict and the raw kernel output beside the reference."""

    case: Case
    backend: str
    outcome: Outcome
    tensors: Tensors | None = None  # on CPU
    ref: Reference | None = None
    out: torch.Tensor | None = None  # kernel out, float64, CPU
    lse: torch.Tensor | None = None
    split_count: int | None = None  # KV splits the backend declares (``num_kv_splits`` / ``num_splits``)


def capture(
    backend: Backend, case: Case, tolerance: Tolerance = Tolerance(), check: Callable[[Case], Outcome] | None = None
) -> Capture:
    """Judge ``case`` and keep the kernel's raw output: ``check`` must keep outputs
    (``check_case(..., keep_output=True)``, the default, or ``pa_oracle.fuzz.run.judge.case_judge(...,
    keep_output=True)``); the kernel runs once, where ``check`` runs it."""
    outcome = (check or partial(check_case, backend, tolerance=tolerance, keep_output=True))(case)
    if outcome.verdict is not None:  # the probes below work on the CPU, whatever device judged
        for name in ("error", "lse_error"):
            if getattr(outcome.verdict, name) is not None:
                setattr(outcome.verdict, name, getattr(outcome.verdict, name).cpu())
    splits = getattr(backend, "num_kv_splits", None) or getattr(backend, "num_splits", None)
    result = Capture(case, backend.name, outcome, split_count=splits if isinstance(splits, int) and splits > 1 else None)
    if outcome.verdict is None or outcome.verdict.error is None or outcome.output is None:
        return result
    kernel = outcome.output
    result.tensors = make_tensors(case, "cpu")
    result.ref = reference(case, result.tensors)
    result.out = kernel.out.detach().to("cpu", torch.float64)
    if kernel.lse is not None and tuple(kernel.lse.shape) == tuple(result.ref.lse.shape):
        result.lse = kernel.lse.detach().to("cpu", torch.float64)
    return result


@dataclass(frozen=True)
class Judged:
    """The parts of a verdict on a returned output that localization reads, known present: out's error per
    element and its limits, and the LSE's when it was judged."""

    out: ErrorStats
    error: torch.Tensor  # |kernel - ref| of out, [total_q, Hq, Dvo]
    lse: ErrorStats | None = None
    lse_error: torch.Tensor | None = None  # [total_q, Hq]

    @staticmethod
    def of(verdict: Verdict | None) -> Judged | None:
        """None for a verdict with no output judged (a crash, a hang, a tool error)."""
        if verdict is None or verdict.error is None or verdict.out is None:
            return None
        return Judged(verdict.out, verdict.error, verdict.lse, verdict.lse_error)

    def out_wrong(self) -> torch.Tensor:
        """[total_q, Hq] bool: some element of the (row, head) pair's out over the allowed maximum."""
        if not self.error.numel():
            return torch.zeros(self.error.shape[:2], dtype=torch.bool)
        return self.error.amax(-1) > self.out.limit_max

    def lse_wrong(self) -> torch.Tensor | None:
        """[total_q, Hq] bool: the pair's LSE over its allowed maximum; None when the LSE was not judged."""
        if self.lse is None or self.lse_error is None:
            return None
        return self.lse_error > self.lse.limit_max


@dataclass
class Localization:
    case: Case
    backend: str
    status: str
    score: torch.Tensor  # [total_q, Hq]: error / allowed, the worse of out and LSE (inf: non-finite)
    wrong: torch.Tensor  # [total_q, Hq] bool
    threshold: str  # how "wrong" was decided
    verdict: Verdict | None = None
    worst: list[Location] = field(default_factory=list)
    checks: list[Clue] = field(default_factory=list)
    toggles: list[Toggle] = field(default_factory=list)
    kv_reads: dict[tuple[int, int], int] = field(default_factory=dict)  # (row, qo head) -> kv head that fits
    profile: tuple[int, int, list[float], int | None] | None = None  # (row, head, error per key toggled, key that fits)

    @property
    def patterns(self) -> list[Clue]:
        """The checks that found something: a pattern, or keys that the case cannot tell apart."""
        return [c for c in self.checks if c.result in ("pattern", "ambiguous")]


# --- per-row probes ------------------------------------------------------------------------------


class _Rows:
    """Per-row facts and, for the probes, each row's per-key softmax terms read off the oracle itself
    (``pa_oracle.oracle.reference``), so that no attention semantics live here: the reference run with a
    one-hot V gives each key's attention weight (0: masked), run again with causal and window off it
    gives every key's logit, and run with every kv head replaced by one gives that head's reading."""

    def __init__(self, cap: Capture) -> None:
        case, lay = cap.case, cap.case.layout
        self.case, self.cap = case, cap
        self.request = [lay.request_of_row(r) for r in range(lay.total_q)]
        self.token = [r - lay.qo_indptr[b] for r, b in enumerate(self.request)]
        self.position = [lay.position_of_row(r) for r in range(lay.total_q)]
        self.kv_len = [lay.kv_lens[b] for b in self.request]
        self.qo_len = [lay.qo_lens[b] for b in self.request]
        self.values: list[torch.Tensor] = []
        self._reads: dict[int, Reference] = {}
        if cap.tensors is None:
            return
        _, values = gather_kv(case, cap.tensors, torch.float64)
        self.values = list(values.split(list(lay.kv_lens)))
        onehot = _one_hot_values(case, cap.tensors)
        as_is = _weights(case, onehot)
        unmasked = _weights(case.replace(options=dataclasses.replace(case.options, causal=False, window_left=-1, sinks=None)), onehot)
        self._weight, self._lse = as_is.out, as_is.lse  # [total_q, Hq, max_kv]: weight of key j; log of the keys' sum
        with torch.no_grad():
            self._logit = torch.log(unmasked.out) + unmasked.lse[..., None]  # -inf: a weight that underflows

    def logits(self, row: int, head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logits [K], attended [K] bool, values [K, Dvo]) of one query row and head over its request's keys."""
        n = self.kv_len[row]
        v = self.values[self.request[row]][:, head // self.case.heads.group_size]
        return self._logit[row, head, :n], self._weight[row, head, :n] > 0, v

    def attend(self, row: int, head: int, kv_head: int) -> tuple[torch.Tensor, float]:
        """(out [Dvo], lse) of the row as the oracle computes it when qo head ``head`` reads kv head ``kv_head``."""
        tensors = self.cap.tensors
        if tensors is None:
            raise ValueError("no tensors captured: the kernel returned no output to probe")
        if kv_head not in self._reads:
            self._reads[kv_head] = reference(self.case, _one_kv_head(tensors, kv_head))
        ref = self._reads[kv_head]
        return ref.out[row, head], float(ref.lse[row, head])

    def toggled(self, row: int, head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(out [K, Dvo], lse [K], dropped [K]): the oracle's row with each key ``j`` toggled in turn
        (an attended key dropped, a masked one added): softmax algebra on the oracle's own terms."""
        s, attend, v = self.logits(row, head)
        weight = self._weight[row, head, : len(s)]
        m = s.max() if len(s) and bool(torch.isfinite(s).any()) else torch.tensor(0.0, dtype=torch.float64)
        w = torch.exp(s - m)
        z = (w * attend).sum()
        total = float(weight.sum())  # z / (z + sink mass): the sink's share of the denominator, from the oracle
        sinks = self.case.options.sinks
        if total > 0:
            sink_w = float(z) * (1.0 / total - 1.0)
        else:  # no attended key: the oracle's out is 0 whatever the sink; its mass is the option's
            sink_w = 0.0 if sinks is None else math.exp(sinks[head] - float(m))
        sign = torch.where(attend, -1.0, 1.0).to(torch.float64)
        numer = (w * attend) @ v + (sign * w)[:, None] * v
        z_j = z + sign * w
        empty = z_j <= 0
        out = torch.where(empty[:, None], 0.0, numer / torch.where(empty, 1.0, z_j + sink_w)[:, None])
        lse = torch.where(empty, -math.inf, m + torch.log(torch.where(empty, 1.0, z_j)))
        return out, lse, attend


def _one_hot_values(case: Case, tensors: Tensors) -> Tensors:
    """The case's q and K with V replaced by one-hot rows: key ``j`` of every request has value e_j
    (divided by ``v_scale``, which the oracle multiplies back for fp8), so the oracle's output is each key's weight."""
    lay = case.layout
    width = max(max(lay.kv_lens, default=0), 1)
    pages, slots = token_addresses(case)
    position = torch.cat([torch.arange(n) for n in lay.kv_lens]) if sum(lay.kv_lens) else torch.zeros(0, dtype=torch.long)
    pool = torch.zeros(lay.num_pages, lay.page_size, case.heads.num_kv_heads, width, dtype=torch.float64)
    pool[pages, slots, :, position] = 1.0 / case.options.v_scale if case.options.is_fp8 else 1.0
    return Tensors(tensors.q, tensors.k_cache, pool)


def _weights(case: Case, onehot: Tensors) -> Reference:
    """The oracle on one-hot values: ``out[row, head, j]`` is key j's weight, ``lse`` the log of the keys' sum."""
    heads = dataclasses.replace(case.heads, head_dim_vo=onehot.v_cache.shape[-1])
    return reference(case.replace(heads=heads, tensors_file=None, storage=None), onehot, engine="torch")  # one-hot tensors: default storage


def _one_kv_head(tensors: Tensors, kv_head: int) -> Tensors:
    """K and V with every kv head replaced by ``kv_head``: each qo head then reads that one."""
    k, v = tensors.k_cache, tensors.v_cache
    return Tensors(tensors.q, k[:, :, kv_head : kv_head + 1].expand_as(k).contiguous(), v[:, :, kv_head : kv_head + 1].expand_as(v).contiguous())


def _key_labels(rows: _Rows, row: int, key: int) -> tuple[str, ...]:
    case, opts, ps = rows.case, rows.case.options, rows.case.layout.page_size
    p, kv_len = rows.position[row], rows.kv_len[row]
    labels = []
    if key == kv_len - 1:
        labels.append("the last key")
    if key == 0:
        labels.append("the first key")
    if key > 0 and key % ps == 0:
        labels.append("first slot of a page")
    if key < kv_len - 1 and key % ps == ps - 1:
        labels.append("last slot of a full page")
    if opts.causal and key == p:
        labels.append("the causal diagonal")
    if opts.causal and key == p + 1:
        labels.append("one past the causal diagonal")
    if opts.window_left >= 0 and key == p - opts.window_left:
        labels.append("the window's left edge")
    if opts.window_left >= 0 and key == p - opts.window_left - 1:
        labels.append("one outside the window")
    if case.options.causal and key > p + 1:
        labels.append("a future key")
    return tuple(labels)


def _misfit(judged: Judged, out: torch.Tensor, lse: torch.Tensor, kernel_out: torch.Tensor | None,
            kernel_lse: torch.Tensor | None) -> torch.Tensor:
    """Per candidate (``out`` [C, Dvo], ``lse`` [C]): how far the kernel's row (``kernel_out`` [Dvo], ``kernel_lse``
    0-d; None: not compared) is from it, in units of the allowed error (<= 1 fits)."""
    misfit = torch.zeros(out.shape[0], dtype=torch.float64)
    if kernel_out is not None:
        limit = max(judged.out.limit_max, 1e-300)
        misfit = torch.maximum(misfit, (out - kernel_out).abs().amax(-1) / limit)
    if kernel_lse is not None and judged.lse is not None:
        limit = max(judged.lse.limit_max, 1e-300)
        diff = (lse - kernel_lse).abs()
        diff = torch.where(torch.isinf(lse) & (lse == kernel_lse), 0.0, diff)
        misfit = torch.maximum(misfit, diff / limit)
    return torch.nan_to_num(misfit, nan=math.inf)


# --- localization --------------------------------------------------------------------------------


def _scores(cap: Capture, judged: Judged) -> tuple[torch.Tensor, torch.Tensor, str]:
    case, stats = cap.case, judged.out
    shape = (case.layout.total_q, case.heads.num_qo_heads)
    score = torch.zeros(shape, dtype=torch.float64)
    out_error = judged.error.amax(-1) if judged.error.numel() else torch.zeros(shape, dtype=torch.float64)
    limit, threshold = stats.limit_max, "error above the allowed maximum"
    if stats.mismatches == 0 and out_error.numel() and out_error.max() > 0 and stats.mean_error > stats.limit_mean:
        limit, threshold = stats.limit_mean, "out error above the allowed *mean* (the failure is a mean-error one)"
    score = torch.maximum(score, out_error / max(limit, 1e-300))
    if judged.lse is not None and judged.lse_error is not None:
        score = torch.maximum(score, judged.lse_error / max(judged.lse.limit_max, 1e-300))
    wrong = score > 1
    if cap.out is not None and cap.ref is not None:
        empty = torch.isinf(cap.ref.lse)
        wrong |= empty & (cap.out != 0).any(-1)
    return score, wrong, threshold


def localize(cap: Capture) -> Localization:
    """Locate and characterize the errors of a captured run (a crash or a pass has nothing to locate)."""
    case, verdict = cap.case, cap.outcome.verdict
    shape = (case.layout.total_q, case.heads.num_qo_heads)
    judged = Judged.of(verdict)
    if judged is None:
        why = f"the kernel {cap.outcome.status}ed: no output to locate" if cap.outcome.status == "crash" else cap.outcome.message
        return Localization(case, cap.backend, cap.outcome.status, torch.zeros(shape), torch.zeros(shape, dtype=torch.bool), "n/a",
                            checks=[Clue("output", "n/a", why)])
    score, wrong, threshold = _scores(cap, judged)
    loc = Localization(case, cap.backend, cap.outcome.status, score, wrong, threshold, verdict, worst_elements(case, judged.error))
    rows = _Rows(cap)
    if rows.values:
        _probe(cap, rows, loc, judged)
    loc.checks = [
        _check_tensors(judged, loc),
        _check_requests(rows, loc),
        _check_heads(cap, rows, loc),
        _check_rows(rows, loc),
        _check_pages(rows, loc),
        _check_empty_rows(cap, loc),
        _check_causal(rows, loc),
        _check_window(rows, loc),
        _check_splits(cap, rows, loc),
        _check_lse(cap, loc, judged),
    ]
    return loc


def _probe(cap: Capture, rows: _Rows, loc: Localization, judged: Judged) -> None:
    """Key toggles and kv-head reads of the worst wrong pairs (``loc.toggles``, ``loc.kv_reads``)."""
    kernel_out, kernel_lse, ref = cap.out, cap.lse, cap.ref
    if kernel_out is None or ref is None:
        return
    out_wrong, lse_wrong = judged.out_wrong(), judged.lse_wrong()
    pairs = loc.wrong.nonzero().tolist()
    pairs.sort(key=lambda rh: -float(loc.score[rh[0], rh[1]]))
    for row, head in pairs[:MAX_PROBED_PAIRS]:
        if not torch.isfinite(kernel_out[row, head]).all():
            continue
        use_out = bool(out_wrong[row, head]) or bool(torch.isinf(ref.lse[row, head]))
        use_lse = kernel_lse is not None and lse_wrong is not None and bool(lse_wrong[row, head])
        if not (use_out or use_lse):
            use_out = True
        compared_out = kernel_out[row, head] if use_out else None
        compared_lse = kernel_lse[row, head] if use_lse and kernel_lse is not None else None
        if rows.kv_len[row] > 0:
            out, lse, attended = rows.toggled(row, head)
            misfit = _misfit(judged, out, lse, compared_out, compared_lse)
            best = int(misfit.argmin())
            fits = bool(misfit[best] <= 1)
            if loc.profile is None:
                loc.profile = (row, head, misfit.clamp(max=1e6).tolist(), best if fits else None)
            if fits:
                page, slot = _slot(cap.case, rows.request[row], best)
                loc.toggles.append(Toggle(row, head, best, bool(attended[best]), _key_labels(rows, row, best), page, slot))
        reads = []
        for kv_head in range(cap.case.heads.num_kv_heads):
            read_out, read_lse = rows.attend(row, head, kv_head)
            reads.append(float(_misfit(judged, read_out[None], torch.tensor([read_lse]), compared_out, compared_lse)[0]))
        best_kv = min(range(len(reads)), key=reads.__getitem__)
        if reads[best_kv] <= 1:
            loc.kv_reads[(row, head)] = best_kv


def _slot(case: Case, request: int, key: int) -> tuple[int, int]:
    page_slot = case.layout.slot_of(request, key)
    assert page_slot is not None
    return page_slot


def _fmt(values: list[int] | set[int], limit: int = 12) -> str:
    values = sorted(values)
    text = ", ".join(map(str, values[:limit]))
    return "{" + text + (f", ... ({len(values)} in all)" if len(values) > limit else "") + "}"


def _check_tensors(judged: Judged, loc: Localization) -> Clue:
    out_wrong = int(judged.out_wrong().sum())
    lse_over = judged.lse_wrong()
    lse_wrong = int(lse_over.sum()) if lse_over is not None else None
    total = loc.wrong.numel()
    parts = [f"out wrong on {out_wrong} of {total} (row, head) pairs"]
    parts.append("the kernel returns no LSE" if lse_wrong is None else f"LSE wrong on {lse_wrong} of {total}")
    evidence = [f"wrong pairs decided by: {loc.threshold}"]
    if out_wrong == 0 and lse_wrong:
        return Clue("out or LSE", "pattern", "only the LSE is wrong; the output is right", tuple(parts + evidence))
    if lse_wrong == 0 and out_wrong:
        return Clue("out or LSE", "pattern", "only the output is wrong; the LSE is right", tuple(parts + evidence))
    return Clue("out or LSE", "no pattern", "; ".join(parts), tuple(evidence))


def _wrong_rows(loc: Localization) -> set[int]:
    return set(loc.wrong.any(-1).nonzero().flatten().tolist())


def _check_requests(rows: _Rows, loc: Localization) -> Clue:
    with_rows = sorted(set(rows.request))
    bad = sorted({rows.request[r] for r in _wrong_rows(loc)})
    maxima = [f"request {b}: max error/allowed {float(loc.score[[r for r in range(len(rows.request)) if rows.request[r] == b]].max()):.3g}" for b in with_rows]
    if not bad:
        return Clue("requests", "n/a", "no wrong (row, head) pair above the threshold", tuple(maxima))
    if len(bad) == len(with_rows):
        return Clue("requests", "no pattern", f"every request with queries is wrong ({len(bad)})", tuple(maxima))
    return Clue("requests", "pattern", f"requests {_fmt(bad)} of {len(with_rows)} are wrong; {_fmt(set(with_rows) - set(bad))} are right", tuple(maxima))


def _check_heads(cap: Capture, rows: _Rows, loc: Localization) -> Clue:
    heads = cap.case.heads
    n, group, n_kv = heads.num_qo_heads, heads.group_size, heads.num_kv_heads
    bad = set(loc.wrong.any(0).nonzero().flatten().tolist())
    evidence = []
    reads = loc.kv_reads
    misread = {rh: kv for rh, kv in reads.items() if kv != rh[1] // group}
    if misread:
        mapping = dict(sorted({h: kv for (_, h), kv in misread.items()}.items()))
        evidence.append(f"{len(misread)} of {len(reads)} probed wrong pairs match the oracle on another kv head: qo head -> kv head read {mapping}")
        if all(kv == h % n_kv for (_, h), kv in misread.items()):
            return Clue("heads", "pattern", "wrong qo heads read kv head h % num_kv_heads instead of h // group_size: a wrong GQA head map",
                         tuple(evidence + [f"wrong qo heads {_fmt(bad)} of {n} (group size {group}, {n_kv} kv heads)"]))
        return Clue("heads", "pattern", f"wrong qo heads read another kv head ({mapping}): a wrong head map", tuple(evidence))
    if not bad:
        return Clue("heads", "n/a", "no wrong pair above the threshold")
    if len(bad) == n:
        return Clue("heads", "no pattern", f"every qo head ({n}) is wrong", tuple(evidence))
    gqa_alt = {h for h in range(n) if h % n_kv != h // group}
    if bad == gqa_alt:
        return Clue("heads", "pattern", "exactly the qo heads with h % num_kv_heads != h // group_size are wrong (a wrong GQA map reads those)",
                     tuple(evidence + [f"wrong {_fmt(bad)}"]))
    if bad == {h for h in range(n) if h % group}:
        return Clue("heads", "pattern", "every qo head but the first of each group is wrong", (f"wrong {_fmt(bad)}, group size {group}",))
    bad_kv = {h // group for h in bad}
    if all(h in bad for h in range(n) if h // group in bad_kv):
        return Clue("heads", "pattern", f"the whole groups of kv heads {_fmt(bad_kv)} are wrong, the others right", (f"wrong qo heads {_fmt(bad)}",))
    return Clue("heads", "no pattern", f"qo heads {_fmt(bad)} of {n} are wrong; no GQA pattern found", tuple(evidence))


def _check_rows(rows: _Rows, loc: Localization) -> Clue:
    bad = _wrong_rows(loc)
    all_rows = set(range(len(rows.request)))
    if not bad:
        return Clue("query rows", "n/a", "no wrong row")
    if bad == all_rows:
        return Clue("query rows", "no pattern", f"every query row ({len(all_rows)}) is wrong")
    properties = {
        "the last query of its request": lambda r: rows.token[r] == rows.qo_len[r] - 1,
        "the first query of its request": lambda r: rows.token[r] == 0,
        "a query before the first key (position < 0)": lambda r: rows.position[r] < 0,
        "a decode row (qo_len 1)": lambda r: rows.qo_len[r] == 1,
    }
    detail = (f"wrong rows {_fmt(bad)} of {len(all_rows)}; their tokens {_fmt({rows.token[r] for r in bad})}",)
    for name, holds in properties.items():
        if {r for r in all_rows if holds(r)} == bad:
            return Clue("query rows", "pattern", f"exactly the rows that are {name} are wrong", detail)
    return Clue("query rows", "no pattern", "wrong rows share none of: last / first query, position < 0, decode", detail)


def _toggle_share(loc: Localization, label: str, dropped: bool | None = None) -> tuple[int, int]:
    hits = sum(label in t.labels and (dropped is None or t.dropped == dropped) for t in loc.toggles)
    return hits, len(loc.toggles)


def _claim(loc: Localization, name: str, finding: str, evidence: list[str]) -> Clue:
    """A toggle-based pattern of check ``name``, or "ambiguous" when every fitted key also carries another
    check's label: the case cannot tell them apart (a larger witness can)."""
    common = set.intersection(*({_FAMILY.get(label, label) for label in t.labels} for t in loc.toggles))
    rivals = sorted(common - {name})
    if not rivals:
        return Clue(name, "pattern", finding, tuple(evidence))
    labels = sorted({label for t in loc.toggles for label in t.labels})
    return Clue(name, "ambiguous",
                 f"the key that explains the error is at once {', '.join(labels)} on every fitted pair: this case cannot tell "
                 f"{name} from {', '.join(rivals)}; a larger case is needed to separate them (the original case's "
                 "localization may, or a finding's first failing case, original.json, which triage localizes then)", tuple([f"if it is the {name}: {finding}"] + evidence))


def _toggle_evidence(loc: Localization, k: int = 3) -> list[str]:
    if not loc.toggles:
        return []
    counts = Counter((t.dropped, t.labels) for t in loc.toggles)
    lines = [
        f"{n} of {len(loc.toggles)} fitted pairs: the oracle {'without' if dropped else 'with the masked'} "
        f"{', '.join(labels) or 'a key at no special position'}"
        for (dropped, labels), n in counts.most_common(k)
    ]
    return lines + [t.describe() for t in loc.toggles[:2]]


def _check_pages(rows: _Rows, loc: Localization) -> Clue:
    ps = rows.case.layout.page_size
    bad_rows = _wrong_rows(loc)

    def rem(row: int) -> int:
        return rows.kv_len[row] % ps

    evidence = []
    hits, fitted = _toggle_share(loc, "the last key")
    if fitted and hits == fitted:
        slots = {rows.kv_len[t.row] - 1 - (rows.kv_len[t.row] - 1) // ps * ps for t in loc.toggles}
        dropped = all(t.dropped for t in loc.toggles)
        verb = "without its last key" if dropped else "with one key more"
        return _claim(loc, "page boundary",
                      f"the kernel's value is the oracle's {verb} (slot {_fmt(slots)} of the last page) on every fitted pair: "
                      "an off-by-one in the last page length", _toggle_evidence(loc))
    hits, fitted = _toggle_share(loc, "first slot of a page")
    if fitted and hits == fitted:
        return _claim(loc, "page boundary", "the key that explains the error is the first slot of a page on every fitted pair",
                      _toggle_evidence(loc))
    if not bad_rows:
        return Clue("page boundary", "n/a", "no wrong row")
    good_rows = {r for r in range(len(rows.request)) if rows.kv_len[r] > 0} - bad_rows
    bad_rem = {rem(r) for r in bad_rows if rows.kv_len[r] > 0}
    good_rem = {rem(r) for r in good_rows}
    evidence.append(f"wrong rows: kv_len % page_size ({ps}) in {_fmt(bad_rem)}; right rows: {_fmt(good_rem) if good_rows else 'none'}")
    if bad_rem and good_rows and not bad_rem & good_rem:
        if bad_rem == {0}:
            finding = "wrong rows all have a full last page (kv_len % page_size == 0); right rows do not"
        elif 0 in good_rem and len(good_rem) == 1:
            finding = "wrong rows all end inside a page (kv_len % page_size != 0); rows with a full last page are right"
        else:
            finding = f"wrong rows all have kv_len % page_size in {_fmt(bad_rem)}; right rows in {_fmt(good_rem)}"
        return Clue("page boundary", "pattern", finding, tuple(evidence))
    if not good_rows:
        evidence.append("every row with keys is wrong, so page alignment cannot separate wrong from right rows")
    return Clue("page boundary", "no pattern", "no page-alignment pattern found", tuple(evidence + _toggle_evidence(loc)))


def _check_empty_rows(cap: Capture, loc: Localization) -> Clue:
    if cap.ref is None:
        return Clue("empty rows", "n/a", "no raw kernel output")
    empty = torch.isinf(cap.ref.lse)
    if not empty.any():
        return Clue("empty rows", "n/a", "the case has no row without keys to attend")
    bad_empty = int((loc.wrong & empty).sum())
    bad_other = int((loc.wrong & ~empty).sum())
    evidence = (f"{int(empty.sum())} empty (row, head) pairs, {bad_empty} wrong; {bad_other} wrong pairs with keys",)
    if bad_empty and not bad_other:
        return Clue("empty rows", "pattern", "only rows with no key to attend are wrong", evidence)
    if bad_empty:
        return Clue("empty rows", "pattern", "empty rows are wrong (and other rows too)", evidence)
    return Clue("empty rows", "no pattern", "empty rows are right", evidence)


def _check_causal(rows: _Rows, loc: Localization) -> Clue:
    if not rows.case.options.causal:
        return Clue("causal diagonal", "n/a", "the case is not causal")
    evidence = _toggle_evidence(loc)
    for label in ("the causal diagonal", "one past the causal diagonal", "a future key"):
        hits, fitted = _toggle_share(loc, label)
        if fitted and hits == fitted:
            return _claim(loc, "causal diagonal", f"the error is explained by {label} on every fitted pair", evidence)
    bad = {rows.request[r] for r in _wrong_rows(loc)}
    requests = set(rows.request)
    shifted = {b for b in requests if rows.case.layout.kv_lens[b] != rows.case.layout.qo_lens[b]}
    if bad and bad == shifted and shifted != requests:
        return Clue("causal diagonal", "pattern",
                     "exactly the requests with kv_len != qo_len are wrong: the mask is aligned top-left, not bottom-right",
                     (f"wrong requests {_fmt(bad)}; requests with kv_len == qo_len {_fmt(requests - shifted)} are right",))
    return Clue("causal diagonal", "no pattern", "no causal-diagonal pattern found", tuple(evidence))


def _check_window(rows: _Rows, loc: Localization) -> Clue:
    if rows.case.options.window_left < 0:
        return Clue("window edge", "n/a", "no sliding window")
    for label in ("the window's left edge", "one outside the window"):
        hits, fitted = _toggle_share(loc, label)
        if fitted and hits == fitted:
            return _claim(loc, "window edge", f"the error is explained by {label} on every fitted pair: a window off by one",
                          _toggle_evidence(loc))
    return Clue("window edge", "no pattern", "no window-edge pattern found", tuple(_toggle_evidence(loc)))


def _check_splits(cap: Capture, rows: _Rows, loc: Localization) -> Clue:
    n = cap.split_count
    if not n:
        return Clue("split boundary", "n/a", "the backend declares no KV split count")
    bad = _wrong_rows(loc)
    assumption = f"assuming {n} even splits of ceil(kv_len / {n}) keys"
    short = {r for r in range(len(rows.request)) if 0 < rows.kv_len[r] < n}
    if bad and short and bad == short:
        return Clue("split boundary", "pattern", f"exactly the rows with fewer keys than splits ({n}) are wrong: an empty split",
                     (assumption,))
    on_boundary = [t for t in loc.toggles if t.key % -(-rows.kv_len[t.row] // n) == 0 and t.key > 0]
    if loc.toggles and len(on_boundary) == len(loc.toggles):
        return Clue("split boundary", "pattern", "the key that explains the error starts a split on every fitted pair",
                     (assumption, *_toggle_evidence(loc)))
    return Clue("split boundary", "no pattern", "no split-boundary pattern found", (assumption,))


def _check_lse(cap: Capture, loc: Localization, judged: Judged) -> Clue:
    if cap.lse is None or cap.ref is None:
        return Clue("LSE", "n/a", "the kernel returns no LSE")
    ref, kernel = cap.ref.lse, cap.lse
    empty = torch.isinf(ref)
    if empty.any() and not (kernel[empty] == -math.inf).all():
        values = sorted(set(kernel[empty & (kernel != -math.inf)].tolist()))[:3]
        return Clue("LSE", "pattern", f"empty rows get a finite LSE {values} instead of -inf (a sentinel)")
    live = ~empty & torch.isfinite(kernel) & (ref.abs() > 1e-3)
    if not live.any():
        return Clue("LSE", "n/a", "no row with keys and a finite kernel LSE")
    limit = judged.lse.limit_max if judged.lse else 0.0
    if (kernel[live] - ref[live] * LOG2_E).abs().max() <= max(limit, 1e-6) * LOG2_E and (kernel[live] - ref[live]).abs().max() > limit:
        return Clue("LSE", "pattern", "the kernel's LSE is the oracle's times log2(e): a base-2 LSE where natural log is declared")
    diff = kernel[live] - ref[live]
    if diff.numel() >= 3 and diff.abs().max() > limit and (diff - diff.mean()).abs().max() <= limit:
        return Clue("LSE", "pattern", f"the kernel's LSE is the oracle's plus a constant {float(diff.mean()):.4g} ({diff.numel()} values)")
    return Clue("LSE", "no pattern", f"LSE error up to {float((kernel[live] - ref[live]).abs().max()):.3g} (allowed {limit:.3g}); no base or offset pattern")
