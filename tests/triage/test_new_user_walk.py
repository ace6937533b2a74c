"""Issue 35 walked again as a new user: a kernel module of one's own, in its own folder, with a sliding window off
by one (``window_left=0`` matters), a GQA map wrong for groups that are not powers of 2, and a kernel made by a
factory (``kernel = make()``). What the walk found still missing, each with a test that fails without its fix:

- ISSUE.md carries where triage located the error on the finding's first failing case when the minimal case is
  ambiguous (it quoted only "this case cannot tell window edge from first key");
- ``repro.py`` run from another folder than the kernel's exits 2 with the folder to run it from, also for a crash
  finding (a ``ModuleNotFoundError`` read as the crash "REPRODUCED", exit 1);
- a result line with a finding says the finding's error over the allowed one (it showed only the passes' 0.00);
- the coverage table counts the failing cases (the first and the minimal), so a finding's group size is never
  "never ran";
- the live line while a finding is shrunk does not say "0 finding(s)";
- the README says how selftest runs and how to build a wheel without downloading torch.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from pa_oracle.backends.user import UserKernel
from pa_oracle.cli import main
from pa_oracle.fuzz.campaign.coverage import coverage_table, exercised
from pa_oracle.fuzz.campaign.findings import FIRST_FAILING, finding_ratio, save_finding
from pa_oracle.fuzz.campaign.state import BackendResult, FindingRecord
from pa_oracle.fuzz.progress import SHRINKING, CampaignProgress
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.fuzz.triage.localize import Clue, Localization
from pa_oracle.fuzz.triage.pipeline import issue_clues
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.report import limit_ratio

from .conftest import mixed_case

ROOT = Path(__file__).resolve().parents[2]

# the new user's own module: plain torch, one request and one head at a time, no import of this project
MY_KERNELS = '''
import math

import torch


def _attend(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
            window_left, logits_soft_cap, window_bug=False, gqa_bug=False):
    hq, page, hk = q.shape[1], k_cache.shape[1], k_cache.shape[2]
    group = hq // hk
    out = torch.zeros(q.shape[0], hq, v_cache.shape[-1], dtype=torch.float32)
    lse = torch.full((q.shape[0], hq), float("-inf"), dtype=torch.float32)
    for r in range(len(qo_indptr) - 1):
        q0, q1, p0, p1 = int(qo_indptr[r]), int(qo_indptr[r + 1]), int(kv_indptr[r]), int(kv_indptr[r + 1])
        if p1 == p0 or q1 == q0:
            continue
        kv_len = (p1 - p0 - 1) * page + int(kv_last_page_len[r])
        pages = kv_indices[p0:p1].long()
        k = k_cache[pages].reshape(-1, hk, k_cache.shape[-1])[:kv_len].float()
        v = v_cache[pages].reshape(-1, hk, v_cache.shape[-1])[:kv_len].float()
        pos = torch.arange(kv_len - (q1 - q0), kv_len)[:, None]
        j = torch.arange(kv_len)[None, :]
        keep = torch.ones(q1 - q0, kv_len, dtype=torch.bool)
        if causal:
            keep &= j <= pos
        if window_left >= 0:
            keep &= j >= pos - window_left - (1 if window_bug else 0)
        for h in range(hq):
            kvh = min(h >> int(math.log2(group)), hk - 1) if gqa_bug else h // group
            s = (q[q0:q1, h].float() @ k[:, kvh].T) * sm_scale
            if logits_soft_cap > 0:
                s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
            s = s.masked_fill(~keep, float("-inf"))
            m = torch.logsumexp(s, dim=-1)
            out[q0:q1, h] = torch.exp(s - m[:, None]).nan_to_num(0.0) @ v[:, kvh]
            lse[q0:q1, h] = m
    return out.to(q.dtype), lse


def make(**bugs):
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap):
        return _attend(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                       window_left, logits_soft_cap, **bugs)
    return kernel


def crashes(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale):
    raise IndexError("index 1 is out of bounds for dimension 1 with size 1")


kernel = make(window_bug=True)  # its __qualname__ is make.<locals>.kernel
my_gqa = make(gqa_bug=True)
fixed = make()
'''


@pytest.fixture
def my_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The new user's folder holding ``my_kernels.py``, importable as the CLI imports it (the current folder)."""
    folder = tmp_path / "my_project"
    folder.mkdir()
    (folder / "my_kernels.py").write_text(textwrap.dedent(MY_KERNELS))
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop("my_kernels", None)


def one_key_window_case() -> Case:
    """The campaign's minimal case of the window bug: kv_len 2, window_left 0 (one key too many is the first key)."""
    return Case(Layout.from_lengths([1], [2], page_size=16), Heads(1, 1, 16, 16),
                Options(window_left=0, q_dtype="float16", kv_dtype="float16"), seed=0)


def _run_script(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python repro.py`` with only torch and numpy importable (no project, no current folder but ``cwd``)."""
    deps = sorted({str(Path(torch.__file__).parents[1]), str(Path(np.__file__).parents[1])})
    return subprocess.run([sys.executable, "-S", str(script)], cwd=cwd, env={"PYTHONPATH": ":".join(deps), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=180)


# --- triage --upstream of a factory-made window kernel: ISSUE.md says where the error is ----------------------


def test_triage_upstream_of_a_factory_kernel_names_the_window_off_by_one_and_repro_runs_where_it_should(
        my_folder: Path, tmp_path: Path) -> None:
    backend = UserKernel.from_spec("my_kernels:kernel")
    assert backend.fn.__qualname__ == "make.<locals>.kernel"
    first, minimal = check_case(backend, mixed_case(window_left=3)), check_case(backend, one_key_window_case())
    assert first.status == minimal.status == "fail", (first.message, minimal.message)
    folder = save_finding(minimal, backend, tmp_path / "pa-findings", "my_kernels:kernel", first=first)
    assert (folder / FIRST_FAILING).is_file()
    report = tmp_path / "report"
    result = CliRunner().invoke(main, ["triage", str(folder), "--kernel", "my_kernels:kernel", "--no-minimize",
                                       "--out", str(tmp_path / "triage"), "--upstream", str(report)])
    assert result.exit_code == 1, result.output
    issue = (report / "ISSUE.md").read_text()
    assert "window_left=0" in issue  # the option the failure needs, though 0 == 0.0
    wrong = issue.split("## What is wrong", 1)[1]
    assert "a window off by one (read on a larger failing case, B=" in wrong, wrong
    assert "from my_kernels import kernel" in issue
    here = _run_script(report / "repro.py", my_folder)  # from the kernel's folder, as ISSUE.md says
    assert here.returncode == 1 and "REPRODUCED" in here.stdout, here.stdout + here.stderr
    elsewhere = _run_script(report / "repro.py", tmp_path)  # from another folder: no verdict, and how to run it
    assert elsewhere.returncode == 2, elsewhere.stdout + elsewhere.stderr
    assert "COULD NOT RUN" in elsewhere.stdout and f"where it was found: {my_folder}" in elsewhere.stdout


def test_a_crash_repro_run_from_another_folder_is_no_reproduction(my_folder: Path, tmp_path: Path) -> None:
    """The kernel's module not importing is no reproduction of a crash: exit 2 and the folder, not 'REPRODUCED'."""
    from pa_oracle.fuzz.triage.upstream import Seen, write_upstream

    backend = UserKernel.from_spec("my_kernels:crashes")
    outcome = check_case(backend, mixed_case())
    assert outcome.status == "crash", outcome.message
    written = write_upstream(tmp_path / "report", mixed_case(), backend, Seen("crash", outcome.message, backend.versions(), "cpu"))
    here = _run_script(written["repro"], my_folder)
    assert here.returncode == 1 and "REPRODUCED: the call raises IndexError" in here.stdout, here.stdout + here.stderr
    elsewhere = _run_script(written["repro"], tmp_path)
    assert elsewhere.returncode == 2 and "REPRODUCED" not in elsewhere.stdout, elsewhere.stdout + elsewhere.stderr
    assert "PYTHONPATH" in elsewhere.stdout and str(my_folder) in elsewhere.stdout


def _loc(case: Case, *clues: Clue) -> Localization:
    rows = case.layout.total_q
    return Localization(case, "k", "fail", torch.zeros(rows, 1), torch.zeros(rows, 1, dtype=torch.bool), "test",
                        checks=list(clues))


def test_issue_clues_resolve_only_an_ambiguous_clue_and_only_by_a_pattern_of_the_same_check() -> None:
    small, large = one_key_window_case(), mixed_case(window_left=3)
    ambiguous = Clue("window edge", "ambiguous", "the key is at once X, Y: this case cannot tell them apart")
    needed = Clue("options needed", "pattern", "the failure needs window")
    resolved = issue_clues([("minimized case", _loc(small, ambiguous, needed)),
                            ("first failing case", _loc(large, Clue("window edge", "pattern", "a window off by one"),
                                                        Clue("requests", "pattern", "request 1 is wrong")))])
    assert resolved == [f"window edge: a window off by one (read on a larger failing case, {large.summary()}; the minimal "
                        "case cannot tell it apart: the key is at once X, Y)", "options needed: the failure needs window"]
    unresolved = issue_clues([("minimized case", _loc(small, ambiguous)),
                              ("first failing case", _loc(large, Clue("window edge", "no pattern", "none")))])
    assert unresolved == [f"window edge: {ambiguous.finding}"]
    assert issue_clues([]) == []


# --- the numbers of a run's lines ------------------------------------------------------------------------------


def test_a_result_line_with_a_finding_says_the_findings_error_over_the_allowed(my_folder: Path) -> None:
    outcome = check_case(UserKernel.from_spec("my_kernels:kernel"), one_key_window_case())
    assert outcome.verdict is not None and outcome.verdict.out is not None
    message = outcome.message.splitlines()[0]
    expected = max(limit_ratio(s) for s in (outcome.verdict.out, outcome.verdict.lse) if s is not None)
    assert finding_ratio(message) == pytest.approx(expected, rel=0.01)  # the message's 3 digits
    result = BackendResult("my_kernels:kernel", examples=4, passed=3, seen=["a", "b", "c", "d"], status="finding",
                           worst_allowed=0.04, findings=[FindingRecord("d", "fail", message, "B=1", None, None)])
    line = result.line()
    shown = re.search(r"1 FINDING\(S\) \(at ([\d,.]+)x the allowed error\), 4 examples", line)
    assert shown is not None and float(shown[1].replace(",", "")) == pytest.approx(expected, rel=0.01), line
    assert "worst pass at 0.04 of the allowed error" in line
    again = BackendResult.from_json(result.to_json())  # resumed or merged from a state file: the same line
    assert again.line() == line
    crash = BackendResult("k", examples=1, seen=["a"], status="finding",
                          findings=[FindingRecord("a", "crash", "IndexError: index 1 is out of bounds", "B=1", None, None)])
    assert "1 FINDING(S), 1 examples" in crash.line()  # no ratio to state


def test_a_passing_kernels_line_states_its_worst_pass_against_the_allowed_error_never_above_1(my_folder: Path) -> None:
    """The walk saw 'worst error ratio 3.31' on a passing backend beside the README's 'limit 3' (the ratio to the
    control alone; the floor made it pass): the line now leads with the error over the allowed one, at most 1."""
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend

    result = fuzz_backend(UserKernel.from_spec("my_kernels:fixed"), CampaignConfig(examples=12, isolate=False))
    assert result.findings == [] and result.passed > 0, result.line()
    assert 0.0 < result.worst_allowed <= 1.0, result.worst_allowed
    assert f"worst pass at {result.worst_allowed:.2f} of the allowed error ({result.worst_ratio:.2f}x the control's)" in result.line()


def test_the_live_line_while_shrinking_counts_the_finding_being_shrunk() -> None:
    lines: list[str] = []
    with CampaignProgress(10, write=lines.append, live=False, heartbeat=0.02) as display:
        display.case(BackendResult("k", examples=3), True)
        display.case(BackendResult("k", examples=3), False)  # Hypothesis shrinks: the finding is not recorded yet
        deadline = time.monotonic() + 10
        while not any(SHRINKING in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.02)
    shrinking = [line for line in lines if SHRINKING in line]
    assert shrinking and all("0 finding(s) + 1 being shrunk" in line for line in shrinking), lines


@pytest.mark.slow
def test_coverage_counts_the_failing_cases_of_a_gqa_map_wrong_for_groups_not_a_power_of_2(my_folder: Path, tmp_path: Path) -> None:
    """The walk's run whose finding had group size 3 printed 'never ran: group_size 3'."""
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
    from pa_oracle.oracle.tensors import load_case

    backend = UserKernel.from_spec("my_kernels:my_gqa")
    result = fuzz_backend(backend, CampaignConfig(examples=200, out_dir=tmp_path / "out"))
    assert result.finding is not None and result.finding_dir is not None, result.line()
    minimal = result.finding.case
    group = minimal.heads.num_qo_heads // minimal.heads.num_kv_heads
    assert group & (group - 1), f"the bug needs a group that is not a power of 2, got {group}"
    cases = [minimal] + ([load_case(result.finding_dir / FIRST_FAILING)] if (result.finding_dir / FIRST_FAILING).exists() else [])
    for case in cases:
        for name, value in exercised(case).items():
            assert result.coverage.counts.get(name, {}).get(value, 0) >= 1, (name, value, result.coverage.counts.get(name))
    table = "\n".join(coverage_table([(result.backend, result.coverage, result.declared)]))
    never = re.search(r"never ran: .*?group_size ([\d, ]+)", table)
    assert never is None or str(group) not in never[1].replace(" ", "").split(","), table
    assert "(at " in result.line() and "x the allowed error)" in result.line()


# --- the README's own commands ---------------------------------------------------------------------------------


def test_the_readme_says_how_selftest_runs_and_how_to_build_a_wheel_without_torch() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "pip wheel . -w dist --no-deps" in readme
    assert "pa-oracle selftest" in readme
