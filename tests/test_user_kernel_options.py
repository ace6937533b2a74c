"""What a user kernel (``--kernel MODULE:FUNCTION``, ``backends/user.py``) is given since issue 34: an fp8 q's
``q_scale`` and the output dtype, every declared MLA pair (or a refusal naming it), and strided views by
default ("refuses views" for a kernel that raises on one). Each is caught by a planted bug of
``fuzz/quality/planted_user.py`` and leaves its correct kernels clean over a few hundred cases."""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from pa_oracle.backends import BackendSpecError, resolve
from pa_oracle.backends.base import Capabilities
from pa_oracle.backends.user import BadDeclaration, UserKernel, capabilities_of, declare
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.draw import families
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.quality import planted, planted_user
from pa_oracle.fuzz.run.runner import ORACLE, ORACLE_CHECK, Outcome, check_case
from pa_oracle.oracle.tolerance import Tolerance
from pa_oracle.oracle.case import FP8_DTYPES, STORAGE_FEATURES, Case, Heads, Layout, Options, Storage

SMALL = Limits(max_batch=3, max_kv_len=48, max_qo_len=8, max_kv_heads=2, max_qo_heads=8)  # quick to shrink
LAYOUT = Layout.from_lengths([1, 3], [5, 9], 4, page_order=[3, 0, 5, 4, 2, 1], extra_pages=1)


def _kernel(name: str) -> UserKernel:
    return UserKernel(getattr(planted_user, name), name=f"pa_oracle.fuzz.quality.planted_user:{name}")


@dataclass(frozen=True)
class _Recorded:
    """The oracle comparison, keeping every outcome it returns."""

    seen: list[Outcome] = field(default_factory=list)
    name: str = ORACLE_CHECK

    def capabilities(self, backend: UserKernel):  # type: ignore[no-untyped-def]
        return ORACLE.capabilities(backend)

    def judge(self, case: Case, backend: UserKernel, tolerance: Tolerance = Tolerance(), keep_output: bool = False) -> Outcome:
        outcome = ORACLE.judge(case, backend, tolerance, keep_output)
        self.seen.append(outcome)
        return outcome


def _outcomes(kernel: UserKernel, examples: int) -> tuple[object, list[Outcome]]:
    """The campaign's result and the outcomes of the cases it judged (a finding's shrinking included)."""
    check = _Recorded()
    result = fuzz_backend(kernel, CampaignConfig(examples=examples, seed=0, isolate=False, limits=SMALL), check=check)
    return result, check.seen


def _fp8_q_case(q_scale: float = 0.75, k_scale: float = 1.0, o_dtype: str = "float16") -> Case:
    """The issue's minimal case: an fp8 q, differing from the default only by its scales."""
    opts = Options(q_dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn", q_scale=q_scale, k_scale=k_scale, o_dtype=o_dtype)
    return Case(LAYOUT, Heads(2, 1, 16, 16), opts, seed=3)


# --- q_scale and the output dtype -------------------------------------------------------------


def test_a_kernel_naming_q_scale_and_out_dtype_is_given_them_and_draws_fp8_q() -> None:
    given_kwargs: dict = {}

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap, k_scale, v_scale, q_scale, out_dtype):
        given_kwargs.update(q_scale=q_scale, out_dtype=out_dtype, sm_scale=sm_scale)
        return planted_user.correct_fp8_q(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                          kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                                          logits_soft_cap=logits_soft_cap, k_scale=k_scale, v_scale=v_scale, q_scale=q_scale,
                                          out_dtype=out_dtype)

    backend = UserKernel(kernel)
    assert set(FP8_DTYPES) <= set(backend.capabilities.q_dtypes)
    case = _fp8_q_case(o_dtype="bfloat16")
    assert check_case(backend, case).status == "pass"
    assert given_kwargs == {"q_scale": 0.75, "out_dtype": torch.bfloat16, "sm_scale": case.sm_scale}  # not folded


def test_without_out_dtype_fp8_q_is_drawn_only_where_declared() -> None:
    caps = capabilities_of(planted.fp8_scale_ignored)  # k_scale / v_scale only
    assert not set(FP8_DTYPES) & set(caps.q_dtypes) and caps.kv_dtypes == FP8_DTYPES


@pytest.mark.parametrize("bug", ["q_scale_ignored", "q_scale_from_k_scale"])
def test_a_q_scale_bug_fails_the_issues_minimal_case_which_the_correct_kernel_passes(bug: str) -> None:
    case = _fp8_q_case(q_scale=0.75, k_scale=1.0)
    assert check_case(_kernel("correct_fp8_q"), case).status == "pass"
    assert check_case(_kernel(bug), case).status == "fail"
    # with q_scale at 1 (all a user could fuzz before) both bugs pass: only the drawn scale shows them
    assert check_case(_kernel(bug), _fp8_q_case(q_scale=1.0)).status == "pass"


def test_q_scale_is_folded_into_sm_scale_for_a_kernel_that_does_not_name_it() -> None:
    backend = UserKernel(planted_user.correct_fp8_q_folded)
    assert backend.unsupported_reason(_fp8_q_case(o_dtype="bfloat16")) is None
    assert check_case(backend, _fp8_q_case(o_dtype="bfloat16")).status == "pass"

    def no_scale_keyword(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal,
                         window_left, logits_soft_cap, k_scale, v_scale):
        raise AssertionError("never called: it cannot take q_scale in")

    no_scale_keyword.pa_oracle_capabilities = {"q_dtypes": FP8_DTYPES}  # type: ignore[attr-defined]
    outcome = check_case(UserKernel(no_scale_keyword), _fp8_q_case())
    assert outcome.status == "unsupported" and "q_scale=0.75" in outcome.message and "sm_scale" in outcome.message


@pytest.mark.parametrize("bug", ["q_scale_ignored", "q_scale_from_k_scale"])
def test_a_q_scale_bug_is_caught_by_the_fuzzer(bug: str) -> None:
    result, _ = _outcomes(_kernel(bug), 200)
    assert result.finding is not None, f"{bug} not caught in 200 examples"
    opts = result.finding.case.options
    assert opts.q_is_fp8 and opts.q_scale != (1.0 if bug == "q_scale_ignored" else opts.k_scale), result.finding.case.summary()


@pytest.mark.parametrize("name", ["correct_fp8_q", "correct_fp8_q_folded"])
def test_the_correct_fp8_q_kernels_stay_clean_over_300_cases(name: str) -> None:
    result, seen = _outcomes(_kernel(name), 300)
    assert result.finding is None and result.examples == 300, result.finding and result.finding.message
    scaled = [o for o in seen if o.case.options.q_is_fp8 and o.case.options.q_scale != 1.0]
    assert len(scaled) >= 20 and all(o.status == "pass" for o in scaled), len(scaled)


def test_the_repro_passes_out_dtype_and_leaves_a_scaled_q_out() -> None:
    backend = _kernel("correct_fp8_q")
    source = backend.call_source(_fp8_q_case(q_scale=1.0, o_dtype="bfloat16"))
    assert source is not None and "out_dtype=torch.bfloat16" in source and "q_scale=1.0" in source
    assert backend.call_source(_fp8_q_case(q_scale=0.75)) is None  # the repro's reference has no q_scale


# --- MLA dims -----------------------------------------------------------------------------------


def test_a_malformed_mla_pair_is_refused_by_name() -> None:
    with pytest.raises(BadDeclaration, match="head_dim_qk > head_dim_vo"):
        declare(mla_dims=((512, 576),))

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, **_):
        raise AssertionError("never called")

    kernel.pa_oracle_capabilities = {"mla": (True,), "mla_dims": ((288, 256), (576,))}  # type: ignore[attr-defined]
    with pytest.raises(BadDeclaration, match=r"kernel\.pa_oracle_capabilities\['mla_dims'\]: \(576,\)"):
        capabilities_of(kernel)


def test_a_malformed_declaration_is_bad_input_on_the_command_line(tmp_path, monkeypatch) -> None:
    (tmp_path / "bad_mla_kernel.py").write_text(
        "from pa_oracle.backends.user import declare\n\n"
        "@declare(mla=(True,), mla_dims=((576, 512), (256, 288)))\n"
        "def attention(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):\n"
        "    raise AssertionError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BackendSpecError, match=r"\(256, 288\)"):
        resolve(kernels=("bad_mla_kernel:attention",))


def test_registered_backends_draw_the_mla_pairs_they_drew_before() -> None:
    """Every registered MLA declaration is inside the built-in pairs, whose order is kept: their draws stay."""
    for caps, expected in ((Capabilities(mla_dims=None), list(families.MLA_DIMS)),
                           (Capabilities(mla_dims=((576, 512),)), [(576, 512)]),
                           (Capabilities(mla_dims=((80, 64), (12, 8))), [(12, 8), (80, 64)])):
        assert families.mla_dims(caps) == expected


def test_every_declared_pair_is_drawn() -> None:
    for declared in (planted_user.OWN_MLA_DIMS, ((288, 256), (40, 32)), ((12, 8), (80, 64)), ((576, 512), (288, 256))):
        caps = capabilities_of(declare(mla=(True,), mla_dims=declared)(planted_user.correct_mla_own_dims))
        seen: set[tuple[int, int]] = set()

        @seed(0)
        @settings(max_examples=40, deadline=None, database=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
        @given(cases(caps, Limits(max_batch=2, max_kv_len=12)))
        def draw(case: Case) -> None:
            seen.add((case.heads.head_dim_qk, case.heads.head_dim_vo))  # noqa: B023 - drawn before the next loop

        draw()
        assert seen == set(declared), (declared, seen)


def test_the_mla_tile_bug_is_caught_on_its_own_pair_and_exact_on_deepseeks() -> None:
    bug = _kernel("mla_tail_dims_dropped")
    deepseek = Case(LAYOUT, Heads(2, 1, 576, 512, mla=True), Options(q_dtype="bfloat16", kv_dtype="bfloat16"), seed=1)
    on_deepseeks = declare(mla=(True,), mla_dims=((576, 512),))(_copy(planted_user.mla_tail_dims_dropped))
    assert check_case(UserKernel(on_deepseeks), deepseek).status == "pass"  # all a 576/512 + 288/256 declaration drew
    result, _ = _outcomes(bug, 100)
    assert result.finding is not None and result.finding.case.heads.head_dim_qk == 288, result.finding
    clean, _ = _outcomes(_kernel("correct_mla_own_dims"), 200)
    assert clean.finding is None and clean.examples == 200


# --- views by default ---------------------------------------------------------------------------


def test_every_user_kernel_draws_views_unless_it_declares_otherwise() -> None:
    assert capabilities_of(planted.correct_attention).storages == STORAGE_FEATURES
    opted_out = declare(storages=("contiguous",))(lambda q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices,
                                                  kv_last_page_len: None)
    assert capabilities_of(opted_out).storages == ("contiguous",)


def test_a_kernel_silently_wrong_on_views_is_caught_and_right_without_them() -> None:
    bug = _kernel("views_read_as_contiguous")
    result, _ = _outcomes(bug, 300)
    assert result.finding is not None, "not caught in 300 examples"
    case = result.finding.case
    assert case.storage is not None and check_case(bug, case.replace(storage=None)).status == "pass", case.summary()


def test_a_kernel_that_refuses_views_is_neither_a_finding_nor_a_pass_there() -> None:
    result, seen = _outcomes(_kernel("correct_refuses_views"), 300)
    assert result.finding is None and result.examples == 300
    refused = [o for o in seen if o.status == "unsupported"]
    assert refused and all(o.message.startswith("Unsupported: refuses views: ValueError on storage ") for o in refused)
    assert all(o.case.storage is not None for o in refused)
    assert sum(o.status == "pass" for o in seen) + len(refused) == len(seen)
    assert result.unsupported == len(refused) and result.passed == len(seen) - len(refused)
    assert result.skip_reasons == {"refuses views": len(refused)}, result.skip_reasons
    assert f"{result.unsupported} unsupported: {len(refused)} refuses views)" in result.line(), result.line()


def _stored_case() -> Case:
    return Case(LAYOUT, Heads(2, 2, 8, 8), Options(causal=True), seed=2, storage=Storage(kv_layout="HND"))


def test_a_kernel_that_raises_on_contiguous_copies_too_crashed() -> None:
    def always_raises(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal):
        raise ValueError("must be contiguous")  # says so, but fails on contiguous tensors too

    outcome = check_case(UserKernel(always_raises), _stored_case())
    assert outcome.status == "crash" and "refuses views" not in outcome.message


def test_a_kernel_that_declares_views_and_raises_on_one_crashed() -> None:
    refusing = declare(storages=STORAGE_FEATURES)(_copy(planted_user.correct_refuses_views))
    outcome = check_case(UserKernel(refusing), _stored_case())
    assert outcome.status == "crash" and "must be contiguous" in outcome.message
    assert check_case(_kernel("correct_refuses_views"), _stored_case()).status == "unsupported"


def _copy(fn):  # type: ignore[no-untyped-def]
    """A new function object with ``fn``'s code (so declaring on it leaves ``fn`` as it is)."""
    return types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
