"""Helper processes drawing a campaign's next chunks (``pa_oracle.fuzz.campaign.drawers``) must not change
what it draws, counts or finds: the same seed gives the same cases, counts and shrunk finding with and
without them, and a helper's draw that the engine's own run could not have made is drawn again."""

from __future__ import annotations

import time

import pytest

from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.drawers import BadDrawProcesses, DrawSpec, Drawers, KnownFindings, draw_in_helper, draw_processes
from pa_oracle.fuzz.campaign.engine import CampaignConfig, Shared, fuzz_backend
from pa_oracle.fuzz.campaign.ledger import Entry, load_ledger
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.campaign.variants import Steering
from tests.test_overlap import PLANTED, TINY, _same


def _run(name: str, drawers: Drawers | None, examples: int, **kwargs):  # type: ignore[no-untyped-def]
    try:
        return fuzz_backend(UserKernel.from_spec(f"{PLANTED}:{name}"),
                            CampaignConfig(examples=examples, limits=TINY, isolate=True, case_timeout=120, seed=3, **kwargs),
                            shared=Shared(drawers=drawers))
    finally:
        if drawers is not None:
            drawers.close()


def _helped() -> Drawers:
    return Drawers(2, first_wait=120.0)  # waits for the helpers to start: every chunk after the first is theirs


def test_a_clean_campaign_draws_the_same_cases_with_helpers_drawing() -> None:
    drawers = _helped()
    alone, helped = _run("correct_attention", None, 150), _run("correct_attention", drawers, 150)
    assert alone.status == "done" and alone.passed == 150
    assert drawers.taken >= 3, "the helpers drew chunks the campaign took"
    _same(alone, helped)


def test_skipped_as_known_counts_the_same_with_helpers_drawing() -> None:
    known = [Entry("top-left", (f"{PLANTED}:top_left_causal",), {}, "tolerated", "planted", None, {feature: True})
             for feature in ("causal", "window")]  # each case the planted bug shows in
    ledger, drawers = [*load_ledger(), *known], _helped()
    alone = _run("top_left_causal", None, 100, ledger=ledger)
    helped = _run("top_left_causal", drawers, 100, ledger=ledger)
    assert alone.status == "done" and alone.skipped_known > 0
    # in this tiny case space a chunk drawn ahead often holds a case the chunk before it drew: drawn again here
    assert drawers.taken >= 1 and drawers.taken + drawers.redrawn >= 3, (drawers.taken, drawers.redrawn)
    _same(alone, helped)


def test_a_finding_shrinks_to_the_same_case_with_helpers_drawing() -> None:
    alone, helped = _run("top_left_causal", None, 200), _run("top_left_causal", _helped(), 200)
    assert alone.status == "finding" and alone.findings
    _same(alone, helped)


def _spec(steering: Steering | None = None) -> DrawSpec:
    backend = get_backend("sdpa-math")
    return DrawSpec(backend.capabilities, TINY, steering, KnownFindings((), backend.name, (), None, "oracle"), Shard(), 0)


def test_a_helper_draw_holding_a_case_an_earlier_chunk_drew_is_drawn_again() -> None:
    spec = _spec()
    first = {case.case_id for _, case in draw_in_helper(spec, 0, 10, frozenset()).events}
    drawers = Drawers(1, first_wait=120.0)
    try:
        drawers.send(spec, 1, 10, set())  # sent before chunk 0's cases were known: it draws Hypothesis's simplest case again
        assert drawers.take(spec, 1, 10, first.__contains__) is None
        assert drawers.redrawn == 1 and drawers.taken == 0
        drawers.send(spec, 2, 10, first)  # sent knowing them: taken
        assert drawers.take(spec, 2, 10, first.__contains__) is not None and drawers.taken == 1
        # sent knowing none of them (past the SENT_IDS latest): the cases that clashed before go along, so it is taken
        drawers.send(spec, 3, 10, set())
        assert drawers.take(spec, 3, 10, first.__contains__) is not None and drawers.taken == 2
    finally:
        drawers.close()


def test_a_helper_draw_for_another_spec_or_size_is_not_taken() -> None:
    drawers = Drawers(1, first_wait=120.0)
    key = (("head_dim_qk", 8),)
    try:
        drawers.send(_spec(Steering((key,), frozenset({key}))), 1, 10, set())
        assert drawers.take(_spec(Steering((key,), frozenset())), 1, 10, lambda _: False) is None  # the allowed keys changed
        drawers.send(_spec(), 2, 10, set())
        assert drawers.take(_spec(), 2, 9, lambda _: False) is None  # another chunk size
        assert drawers.take(_spec(), 3, 10, lambda _: False) is None  # never sent
    finally:
        drawers.close()


def test_draw_processes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PA_ORACLE_DRAW_PROCESSES", "3")
    assert draw_processes() == 3
    monkeypatch.setenv("PA_ORACLE_DRAW_PROCESSES", "0")
    assert draw_processes() == 0
    for bad in ("-1", "two", "1.5"):
        monkeypatch.setenv("PA_ORACLE_DRAW_PROCESSES", bad)
        with pytest.raises(BadDrawProcesses, match="PA_ORACLE_DRAW_PROCESSES"):
            draw_processes()
    monkeypatch.delenv("PA_ORACLE_DRAW_PROCESSES")
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert draw_processes() == 0, "a 2-core machine draws in the campaign process alone"
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert draw_processes() == 3


def test_a_killed_draw_process_leaves_the_campaign_drawing_itself() -> None:
    spec, drawers = _spec(), Drawers(1, first_wait=120.0)
    try:
        drawers.send(spec, 1, 10, set())
        assert drawers.take(spec, 1, 10, lambda _: False) is not None  # up and drawing
        pool = drawers._pool
        for process in list(pool._processes.values()):  # type: ignore[union-attr]
            process.kill()
            process.join()
        deadline = time.monotonic() + 30
        while not pool._broken and time.monotonic() < deadline:  # type: ignore[union-attr]  # the pool notices
            time.sleep(0.05)
        assert pool._broken  # type: ignore[union-attr]
        drawers.send(spec, 2, 10, set())  # submitting to a broken pool raises: not out of the campaign
        assert drawers.broken and drawers.take(spec, 2, 10, lambda _: False) is None
    finally:
        drawers.close()


def test_started_draw_processes_are_up_before_their_first_chunk() -> None:
    drawers = Drawers(2)  # first_wait 0: before the helpers answered, the campaign does not wait for them
    drawers.WAIT = 120.0  # once up, the wait for a draw (2 s in a campaign; a loaded CI machine draws slower)
    try:
        assert not drawers._up()
        drawers.start()
        deadline = time.monotonic() + 120
        while not drawers._up() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert drawers._up(), "the start tasks returned: the helpers are up"
        spec = _spec()
        drawers.send(spec, 1, 10, set())
        assert drawers.take(spec, 1, 10, lambda _: False) is not None, "so the first take waits for its draw"
    finally:
        drawers.close()


def test_a_campaign_starts_its_draw_processes_only_for_isolated_backends(tmp_path, monkeypatch) -> None:
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, run_campaign
    from pa_oracle.fuzz.campaign.state import CampaignState

    started: list[int] = []
    monkeypatch.setattr(Drawers, "start", lambda self: started.append(self.count))
    monkeypatch.setenv("PA_ORACLE_DRAW_PROCESSES", "2")
    backend = UserKernel.from_spec(f"{PLANTED}:correct_attention")
    for isolate, examples in ((False, 30), (True, 5), (True, 30)):
        run_campaign([backend], CampaignState({"seed": 0}), tmp_path / f"{isolate}{examples}.json", CampaignConfig(examples=examples, limits=TINY, isolate=isolate, case_timeout=120))
    assert started == [2], "started once: for the isolated run past one chunk, not the in-process one or one chunk"
