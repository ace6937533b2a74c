"""``benchmarks/fuzz_rate.py --threads``: the one lock around a case's plan and run is released
however ``check_case`` leaves the case (a tool error between plan and run included), so the other
threads never wait on it forever."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from pa_oracle.backends import get_backend

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz_rate.py"


def _fuzz_rate() -> Any:
    spec = importlib.util.spec_from_file_location("fuzz_rate_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_tool_error_between_plan_and_run_does_not_keep_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    fuzz_rate = _fuzz_rate()
    backend = get_backend("sdpa-math")
    drawn = fuzz_rate.draw_cases(backend, 6, 0, compile_budget=None)
    calls, real = [], type(backend).plan_inputs

    def late_error(self: Any, plan: Any) -> Any:  # e.g. a CUDA error of an earlier kernel surfacing here
        calls.append(plan)
        if len(calls) == 2:
            raise RuntimeError("a late device error")
        return real(self, plan)

    monkeypatch.setattr(type(backend), "plan_inputs", late_error)
    ended: list[str] = []

    def judge_all() -> None:
        try:
            fuzz_rate.threaded_pass(backend, drawn, 2)
            ended.append("returned")
        except RuntimeError as exc:
            ended.append(str(exc))

    worker = threading.Thread(target=judge_all, daemon=True)
    worker.start()
    worker.join(60)
    assert ended == ["a late device error"], "the pass never ended: a thread waits on the leaked lock"
    assert len(calls) > 2, "the case waiting for the failed case's turn was judged after it"  # (map cancels the ones not started)


def test_threads_give_the_verdicts_one_thread_gives() -> None:
    fuzz_rate = _fuzz_rate()
    backend = get_backend("sdpa-math")
    drawn = fuzz_rate.draw_cases(backend, 8, 1, compile_budget=None)
    _, alone = fuzz_rate.threaded_pass(backend, drawn, 1)
    _, together = fuzz_rate.threaded_pass(backend, drawn, 3)
    assert alone == together and len(alone) == len(drawn)
