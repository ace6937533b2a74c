"""A campaign's state is saved after a chunk about every second, not after every chunk (a save writes every drawn
id: ~15% of a 5-minute H200 campaign went to saving), and a run cut in the middle of a chunk still saves each
backend as of its last whole chunk (``pa_oracle.fuzz.campaign.state.Checkpoints``)."""

from __future__ import annotations

import pytest

from pa_oracle.fuzz.campaign.state import BackendResult, CampaignState, Checkpoints


def _chunk(result: BackendResult, ids: list[str], status: str = "running") -> BackendResult:
    result.seen += ids
    result.examples += len(ids)
    result.chunks_done += 1
    result.status = status  # type: ignore[assignment]
    return result


@pytest.fixture
def saves(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    state = CampaignState({"seed": 0}, {"k": BackendResult("k"), "m": BackendResult("m")})
    path = tmp_path / "campaign.json"
    state.save(path)
    written: list[int] = []
    save = CampaignState.save
    monkeypatch.setattr(CampaignState, "save", lambda self, p, as_of=None: (written.append(1), save(self, p, as_of))[1])
    return state, path, written


def test_chunks_are_saved_once_a_second_and_a_pairs_end_at_once(saves, monkeypatch) -> None:
    state, path, written = saves
    clock = [100.0]
    monkeypatch.setattr("pa_oracle.fuzz.campaign.state.time.monotonic", lambda: clock[0])
    checkpoint, result = Checkpoints(state, path), state.results["k"]
    checkpoint(_chunk(result, ["a"]))
    assert len(written) == 1, "the first chunk is saved"
    checkpoint(_chunk(result, ["b"]))
    clock[0] += 0.5
    checkpoint(_chunk(result, ["c"]))
    assert len(written) == 1 and CampaignState.load(path).results["k"].seen == ["a"], "not within a second"
    clock[0] += 0.6
    checkpoint(_chunk(result, ["d"]))
    assert len(written) == 2 and CampaignState.load(path).results["k"].seen == ["a", "b", "c", "d"]
    checkpoint(_chunk(result, ["e"], status="finding"))
    assert len(written) == 3, "a chunk that ends the pair's run is saved at once"
    checkpoint(_chunk(result, ["f"]))
    checkpoint.flush()
    assert len(written) == 4 and CampaignState.load(path).results["k"].seen == list("abcdef"), "a turn's end is saved"
    result.notes.append("a note the turn's end adds after its last chunk")
    checkpoint.flush()
    assert len(written) == 5 and CampaignState.load(path).results["k"].notes == result.notes


def test_a_run_cut_in_a_chunk_saves_each_pair_as_of_its_last_whole_chunk(saves) -> None:
    state, path, written = saves
    checkpoint = Checkpoints(state, path)
    checkpoint(_chunk(state.results["m"], ["x"]))
    checkpoint.flush()  # m's turn ends
    checkpoint(_chunk(state.results["k"], ["a"]))
    checkpoint(_chunk(state.results["k"], ["b"]))  # within the second: not written
    state.results["k"].seen.append("half")  # the next chunk, cut (Ctrl-C) before it ended
    state.results["k"].examples += 1
    checkpoint.flush(broken=True)
    saved = CampaignState.load(path).results
    assert (saved["k"].seen, saved["k"].examples, saved["k"].chunks_done) == (["a", "b"], 2, 2)
    assert saved["m"].seen == ["x"]


def test_a_run_cut_in_a_turns_first_chunk_saves_the_pair_as_it_was_before_it(saves) -> None:
    state, path, _ = saves
    checkpoint = Checkpoints(state, path)
    checkpoint(_chunk(state.results["k"], ["a"]))
    checkpoint.flush()  # k's turn ends; m's turn starts
    checkpoint(_chunk(state.results["m"], ["x"]))
    checkpoint.flush()  # m's turn ends; k's second turn starts
    state.results["k"].seen.append("half")  # cut in its first chunk, before any checkpoint of this turn
    state.results["k"].examples += 1
    checkpoint.flush(broken=True)
    saved = CampaignState.load(path).results
    assert (saved["k"].seen, saved["k"].examples) == (["a"], 1) and saved["m"].seen == ["x"]
