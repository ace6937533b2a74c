"""A warm-up (``pa-oracle warmup``, a run's build process) names a key built by judging one case as built, whatever
that case's verdict (a warm-up is no campaign), and a key whose case errored or crashed as not built, with the reason."""

from __future__ import annotations

import pytest
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.campaign.builds import warm_key
from pa_oracle.fuzz.campaign.variants import candidates
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.fuzz.run.runner import Outcome


@pytest.mark.parametrize(("status", "built"), [("pass", True), ("fail", True), ("error", False), ("crash", False)])
def test_a_judged_compile_reports_built_or_not_by_its_status(monkeypatch: pytest.MonkeyPatch, status: str, built: bool) -> None:
    backend = get_backend("flex")  # builds by judging a case (no ahead-of-time build)
    monkeypatch.setattr("pa_oracle.fuzz.run.runner.check_case", lambda b, case: Outcome(case, b.name, status, f"{status.upper()}: why\ntrace"))
    key = candidates(backend, Limits())[2][0]  # type: ignore[index]
    why = warm_key(backend, key, Limits(), 0)
    if built:
        assert why is None
    else:
        assert why is not None and why.startswith(status) and f"{status.upper()}: why" in why and "trace" not in why


def test_a_crash_without_a_message_is_still_named_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = get_backend("flex")
    monkeypatch.setattr("pa_oracle.fuzz.run.runner.check_case", lambda b, case: Outcome(case, b.name, "crash", ""))
    key = candidates(backend, Limits())[2][0]  # type: ignore[index]
    assert warm_key(backend, key, Limits(), 0) == "crash: "
