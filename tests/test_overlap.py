"""Drawing the next chunk while the worker judges this one (``pa_oracle.fuzz.campaign.chunks``)
must not change what a campaign draws, counts or finds: the same seed gives the same cases, the
same counts and the same shrunk finding with the pipeline on and off."""

from __future__ import annotations

from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.campaign.ledger import load_ledger
from pa_oracle.fuzz.draw.strategies import Limits

TINY = Limits(max_batch=2, max_kv_len=12, max_qo_len=3, max_kv_heads=2, max_qo_heads=4, head_dims=(8, 16))
PLANTED = "pa_oracle.fuzz.quality.planted"


def _run(name: str, pipeline: bool, examples: int, **kwargs):  # type: ignore[no-untyped-def]
    return fuzz_backend(UserKernel.from_spec(f"{PLANTED}:{name}"),
                        CampaignConfig(examples=examples, limits=TINY, isolate=True, case_timeout=120, pipeline=pipeline,
                                       seed=3, **kwargs))


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    assert a.seen == b.seen, "the same cases, in the same order"
    for name in ("examples", "passed", "unsupported", "skipped_known", "chunks_done", "status", "worst_ratio"):
        assert getattr(a, name) == getattr(b, name), (name, getattr(a, name), getattr(b, name))
    assert a.coverage.counts == b.coverage.counts
    assert [f.case_id for f in a.findings] == [f.case_id for f in b.findings]


def test_a_clean_campaign_draws_and_counts_the_same_with_and_without_the_pipeline() -> None:
    sync, piped = _run("correct_attention", False, 80), _run("correct_attention", True, 80)
    assert sync.status == "done" and sync.passed == 80
    _same(sync, piped)


def test_a_finding_shrinks_to_the_same_case_with_and_without_the_pipeline() -> None:
    sync, piped = _run("top_left_causal", False, 200), _run("top_left_causal", True, 200)
    assert sync.status == "finding" and sync.findings
    _same(sync, piped)


def test_skipped_as_known_counts_the_same_with_and_without_the_pipeline() -> None:
    ledger = load_ledger()
    sync = _run("nan_on_empty", False, 60, ledger=ledger)
    piped = _run("nan_on_empty", True, 60, ledger=ledger)
    _same(sync, piped)


def test_a_chunk_drawn_and_counted_on_either_judge_is_what_the_engines_own_run_counts() -> None:
    """Chunks as data over the one judging interface: drawn into an in-process or an isolated judge
    (``draw_chunk``) and counted (``count_clean_chunk``), the first chunk is the engine's own run's."""
    from pa_oracle.fuzz.campaign.chunks import Chunk, count_clean_chunk, draw_chunk
    from pa_oracle.fuzz.campaign.shard import Shard
    from pa_oracle.fuzz.campaign.state import BackendResult
    from pa_oracle.fuzz.draw.strategies import cases
    from pa_oracle.fuzz.run.judge import JudgeSettings, judge_for

    kernel = UserKernel.from_spec(f"{PLANTED}:correct_attention")
    engine = fuzz_backend(kernel, CampaignConfig(examples=10, limits=TINY, isolate=False, seed=3))
    assert engine.status == "done" and engine.passed == 10 and engine.chunks_done == 1
    for isolate in (False, True):
        judge = judge_for(kernel, settings=JudgeSettings(isolate=isolate, timeout=120))
        try:
            chunk = draw_chunk(Chunk(0, 10, Shard(), 3), cases(kernel.capabilities, TINY), set(), lambda case: False, judge,
                               deadline=None, cutoff=None)
            assert chunk.complete and not chunk.helped and len(chunk.queued) == judge.pending == 10
            result = BackendResult(kernel.name)
            assert count_clean_chunk(result, chunk, judge, set(), None, None, None) == (True, None)
        finally:
            judge.close()
        assert result.seen == engine.seen and result.passed == 10 and judge.pending == 0, isolate
