"""``pa-oracle warmup`` names a key built by judging one case as built, whatever that case's verdict (a warm-up
is no campaign), and a key whose case errored or crashed as not built, with the reason."""

from __future__ import annotations

import pytest
from pa_oracle.backends import get_backend
from pa_oracle.fuzz import warmup
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.fuzz.run.runner import Outcome


@pytest.mark.parametrize(("status", "built"), [("pass", True), ("fail", True), ("error", False), ("crash", False)])
def test_a_judged_compile_reports_built_or_not_by_its_status(monkeypatch: pytest.MonkeyPatch, status: str, built: bool) -> None:
    backend = get_backend("flex")  # builds by judging a case (no ahead-of-time build)
    monkeypatch.setattr(backend, "build_variants", lambda keys: None)
    monkeypatch.setattr(warmup, "check_case", lambda b, case: Outcome(case, b.name, status, f"{status.upper()}: why\ntrace"))
    lines: list[str] = []
    keys = warmup.warm_backend(backend, 1, 0, Limits(), echo=lines.append)
    assert len(keys) == int(built)
    key_line = next(line for line in lines if line.startswith("  "))
    if built:
        assert "built in" in key_line and f"judged {status}" in key_line
    else:
        assert key_line.split(": ", 1)[1].startswith("not built") and f"{status.upper()}: why" in key_line and "trace" not in key_line
    assert lines[-1].startswith(f"flex: built {int(built)} of 1")


def test_a_crash_without_a_message_is_still_named_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = get_backend("flex")
    monkeypatch.setattr(backend, "build_variants", lambda keys: None)
    monkeypatch.setattr(warmup, "check_case", lambda b, case: Outcome(case, b.name, "crash", ""))
    lines: list[str] = []
    assert warmup.warm_backend(backend, 1, 0, Limits(), echo=lines.append) == []
    assert any(line.startswith("  ") and "not built" in line and "(crash: )" in line for line in lines)


def test_a_warm_up_builds_the_modules_every_key_shares_first(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = get_backend("flex")
    order: list[str] = []
    monkeypatch.setattr(backend, "build_shared", lambda: order.append("shared") or True)
    monkeypatch.setattr(backend, "build_variants", lambda keys: order.append("variants") or list(keys))
    lines: list[str] = []
    warmup.warm_backend(backend, 1, 0, Limits(), echo=lines.append)
    assert order == ["shared", "variants"] and any("built flex's shared modules" in line for line in lines)
