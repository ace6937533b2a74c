"""Reports that say where a kernel is wrong: worst elements mapped back to (request, query token,
qo head -> kv head, position, page, slot), per-request and per-head error, and a repro command.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tolerance import ErrorStats, Verdict


@dataclass(frozen=True)
class Location:
    """Where one output element lives in the batch."""

    row: int
    request: int
    token: int  # query index within its request
    position: int  # absolute position (bottom-right alignment; negative: before the first key)
    qo_head: int
    kv_head: int
    dim: int
    page: int | None  # page holding the key at the query's own position (None if outside the cache)
    slot: int | None
    error: float

    def describe(self) -> str:
        where = f"page {self.page} slot {self.slot}" if self.page is not None else "no page"
        return (
            f"request {self.request} token {self.token} (pos {self.position}, {where}) "
            f"qo_head {self.qo_head} -> kv_head {self.kv_head} dim {self.dim}: |err| {self.error:.3g}"
        )


def locate(case: Case, row: int, head: int, dim: int, error: float) -> Location:
    layout = case.layout
    request = layout.request_of_row(row)
    position = layout.position_of_row(row)
    page_slot = layout.slot_of(request, position)
    return Location(
        row=row,
        request=request,
        token=row - layout.qo_indptr[request],
        position=position,
        qo_head=head,
        kv_head=head // case.heads.group_size,
        dim=dim,
        page=page_slot[0] if page_slot else None,
        slot=page_slot[1] if page_slot else None,
        error=error,
    )


def worst_elements(case: Case, error: torch.Tensor, k: int = 8) -> list[Location]:
    """The ``k`` largest errors of ``error`` [total_q, Hq, Dvo], located."""
    flat = error.flatten()
    if flat.numel() == 0:
        return []
    values, indices = flat.topk(min(k, flat.numel()))
    shape = error.shape
    located = []
    for value, index in zip(values.tolist(), indices.tolist()):
        if value <= 0:
            break
        row, rest = divmod(index, shape[1] * shape[2])
        head, dim = divmod(rest, shape[2])
        located.append(locate(case, row, head, dim, value))
    return located


def per_request_error(case: Case, error: torch.Tensor) -> list[float]:
    layout = case.layout
    return [
        float(error[a:b].max()) if b > a else 0.0 for a, b in zip(layout.qo_indptr, layout.qo_indptr[1:])
    ]


def per_head_error(error: torch.Tensor) -> list[float]:
    if error.numel() == 0:
        return [0.0] * error.shape[1]
    return error.amax(dim=(0, 2)).tolist()


def limit_ratio(stats: ErrorStats) -> float:
    """Max error over the allowed max error, the tolerance floor included: 1.0 is at the limit, above
    it fails (``ErrorStats.ratio``, over the control's error alone, can pass above 3 by the floor)."""
    if stats.limit_max > 0:
        return stats.max_error / stats.limit_max
    return 0.0 if stats.max_error == 0 else float("inf")


def _stats_line(stats: ErrorStats) -> str:
    return (
        f"| {stats.name} | {stats.max_error:.3g} | {stats.limit_max:.3g} | {limit_ratio(stats):.2f} | "
        f"{stats.control_max_error:.3g} | {stats.ratio:.2f} | {stats.mean_error:.3g} | {stats.control_mean_error:.3g} | "
        f"{stats.mismatches} / {stats.numel} |"
    )


def format_report(
    case: Case, backend: str, verdict: Verdict, repro: str | None = None, conversions: tuple[str, ...] = ()
) -> str:
    """Markdown: summary, recreate command, case, error table, worst elements, per request/head.
    ``conversions``: the kernel conventions the adapter converted before the comparison."""
    lines = [f"# {backend}: {'PASS' if verdict.passed else 'FAIL'} on case {case.case_id}", ""]
    lines += [f"- {f}" for f in verdict.failures] or ["- no failure"]
    lines += [f"- kernel conventions converted by the adapter: {'; '.join(conversions)}"] if conversions else []
    if repro:
        lines += ["", "To recreate this report, run:", "", f"    {repro}"]
    lines += ["", "## Case", "", f"    {case.summary()}", ""]
    lay = case.layout
    lines += [
        f"- qo_indptr {list(lay.qo_indptr)}",
        f"- kv_indptr {list(lay.kv_indptr)}",
        f"- kv_indices {list(lay.kv_indices)}",
        f"- kv_last_page_len {list(lay.kv_last_page_len)}",
        f"- num_pages {lay.num_pages}, group size {case.heads.group_size}, sm_scale {case.sm_scale:.6g}",
    ]
    stats = [s for s in (verdict.out, verdict.lse) if s is not None]
    if stats:
        lines += [
            "",
            "## Error against the float64 reference",
            "",
            "| tensor | max err | allowed max | err / allowed | control max err | x control | mean err | control mean | mismatched |",
            "|---|---|---|---|---|---|---|---|---|",
            *[_stats_line(s) for s in stats],
            "",
            "err / allowed: 1.00 is at the limit (the floor included), above it fails; the triage plots use this scale. "
            "x control: max err over the control's (flash-attn's number; the floor lets a pass exceed the 3x).",
        ]
    if verdict.error is not None and verdict.error.numel():
        worst = worst_elements(case, verdict.error)
        if worst:
            lines += ["", "## Worst elements", "", *[f"- {w.describe()}" for w in worst]]
        if verdict.lse_error is not None:
            worst_lse = worst_elements(case, verdict.lse_error[..., None], k=4)
            if worst_lse:
                lines += ["", "## Worst LSE elements", "", *[f"- {w.describe().replace(' dim 0', '')}" for w in worst_lse]]
        lines += ["", "## Max error per request", "", "| request | qo_len | kv_len | max err |", "|---|---|---|---|"]
        for b, err in enumerate(per_request_error(case, verdict.error)):
            lines.append(f"| {b} | {lay.qo_lens[b]} | {lay.kv_lens[b]} | {err:.3g} |")
        lines += ["", "## Max error per qo head", "", "| qo head | kv head | max err |", "|---|---|---|"]
        for h, err in enumerate(per_head_error(verdict.error)):
            lines.append(f"| {h} | {h // case.heads.group_size} | {err:.3g} |")
    return "\n".join(lines) + "\n"
