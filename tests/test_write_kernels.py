"""User write kernels (``pa-oracle writes --kernel``, the ``pa_oracle.backends.writes`` entry points) on the
write campaign (isolation, budgets, resume, exit codes), and the newer write draws: fp8 caches quantised
on write and padding rows (slot -1), each with a planted bug only it catches."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, find, given, seed, settings
from hypothesis.errors import NoSuchExample

from pa_oracle.backends.writes import WriteCapabilities, get_write_kernel
from pa_oracle.cli import main
from pa_oracle.fuzz.checks.append import judge_write
from pa_oracle.fuzz.draw.appends import append_cases
from pa_oracle.fuzz.draw.determinism import seed_only_draws
from pa_oracle.fuzz.run.isolation import FIRST_CASE_FACTOR
from pa_oracle.fuzz.quality import planted_writes
from pa_oracle.oracle.append import AppendCase, compare_pools, expected_pools, make_inputs, quantised_values
from pa_oracle.oracle.case import CaseError

PLANTED = "pa_oracle.fuzz.quality.planted_writes"
SEARCH = settings(max_examples=300, database=None, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
# drawn at 104c9a3's parent (before fp8 and padding), seed 1234: a kernel that declares neither draws them still
PINNED = {
    "default": ["764fefd9979c", "6d678c98fdeb", "c0ce97ce4bb5", "f436addfa0d6", "b1d1c8a5538b", "9f701899ab70", "f0d9b8d1a99e", "f8e6dc011bff"],
    "flash-attn-kvcache-append": ["7fd579684c17", "1fe09f411247", "753af09ebe53", "bee832d8ff84", "a68260565db9", "34c5c948ed99", "22363a97da92", "07c8de805a7b"],
    "flashinfer-append": ["3bd69bcb34ac", "5e68fd4bd298", "3c808c65075c", "014795736bc7", "0af52bfe0d24", "8101a7601acc", "1c618270b0e6", "80927991c5a0"],
}


def _drawn(caps: WriteCapabilities) -> list[str]:
    ids: list[str] = []

    @seed(1234)
    @settings(max_examples=30, database=None, deadline=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(append_cases(caps))
    def take(case: AppendCase) -> None:
        ids.append(hashlib.sha256(json.dumps(case.to_json(), sort_keys=True).encode()).hexdigest()[:12])

    with seed_only_draws():
        take()
    return ids[:8]


def test_kernels_that_declare_neither_fp8_nor_padding_draw_what_they_drew() -> None:
    drawn = {"default": _drawn(WriteCapabilities())}
    drawn.update({name: _drawn(get_write_kernel(name).capabilities) for name in PINNED if name != "default"})
    assert drawn == PINNED


def _writes(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["writes", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("kernel", planted_writes.UPSTREAM_BUGS + planted_writes.NEW_DRAW_BUGS, ids=lambda k: k.__name__)
def test_each_planted_bug_class_is_caught_from_the_cli(kernel: type, tmp_path: Path) -> None:
    spec = f"{PLANTED}:{kernel.__name__}"
    code, output = _writes("--kernel", spec, "-n", "300", "--out", str(tmp_path), "--no-isolate")
    assert code == 1 and " FAIL fail (after " in output, output
    assert int(output.split("(after ")[1].split()[0]) <= 25, output  # within a chunk
    saved = next(tmp_path.glob("*/writes.json"))
    assert json.loads(saved.read_text())["kernel"] == spec
    code, output = _writes("--kernel", spec, "--case", str(saved), "--no-isolate")
    assert code == 1 and "FAIL" in output, output


def test_the_correct_writers_are_clean_from_the_cli(tmp_path: Path) -> None:
    for name in ("QuantisingLoop", "PerTokenLoop"):
        code, output = _writes("--kernel", f"{PLANTED}:{name}", "-n", "200", "--out", str(tmp_path / name), "--no-isolate")
        assert code == 0 and " ok   200 examples" in output, output
    code, output = _writes("-b", "torch-scatter", "-n", "300", "--out", str(tmp_path / "scatter"))
    assert code == 0 and " ok   300 examples" in output, output


@pytest.mark.parametrize("kernel", [planted_writes.QuantisingLoop, "torch-scatter"], ids=str)
def test_correct_writers_stay_clean_over_fp8_and_padding_cases(kernel: object) -> None:
    writer = get_write_kernel(kernel) if isinstance(kernel, str) else kernel()  # type: ignore[operator]
    drew = {"fp8 scaled": 0, "padding": 0}

    @SEARCH
    @given(append_cases(writer.capabilities))
    def run(case: AppendCase) -> None:
        drew["fp8 scaled"] += case.quantised and (case.k_scale, case.v_scale) != (1.0, 1.0)
        drew["padding"] += case.padding > 0
        outcome = judge_write(case, writer)
        assert outcome.ok, f"{case}: {outcome.detail}"

    run()
    assert drew["fp8 scaled"] >= 30 and drew["padding"] >= 100, drew


@pytest.mark.parametrize("kernel", planted_writes.NEW_DRAW_BUGS, ids=lambda k: k.__name__)
def test_a_new_draw_bug_is_caught_only_by_its_draw(kernel: type) -> None:
    writer = kernel()
    case = find(append_cases(writer.capabilities), lambda c: not judge_write(c, writer).ok, settings=SEARCH)
    if kernel is planted_writes.PaddingToLastSlot:
        assert case.padding > 0, case
    else:
        assert case.quantised and (case.k_scale, case.v_scale) != (1.0, 1.0), case
    with pytest.raises(NoSuchExample):  # the draws before fp8 and padding pass it
        find(append_cases(WriteCapabilities()), lambda c: not judge_write(c, writer).ok, settings=SEARCH)


def test_fp8_values_are_rounded_once_from_float64() -> None:
    case = AppendCase(seq_lens_before=(0,), append_lens=(1,), page_size=1, num_kv_heads=1, head_dim=4,
                      dtype="float8_e4m3fn", append_dtype="float32", k_scale=0.5, v_scale=2.0)
    # e4m3 near 1: steps of 0.125; 1.0625 is a tie between 1.0 (even code) and 1.125; 400 saturates at 448
    values = torch.tensor([1.0625, 1.0625 * (1 + 2**-20), 0.25, 800.0], dtype=torch.float64) * 0.5
    want, also = quantised_values(case, values, 0.5)
    assert want.to(torch.float64).tolist() == [1.0, 1.125, 0.25, 448.0]
    near_tie = quantised_values(case, torch.tensor([1.0625 * (1 + 2**-24)]) * 0.5, 0.5)
    assert near_tie[0].to(torch.float64).item() == 1.125 and near_tie[1].to(torch.float64).item() == 1.0  # float32's slack
    assert torch.equal(also.view(torch.uint8)[1:], want.view(torch.uint8)[1:])  # away from a tie: one answer


def test_fp8_pool_judged_against_the_quantised_value() -> None:
    case = AppendCase(seq_lens_before=(2,), append_lens=(3,), page_size=4, num_kv_heads=2, head_dim=8,
                      dtype="float8_e5m2", append_dtype="bfloat16", k_scale=0.3125, v_scale=1.75, spare_pages=1)
    inputs = make_inputs(case)
    assert inputs.append_k.dtype == torch.bfloat16 and inputs.k_pool.dtype == torch.float8_e5m2
    k, v = expected_pools(case, inputs)
    assert compare_pools(case, inputs, k, v).ok
    unscaled = k.clone()
    pages = inputs.kv_indices.tolist()
    unscaled[pages[0], 2] = inputs.append_k[0].to(torch.float8_e5m2)  # stored without the scale
    verdict = compare_pools(case, inputs, unscaled, v)
    assert not verdict.ok and verdict.mismatches[0][:3] == ("k", pages[0], 2) and verdict.mismatches[0].appended


def test_padding_rows_are_stored_nowhere() -> None:
    case = AppendCase(seq_lens_before=(1,), append_lens=(2,), page_size=2, num_kv_heads=1, head_dim=2, dtype="float32",
                      spare_pages=0, padding=2)
    inputs = make_inputs(case)
    assert inputs.slot_mapping.tolist()[-2:] == [-1, -1] and inputs.append_k.shape[0] == 4
    assert inputs.batch_indices.tolist() == [0, 0, -1, -1] and inputs.positions.tolist() == [1, 2, -1, -1]
    k, v = expected_pools(case, inputs)
    last = case.num_pages - 1  # owned by the request (no spare page), its last slot not appended
    assert torch.equal(k[last, 1].view(torch.int32), inputs.k_pool[last, 1].view(torch.int32))
    assert not judge_write(case, planted_writes.PaddingToLastSlot()).ok and judge_write(case, get_write_kernel("torch-scatter")).ok


def test_write_case_fields_are_checked() -> None:
    with pytest.raises(CaseError, match="needs append_dtype"):
        AppendCase(seq_lens_before=(0,), append_lens=(1,), page_size=1, num_kv_heads=1, head_dim=1, dtype="float8_e4m3fn")
    with pytest.raises(CaseError, match="fp8 caches"):
        AppendCase(seq_lens_before=(0,), append_lens=(1,), page_size=1, num_kv_heads=1, head_dim=1, k_scale=0.5)
    with pytest.raises(CaseError, match="finite numbers > 0"):
        AppendCase(seq_lens_before=(0,), append_lens=(1,), page_size=1, num_kv_heads=1, head_dim=1,
                   dtype="float8_e5m2", append_dtype="float16", v_scale=float("nan"))
    old = AppendCase(seq_lens_before=(1,), append_lens=(2,), page_size=4, num_kv_heads=1, head_dim=2)
    assert set(old.to_json()) == {"seq_lens_before", "append_lens", "page_size", "num_kv_heads", "head_dim", "dtype",
                                  "kv_layout", "combined", "spare_pages", "seed"}  # an old case's JSON as it was
    new = AppendCase(seq_lens_before=(1,), append_lens=(2,), page_size=4, num_kv_heads=1, head_dim=2, dtype="float8_e4m3fn",
                     append_dtype="float16", k_scale=0.5, padding=1)
    assert AppendCase.from_json(new.to_json()) == new


KERNELS = '''
import ctypes, time
import torch

def segfaults(key, value, k_cache, v_cache, *, slot_mapping):
    ctypes.string_at(0)

def raises(key, value, k_cache, v_cache, *, slot_mapping):
    raise RuntimeError("boom")

def exits(key, value, k_cache, v_cache, *, slot_mapping):
    raise SystemExit(0)

def hangs(key, value, k_cache, v_cache, *, slot_mapping):
    time.sleep(60)

def returns_something(key, value, k_cache, v_cache, *, slot_mapping):
    return k_cache

def vllm_like(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale, **rest):
    real = slot_mapping >= 0
    slots = slot_mapping[real]
    page = k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]
    for pool, values, scale in ((k_cache, key, k_scale), (v_cache, value, v_scale)):
        values = values[real]
        if pool.dtype != values.dtype:
            values = (values.float() * (1.0 / scale)).to(pool.dtype)  # a reciprocal in float32: within the slack
        view = pool if kv_layout == "NHD" else pool.permute(0, 2, 1, 3)
        view[slots // page, slots % page] = values

def too_few(key, value):
    pass
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"user_writes_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(KERNELS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_user_function_with_fp8_and_padding_is_clean(user_module: str, tmp_path: Path) -> None:
    from pa_oracle.backends.writes.user import user_write_kernel

    caps = user_write_kernel(f"{user_module}:vllm_like").capabilities
    assert caps.padding and "float8_e4m3fn" in caps.dtypes and caps.layouts == ("NHD", "HND")
    code, output = _writes("--kernel", f"{user_module}:vllm_like", "-n", "150", "--out", str(tmp_path / "o"), "--no-isolate")
    assert code == 0 and " ok   150 examples" in output, output


@pytest.mark.parametrize("function,expect", [("segfaults", "signal SIGSEGV"), ("raises", "RuntimeError: boom"),
                                             ("exits", "SystemExit"), ("returns_something", "returns None")])
def test_a_crashing_write_kernel_is_a_finding_in_its_worker(user_module: str, tmp_path: Path, function: str, expect: str) -> None:
    code, output = _writes("--kernel", f"{user_module}:{function}", "-n", "20", "--out", str(tmp_path / "o"))
    assert code == 1 and "FAIL crash" in output and expect in output and "Traceback" not in output, output
    saved = next((tmp_path / "o").glob("*/writes.json"))
    code, output = _writes("--kernel", f"{user_module}:{function}", "--case", str(saved))
    assert code == 1 and "CRASH" in output and expect in output, output  # the replay is isolated too


def test_a_hanging_write_kernel_is_a_hang_finding(user_module: str, tmp_path: Path) -> None:
    code, output = _writes("--kernel", f"{user_module}:hangs", "-n", "5", "--case-timeout", "2", "--out", str(tmp_path / "o"))
    # (the engine's worker gives the first case after a start FIRST_CASE_FACTOR times the case timeout: it may compile)
    assert code == 1 and "FAIL hang" in output and f"no answer after {2 * FIRST_CASE_FACTOR:g} s" in output, output


def test_bad_kernel_specs_are_bad_input(user_module: str) -> None:
    for spec, says in ((f"{user_module}:too_few", "(key, value, k_cache, v_cache)"), (f"{user_module}:nope", "no attribute"),
                       ("no_such_module_here:x", "cannot import it"), ("nocolon", "MODULE:FUNCTION"),
                       (f"{PLANTED}:WriteCapabilities", "not a WriteKernel")):
        code, output = _writes("--kernel", spec)
        assert code == 2 and says in output, (spec, output)


def test_budgets_resume_and_the_state(tmp_path: Path) -> None:
    out = str(tmp_path / "o")
    code, output = _writes("-b", "torch-scatter", "-n", "100000", "--time-budget", "1.5", "--out", out)
    assert code == 0 and "(time budget)" in output, output
    code, output = _writes("-b", "torch-scatter", "-n", "30", "--out", out)
    assert code == 2 and "--resume continues it" in output, output
    code, _ = _writes("-b", "torch-scatter", "-n", "30", "--out", out, "--overwrite")
    state = json.loads((tmp_path / "o" / "writes-state.json").read_text())["backends"]["torch-scatter:write"]
    assert code == 0 and state["examples"] == 30 and state["chunks_done"] == 2
    code, output = _writes("-b", "torch-scatter", "-n", "80", "--out", out, "--resume")
    state = json.loads((tmp_path / "o" / "writes-state.json").read_text())["backends"]["torch-scatter:write"]
    assert code == 0 and state["examples"] == 80 and len(set(state["seen"])) == 80 and state["chunks_done"] == 4, output
    code, output = _writes("-b", "torch-scatter", "-n", "80", "--out", out, "--resume", "--seed", "9")
    assert code == 2 and "config.seed" in output, output


def test_a_resumed_finding_still_exits_1(tmp_path: Path) -> None:
    out = str(tmp_path / "o")
    spec = f"{PLANTED}:OneSlotPast"
    assert _writes("--kernel", spec, "-n", "50", "--out", out, "--no-isolate")[0] == 1
    code, output = _writes("--kernel", spec, "-n", "100", "--out", out, "--resume", "--no-isolate")
    assert code == 1 and "FAIL" in output, output


def test_write_kernels_from_an_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    import pa_oracle.backends.writes as writes

    (tmp_path / "third_party_writes.py").write_text(textwrap.dedent('''
        from pa_oracle.backends.writes import register
        from pa_oracle.fuzz.quality.planted_writes import PerTokenLoop

        @register
        class ThirdParty(PerTokenLoop):
            name = "third-party-append"
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = importlib.metadata.EntryPoint("third", "third_party_writes", writes.ENTRY_POINTS)
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [entry] if group == writes.ENTRY_POINTS else real(group=group))
    monkeypatch.setattr(writes, "_discovered", False)
    monkeypatch.setattr(writes, "_REGISTRY", dict(writes._REGISTRY))
    assert "third-party-append" in writes.discover()
    code, output = _writes("-b", "third-party-append", "-n", "30", "--out", str(tmp_path / "o"))
    assert code == 0 and "third-party-append" in output and " ok   30 examples" in output, output


def test_selftest_runs_every_planted_and_correct_write_kernel() -> None:
    from pa_oracle.fuzz.quality import planted_writes, selftest

    names = {name for module, name in selftest.selftest_kernels() if module is selftest.WRITES}
    everything = (*planted_writes.BUGS, *planted_writes.UPSTREAM_BUGS, *planted_writes.NEW_DRAW_BUGS, *planted_writes.CORRECT)
    assert names == {k.__name__ for k in everything}
    assert all(selftest._is_bug(selftest.WRITES, k.__name__) for k in planted_writes.NEW_DRAW_BUGS)
    assert not any(selftest._is_bug(selftest.WRITES, k.__name__) for k in planted_writes.CORRECT)
