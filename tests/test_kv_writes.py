"""KV-cache write kernels (``pa_oracle.oracle.append``): the byte-for-byte oracle, the torch
scatter and the real library appends, and planted write bugs that must be caught."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis.errors import NoSuchExample

from pa_oracle.backends.writes import WriteCapabilities, discover, get_write_kernel
from pa_oracle.fuzz.checks.append import judge_write
from pa_oracle.fuzz.draw.appends import append_cases
from pa_oracle.fuzz.quality import planted_writes
from pa_oracle.oracle.append import AppendCase, compare_pools, expected_pools, make_inputs
from pa_oracle.oracle.case import CaseError

FAST = settings(max_examples=150, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
CPU_CAPS = WriteCapabilities()


def test_expected_pool_by_hand():
    """Two requests, page 4: request 0 has 3 tokens and appends 2 (slot 3 of page 0, slot 0 of page 1);
    request 1 is empty and appends 1 (slot 0 of its page)."""
    case = AppendCase(seq_lens_before=(3, 0), append_lens=(2, 1), page_size=4, num_kv_heads=2, head_dim=3,
                      dtype="float32", spare_pages=1, seed=7)
    inputs = make_inputs(case)
    assert inputs.kv_indptr.tolist() == [0, 2, 3] and inputs.kv_last_page_len.tolist() == [1, 1]
    assert inputs.positions.tolist() == [3, 4, 0] and inputs.batch_indices.tolist() == [0, 0, 1]
    pages = inputs.kv_indices.tolist()
    k, _ = expected_pools(case, inputs)
    assert torch.equal(k[pages[0], 3], inputs.append_k[0]) and torch.equal(k[pages[1], 0], inputs.append_k[1])
    assert torch.equal(k[pages[2], 0], inputs.append_k[2])
    untouched = torch.ones(case.num_pages, case.page_size, dtype=torch.bool)
    untouched[pages[0], 3] = untouched[pages[1], 0] = untouched[pages[2], 0] = False
    assert torch.equal(k[untouched].view(torch.int32), inputs.k_pool[untouched].view(torch.int32))


def test_compare_pools_names_the_slot():
    case = AppendCase(seq_lens_before=(0,), append_lens=(1,), page_size=2, num_kv_heads=1, head_dim=4, kv_layout="HND")
    inputs = make_inputs(case)
    want_k, want_v = expected_pools(case, inputs)
    spoiled = want_v.clone()
    spoiled[0, 0, 1, 2] += 1  # page 0, head 0, slot 1
    verdict = compare_pools(case, inputs, want_k, spoiled)
    assert not verdict.ok and verdict.count == 1
    assert verdict.mismatches[0][:4] == ("v", 0, 1, 0)
    assert compare_pools(case, inputs, want_k, want_v).ok


def test_append_case_json_round_trip_and_bad_input():
    case = AppendCase(seq_lens_before=(1, 5), append_lens=(2, 0), page_size=3, num_kv_heads=2, head_dim=8, combined=True)
    assert AppendCase.from_json(case.to_json()) == case
    with pytest.raises(CaseError, match="unknown field"):
        AppendCase.from_json({**case.to_json(), "extra": 1})
    with pytest.raises(CaseError, match="kv_layout"):
        AppendCase.from_json({**case.to_json(), "kv_layout": "NDH"})
    with pytest.raises(CaseError, match="one length"):
        AppendCase(seq_lens_before=(1,), append_lens=(1, 2), page_size=1, num_kv_heads=1, head_dim=1)


@FAST
@given(case=append_cases(CPU_CAPS))
def test_torch_scatter_writes_exactly_the_appended_slots(case):
    outcome = judge_write(case, get_write_kernel("torch-scatter"))
    assert outcome.ok, outcome.detail


@pytest.mark.parametrize("kernel", planted_writes.CORRECT, ids=lambda k: k.name)
def test_a_correct_kernel_written_differently_passes(kernel):
    @FAST
    @given(case=append_cases(CPU_CAPS))
    def run(case):
        outcome = judge_write(case, kernel())
        assert outcome.ok, outcome.detail

    run()


@pytest.mark.parametrize("kernel", planted_writes.BUGS, ids=lambda k: k.name)
def test_planted_write_bug_is_caught_within_300_examples(kernel):
    try:
        case = find(append_cases(CPU_CAPS), lambda c: not judge_write(c, kernel()).ok,
                    settings=settings(max_examples=300, database=None, derandomize=True, deadline=None,
                                      suppress_health_check=list(HealthCheck)))
    except NoSuchExample:
        pytest.fail(f"{kernel.name} passed 300 examples")
    assert not judge_write(case, kernel()).ok


def test_a_kernel_that_changes_its_inputs_is_reported():
    class Mutates(planted_writes.PerTokenLoop):
        def append(self, case, inputs):
            super().append(case, inputs)
            inputs.kv_indices.zero_()

    case = AppendCase(seq_lens_before=(0, 2), append_lens=(3, 1), page_size=2, num_kv_heads=1, head_dim=2, spare_pages=2)
    outcome = judge_write(case, Mutates())
    assert outcome.status == "mutated" and "kv_indices" in outcome.detail


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["flashinfer-append", "flash-attn-kvcache-append"])
def test_real_library_appends(name):
    kernel = discover()[name]()
    reason = kernel.unavailable_reason()
    if reason:
        pytest.skip(f"{name}: {reason}")

    @settings(max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=append_cases(kernel.capabilities))
    def run(case):
        outcome = judge_write(case, kernel)
        assert outcome.ok, f"{case}: {outcome.detail}"

    run()


def test_cli_fuzzes_and_replays(tmp_path):
    from click.testing import CliRunner

    from pa_oracle.cli import main

    result = CliRunner().invoke(main, ["writes", "-b", "torch-scatter", "-n", "30", "--out", str(tmp_path)])
    assert result.exit_code == 0 and "torch-scatter" in result.output and " ok " in result.output, result.output
    case = AppendCase(seq_lens_before=(3,), append_lens=(2,), page_size=4, num_kv_heads=1, head_dim=2)
    (tmp_path / "w.json").write_text(__import__("json").dumps({"case": case.to_json()}))
    result = CliRunner().invoke(main, ["writes", "-b", "torch-scatter", "--case", str(tmp_path / "w.json")])
    assert result.exit_code == 0 and "PASS" in result.output, result.output
    (tmp_path / "list.json").write_text("[1, 2]")
    result = CliRunner().invoke(main, ["writes", "-b", "torch-scatter", "--case", str(tmp_path / "list.json")])
    assert result.exit_code == 2 and "expected a JSON object" in result.output, result.output
    result = CliRunner().invoke(main, ["writes", "-b", "nope"])
    assert result.exit_code == 2 and "unknown write kernel" in result.output
