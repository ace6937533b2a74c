"""``pa-oracle triage --upstream``: the repro runs without this project, exits 1 on the buggy kernel
and 0 on a correct one."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from pa_oracle.backends import discover
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.quality import planted
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.fuzz.triage.cli import triage
from pa_oracle.fuzz.triage.upstream import EMBED_LIMIT, HAND_WRITTEN, NoUpstreamRepro, Seen, issue_markdown, repro_script, write_upstream
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.tensors import load_case

from .conftest import mixed_case

GOLDEN = Path(__file__).resolve().parents[2] / "golden"

# a wrapper that refuses any import of pa_oracle and reports one (exit 3) if the script tried
_WITHOUT_PROJECT = """
import runpy, sys
class Refuse:
    tried = False
    def find_spec(self, name, path=None, target=None):
        if name == "pa_oracle" or name.startswith("pa_oracle."):
            Refuse.tried = True
            raise ImportError(name)
sys.meta_path.insert(0, Refuse())
code = 0
try:
    runpy.run_path(sys.argv[1], run_name="__main__")
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else 1
sys.exit(3 if Refuse.tried or any(m.split(".")[0] == "pa_oracle" for m in sys.modules) else code)
"""


def _kernel_module(folder: Path) -> Path:
    """A module holding the planted kernels' own source (no import of this project): ``buggy`` (the window
    off by one), ``fixed``, ``raises`` (a crash) and ``soft_cap_bug``."""
    source = "import math\nimport torch\n\n" + "\n\n".join(
        inspect.getsource(f) for f in (planted._paged_attention, planted._softmax_weighted, planted._split_in_two))
    for name, bug in (("buggy", "window_off_by_one"), ("fixed", ""), ("soft_cap_bug", "soft_cap_after_masking")):
        source += f"""

def {name}(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale, window_left,
           logits_soft_cap):
    return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                            kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                            window_left=window_left, logits_soft_cap=logits_soft_cap, bug={bug!r})
"""
    source += """

def raises(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale):
    if int(qo_indptr[-1]) < len(qo_indptr) - 1:
        raise RuntimeError("shape is invalid")
    return fixed(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                 kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=-1, logits_soft_cap=0.0)
"""
    source += """

buggy.pa_oracle_capabilities = {"storages": ("contiguous", "combined", "HND", "fused_qkv", "pool_offset")}
"""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "standalone_kernels.py").write_text(source)
    return folder


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = _kernel_module(tmp_path / "kernels")
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop("standalone_kernels", None)


def run_repro(repro: Path, kernels: Path) -> subprocess.CompletedProcess[str]:
    """``python repro.py`` with only torch, numpy and the kernel module importable (``-S``: no site, so no
    editable install of this project; the wrapper also refuses pa_oracle)."""
    deps = sorted({str(Path(torch.__file__).parents[1]), str(Path(np.__file__).parents[1])})
    env = {"PYTHONPATH": ":".join([str(kernels), *deps]), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-S", "-c", _WITHOUT_PROJECT, str(repro)], cwd=repro.parent, env=env,
                          capture_output=True, text=True, timeout=120)


def _write(tmp_path: Path, name: str, case: Case) -> tuple[Path, str]:
    backend = UserKernel.from_spec(f"standalone_kernels:{name}")
    outcome = check_case(backend, case)
    written = write_upstream(tmp_path / name, case, backend, Seen(outcome.status, outcome.message, backend.versions(), "cpu"))
    return written["repro"], outcome.status


def test_the_repro_reproduces_the_planted_window_bug_without_the_project(tmp_path: Path, kernels: Path) -> None:
    case = mixed_case(window_left=3)
    buggy, status = _write(tmp_path, "buggy", case)
    assert status == "fail"
    done = run_repro(buggy, kernels)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REPRODUCED" in done.stdout and "expected" in done.stdout and "got" in done.stdout
    fixed, status = _write(tmp_path, "fixed", case)
    assert status == "pass"
    done = run_repro(fixed, kernels)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NOT REPRODUCED" in done.stdout


def test_a_buggy_repro_run_on_the_fixed_kernel_passes(tmp_path: Path, kernels: Path) -> None:
    """The same repro flips to exit 0 once the kernel is fixed (the module's function replaced)."""
    case = mixed_case(window_left=3, logits_soft_cap=5.0)
    repro, status = _write(tmp_path, "soft_cap_bug", case)
    assert status == "fail"
    assert run_repro(repro, kernels).returncode == 1
    module = kernels / "standalone_kernels.py"
    module.write_text(module.read_text().replace("bug='soft_cap_after_masking'", "bug=''"))
    done = run_repro(repro, kernels)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_crash_reproduces_as_a_crash(tmp_path: Path, kernels: Path) -> None:
    case = Case(Layout.from_lengths([0, 1], [0, 3], page_size=4), Heads(2, 1, 8, 8), seed=3)
    repro, status = _write(tmp_path, "raises", case)
    assert status == "crash"
    done = run_repro(repro, kernels)
    assert done.returncode == 1 and "REPRODUCED: the call raises RuntimeError" in done.stdout, done.stdout + done.stderr


def test_a_kernel_that_raises_on_a_value_finding_is_not_a_reproduction(tmp_path: Path, kernels: Path) -> None:
    case = Case(Layout.from_lengths([0, 1], [0, 3], page_size=4), Heads(2, 1, 8, 8), seed=3)
    backend = UserKernel.from_spec("standalone_kernels:raises")
    repro = write_upstream(tmp_path / "x", case, backend, Seen("fail", "FAIL: out max error", {}, "cpu"))["repro"]
    done = run_repro(repro, kernels)
    assert done.returncode == 2 and "COULD NOT RUN" in done.stdout


def test_large_tensors_go_to_an_npz_beside_the_script(tmp_path: Path, kernels: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pa_oracle.fuzz.triage.upstream.EMBED_LIMIT", 16)
    assert EMBED_LIMIT > 16
    repro, _ = _write(tmp_path, "buggy", mixed_case(window_left=3))
    assert (repro.parent / "inputs.npz").exists() and "TENSORS = None" in repro.read_text()
    assert run_repro(repro, kernels).returncode == 1


def test_an_adapter_without_call_source_says_so() -> None:
    backend = discover()["sdpa-math"]()
    with pytest.raises(NoUpstreamRepro, match="no upstream repro for this adapter"):
        repro_script(mixed_case(), backend, Seen("fail", "x"))


def test_triage_upstream_writes_a_repro_for_the_minimized_case(tmp_path: Path, kernels: Path) -> None:
    case_path = mixed_case(window_left=3).save(tmp_path / "case.json")
    result = CliRunner().invoke(triage, [str(case_path), "-k", "standalone_kernels:buggy", "--out", str(tmp_path / "t"),
                                         "--upstream", str(tmp_path / "up"), "--budget", "60"])
    assert result.exit_code == 1, result.output
    issue = (tmp_path / "up" / "ISSUE.md").read_text()
    assert "## Minimal case" in issue and "standalone_kernels" in issue
    assert run_repro(tmp_path / "up" / "repro.py", kernels).returncode == 1


@pytest.mark.parametrize("report", sorted(p.name for p in (GOLDEN / "reports").iterdir() if p.is_dir()))
def test_each_golden_report_is_complete_and_regenerates_identically(report: str, tmp_path: Path) -> None:
    """repro.py compiles and is what ``golden report`` writes today from its golden case; ISSUE.md explains it."""
    folder = GOLDEN / "reports" / report
    repro = (folder / "repro.py").read_text()
    compile(repro, str(folder / "repro.py"), "exec")
    issue = (folder / "ISSUE.md").read_text()
    assert "## Why" in issue and "## Minimal case" in issue and "REPRODUCED" in issue
    if report in HAND_WRITTEN_REPORTS:  # a minimal repro written for the maintainers (it cannot be regenerated)
        _check_hand_written(folder, repro)
        return
    assert HAND_WRITTEN not in repro
    backend_name = re.search(r"paged-attention-oracle's '([^']+)' adapter makes it", repro).group(1)
    case_id = re.search(r"from case (\w+)\.", repro).group(1)
    (case_path,) = [p for p in (GOLDEN / "cases").glob("*.json") if load_case(p).case_id == case_id]
    case = load_case(case_path)
    backend = discover()[backend_name]()
    again, _ = repro_script(case, backend, _seen(case))
    _same_but_for_the_cpu_rounding(again, repro)
    options = re.compile(r"^- options: .*$", re.M)  # every option of the case by value, as golden report writes it now
    assert options.findall(issue_markdown(case, backend, _seen(case))) == options.findall(issue)


_FLOAT = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


def _same_but_for_the_cpu_rounding(again: str, stored: str) -> None:
    """The same text, and the same numbers to 1e-4: the tolerance a repro embeds comes from bf16 controls computed
    on the CPU, whose last digits differ between CPUs (an ALLOWED out_mean of 0.0128758 on one 2-core machine,
    0.0128760 on another, at the same torch)."""
    assert _FLOAT.split(again) == _FLOAT.split(stored), "the repro's text changed"
    pairs = list(zip(map(float, _FLOAT.findall(again)), map(float, _FLOAT.findall(stored))))
    assert len(pairs) == len(_FLOAT.findall(stored))
    assert [(a, b) for a, b in pairs if a != pytest.approx(b, rel=1e-4, abs=1e-12)] == []


HAND_WRITTEN_REPORTS = {"flashinfer-mla-causal-tile-floor", "flashinfer-pod-decode-tile-16"}


def _check_hand_written(folder: Path, repro: str) -> None:
    """It names its golden case, the ledger points at it, and without its library it exits 2 (not 1)."""
    import json

    case_name = re.search(re.escape(HAND_WRITTEN) + r" (\S+?)\.?\n", repro).group(1)
    assert (GOLDEN / "cases" / f"{case_name}.json").exists()
    entries = json.loads((GOLDEN / "ledger.json").read_text())["entries"]
    assert {e.get("report") for e in entries if e["case"] == case_name} == {f"reports/{folder.name}/ISSUE.md"}
    blocked = "import sys; sys.modules['flashinfer'] = None; import runpy; runpy.run_path(sys.argv[1], run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", blocked, str(folder / "repro.py")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr


def _seen(case: Case) -> Seen:
    from pa_oracle.fuzz.campaign.finding_record import read_meta
    from pa_oracle.fuzz.triage.upstream import seen_from_record

    return seen_from_record(read_meta(case.meta, "a golden case"), "NVIDIA H200")


def test_every_adapter_call_source_compiles_on_a_case_it_supports() -> None:
    case = Case(Layout.from_lengths([1, 1], [3, 300], page_size=256), Heads(4, 2, 64, 64),
                Options(q_dtype="bfloat16", kv_dtype="bfloat16"), seed=0)
    sources = {}
    for name, cls in discover().items():
        source = cls().call_source(case)
        if source is not None:
            compile(source, name, "exec")
            sources[name] = source
    assert {"flashinfer-decode", "flashinfer-decode-tc", "flash-attn-varlen", "flash-attn-kvcache",
            "flash-attn-kvcache-split4", "flash-attn-kvcache-paged", "sglang-decode", "sglang-extend"} <= set(sources)


def test_a_case_in_another_memory_layout_gets_no_repro_that_would_drop_it(kernels: Path) -> None:
    from pa_oracle.oracle.case import Storage

    backend = UserKernel.from_spec("standalone_kernels:buggy")
    case = mixed_case().replace(storage=Storage("combined", "HND"))
    with pytest.raises(NoUpstreamRepro, match="storage combined"):
        repro_script(case, backend, Seen("fail", "x"))
    assert repro_script(case.replace(storage=None), backend, Seen("fail", "x"))[0]  # the default storage has one


def test_golden_report_keeps_a_hand_written_repro(tmp_path: Path) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "repro.py").write_text(f'"""x\n\n{HAND_WRITTEN} some-case.\n"""\n')
    case_path = mixed_case().save(tmp_path / "case.json")
    from pa_oracle.fuzz.triage.cli import golden

    result = CliRunner().invoke(golden, ["report", str(case_path), "-b", "flashinfer-decode", "--out", str(out)])
    assert result.exit_code == 2 and "written by hand" in result.output
    assert (out / "repro.py").read_text().startswith('"""x')


def test_triage_writes_the_repro_of_a_layout_finding_in_the_default_storage(tmp_path: Path, kernels: Path) -> None:
    from pa_oracle.oracle.case import Storage

    case_path = mixed_case(window_left=3).replace(storage=Storage("combined", "HND")).save(tmp_path / "case.json")
    result = CliRunner().invoke(triage, [str(case_path), "-k", "standalone_kernels:buggy", "--out", str(tmp_path / "t"),
                                         "--upstream", str(tmp_path / "up"), "--no-minimize"])
    assert result.exit_code == 1, result.output
    assert "fails in the default storage too" in result.output
    assert run_repro(tmp_path / "up" / "repro.py", kernels).returncode == 1
    minimized = CliRunner().invoke(triage, [str(case_path), "-k", "standalone_kernels:buggy", "--out", str(tmp_path / "m"),
                                            "--upstream", str(tmp_path / "m-up"), "--budget", "60"])
    assert "storage combined+HND off" in minimized.output and "default storage too" not in minimized.output, minimized.output
