"""A kernel's ``os._exit(0)`` is a crash finding, also in one process (``--no-isolate``), where it ended the run
with status 0 and no output before (``boundary.exit_refused`` around every kernel call)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("isolation", ["--no-isolate", "--isolate"])
def test_os_exit_zero_in_an_attention_kernel_is_a_crash_finding(isolation: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pa_oracle", "fuzz", "--kernel", "tests.reliability.bad_kernels:exits_zero_hard", isolation,
         "-n", "5", "--max-batch", "2", "--max-kv-len", "12", "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "FINDING" in done.stdout and "Traceback (most recent call last)" not in done.stdout + done.stderr
    if isolation == "--no-isolate":
        assert "os._exit(0)" in done.stdout, done.stdout[-2000:]
