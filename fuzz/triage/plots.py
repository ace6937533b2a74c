"""Triage plots as PNG bytes (matplotlib, optional: ``pip install 'paged-attention-oracle[triage]'``):
error over (query row, head), error per request, and the per-key probe of the worst wrong pair.
Errors are shown in units of the allowed error (1 = the tolerance limit).
"""

from __future__ import annotations

import io

from pa_oracle.fuzz.triage.localize import Localization


def unavailable_reason() -> str | None:
    """Why plots cannot be drawn here, or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        return f"matplotlib is not installed ({exc}); pip install 'paged-attention-oracle[triage]'"
    return None


def _png(fig) -> bytes:  # type: ignore[no-untyped-def]
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def figures(loc: Localization) -> dict[str, tuple[bytes, str]]:
    """``{name: (png, caption)}`` for one localization; empty if matplotlib is missing."""
    if unavailable_reason() is not None:
        return {}
    import torch
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    figs: dict[str, tuple[bytes, str]] = {}
    lay = loc.case.layout
    score = torch.nan_to_num(loc.score.double(), posinf=1e6).clamp(min=0)
    if score.numel() >= 2:
        fig = Figure(layout="constrained", figsize=(min(2 + 0.4 * score.shape[1], 10), min(2 + 0.12 * score.shape[0], 10)))
        ax = fig.subplots()
        image = ax.imshow(torch.log10(score + 1e-3).numpy(), aspect="auto", cmap="magma", interpolation="nearest")
        for start in lay.qo_indptr[1:-1]:
            ax.axhline(start - 0.5, color="cyan", linewidth=0.8)
        ax.set_xlabel("qo head")
        ax.set_ylabel("query row (cyan: request boundaries)")
        fig.colorbar(image, ax=ax, label="log10(error / allowed)")
        figs["heatmap"] = (_png(fig), "Error over (query row, qo head), in units of the allowed error (0 = at the limit).")
    if lay.batch_size >= 2:
        per_request = [float(score[a:b].max()) if b > a else 0.0 for a, b in zip(lay.qo_indptr, lay.qo_indptr[1:])]
        fig = Figure(layout="constrained", figsize=(min(2 + 0.5 * len(per_request), 10), 3))
        ax = fig.subplots()
        ax.bar(range(len(per_request)), [max(v, 1e-3) for v in per_request], color=["C3" if v > 1 else "C2" for v in per_request])
        ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(per_request)))
        ax.set_xticklabels([f"{b}\nkv {lay.kv_lens[b]}" for b in range(len(per_request))], fontsize=7)
        ax.set_ylabel("max error / allowed")
        figs["requests"] = (_png(fig), "Max error per request (red: over the limit, dashed line).")
    decode_rows = [r for r in range(lay.total_q) if lay.qo_lens[lay.request_of_row(r)] == 1]
    if len(decode_rows) >= 2:
        fig = Figure(layout="constrained", figsize=(5, 3))
        ax = fig.subplots()
        kv = [lay.kv_lens[lay.request_of_row(r)] for r in decode_rows]
        ax.scatter(kv, [max(float(score[r].max()), 1e-3) for r in decode_rows], s=12)
        ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
        for boundary in range(0, max(kv) + 1, lay.page_size):
            ax.axvline(boundary, color="0.85", linewidth=0.5, zorder=0)
        ax.set_yscale("log")
        ax.set_xlabel("kv_len (grey: page boundaries)")
        ax.set_ylabel("row max error / allowed")
        figs["decode_kv_len"] = (_png(fig), "Decode rows: error against kv_len.")
    if loc.profile is not None:
        row, head, misfit, fit = loc.profile
        fig = Figure(layout="constrained", figsize=(min(3 + 0.05 * len(misfit), 10), 3))
        ax = fig.subplots()
        ax.plot(range(len(misfit)), [max(m, 1e-3) for m in misfit], marker=".", linewidth=0.8)
        ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
        for boundary in range(0, len(misfit) + 1, lay.page_size):
            ax.axvline(boundary - 0.5, color="0.85", linewidth=0.5, zorder=0)
        if fit is not None:
            ax.plot([fit], [max(misfit[fit], 1e-3)], "r*", markersize=12)
        ax.set_yscale("log")
        ax.set_xlabel("key position j (grey: page boundaries)")
        ax.set_ylabel("|kernel - oracle(j toggled)| / allowed")
        figs["kv_probe"] = (
            _png(fig),
            (
                f"Row {row}, qo head {head}: distance of the kernel's value to the oracle with key j dropped (or, if "
                "masked, added); below the dashed line that single key explains the error (red star)."
            ),
        )
    return figs
