"""The teacher-forced logit gate on a tiny random model (float32, CPU): correct attention passes,
planted bugs fail, and the batching scores exactly the answer tokens."""

from __future__ import annotations

import json

import pytest
import torch
from pa_oracle.backends.user import UserKernel, declare
from pa_oracle.fuzz.quality.planted import correct_attention
from pa_oracle.gates.data import Problem, read_gsm8k
from pa_oracle.gates.logits import (
    THRESHOLDS,
    LogitGateConfig,
    ScoredText,
    _batch,
    _decode_batch,
    gsm8k_texts,
    run_logit_gate,
)
from pa_oracle.gates.models import tiny_tokenizer
from pa_oracle.gates.swap import SwapError, implementation_name, registered_swap, resolve_backend
from pa_oracle.oracle.errors import BadInput

pytest.importorskip("transformers", reason="the gates need transformers (pip install 'paged-attention-oracle[test]')")


@pytest.fixture(scope="module")
def texts(gsm8k_dir):
    return gsm8k_texts(read_gsm8k(gsm8k_dir))


def _gate(model, texts, backend: str, reference: str = "oracle", padding: str = "left"):
    config = LogitGateConfig(backend=backend, reference=reference, batch_size=2, padding_side=padding)
    return run_logit_gate(model, tiny_tokenizer(), texts, config)


@pytest.mark.parametrize("backend", ["sdpa-math", "hf:sdpa", "pa_oracle.fuzz.quality.planted:correct_attention"])
def test_correct_attention_passes_against_the_oracle(tiny_llama, texts, backend: str) -> None:
    result = _gate(tiny_llama, texts, backend)
    assert result.passed, result.to_markdown()
    assert result.tokens > 200 and result.texts == len(texts) and result.thresholds == THRESHOLDS["float32"]
    assert result.nonfinite == 0 and result.max_kl < 1e-8


@pytest.mark.parametrize("padding", ["left", "right"])
def test_wrong_gqa_map_fails_the_gate(tiny_llama, texts, padding: str) -> None:
    result = _gate(tiny_llama, texts, "pa_oracle.fuzz.quality.planted:wrong_gqa_map", padding=padding)
    assert not result.passed
    assert any("mean KL" in f for f in result.failures) and result.mean_kl > 1000 * THRESHOLDS["float32"].mean_kl
    assert result.worst and result.worst[0].kl == result.max_kl


def test_a_kernel_reading_poisoned_slots_fails_on_nonfinite_logits(tiny_llama, texts) -> None:
    result = _gate(tiny_llama, texts[:2], "pa_oracle.fuzz.quality.planted:reads_past_last_page")
    assert not result.passed and result.nonfinite > 0 and "NaN/inf" in result.failures[0]
    json.dumps(result.to_json(), allow_nan=False)  # inf metrics become null, the JSON stays valid


def test_right_padding_scores_the_same_tokens_as_left_padding(tiny_llama, texts) -> None:
    left, right = _gate(tiny_llama, texts, "sdpa-math"), _gate(tiny_llama, texts, "sdpa-math", padding="right")
    assert right.passed and right.tokens == left.tokens


@pytest.mark.parametrize("padding", ["left", "right"])
def test_batch_scores_exactly_the_answer_tokens(padding: str) -> None:
    tokenizer = tiny_tokenizer()
    texts = [ScoredText("Q: 1+1?\nA:", " 2"), ScoredText("Q: a longer question?\nA:", " It is 42.")]
    batch = _batch(tokenizer, texts, padding, device="cpu")
    for b, text in enumerate(texts):
        gold = tokenizer(text.continuation, add_special_tokens=False)["input_ids"]
        assert batch.gold[b].tolist() == gold
        assert batch.input_ids[b, batch.scored[b] + 1].tolist() == gold  # logits at t predict token t + 1
        assert batch.attention_mask[b, batch.scored[b] + 1].all()
        assert torch.equal(batch.kept[batch.rows[b]], batch.scored[b])  # the LM head computes these rows
    assert (batch.attention_mask[0] == 0).any(), "the shorter text must be padded"
    real = batch.attention_mask.bool()
    assert batch.position_ids[real].tolist() == [p for n in real.sum(1).tolist() for p in range(n)]


def test_result_renders_as_json_and_markdown(tiny_llama, texts) -> None:
    result = _gate(tiny_llama, texts[:2], "pa_oracle.fuzz.quality.planted:wrong_gqa_map")
    data = json.loads(json.dumps(result.to_json()))
    assert data["passed"] is False and data["failures"] == result.failures and data["thresholds"]["mean_kl"] > 0
    assert data["versions"]["transformers"] and data["backend"] == "pa_oracle.fuzz.quality.planted:wrong_gqa_map"
    text = result.to_markdown()
    assert text.startswith("# Logit gate: pa_oracle.fuzz.quality.planted:wrong_gqa_map vs oracle: FAIL") and "| max KL" in text


def test_gsm8k_reader_checks_its_input(tmp_path, gsm8k_dir) -> None:
    assert read_gsm8k(gsm8k_dir, limit=2) == read_gsm8k(gsm8k_dir)[:2]
    assert read_gsm8k(gsm8k_dir)[1].final_answer == "60"
    with pytest.raises(BadInput, match="train.jsonl"):
        read_gsm8k(gsm8k_dir, split="train")
    (tmp_path / "test.jsonl").write_text('{"question": "q"}\n')
    with pytest.raises(BadInput, match="test.jsonl:1"):
        read_gsm8k(tmp_path)
    assert Problem("q", "so 1,234\n#### 1,234").final_answer == "1234"


@declare(max_qo_len=1)
def decode_only(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                window_left, logits_soft_cap):
    """A correct kernel that declares one query per sequence, like FlashInfer's decode wrapper."""
    return correct_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                             kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                             window_left=window_left, logits_soft_cap=logits_soft_cap)


def test_decode_mode_gates_a_decode_only_kernel_behind_the_reference_prefill(tiny_llama, texts) -> None:
    backend = UserKernel(decode_only, name="decode_only")
    with pytest.raises(SwapError, match="qo_len > 1"):  # prefill mode needs a kernel that takes whole prompts
        _gate(tiny_llama, texts[:1], backend)
    short = texts[:2]  # one batch: every decode step is a forward pass
    progress = []
    result = run_logit_gate(tiny_llama, tiny_tokenizer(), short, LogitGateConfig(backend, mode="decode", batch_size=2),
                            progress=lambda done, total: progress.append((done, total)))
    assert result.passed, result.to_markdown()
    assert result.prefill == "oracle" and "decode mode (prompt prefilled by oracle)" in result.to_markdown()
    swap = registered_swap(implementation_name(backend, 16, 1, resolve_backend("oracle")))
    layers = tiny_llama.config.num_hidden_layers
    assert swap.prefill_calls == layers and swap.calls > 10 * swap.prefill_calls  # decode steps dominate
    forwards = swap.calls // layers  # the backend's run; the reference's has as many
    assert progress == [(n, 2 * forwards) for n in range(1, 2 * forwards + 1)]
    assert swap.page_tables == swap.plans == forwards  # one page table and one plan per forward, not per layer
    # one fewer token per text than prefill mode: answer token 0 is predicted by the prefill, not scored
    assert result.tokens == _gate(tiny_llama, short, "sdpa-math").tokens - len(short)


def test_decode_mode_fails_a_wrong_gqa_map(tiny_llama, texts) -> None:
    shortest = [min(texts, key=lambda t: len(t.continuation))]
    config = LogitGateConfig("pa_oracle.fuzz.quality.planted:wrong_gqa_map", mode="decode")
    result = run_logit_gate(tiny_llama, tiny_tokenizer(), shortest, config)
    assert not result.passed and result.mean_kl > 1000 * THRESHOLDS["float32"].mean_kl


def test_decode_batch_feeds_answers_one_column_per_step() -> None:
    tokenizer = tiny_tokenizer()
    texts = [ScoredText("Q: 1+1?\nA:", " 2."), ScoredText("Q: a longer question?\nA:", " It is 42.")]
    batch = _decode_batch(tokenizer, texts, device="cpu")
    p = batch.prompt_width
    for b, text in enumerate(texts):
        prompt = tokenizer(text.prompt)["input_ids"]
        answer = tokenizer(text.continuation, add_special_tokens=False)["input_ids"]
        assert batch.input_ids[b, p - len(prompt) : p].tolist() == prompt  # prompts end at one column
        assert batch.input_ids[b, p : p + len(answer)].tolist() == answer
        assert batch.gold[b].tolist() == answer[1:] == batch.input_ids[b, batch.scored[b] + 1].tolist()
    assert batch.attention_mask[:, p:].all() and not batch.attention_mask[0, 0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"padding_side": "middle"}, "padding_side must be 'left' or 'right'"),
        ({"mode": "beam"}, "mode must be 'prefill' or 'decode'"),
        ({"mode": "decode", "padding_side": "right"}, "decode mode left-pads"),
        ({"prefill": "oracle"}, "prefill= names the prefill backend of decode mode"),
        ({"batch_size": 0}, "need batch_size >= 1"),
    ],
)
def test_the_config_refuses_settings_that_cannot_run(options, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        LogitGateConfig("sdpa-math", **options)


def test_decode_mode_prefills_the_backends_run_with_the_reference_unless_told() -> None:
    assert LogitGateConfig("sdpa-math", reference="control", mode="decode").backend_prefill == "control"
    assert LogitGateConfig("sdpa-math", reference="hf:sdpa", mode="decode").backend_prefill == "oracle"
    assert LogitGateConfig("hf:eager", mode="decode").backend_prefill is None  # a stock backend prefills itself
    assert LogitGateConfig("sdpa-math", mode="decode", prefill="control").backend_prefill == "control"
    assert LogitGateConfig("sdpa-math").backend_prefill is None


def test_a_gate_needs_texts_and_calibrated_thresholds(tiny_llama) -> None:
    with pytest.raises(BadInput, match="at least one text"):
        run_logit_gate(tiny_llama, tiny_tokenizer(), [], LogitGateConfig("sdpa-math"))
    assert LogitGateConfig("sdpa-math").thresholds_for("bfloat16") == THRESHOLDS["bfloat16"]
    with pytest.raises(BadInput, match="no calibrated thresholds for dtype float64"):
        LogitGateConfig("sdpa-math").thresholds_for("float64")
