"""Triage plots that read (issue 35): big enough to show the page lines, every label inside the figure, and
errors on the report's one scale, error / allowed with 1 at the limit (the floor included)."""

from __future__ import annotations

import struct

import pytest
from pa_oracle.fuzz.triage import plots
from pa_oracle.fuzz.triage.localize import capture, localize
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.report import format_report, limit_ratio

from .conftest import kernel

pytest.importorskip("matplotlib", reason="the triage plots need matplotlib (the [triage] extra)")


def _case() -> Case:
    """Two decode requests and a prefill one over shuffled pages: every plot has something to draw."""
    layout = Layout.from_lengths([1, 1, 3], [9, 17, 13], page_size=4, page_order=list(range(13))[::-1], extra_pages=1)
    return Case(layout, Heads(4, 2, 16, 16), Options(q_dtype="bfloat16", kv_dtype="bfloat16"), seed=2)


@pytest.fixture(scope="module")
def loc():
    loc = localize(capture(kernel("last_page_off_by_one"), _case()))
    assert loc.status == "fail"
    return loc


@pytest.fixture(scope="module")
def drawn(loc):
    figs = plots.draw(loc)
    assert set(figs) == {"heatmap", "requests", "decode_kv_len", "kv_probe"}, set(figs)
    return figs


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])


def test_every_png_is_large_enough_to_show_the_page_lines(loc) -> None:
    for name, (png, _) in plots.figures(loc).items():
        width, height = _png_size(png)
        assert width >= 640 and height >= 400, (name, width, height)


def test_every_label_lies_inside_the_figure(drawn) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for name, (fig, _) in drawn.items():
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        box = fig.get_tightbbox(canvas.get_renderer())  # inches
        width, height = fig.get_size_inches()
        eps = 1e-3
        assert box.x0 >= -eps and box.y0 >= -eps and box.x1 <= width + eps and box.y1 <= height + eps, (name, box, width, height)
        labels = [ax.get_ylabel() for ax in fig.axes] + [ax.get_xlabel() for ax in fig.axes]
        assert any("1 = at the limit" in label for label in labels), (name, labels)


def test_the_heatmap_shows_the_reports_err_over_allowed(loc, drawn) -> None:
    from matplotlib.colors import LogNorm

    fig, caption = drawn["heatmap"]
    image = fig.axes[0].images[0]
    assert isinstance(image.norm, LogNorm) and image.norm.vmin < 1.0 < image.norm.vmax
    shown = float(image.get_array().max())
    stats = [s for s in (loc.verdict.out, loc.verdict.lse) if s is not None]
    assert shown == pytest.approx(max(min(limit_ratio(s), 1e6) for s in stats), rel=1e-9)
    assert shown > 1.0  # a failing case is over the limit on the same scale the report prints
    assert "1 = at the limit" in caption and "floor included" in caption


def test_the_report_prints_err_over_allowed_beside_the_control_ratio(loc) -> None:
    text = format_report(loc.case, loc.backend, loc.verdict)
    header = next(line for line in text.splitlines() if line.startswith("| tensor |"))
    row = next(line for line in text.splitlines() if line.startswith("| out |"))
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert float(cells["err / allowed"]) == pytest.approx(loc.verdict.out.max_error / loc.verdict.out.limit_max, abs=0.006)
    assert float(cells["x control"]) == pytest.approx(min(loc.verdict.out.ratio, 1e300), abs=0.006) or cells["x control"] == "inf"
    assert "1.00 is at the limit" in text
