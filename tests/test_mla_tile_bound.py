"""The known-finding predicate of FlashInfer's MLA causal tile bound (golden case
flashinfer-mla-causal-tile-last-key) and the standalone report's model of the same bound agree, and the
ledger entry covers the golden case on both MLA adapters."""

from __future__ import annotations

import importlib.util
import itertools

import pytest
from pa_oracle.fuzz.campaign.ledger import golden_cases, known_finding, load_ledger
from pa_oracle.fuzz.draw.features import case_features, mla_causal_tile_lost_keys
from pa_oracle.golden import root
from pa_oracle.oracle.case import Case, Heads, Layout, Options

NAME = "flashinfer-mla-causal-tile-last-key"


def _mla(qo: int, kv: int, heads: int, causal: bool = True, kv_dtype: str = "bfloat16") -> Case:
    return Case(Layout.from_lengths([qo], [kv], 64), Heads(heads, 1, 576, 512, mla=True), Options(causal=causal, kv_dtype=kv_dtype))


def _repro():
    path = root() / "reports" / "flashinfer-mla-causal-tile-floor" / "repro.py"
    spec = importlib.util.spec_from_file_location("mla_tile_repro", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_golden_case_loses_the_rows_seen_on_the_h200() -> None:
    case = Case.load_json(next(p for p in golden_cases() if p.stem == NAME))
    assert mla_causal_tile_lost_keys(case) == [(0, 10, head) for head in range(8)]  # token 10, heads 0-7 (H200)
    assert case_features(case)["mla_causal_tile_key_lost"]


@pytest.mark.parametrize("backend", ["flashinfer-mla", "flashinfer-mla-fa3"])
def test_the_ledger_skips_the_class_on_both_mla_adapters(backend: str) -> None:
    entries = load_ledger()
    hit = known_finding(entries, _mla(64, 118, 12), backend, {"flashinfer": "0.7.2.post1"}, backend)
    assert hit is not None and hit.case == NAME
    assert known_finding(entries, _mla(64, 118, 16), backend, {"flashinfer": "0.7.2.post1"}, backend) is None


def test_heads_dividing_the_tile_and_non_causal_cases_lose_nothing() -> None:
    for qo, kv, heads in itertools.product((1, 7, 43, 64), (64, 65, 118, 200), (1, 2, 4, 8, 16, 32, 64, 128)):
        if qo <= kv:
            assert not mla_causal_tile_lost_keys(_mla(qo, kv, heads)), (qo, kv, heads)
    assert not mla_causal_tile_lost_keys(_mla(64, 118, 12, causal=False))


def test_the_report_and_the_predicate_model_the_same_bound() -> None:
    repro = _repro()
    hits = 0
    for qo, kv, heads in itertools.product(range(1, 70, 3), range(1, 260, 7), (3, 5, 6, 12, 20, 24)):
        if qo > kv:
            continue
        ours = [(token, head) for _, token, head in mla_causal_tile_lost_keys(_mla(qo, kv, heads))]
        assert ours == repro.lost_rows(qo, kv, heads), (qo, kv, heads)
        hits += bool(ours)
    assert hits > 10  # the sweep reaches the bug, so agreement means something
    assert repro.lost_rows(43, 65, 3) == [(42, 0), (42, 1)]


def test_fp8_kv_uses_the_32_key_tile() -> None:  # fa2's EFF_CTA_TILE_KV for e4m3
    case = _mla(43, 33, 3, kv_dtype="float8_e4m3fn")  # bound 33 - 43 + 42 = 32
    assert mla_causal_tile_lost_keys(case) == [(0, 42, 0), (0, 42, 1)]
    assert not mla_causal_tile_lost_keys(_mla(43, 33, 3))  # a 16-bit cache: 64-key tiles, 32 is inside one
