"""Triage plots as PNG bytes (matplotlib, optional: ``pip install 'paged-attention-oracle[triage]'``):
error over (query row, head), error per request, and the per-key probe of the worst wrong pair.
Errors are shown in units of the allowed error, as the report's "err / allowed" column: 1 = at the
tolerance limit, its floor included (log axes and a log color scale).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from pa_oracle.fuzz.triage.localize import Localization

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def unavailable_reason() -> str | None:
    """Why plots cannot be drawn here, or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        return f"matplotlib is not installed ({exc}); pip install 'paged-attention-oracle[triage]'"
    return None


DPI = 100
MIN_SIZE = (6.4, 4.0)  # inches: at DPI, 640 x 400 px, room for the labels and lines that can be told apart
GRID: dict[str, Any] = dict(color="0.55", linewidth=0.8, zorder=0)  # page boundaries: visible, behind the data
SCALE = "error / allowed (1 = at the limit, floor included)"  # the report's "err / allowed" column


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _size(width: float, height: float) -> tuple[float, float]:
    return max(width, MIN_SIZE[0]), max(height, MIN_SIZE[1])


def figures(loc: Localization) -> dict[str, tuple[bytes, str]]:
    """``{name: (png, caption)}`` for one localization; empty if matplotlib is missing."""
    return {name: (_png(fig), caption) for name, (fig, caption) in draw(loc).items()}


def draw(loc: Localization) -> dict[str, tuple[Figure, str]]:
    """``{name: (matplotlib Figure, caption)}``; empty if matplotlib is missing. Every error is on one
    scale, the report's: error / allowed, 1 at the limit (the tolerance floor included), log axes."""
    if unavailable_reason() is not None:
        return {}
    import torch
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    figs: dict[str, tuple[Figure, str]] = {}
    lay = loc.case.layout
    score = torch.nan_to_num(loc.score.double(), posinf=1e6).clamp(min=0)
    if score.numel() >= 2:
        fig = Figure(layout="constrained", figsize=_size(2.5 + 0.4 * score.shape[1], min(2 + 0.12 * score.shape[0], 10)))
        ax = fig.subplots()
        top = max(float(score.max()), 10.0)
        image = ax.imshow(score.clamp(min=1e-3).numpy(), aspect="auto", cmap="magma", interpolation="nearest",
                          norm=LogNorm(vmin=1e-3, vmax=top))
        for start in lay.qo_indptr[1:-1]:
            ax.axhline(start - 0.5, color="cyan", linewidth=1.2)
        ax.set_xlabel("qo head")
        ax.set_ylabel("query row\n(cyan: request boundaries)")
        bar = fig.colorbar(image, ax=ax)
        bar.set_label("error / allowed (log scale)\n1 = at the limit, floor included")
        bar.ax.axhline(1.0, color="cyan", linewidth=1.2)
        figs["heatmap"] = (fig, f"Error over (query row, qo head) as {SCALE}, on a log color scale (cyan tick at 1).")
    if lay.batch_size >= 2:
        per_request = [float(score[a:b].max()) if b > a else 0.0 for a, b in zip(lay.qo_indptr, lay.qo_indptr[1:])]
        fig = Figure(layout="constrained", figsize=_size(2 + 0.5 * len(per_request), 3))
        ax = fig.subplots()
        ax.bar(range(len(per_request)), [max(v, 1e-3) for v in per_request], color=["C3" if v > 1 else "C2" for v in per_request])
        ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(per_request)))
        ax.set_xticklabels([f"{b}\nkv {lay.kv_lens[b]}" for b in range(len(per_request))], fontsize=7)
        ax.set_xlabel("request (kv_len)")
        ax.set_ylabel("max error / allowed\n(1 = at the limit)")
        figs["requests"] = (fig, f"Max error per request as {SCALE} (red: over the limit, dashed line).")
    decode_rows = [r for r in range(lay.total_q) if lay.qo_lens[lay.request_of_row(r)] == 1]
    if len(decode_rows) >= 2:
        fig = Figure(layout="constrained", figsize=_size(5, 3))
        ax = fig.subplots()
        kv = [lay.kv_lens[lay.request_of_row(r)] for r in decode_rows]
        ax.scatter(kv, [max(float(score[r].max()), 1e-3) for r in decode_rows], s=12)
        ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
        for boundary in range(0, max(kv) + 1, lay.page_size):
            ax.axvline(boundary, **GRID)
        ax.set_yscale("log")
        ax.set_xlabel("kv_len (grey: page boundaries)")
        ax.set_ylabel("row max error / allowed\n(1 = at the limit)")
        figs["decode_kv_len"] = (fig, f"Decode rows: error against kv_len, as {SCALE}.")
    if loc.profile is not None:
        row, head, misfit, fit = loc.profile
        fig = Figure(layout="constrained", figsize=_size(3 + 0.05 * len(misfit), 3))
        ax = fig.subplots()
        ax.plot(range(len(misfit)), [max(m, 1e-3) for m in misfit], marker=".", linewidth=0.8)
        ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
        for boundary in range(0, len(misfit) + 1, lay.page_size):
            ax.axvline(boundary - 0.5, **GRID)
        if fit is not None:
            ax.plot([fit], [max(misfit[fit], 1e-3)], "r*", markersize=12)
        ax.set_yscale("log")
        ax.set_xlabel("key position j (grey: page boundaries)")
        ax.set_ylabel("|kernel - oracle(j toggled)|\n/ allowed (1 = at the limit)")
        figs["kv_probe"] = (
            fig,
            (
                f"Row {row}, qo head {head}: distance of the kernel's value to the oracle with key j dropped (or, if "
                f"masked, added), as {SCALE}; below the dashed line that single key explains the error (red star)."
            ),
        )
    return figs
