from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from pa_oracle.oracle.case import Case, CaseError, CustomMask, Heads, Layout, Options, Rope
from pa_oracle.oracle.reference import FP8_DOT_BITS, fp8_logit_noise, plain_controls, reference
from pa_oracle.oracle.tensors import load_case, load_tensors, make_tensors, query_values, raw_bits, save_case, token_addresses

GOLDEN = sorted((Path(__file__).resolve().parents[2] / "golden" / "cases").glob("*.json"))
E4M3 = "float8_e4m3fn"
D_CKV, D_KPE = 8, 4  # MLA_DIMS' small pair (12, 8)
MLA = Heads(3, 1, D_CKV + D_KPE, D_CKV, mla=True)
LAYOUT = Layout.from_lengths([1, 3], [6, 5], page_size=4, extra_pages=1)


def _fp8_q(q_scale: float = 0.5, k_scale: float = 0.75, v_scale: float = 0.75, kv_dtype: str = E4M3, **more: object) -> Options:
    return Options(q_dtype=E4M3, kv_dtype=kv_dtype, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, o_dtype="bfloat16",
                   **more)  # type: ignore[arg-type]


def _by_hand(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain MQA over the stored codes, in Python floats: q = stored * q_scale over the whole row [q_nope | q_pe],
    K = latent row * k_scale, V = its first D_CKV dims * v_scale; the logit one dot over D_CKV + D_KPE dims."""
    tensors, opts, lay = make_tensors(case), case.options, case.layout
    pages, slots = token_addresses(case)
    rows = [tensors.k_cache[int(p), int(s), 0].double().tolist() for p, s in zip(pages, slots)]
    out = torch.zeros(lay.total_q, case.heads.num_qo_heads, D_CKV, dtype=torch.float64)
    lse = torch.full(out.shape[:2], float("-inf"), dtype=torch.float64)
    row, start = 0, 0
    for qo, kv in zip(lay.qo_lens, lay.kv_lens):
        for i in range(qo):
            for h in range(case.heads.num_qo_heads):
                q = [x * opts.q_scale for x in tensors.q[row, h].double().tolist()]
                attended = [j for j in range(kv) if not opts.causal or j <= kv - qo + i]
                logits = {j: case.sm_scale * sum(a * c * opts.k_scale for a, c in zip(q, rows[start + j])) for j in attended}
                if logits:
                    top = max(logits.values())
                    weights = {j: math.exp(s - top) for j, s in logits.items()}
                    total = sum(weights.values())
                    out[row, h] = torch.tensor([sum(w * rows[start + j][d] * opts.v_scale for j, w in weights.items()) / total
                                                for d in range(D_CKV)], dtype=torch.float64)
                    lse[row, h] = top + math.log(total)
            row += 1
        start += kv
    return out, lse


@pytest.mark.parametrize("opts", [_fp8_q(causal=True), _fp8_q(q_scale=2.0, k_scale=0.25, v_scale=1.5),
                                  _fp8_q(q_scale=0.75, sm_scale=0.3, kv_dtype="float8_e5m2")],
                         ids=["causal", "k_scale_ne_v_scale", "e5m2_kv"])
def test_the_oracle_dequantises_q_nope_and_q_pe_by_the_one_q_scale_as_a_hand_computation(opts: Options) -> None:
    case = Case(LAYOUT, MLA, opts, seed=5)
    ref = reference(case, make_tensors(case))
    out, lse = _by_hand(case)
    torch.testing.assert_close(ref.out, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref.lse, lse, rtol=0, atol=1e-12)


def test_q_nope_and_q_pe_are_stored_once_as_value_over_q_scale() -> None:
    case = Case(LAYOUT, MLA, _fp8_q(), seed=5)
    tensors = make_tensors(case)
    unscaled = make_tensors(case.replace(options=Options(q_dtype="float32", kv_dtype=E4M3, k_scale=0.75, v_scale=0.75)))
    expected = (unscaled.q / 0.5).to(torch.float8_e4m3fn)
    assert tensors.q.dtype == torch.float8_e4m3fn and tensors.q.shape[-1] == D_CKV + D_KPE
    assert torch.equal(tensors.q.view(torch.uint8), expected.view(torch.uint8))  # both parts, one scale
    assert torch.equal(query_values(case, tensors, torch.float64), tensors.q.double() * 0.5)
    assert tensors.v_is_latent_view()


def test_the_fp8_logit_noise_runs_over_the_whole_mla_logit_dim() -> None:
    case = Case(LAYOUT, MLA, _fp8_q(), seed=5)
    tensors = make_tensors(case)
    pages, slots = token_addresses(case)
    keys = tensors.k_cache[pages, slots, 0].double() * 0.75  # [total_kv, D_CKV + D_KPE]
    q = tensors.q.double() * 0.5
    want = q.norm(dim=-1) * keys.norm(dim=-1).max() * case.sm_scale * 2.0**-FP8_DOT_BITS
    torch.testing.assert_close(fp8_logit_noise(case, tensors), want, rtol=1e-12, atol=0)
    latent_only = q[..., :D_CKV].norm(dim=-1) * keys[:, :D_CKV].norm(dim=-1).max() * case.sm_scale * 2.0**-FP8_DOT_BITS
    assert bool((want > latent_only).all())  # q_pe . kpe counted: a bound over d_ckv alone would be too tight


def test_the_controls_dequantise_both_parts_as_the_reference_does() -> None:
    case = Case(Layout.from_lengths([2, 4], [40, 30], page_size=4), MLA, _fp8_q(q_scale=0.25), seed=9)
    tensors = make_tensors(case)
    ref = reference(case, tensors)
    for out, lse in plain_controls(case, tensors, torch.bfloat16):
        assert out.dtype == torch.bfloat16
        assert float((out.double() - ref.out).abs().max()) < 0.05
        assert float((lse.double() - ref.lse).abs().max()) < 0.05
    unscaled_pe = tensors.copy()
    unscaled_pe.q[..., D_CKV:] = (tensors.q[..., D_CKV:].float() / 0.25).to(tensors.q.dtype)  # q_pe dequantised by 1
    assert float((reference(case, unscaled_pe).lse - ref.lse).abs().max()) > 0.05  # a q_pe left unscaled moves the LSE beyond that


def test_what_no_kernel_can_do_is_refused_by_name_on_mla() -> None:
    with pytest.raises(CaseError, match="q_dtype must be one of"):
        Options(q_dtype="float8_e4m3fnuz", kv_dtype=E4M3, o_dtype="bfloat16")  # no such q dtype
    with pytest.raises(CaseError, match="q_scale=0.5 needs an fp8 q_dtype"):
        Case(LAYOUT, MLA, Options(q_dtype="bfloat16", kv_dtype=E4M3, q_scale=0.5))
    with pytest.raises(CaseError, match="kv_dtype: an fp8 q takes an fp8 KV"):
        Case(LAYOUT, MLA, Options(q_dtype=E4M3, kv_dtype="bfloat16", o_dtype="bfloat16"))
    with pytest.raises(CaseError, match="o_dtype: an fp8 q needs an output dtype"):
        Case(LAYOUT, MLA, Options(q_dtype=E4M3, kv_dtype=E4M3))
    with pytest.raises(CaseError, match="q_scale"):
        _fp8_q(q_scale=0.0)
    with pytest.raises(CaseError, match="rope: RoPE of an fp8 q is not modelled"):
        _fp8_q(rope=Rope())
    with pytest.raises(CaseError, match="an fp8 q with a custom mask is not modelled"):
        Case(LAYOUT, MLA, _fp8_q(), custom_mask=CustomMask(tree_parents=((-1,), (-1, 0, 0))))


def test_a_case_file_with_a_q_scale_and_no_fp8_q_is_refused_naming_the_field() -> None:
    data = Case(LAYOUT, MLA, Options(q_dtype="bfloat16", kv_dtype="bfloat16"), seed=5).to_json()
    data.pop("case_id")
    data["options"]["q_scale"] = 0.5
    with pytest.raises(CaseError, match="q_scale=0.5 needs an fp8 q_dtype, got bfloat16"):
        Case.from_json(data)


def test_an_mla_fp8_q_case_round_trips_and_a_bf16_one_is_written_as_before() -> None:
    case = Case(LAYOUT, MLA, _fp8_q(), seed=5)
    again = Case.from_json(json.loads(json.dumps(case.to_json())))
    assert again == case and again.case_id == case.case_id
    assert "mla" in case.summary() and "q_scale=0.5 o=bfloat16" in case.summary()
    plain = Case(LAYOUT, MLA, Options(q_dtype="bfloat16", kv_dtype="bfloat16"), seed=5)
    assert not {"q_scale", "o_dtype"} & set(plain.to_json()["options"])


def test_an_mla_fp8_q_case_with_a_sidecar_loads_its_codes_bit_for_bit(tmp_path: Path) -> None:
    case = Case(LAYOUT, MLA, _fp8_q(), seed=5)
    tensors = make_tensors(case)
    saved = save_case(case, tmp_path, tensors)
    loaded = load_case(tmp_path / "case.json")
    again = load_tensors(loaded, tmp_path / str(loaded.tensors_file))
    assert loaded.case_id == saved.case_id
    assert loaded.options == case.options and again.q.dtype == torch.float8_e4m3fn and again.v_is_latent_view()
    assert torch.equal(raw_bits(again.q), raw_bits(tensors.q)) and torch.equal(raw_bits(again.k_cache), raw_bits(tensors.k_cache))
    torch.testing.assert_close(reference(loaded, again).out, reference(case, tensors).out, rtol=0, atol=0)


def test_every_golden_mla_case_keeps_its_id() -> None:
    mla = [json.loads(path.read_text()) for path in GOLDEN]
    mla = [data for data in mla if data["heads"].get("mla")]
    assert mla, "the golden corpus holds MLA cases"
    for data in mla:
        assert "q_scale" not in data["options"] and Case.from_json(data).case_id == data["case_id"]
