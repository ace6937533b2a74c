"""GSM8k gate: --shard I/N, gsm8k-merge, --reference-run and the fast (stock SDPA) reference."""

import json

import pytest
from pa_oracle.gates.gsm8k import (
    GateInputError,
    RunOutcome,
    SavedRuns,
    Shard,
    TaskSettings,
    merge_outcomes,
    merge_saved,
)

from tests.gates.test_gsm8k import _fake_runs, _gate, logged_samples, needs_lm_eval, outcome_from_samples, planted

FILTERS_BOTH = ("strict-match", "flexible-extract")


def test_shards_split_doc_ids_deterministically():
    shards = [Shard.parse(f"{i}/3") for i in (1, 2, 3)]
    owners = [[s.holds(doc) for s in shards].index(True) for doc in range(10)]
    assert owners == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    assert str(Shard.parse(" 2 / 3 ")) == "2/3"
    for bad in ("0/3", "4/3", "1-3", "a/b"):
        with pytest.raises(GateInputError):
            Shard.parse(bad)


def _outcome(label: str, right: list[bool], keep=lambda doc: True) -> RunOutcome:
    samples = logged_samples({f: right for f in FILTERS_BOTH})
    return outcome_from_samples(label, [x for x in samples if keep(x["doc_id"])])


def test_merged_outcome_round_trips_and_refuses_overlap():
    right = [i % 3 == 0 for i in range(12)]
    parts = [_outcome("k", right, Shard(i, 4).holds) for i in (1, 2, 3, 4)]
    merged = merge_outcomes([RunOutcome.from_json(json.loads(json.dumps(p.to_json()))) for p in parts])
    whole = _outcome("k", right)
    assert merged.correct == whole.correct and merged.questions == whole.questions
    assert merged.responses == whole.responses and merged.extracted == whole.extracted
    with pytest.raises(GateInputError, match="more than one shard"):
        merge_outcomes([parts[0], parts[0]])
    with pytest.raises(GateInputError, match="different attentions"):
        merge_outcomes([parts[0], _outcome("other", right, Shard(2, 4).holds)])


def _saved(shard: Shard | None, **changes) -> SavedRuns:
    right = [i % 2 == 0 for i in range(8)]
    keep = shard.holds if shard else (lambda doc: True)
    fields = dict(model="m", settings=TaskSettings(), limit=None, shard=shard, backend="k", reference="r",
                  outcomes={"k": _outcome("k", right, keep), "r": _outcome("r", right, keep)}, model_sha256="ab")
    return SavedRuns(**{**fields, **changes})


def test_merge_needs_every_shard_of_one_split_and_one_task():
    merged = merge_saved([_saved(Shard(2, 2)), _saved(Shard(1, 2))])
    assert merged.shard is None and sorted(merged.outcomes["k"].questions) == list(range(8))
    with pytest.raises(GateInputError, match="each of the shards"):
        merge_saved([_saved(Shard(1, 3)), _saved(Shard(2, 3))])
    with pytest.raises(GateInputError, match="each of the shards"):
        merge_saved([_saved(Shard(1, 2)), _saved(Shard(1, 2))])
    with pytest.raises(GateInputError, match="one --shard I/N split"):
        merge_saved([_saved(Shard(1, 2)), _saved(None)])
    with pytest.raises(GateInputError, match="differ"):
        merge_saved([_saved(Shard(1, 2)), _saved(Shard(2, 2), model_sha256="cd")])
    with pytest.raises(GateInputError, match="ran r vs k2"):
        merge_saved([_saved(Shard(1, 2)), _saved(Shard(2, 2), reference="k2", backend="r")])


def _verdict(data: dict) -> dict:
    """The parts of a gate's JSON that do not depend on how it was run (paths, wall times)."""
    return {k: data[k] for k in ("passed", "failures", "filters", "questions", "accuracy", "identical_responses")}


@needs_lm_eval
def test_sharded_gate_merges_into_the_unsharded_verdict(monkeypatch, tmp_path):
    reference, backend = planted(40, reference_right=30, losses=12, wins=1)
    _fake_runs(monkeypatch, {"hf:sdpa": reference, "hf:eager": backend})
    whole = _gate("--backend", "hf:eager", "--json", "--out", str(tmp_path / "whole"))
    assert whole.exit_code == 1, whole.output
    folders = []
    for i in (1, 2, 3):
        part = _gate("--backend", "hf:eager", "--shard", f"{i}/3", "--json", "--out", str(tmp_path / "parts"))
        data = json.loads(part.stdout)
        assert [q["doc_id"] for q in data["questions"]] == list(range(i - 1, 40, 3))
        folders.append(str(tmp_path / "parts" / "gsm8k" / f"hf_eager-vs-hf_sdpa-shard-{i}-of-3"))
    from click.testing import CliRunner
    from pa_oracle.cli import main

    merged = CliRunner().invoke(main, ["gate", "gsm8k-merge", *folders, "--json", "--out", str(tmp_path / "merged")])
    assert merged.exit_code == 1, merged.output
    assert _verdict(json.loads(merged.stdout)) == _verdict(json.loads(whole.stdout))
    assert json.loads(merged.stdout)["filters"]["flexible-extract"]["lost_doc_ids"] == list(range(12))
    saved = SavedRuns.load(tmp_path / "merged" / "gsm8k" / "hf_eager-vs-hf_sdpa")
    assert saved.shard is None and len(saved.outcomes["hf:eager"].questions) == 40
    missing = CliRunner().invoke(main, ["gate", "gsm8k-merge", *folders[:2], "--out", str(tmp_path / "merged")])
    assert missing.exit_code == 2 and "each of the shards" in missing.output, missing.output
    refused = _gate("--backend", "hf:eager", "--shard", "1/3", "--save-expected", str(tmp_path / "e.json"))
    assert refused.exit_code == 2 and "gsm8k-merge" in refused.output, refused.output


@needs_lm_eval
def test_a_saved_reference_run_is_reused_not_rerun(monkeypatch, tmp_path):
    reference, backend = planted(40, reference_right=30, losses=3, wins=2)
    _fake_runs(monkeypatch, {"hf:sdpa": reference, "hf:eager": backend, "oracle": reference})
    first = _gate("--backend", "hf:eager", "--json", "--out", str(tmp_path))
    assert first.exit_code == 0, first.output
    import pa_oracle.gates.gsm8k

    ran = []
    real = pa_oracle.gates.gsm8k.run_gsm8k
    monkeypatch.setattr(pa_oracle.gates.gsm8k, "run_gsm8k", lambda *a, **kw: ran.append(kw["label"]) or real(*a, **kw))
    folder = tmp_path / "gsm8k" / "hf_eager-vs-hf_sdpa"
    again = _gate("--backend", "hf:eager", "--reference-run", str(folder), "--json", "--out", str(tmp_path / "again"))
    assert again.exit_code == 0 and ran == ["hf:eager"], again.output
    assert _verdict(json.loads(again.stdout)) == _verdict(json.loads(first.stdout))
    cut_short = SavedRuns.load(folder)  # what a gate stopped during its backend run leaves behind
    del cut_short.outcomes["hf:eager"]
    cut_short.save(tmp_path / "cut")
    ran.clear()
    resumed = _gate("--backend", "hf:eager", "--reference-run", str(tmp_path / "cut" / "runs.json"), "--json",
                    "--out", str(tmp_path / "resumed"))
    assert resumed.exit_code == 0 and ran == ["hf:eager"], resumed.output
    assert _verdict(json.loads(resumed.stdout)) == _verdict(json.loads(first.stdout))
    with pytest.raises(GateInputError, match="no run of hf:eager"):
        merge_saved([_with_shard(cut_short, Shard(1, 1))])
    other_shard = _gate("--backend", "oracle", "--reference-run", str(folder), "--shard", "1/2")
    assert other_shard.exit_code == 2 and "shard" in other_shard.output, other_shard.output
    other_ref = _gate("--backend", "oracle", "--reference", "hf:eager", "--reference-run", str(folder))
    assert other_ref.exit_code == 2 and "ran reference hf:sdpa" in other_ref.output, other_ref.output


def _with_shard(saved: SavedRuns, shard: Shard) -> SavedRuns:
    saved.shard = shard
    return saved


def test_saved_runs_refuse_other_schemas(tmp_path):
    path = _saved(None).save(tmp_path)
    assert SavedRuns.load(tmp_path).outcomes["k"].correct == _saved(None).outcomes["k"].correct
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema_version": 9}))
    with pytest.raises(GateInputError, match="schema_version"):
        SavedRuns.load(path)


# ---------------------------------------------------------------- lm-eval for real (offline, tiny model)
TRAIN = [(f"Ann has {a} hats and gets {b} more. How many hats?", f"{a} + {b} = {a + b}\n#### {a + b}") for a, b in
         ((1, 2), (3, 4), (5, 6), (7, 8), (2, 9))]
TEST = [(f"Bo has {a} cups and breaks {b}. How many are left?", f"{a} - {b} = {a - b}\n#### {a - b}") for a, b in
        ((9, 2), (8, 3), (7, 1))]


@pytest.fixture(scope="module")
def tiny_shots(tmp_path_factory):
    """A tiny model, 3 test questions and 5 train ones: with 1 shot, lm-eval's random stream picks
    different shots for different questions, so a shard that consumed it differently would show."""
    pytest.importorskip("transformers")
    pytest.importorskip("lm_eval")
    from pa_oracle.gates.models import save_tiny

    root = tmp_path_factory.mktemp("gsm8k-shots")
    (root / "data").mkdir()
    for split, problems in (("test", TEST), ("train", TRAIN)):
        lines = [json.dumps({"question": q, "answer": a}) for q, a in problems]
        (root / "data" / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return save_tiny(root / "model"), root / "data"


def test_real_shards_keep_the_unsharded_prompts_and_generations(tiny_shots, tmp_path):
    model, data = tiny_shots
    common = ["--backend", "oracle", "--data", str(data), "--num-fewshot", "1", "--max-gen-toks", "4",
              "--batch-size", "1", "--dtype", "float32", "--device", "cpu", "--json"]
    whole = _gate(*common, "--out", str(tmp_path / "whole"), model=str(model))
    assert whole.exit_code == 0, whole.output
    assert json.loads(whole.stdout)["reference"] == "hf:sdpa"  # the fast stock reference is the default
    for i in (1, 2):
        part = _gate(*common, "--shard", f"{i}/2", "--out", str(tmp_path / "parts"), model=str(model))
        assert part.exit_code == 0, part.output
    merged = merge_saved([SavedRuns.load(tmp_path / "parts" / "gsm8k" / f"oracle-vs-hf_sdpa-shard-{i}-of-2") for i in (1, 2)])
    unsharded = SavedRuns.load(tmp_path / "whole" / "gsm8k" / "oracle-vs-hf_sdpa")
    for label in ("oracle", "hf:sdpa"):
        assert merged.outcomes[label].questions == unsharded.outcomes[label].questions  # same prompt hashes
        assert merged.outcomes[label].responses == unsharded.outcomes[label].responses
        assert merged.outcomes[label].correct == unsharded.outcomes[label].correct
    assert sorted(merged.outcomes["oracle"].questions) == [0, 1, 2]
    # the questions of shard 2/2 (doc 1 alone) would have drawn doc 0's shot from a fresh stream
    prompts = {q.prompt_hash for q in unsharded.outcomes["oracle"].questions.values()}
    assert len(prompts) == 3
