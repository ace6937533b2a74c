"""The campaign's progress display (pa_oracle.fuzz.progress) and the engine's per-case callback."""

from __future__ import annotations

import time
from types import SimpleNamespace

from pa_oracle.fuzz.progress import JUDGING, SHRINKING, STARTING, CampaignProgress


def _result(backend: str, examples: int, findings: int = 0) -> SimpleNamespace:
    return SimpleNamespace(backend=backend, examples=examples, findings=[object()] * findings)


def _wait_for(lines: list[str], text: str, seconds: float = 5.0) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hits = [line for line in lines if text in line]
        if hits:
            return hits[-1]
        time.sleep(0.01)
    raise AssertionError(f"no line with {text!r} in {lines}")


def test_without_a_terminal_it_prints_the_engines_lines_and_a_heartbeat_with_phase_rate_and_findings() -> None:
    lines: list[str] = []
    with CampaignProgress(10, write=lines.append, live=False, heartbeat=0.02) as display:
        display.line("fuzzing sdpa-math on cpu ...")
        assert lines == ["fuzzing sdpa-math on cpu ..."]
        assert STARTING in _wait_for(lines, "sdpa-math: ")  # a long first case (worker start, compile) still beats
        for n in (1, 2, 3):
            display.case(_result("sdpa-math", n), True)
        beat = _wait_for(lines, "3/10 cases judged")
        assert f"sdpa-math: {JUDGING}, 3/10 cases judged" in beat and "/s, 0 finding(s)" in beat
        display.case(_result("sdpa-math", 3), False)
        assert SHRINKING in _wait_for(lines, SHRINKING)
        display.line("fuzzing flex on cpu ...")
        display.case(_result("flex", 1, findings=1), True)
        assert "flex: judging, 1/10 cases judged" in _wait_for(lines, "flex: judging")
        assert "1 finding(s)" in _wait_for(lines, "flex: judging")
    count = len(lines)
    time.sleep(0.1)
    assert len(lines) == count, "closed: no more heartbeat"


def test_a_compile_shows_as_the_phase_with_its_variant_and_seconds_until_the_next_judged_case() -> None:
    lines: list[str] = []
    with CampaignProgress(10, write=lines.append, live=False, heartbeat=0.02) as display:
        display.line("fuzzing flashinfer-decode on cuda ...")
        display.case(_result("flashinfer-decode", 1), True)
        display.line("  compiling flashinfer-decode bfloat16 hd128 window (its first case) ...")
        beat = _wait_for(lines, "flashinfer-decode: compiling")
        assert "compiling bfloat16 hd128 window " in beat and "s, 1/10 cases judged" in beat, beat
        display.case(_result("flashinfer-decode", 2), True)
        assert f"flashinfer-decode: {JUDGING}, 2/10" in _wait_for(lines, "2/10 cases judged")
        display.line("fuzzing flashinfer-decode on cuda ... (turn 2)")
        assert STARTING in _wait_for(lines, f"flashinfer-decode: {STARTING}")


def test_on_a_terminal_a_rich_display_runs_and_the_engines_lines_still_print(capsys) -> None:
    display = CampaignProgress(4, live=True)
    display.line("fuzzing sdpa-math on cpu ...")
    display.case(_result("sdpa-math", 1), True)
    display.case(_result("sdpa-math", 2), False)
    display.close()
    display.close()  # closing twice is harmless (the CLI closes before printing and on exit)
    assert "fuzzing sdpa-math on cpu ..." in capsys.readouterr().err


def test_the_engine_reports_each_judged_case() -> None:
    from pa_oracle.backends import get_backend
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, Hooks, fuzz_backend

    calls: list[tuple[int, bool]] = []
    result = fuzz_backend(get_backend("sdpa-math"), CampaignConfig(examples=3), hooks=Hooks(on_case=lambda r, searching: calls.append((r.examples, searching))))
    assert result.examples == 3 and calls == [(1, True), (2, True), (3, True)]
