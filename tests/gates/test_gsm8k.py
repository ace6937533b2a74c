import importlib.util
import json
from pathlib import Path

import pytest
from pa_oracle.gates.gsm8k import (
    FILTERS,
    Criteria,
    Expected,
    GateInputError,
    TaskSettings,
    judge,
    load_expected,
    local_task_yaml,
    model_key,
    outcome_from_samples,
    result_json,
    result_markdown,
    save_expected,
    write_reports,
)

SHARED_GSM8K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
needs_lm_eval = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="needs lm-eval: pip install -e '.[eval]'")
SETTINGS = TaskSettings(num_fewshot=5, max_gen_toks=256)


def logged_samples(right: dict[str, list[bool]], *, prompt_tag: str = "p") -> list[dict]:
    """What lm-eval logs with log_samples=True: one entry per (question, filter)."""
    samples = []
    for filter_name, outcomes in right.items():
        for doc_id, ok in enumerate(outcomes):
            answer = str(doc_id) if ok else "[invalid]"
            samples.append({
                "doc_id": doc_id, "filter": filter_name, "exact_match": float(ok),
                "doc": {"question": f"question {doc_id}?"}, "target": f"work\n#### {doc_id}",
                "resps": [[f"so the answer is {answer}"]], "filtered_resps": [answer],
                "prompt_hash": f"{prompt_tag}{doc_id}",
            })
    return samples


def runs(reference: list[bool], backend: list[bool], *, filters=FILTERS):
    ref = outcome_from_samples("oracle", logged_samples({f: reference for f in filters}))
    out = outcome_from_samples("kernel", logged_samples({f: backend for f in filters}))
    return out, ref


def planted(n: int, *, reference_right: int, losses: int, wins: int) -> tuple[list[bool], list[bool]]:
    """Reference right on the first ``reference_right`` questions; the backend loses the first
    ``losses`` of those and wins the first ``wins`` of the others."""
    reference = [i < reference_right for i in range(n)]
    backend = list(reference)
    for i in range(losses):
        backend[i] = False
    for i in range(reference_right, reference_right + wins):
        backend[i] = True
    return reference, backend


def test_planted_losses_fail_the_gate():
    backend, reference = runs(*planted(40, reference_right=30, losses=12, wins=1))
    result = judge(backend, reference, model="m", settings=SETTINGS)
    verdict = result.verdicts["flexible-extract"]
    assert (verdict.mcnemar.losses, verdict.mcnemar.wins) == (12, 1)
    assert verdict.mcnemar.p_backend_worse == pytest.approx(14 / 8192)  # P(X >= 12), X ~ Bin(13, 1/2)
    assert not result.passed
    assert "McNemar" in result.failures[0] and "12" in result.failures[0], result.failures
    assert result.losses["flexible-extract"] == list(range(12))
    report = result_markdown(result, backend, reference)
    assert report.startswith("# GSM8k gate: FAIL") and "### doc 0 (answer 0)" in report


def test_noise_both_ways_passes():
    backend, reference = runs(*planted(40, reference_right=30, losses=3, wins=2))
    result = judge(backend, reference, model="m", settings=SETTINGS)
    assert result.passed, result.failures
    assert result.verdicts["flexible-extract"].mcnemar.p_backend_worse == pytest.approx(0.5)  # P(X >= 3), Bin(5, 1/2)
    assert result.identical_responses == 35


def test_only_gated_filters_decide():
    strict_ref, strict_backend = planted(40, reference_right=30, losses=12, wins=0)
    same = [i < 30 for i in range(40)]
    ref = outcome_from_samples("oracle", logged_samples({"strict-match": strict_ref, "flexible-extract": same}))
    out = outcome_from_samples("kernel", logged_samples({"strict-match": strict_backend, "flexible-extract": same}))
    assert judge(out, ref, model="m", settings=SETTINGS).passed
    both = judge(out, ref, model="m", settings=SETTINGS, criteria=Criteria(gated=FILTERS))
    assert not both.passed and both.failures[0].startswith("strict-match: McNemar")


def expected(accuracy: float, **changes) -> Expected:
    fields = {
        "model": "m", "task": SETTINGS, "n": 1319, "accuracy": {"flexible-extract": accuracy, "strict-match": accuracy},
        "date": "2026-11-30", "lm_eval_version": "0.4.13", "reference": "oracle",
    }
    return Expected(**{**fields, **changes})


def test_expected_accuracy_fails_a_backend_far_below_it():
    same = [i % 2 == 0 for i in range(40)]  # 20/40 right in both runs: McNemar sees nothing
    backend, reference = runs(same, same)
    low = judge(backend, reference, model="m", settings=SETTINGS, expected=expected(0.75))
    verdict = low.verdicts["flexible-extract"]
    assert verdict.mcnemar.p_backend_worse == 1.0
    assert verdict.backend_lower_bound < 0.75 - verdict.margin
    assert not low.passed and "Wilson lower bound" in low.failures[0], low.failures
    assert judge(backend, reference, model="m", settings=SETTINGS, expected=expected(0.5)).passed
    explicit = judge(backend, reference, model="m", settings=SETTINGS, expected=expected(0.75), criteria=Criteria(margin=0.5))
    assert explicit.passed and explicit.verdicts["flexible-extract"].margin == 0.5


def test_criteria_refuse_an_alpha_outside_the_open_half_interval():
    for alpha in (0.0, 0.5, 1.2):
        with pytest.raises(GateInputError, match=r"alpha must lie in \(0, 0.5\)"):
            Criteria(alpha=alpha)
    backend, reference = runs([True] * 10, [True] * 3 + [False] * 7)  # lost 7 of 10: p(worse) = 1/128
    assert judge(backend, reference, model="m", settings=SETTINGS, criteria=Criteria(alpha=0.05)).failures
    assert judge(backend, reference, model="m", settings=SETTINGS, criteria=Criteria(alpha=0.005)).passed


def test_expected_must_match_model_and_task():
    backend, reference = runs([True] * 5, [True] * 5)
    with pytest.raises(GateInputError, match="measured with"):
        judge(backend, reference, model="m", settings=TaskSettings(num_fewshot=8), expected=expected(0.7))
    with pytest.raises(GateInputError, match="for model 'other'"):
        judge(backend, reference, model="m", settings=SETTINGS, expected=expected(0.7, model="other"))


def test_expected_file_round_trip_and_validation(tmp_path):
    path = save_expected(tmp_path / "golden" / "m.json", expected(0.42))
    assert load_expected(path) == expected(0.42)
    record = json.loads(path.read_text())
    assert set(record) >= {"model", "task", "n", "accuracy", "date", "lm_eval_version", "schema_version"}
    path.write_text(json.dumps({**record, "schema_version": 2}))
    with pytest.raises(GateInputError, match="schema_version 2"):
        load_expected(path)
    path.write_text(json.dumps({**record, "accuracy": {"flexible-extract": 1.5}}))
    with pytest.raises(GateInputError, match=r"in \[0, 1\]"):
        load_expected(path)
    path.write_text(json.dumps({k: v for k, v in record.items() if k != "n"}))
    with pytest.raises(GateInputError, match="missing or malformed"):
        load_expected(path)


def test_pairing_rejects_runs_that_do_not_match():
    reference = outcome_from_samples("oracle", logged_samples({"flexible-extract": [True, False, True]}))
    shorter = outcome_from_samples("kernel", logged_samples({"flexible-extract": [True, False]}))
    with pytest.raises(GateInputError, match="different questions"):
        judge(shorter, reference, model="m", settings=SETTINGS)
    other_prompts = outcome_from_samples("kernel", logged_samples({"flexible-extract": [True] * 3}, prompt_tag="q"))
    with pytest.raises(GateInputError, match="different prompts"):
        judge(other_prompts, reference, model="m", settings=SETTINGS)


def test_logged_samples_are_validated():
    twice = logged_samples({"flexible-extract": [True]}) * 2
    with pytest.raises(GateInputError, match="logged twice"):
        outcome_from_samples("kernel", twice)
    partial = logged_samples({"flexible-extract": [True]})
    partial[0]["exact_match"] = 0.5
    with pytest.raises(GateInputError, match="not 0 or 1"):
        outcome_from_samples("kernel", partial)
    with pytest.raises(GateInputError, match="no samples"):
        outcome_from_samples("kernel", [])


def test_reports_hold_every_question(tmp_path):
    backend, reference = runs(*planted(10, reference_right=6, losses=2, wins=1))
    result = judge(backend, reference, model="m", settings=SETTINGS)
    json_path, md_path = write_reports(tmp_path, result, backend, reference, command="pa-oracle gate gsm8k ...")
    data = json.loads(json_path.read_text())
    assert data == json.loads(json.dumps(result_json(result, backend, reference)))
    assert [q["doc_id"] for q in data["questions"]] == list(range(10))
    assert data["questions"][0] == {
        "doc_id": 0, "target": "0", "backend": {f: False for f in FILTERS}, "reference": {f: True for f in FILTERS},
        "backend_answer": {f: "[invalid]" for f in FILTERS}, "reference_answer": {f: "0" for f in FILTERS},
        "same_generation": False,
    }
    assert sum(q["same_generation"] for q in data["questions"]) == data["identical_responses"] == 7
    assert data["filters"]["flexible-extract"]["losses"] == 2 and data["filters"]["flexible-extract"]["wins"] == 1
    assert "pa-oracle gate gsm8k ..." in md_path.read_text()


def test_model_key_names_the_golden_file(tmp_path):
    assert model_key("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB--SmolLM2-135M-Instruct"
    assert model_key("/tmp", gguf_file="/tmp/smollm2.gguf") == "smollm2" == model_key("/tmp/smollm2.gguf")
    (tmp_path / "my model").mkdir()
    assert model_key(str(tmp_path / "my model")) == "my_model"


def test_local_task_needs_both_splits(tmp_path):
    (tmp_path / "test.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    with pytest.raises(GateInputError, match="train.jsonl"):
        local_task_yaml(tmp_path)


# ---------------------------------------------------------------- the CLI, with the two runs planted
def _fake_runs(monkeypatch, outcomes: dict[str, list[bool]]):
    import pa_oracle.gates.cli
    import pa_oracle.gates.gsm8k
    import torch
    from pa_oracle.gates.models import LoadedModel

    monkeypatch.setattr(pa_oracle.gates.cli, "load_for_gate", lambda *args: LoadedModel(torch.nn.Linear(1, 1), None, "fake"))

    def fake_run(model, tokenizer, *, attn_implementation, label, settings, questions, batch_size):
        samples = logged_samples({f: outcomes[label] for f in FILTERS})
        shard = questions.shard
        return outcome_from_samples(label, [x for x in samples if shard is None or shard.holds(x["doc_id"])])

    monkeypatch.setattr(pa_oracle.gates.gsm8k, "run_gsm8k", fake_run)


def _gate(*args: str, model: str = "some/model"):
    from click.testing import CliRunner
    from pa_oracle.cli import main

    return CliRunner().invoke(main, ["gate", "gsm8k", "--model", model, *args])


@needs_lm_eval
def test_cli_exits_1_when_the_backend_loses_questions(monkeypatch, tmp_path):
    reference, backend = planted(40, reference_right=30, losses=12, wins=1)
    _fake_runs(monkeypatch, {"hf:sdpa": reference, "hf:eager": backend})
    result = _gate("--backend", "hf:eager", "--reference", "hf:sdpa", "--out", str(tmp_path))
    assert result.exit_code == 1, result.output
    assert "GSM8k gate FAIL: hf:eager vs hf:sdpa" in result.output and "lost 12 / won 1" in result.output
    report = tmp_path / "gsm8k" / "hf_eager-vs-hf_sdpa" / "gsm8k.md"
    rerun = f"pa-oracle gate gsm8k --model some/model --backend hf:eager --reference hf:sdpa --out {tmp_path}\n"
    assert rerun in report.read_text()


@needs_lm_eval
def test_cli_saves_and_then_checks_an_expected_accuracy(monkeypatch, tmp_path):
    reference, backend = planted(40, reference_right=30, losses=3, wins=3)
    _fake_runs(monkeypatch, {"hf:sdpa": reference, "hf:eager": backend})
    golden = tmp_path / "golden"
    monkeypatch.setattr("pa_oracle.gates.gsm8k.EXPECTED_DIR", golden)
    saved = golden / "some--model.json"
    first = _gate("--backend", "hf:eager", "--reference", "hf:sdpa", "--save-expected", str(saved), "--json",
                  "--out", str(tmp_path))
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["expected_file"] is None
    assert load_expected(saved).accuracy == {"strict-match": 0.75, "flexible-extract": 0.75}
    worse = [i < 20 for i in range(40)]  # McNemar alone would see 10 losses, 0 wins: p = 1/1024
    _fake_runs(monkeypatch, {"hf:sdpa": worse, "hf:eager": worse})
    second = _gate("--backend", "hf:eager", "--reference", "hf:sdpa", "--json", "--out", str(tmp_path))
    data = json.loads(second.stdout)
    assert second.exit_code == 1 and data["expected_file"] == str(saved), second.output
    assert data["failures"][0].startswith("flexible-extract: Wilson lower bound")
    mismatch = _gate("--backend", "hf:eager", "--reference", "hf:sdpa", "--num-fewshot", "8", "--out", str(tmp_path))
    assert mismatch.exit_code == 2 and "measured with" in mismatch.output, mismatch.output


@needs_lm_eval
def test_cli_rejects_the_same_backend_twice():
    result = _gate("--backend", "oracle", "--reference", "oracle")
    assert result.exit_code == 2 and "differ" in result.output, result.output


# ---------------------------------------------------------------- lm-eval for real (offline)
def _lm_eval():
    pytest.importorskip("transformers", reason="needs transformers (pip install -e '.[eval]')")
    return pytest.importorskip("lm_eval", reason="needs lm-eval (pip install -e '.[eval]')")


@pytest.mark.skipif(not SHARED_GSM8K.is_dir(), reason=f"no GSM8k data at {SHARED_GSM8K} (CI has it beside the checkout)")
def test_local_task_is_lm_evals_gsm8k_on_the_shared_data(tmp_path):
    _lm_eval()
    from pa_oracle.gates.gsm8k import task_manager

    task = task_manager(SHARED_GSM8K, tmp_path).load(["gsm8k"])["tasks"]["gsm8k"]
    assert len(task.test_docs()) == 1319 and len(task.training_docs()) == 7473
    first = task.test_docs()[0]
    assert task.doc_to_text(first) == f"Question: {first['question']}\nAnswer:"
    assert first["question"].startswith("Janet’s ducks lay 16 eggs per day.")
    assert task.doc_to_target(first).endswith("#### 18")
    assert [f.name for f in task._filters] == list(FILTERS)
    assert task.config.num_fewshot == 5 and task.config.fewshot_split == "train"
    assert task.config.generation_kwargs["until"][0] == "Question:"


TINY_PROBLEMS = [
    ("Tom has 3 apples and buys 2 more. How many apples does he have?", "3 + 2 = 5\n#### 5"),
    ("A box holds 4 pens. How many pens are in 2 boxes?", "4 * 2 = 8\n#### 8"),
    ("Sara had 10 coins and spent 7. How many are left?", "10 - 7 = 3\n#### 3"),
    ("Each of 3 cats eats 2 fish. How many fish?", "3 * 2 = 6\n#### 6"),
]


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    _lm_eval()
    from pa_oracle.gates.models import save_tiny

    root = tmp_path_factory.mktemp("gsm8k-tiny")
    data = root / "data"
    data.mkdir()
    for split, problems in (("test", TINY_PROBLEMS[:3]), ("train", TINY_PROBLEMS[3:])):
        lines = [json.dumps({"question": q, "answer": a}) for q, a in problems]
        (data / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return save_tiny(root / "model"), data


def _tiny_gate(tiny_setup, tmp_path, backend: str, *args: str, exit_code: int = 0) -> dict:
    model, data = tiny_setup
    result = _gate("--backend", backend, "--reference", "hf:sdpa", "--data", str(data), "--limit", "3",
                   "--num-fewshot", "1", "--max-gen-toks", "4", "--batch-size", "3", "--dtype", "float32",
                   "--device", "cpu", "--json", "--out", str(tmp_path), *args, model=str(model))
    assert result.exit_code == exit_code, result.output
    return json.loads(result.stdout) if exit_code == 0 else {"output": result.output}


def test_end_to_end_oracle_generates_what_sdpa_generates(tiny_setup, tmp_path):
    data = _tiny_gate(tiny_setup, tmp_path, "oracle")
    assert data["passed"] and data["backend"] == "oracle" and data["reference"] == "hf:sdpa"
    assert [q["doc_id"] for q in data["questions"]] == [0, 1, 2]
    assert [q["target"] for q in data["questions"]] == ["5", "8", "3"]
    assert {f: v["n"] for f, v in data["filters"].items()} == {f: 3 for f in FILTERS}
    assert data["identical_responses"] == 3  # float32 model: the float64 oracle rounds to sdpa's tokens
    assert (tmp_path / "gsm8k" / "oracle-vs-hf_sdpa" / "gsm8k.md").read_text().startswith("# GSM8k gate: PASS")


def test_end_to_end_planted_kernel_changes_the_generations(tiny_setup, tmp_path):
    data = _tiny_gate(tiny_setup, tmp_path, "pa_oracle.fuzz.quality.planted:wrong_gqa_map")
    # a random model answers nothing right: the gate has no power here (it passes, and says so)
    assert data["identical_responses"] < 3
    assert data["filters"]["flexible-extract"]["detectable_drop_80pct"] is None


def test_a_decode_kernel_runs_the_gate_behind_a_prefill_kernel(tiny_setup, tmp_path):
    decode_only = "tests.gates.test_logits:decode_only"  # one query per sequence, as FlashInfer's decode wrapper
    alone = _tiny_gate(tiny_setup, tmp_path, decode_only, exit_code=2)  # a setting the gate cannot run
    assert "qo_len > 1" in alone["output"]  # the prompt's forward: the gate names why it cannot run
    data = _tiny_gate(tiny_setup, tmp_path, decode_only, "--prefill", "oracle")
    assert data["passed"] and data["backend"] == f"{decode_only}+prefill=oracle", data["backend"]
    assert data["identical_responses"] == 3  # float32: the decode steps through the kernel give sdpa's tokens
    rerun = (tmp_path / "gsm8k" / "tests.gates.test_logits_decode_only_prefill_oracle-vs-hf_sdpa" / "gsm8k.md").read_text()
    assert f"--backend {decode_only} --reference hf:sdpa" in rerun and "--prefill oracle" in rerun


GOLDEN_GSM8K = sorted((Path(__file__).resolve().parents[2] / "golden" / "gsm8k").glob("*.json"))


@pytest.mark.parametrize("path", GOLDEN_GSM8K, ids=[p.stem for p in GOLDEN_GSM8K])
def test_golden_expected_accuracies_load_under_their_model_key(path: Path) -> None:
    """A stored expected accuracy is found by ``model_key`` (the file name) and is a real run's."""
    expected = load_expected(path)
    assert expected.model == path.stem
    assert expected.n >= 1 and all(0.0 <= acc <= 1.0 for acc in expected.accuracy.values())
    assert expected.task.task == "gsm8k"


def test_the_golden_gsm8k_corpus_is_not_empty() -> None:
    assert GOLDEN_GSM8K, "golden/gsm8k/ holds no expected accuracy"
