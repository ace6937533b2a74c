"""A fault the kernel leaves on the device (reported asynchronously, at the next CUDA call) is the
kernel's crash, never a tool error of the oracle that happened to make that next call."""

from __future__ import annotations

import pytest
import torch
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.run import runner
from pa_oracle.oracle.case import Case, Heads, Layout

FAULT = "CUDA error: an illegal memory access was encountered"


def test_finished_waits_for_a_cuda_device_only(monkeypatch: pytest.MonkeyPatch) -> None:
    waited: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    assert runner.finished("out", torch.device("cpu")) == "out" and waited == []
    assert runner.finished("out", torch.device("cuda", 0)) == "out" and waited == [torch.device("cuda", 0)]


def test_a_fault_surfacing_at_the_wait_is_a_crash_of_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    def fault(result: object, device: torch.device) -> object:
        raise RuntimeError(FAULT)

    monkeypatch.setattr(runner, "finished", fault)
    case = Case(Layout.from_lengths([2], [5], 4), Heads(2, 1, 16, 16))
    outcome = runner.check_case(get_backend("sdpa-math"), case)
    assert outcome.status == "crash" and FAULT in outcome.message and outcome.is_finding
