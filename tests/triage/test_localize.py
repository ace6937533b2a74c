from __future__ import annotations

import pytest
import torch
from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.fuzz.triage.localize import Capture, _Rows, capture, localize
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.reference import reference
from pa_oracle.oracle.tensors import make_tensors

from .conftest import kernel, mixed_case


def check(loc, name):
    return next(c for c in loc.checks if c.name == name)


def test_the_row_probe_recomputes_the_oracle_with_every_option() -> None:
    case = Case(
        Layout.from_lengths([3, 1], [11, 6], page_size=4),
        Heads(4, 2, 8, 8),
        Options(causal=True, window_left=5, logits_soft_cap=20.0, alibi_slopes=(0.5, 0.25, 0.125, 0.0625),
                sinks=(0.1, -0.3, 0.7, 0.0), sm_scale=0.4),
        seed=2,
    )
    tensors = make_tensors(case)
    cap = Capture(case, "oracle", Outcome(case, "oracle", "pass"), tensors, reference(case, tensors))
    rows = _Rows(cap)
    for row in range(case.layout.total_q):
        for head in range(4):
            out, lse = rows.attend(row, head, head // 2)
            torch.testing.assert_close(out, cap.ref.out[row, head], rtol=0, atol=1e-12)
            assert lse == pytest.approx(float(cap.ref.lse[row, head]), abs=1e-12)


def test_last_page_bug_points_at_the_last_key() -> None:
    loc = localize(capture(kernel("last_page_off_by_one"), mixed_case()))
    page = check(loc, "page boundary")
    assert page.result == "pattern" and "off-by-one in the last page length" in page.finding, page
    assert loc.toggles and all(t.dropped and "the last key" in t.labels for t in loc.toggles)


def test_reading_past_the_last_page_follows_partial_pages() -> None:
    loc = localize(capture(kernel("reads_past_last_page"), mixed_case()))  # kv_lens 9, 8, 13 with pages of 4
    page = check(loc, "page boundary")
    assert page.result == "pattern" and "kv_len % page_size != 0" in page.finding, page
    assert check(loc, "requests").finding.startswith("requests {0, 2} of 3 are wrong")


def test_wrong_gqa_map_is_read_off_the_kv_head() -> None:
    loc = localize(capture(kernel("wrong_gqa_map"), mixed_case()))
    heads = check(loc, "heads")
    assert heads.result == "pattern" and "wrong GQA head map" in heads.finding, heads
    assert set(loc.kv_reads.items()) >= {((0, 1), 1), ((0, 2), 0)}  # h % 2 instead of h // 2


def test_window_off_by_one_is_the_window_edge() -> None:
    loc = localize(capture(kernel("window_off_by_one"), mixed_case(window_left=3)))
    assert loc.status == "fail", loc.verdict.headline()
    assert check(loc, "window edge").result == "pattern"


def test_base_two_lse_is_recognized() -> None:
    loc = localize(capture(kernel("lse_base_two"), mixed_case()))
    assert check(loc, "LSE").result == "pattern" and "log2(e)" in check(loc, "LSE").finding
    assert check(loc, "out or LSE").finding == "only the LSE is wrong; the output is right"


def test_a_correct_kernel_shows_no_pattern() -> None:
    loc = localize(capture(kernel("correct_attention"), mixed_case(causal=True, window_left=4)))
    assert loc.status == "pass" and not loc.wrong.any() and not loc.patterns, loc.patterns
