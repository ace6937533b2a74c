from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pa_oracle.oracle.case import SCHEMA_VERSION, Case, CaseError, Heads, Layout, Options
from pa_oracle.oracle.tensors import Tensors, check_signal, load_case, load_tensors, make_tensors, save_tensors

LAYOUT = dict(qo_indptr=(0, 1, 3), kv_indptr=(0, 2, 3), kv_indices=(4, 0, 2), kv_last_page_len=(3, 1), page_size=4, num_pages=5)


def layout(**changes):
    return Layout(**{**LAYOUT, **changes})


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(qo_indptr=(0, 3, 1)), r"qo_indptr is not monotone at request 1"),
        (dict(kv_indptr=(1, 2, 3)), r"kv_indptr\[0\] must be 0"),
        (dict(kv_last_page_len=(5, 1)), r"kv_last_page_len\[0\]=5 out of range 1..page_size=4 for request 0"),
        (dict(kv_last_page_len=(0, 1)), r"kv_last_page_len\[0\]=0 out of range"),
        (dict(kv_indices=(4, 0, 7)), r"page id 7 of request 1 out of range 0..4"),
        (dict(kv_indices=(4, 0, 0)), r"page 0 is used twice \(requests 0 and 1\)"),
        (dict(kv_indices=(4, 0)), r"kv_indices has 2 entries but kv_indptr\[-1\]=3"),
        (dict(kv_last_page_len=(3,)), r"kv_last_page_len has 1 entries, expected batch_size=2"),
        (dict(page_size=0), r"page_size must be >= 1"),
    ],
)
def test_invalid_layouts_name_the_field_and_request(changes, message) -> None:
    with pytest.raises(CaseError, match=message):
        layout(**changes)


def test_request_without_pages_must_have_last_page_len_zero() -> None:
    with pytest.raises(CaseError, match=r"kv_last_page_len\[1\]=2 but request 1 has no pages"):
        Layout((0, 1, 2), (0, 1, 1), (0,), (1, 2), page_size=4, num_pages=1)
    assert Layout((0, 1, 2), (0, 1, 1), (0,), (1, 0), page_size=4, num_pages=1).kv_lens == (1, 0)


def test_derived_fields() -> None:
    lay = layout()
    assert lay.kv_lens == (7, 1) and lay.qo_lens == (1, 2)
    assert lay.block_table(pad=-1) == [[4, 0], [2, -1]]
    assert [lay.position_of_row(r) for r in range(3)] == [6, -1, 0]  # request 1: qo_len 2 > kv_len 1
    assert lay.slot_of(0, 5) == (0, 1) and lay.slot_of(1, -1) is None


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Heads(6, 4, 8, 8), "num_qo_heads=6 is not a multiple of num_kv_heads=4"),
        (lambda: Options(q_dtype="float64"), "q_dtype must be one of"),
        (lambda: Options(window_left=-2), "window_left must be -1"),
        (lambda: Options(k_scale=0.5), "k_scale=0.5 needs an fp8 kv_dtype"),
        (lambda: Options(logits_soft_cap=float("inf")), "logits_soft_cap must be finite"),
        (lambda: Case(layout(), Heads(2, 1, 8, 8), Options(sinks=(1.0,))), "sinks has 1 entries, expected num_qo_heads=2"),
    ],
)
def test_invalid_options(make, message) -> None:
    with pytest.raises(CaseError, match=message):
        make()


def test_json_round_trip(tmp_path) -> None:
    case = Case(layout(), Heads(4, 2, 8, 16), Options(causal=True, alibi_slopes=(0.5, 0.25, 0.1, 0.05), kv_dtype="float8_e4m3fn", k_scale=0.5), seed=3, distribution="peaked")
    path = case.save(tmp_path / "c.json")
    assert load_case(path) == case
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(schema_version=99), "unknown case schema_version 99"),
        (lambda d: d.pop("layout"), "c.json: layout: missing"),
        (lambda d: d.update(extra=1), r"c.json: extra: unknown field \(known: schema_version, layout"),
        (lambda d: d["heads"].update(bogus=1), r"c.json: heads.bogus: unknown field \(known: num_qo_heads"),
        (lambda d: d.update(case_id="000000000000"), "does not match"),
    ],
)
def test_malformed_case_files_are_refused(tmp_path, edit, message) -> None:
    data = Case(layout(), Heads(2, 1, 8, 8)).to_json()
    edit(data)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CaseError, match=message):
        load_case(path)


def test_not_json_is_refused(tmp_path) -> None:
    (tmp_path / "c.json").write_text("{nope")
    with pytest.raises(CaseError, match="not valid JSON"):
        load_case(tmp_path / "c.json")


@pytest.mark.parametrize("q_dtype, kv_dtype", [("bfloat16", "float8_e5m2"), ("float16", "float16"), ("float32", "float8_e4m3fn")])
def test_npz_sidecar_round_trip_is_bit_exact(tmp_path, q_dtype, kv_dtype) -> None:
    case = Case(layout(), Heads(2, 1, 8, 8), Options(q_dtype=q_dtype, kv_dtype=kv_dtype), seed=1)
    tensors = make_tensors(case)
    save_tensors(tensors, tmp_path / "t.npz")
    assert load_tensors(case, tmp_path / "t.npz").fingerprint() == tensors.fingerprint()


def test_npz_sidecar_is_checked_against_the_case(tmp_path) -> None:
    case = Case(layout(), Heads(2, 1, 8, 8))
    save_tensors(make_tensors(case), tmp_path / "t.npz")
    with pytest.raises(CaseError, match="k_cache is"):
        load_tensors(case.replace(heads=Heads(2, 2, 8, 8)), tmp_path / "t.npz")
    np.savez(tmp_path / "bad.npz", q=np.zeros(3))
    with pytest.raises(CaseError, match=r"bad.npz: missing arrays \[.k_cache__bits"):
        load_tensors(case, tmp_path / "bad.npz")


def test_unreferenced_slots_are_poisoned_and_values_follow_logical_tokens() -> None:
    case = Case(layout(), Heads(2, 1, 8, 8))
    tensors = make_tensors(case)
    assert tensors.k_cache[1].isnan().all() and tensors.k_cache[3].isnan().all()  # unused pages
    assert tensors.k_cache[0, 3:].isnan().all()  # slots past request 0's last_page_len
    assert not tensors.k_cache[4].isnan().any()


def test_near_uniform_inputs_are_refused() -> None:
    case = Case(layout(), Heads(2, 1, 8, 8))
    tensors = make_tensors(case)
    quiet = Tensors(tensors.q * 1e-3, tensors.k_cache * 1e-3, tensors.v_cache)
    with pytest.raises(CaseError, match="near-uniform"):
        check_signal(case, quiet)
    check_signal(case, tensors)


@pytest.mark.parametrize("distribution", ["normal", "peaked", "outliers", "near_ties", "exact"])
def test_every_distribution_carries_signal_and_is_deterministic(distribution) -> None:
    case = Case(Layout.from_lengths([4, 1], [40, 9], 8), Heads(4, 2, 16, 16), seed=5, distribution=distribution)
    a, b = make_tensors(case), make_tensors(case)
    assert a.fingerprint() == b.fingerprint()
    check_signal(case, a)
    assert torch.isfinite(a.q).all()


def test_fingerprint_is_a_blake2b_of_dtype_shape_and_raw_bits(monkeypatch) -> None:
    import hashlib

    import pa_oracle.oracle.tensors as tensors_module
    from pa_oracle.oracle.tensors import digest, raw_bits

    def definition(t: torch.Tensor) -> str:
        hasher = hashlib.blake2b(digest_size=32)
        hasher.update(repr((str(t.dtype), tuple(t.shape))).encode())
        hasher.update(raw_bits(t).flatten().numpy().tobytes())
        return hasher.hexdigest()

    pool = torch.randn(3, 70_000).to(torch.bfloat16)
    pool[0, 5] = float("nan")
    tensors = Tensors(pool[0], pool, pool[:, :7])  # a non-contiguous view too
    extra = {"kv_indices": torch.tensor([3, -1, 7], dtype=torch.int32), "none": torch.zeros(0), "fp8": torch.randn(9).to(torch.float8_e4m3fn)}
    named = {**tensors.as_dict(), **extra}
    assert tensors.fingerprint(extra) == {name: definition(t) for name, t in named.items()}
    monkeypatch.setattr(tensors_module, "DIGEST_CHUNK", 1000)  # read back in chunks: the same digest
    assert digest(pool) == definition(pool)
    # changes that keep a position-weighted sum of the bits: (+d, -2d, +d) on three words, a swap 65521 apart
    three = pool.clone()
    three.view(torch.int16)[0, 10:13] += torch.tensor([64, -128, 64], dtype=torch.int16)
    swapped = pool.clone().flatten()
    swapped[[70_000, 70_000 + 65_521]] = swapped[[70_000 + 65_521, 70_000]]
    for changed in (three, swapped.view(3, 70_000)):
        assert not torch.equal(raw_bits(changed), raw_bits(pool))
        assert Tensors(pool[0], changed, pool[:, :7]).fingerprint()["k_cache"] != tensors.fingerprint()["k_cache"]
