"""The teacher-forced logit gate: the same model scores the same texts twice, its attention run by a
reference and by the backend under test (each through ``pa_oracle.gates.swap``, or transformers' stock
implementation as ``hf:NAME``), and the next-token distributions over the answer tokens are
compared: KL(reference || backend) per token (mean and max), top-1 agreement, and the largest
change in the gold token's log-prob. Texts go in padded batches, so ragged batches are exercised.

Thresholds (``THRESHOLDS``, per model dtype) and how they were chosen: README "Accuracy gates".
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import torch
from pa_oracle.backends.base import Backend
from pa_oracle.gates.data import Problem
from pa_oracle.gates.errors import GateInputError
from pa_oracle.gates.swap import STOCK_PREFIX, attn_implementation_for, registered_swap


@dataclass(frozen=True)
class ScoredText:
    """``prompt`` conditions, ``continuation`` is scored (tokenized separately, so no token
    straddles the boundary)."""

    prompt: str
    continuation: str


def gsm8k_texts(problems: Sequence[Problem]) -> list[ScoredText]:
    """Question as the prompt, the gold worked answer as the scored continuation."""
    return [ScoredText(f"Question: {p.question}\nAnswer:", f" {p.answer}") for p in problems]


@dataclass(frozen=True)
class Thresholds:
    """A backend passes when every bound holds (and every scored logit is finite)."""

    mean_kl: float  # nats per answer token, KL(reference || backend)
    max_kl: float  # nats, worst single answer token
    min_top1: float  # fraction of answer tokens whose argmax agrees

    def failures(self, mean_kl: float, max_kl: float, top1: float) -> list[str]:
        checks = [
            (mean_kl <= self.mean_kl, f"mean KL {mean_kl:.3g} > {self.mean_kl:g}"),
            (max_kl <= self.max_kl, f"max KL {max_kl:.3g} > {self.max_kl:g}"),
            (top1 >= self.min_top1, f"top-1 agreement {top1:.4f} < {self.min_top1:g}"),
        ]
        return [why for ok, why in checks if not ok]  # NaN fails every comparison, so it fails here


# Calibrated on SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to the dtype), 16 GSM8k test texts,
# 2274 answer tokens, against the float64 oracle: the worst of four correct attentions (stock SDPA,
# the swapped sdpa-math, the dtype-rounded control, a plain fp32 kernel) times 10 for the KLs; for
# top-1, 3x the worst correct share of flipped tokens, floored at 0.1% of tokens (near-ties).
# A wrong GQA map gives mean KL ~9.8 and top-1 ~2% in every dtype. README "Accuracy gates".
THRESHOLDS: dict[str, Thresholds] = {
    "float32": Thresholds(mean_kl=1e-10, max_kl=3e-9, min_top1=0.999),  # worst correct: 8.7e-12, 2.3e-10, 100%
    "bfloat16": Thresholds(mean_kl=0.02, max_kl=0.6, min_top1=0.95),  # worst correct: 1.8e-3, 0.060, 98.3%
    "float16": Thresholds(mean_kl=3e-4, max_kl=0.02, min_top1=0.99),  # worst correct: 3.0e-5, 1.6e-3, 99.8%
}


@dataclass(frozen=True)
class WorstToken:
    text: int  # index into the texts
    position: int  # index among the text's answer tokens
    token: str  # the gold token
    kl: float
    reference_top: str
    backend_top: str


@dataclass
class LogitGateResult:
    model: str
    backend: str
    reference: str
    dtype: str
    device: str
    texts: int
    tokens: int  # answer tokens scored
    batch_size: int
    padding_side: str
    mode: str  # "prefill" (whole texts in one forward) or "decode" (answer tokens one step at a time)
    prefill: str | None  # decode mode: what prefilled the prompt in the backend's run
    mean_kl: float
    max_kl: float
    top1_agreement: float
    max_abs_dlogprob: float  # |log p_ref(gold) - log p_backend(gold)|, worst token
    mean_abs_dlogprob: float
    nonfinite: int  # answer tokens where the backend's logits hold NaN or inf
    thresholds: Thresholds
    worst: list[WorstToken] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    numerics: dict[str, str] = field(default_factory=dict)  # torch's process-wide precision switches (``numerics``)

    @property
    def failures(self) -> list[str]:
        failed = self.thresholds.failures(self.mean_kl, self.max_kl, self.top1_agreement)
        if self.nonfinite:
            failed.insert(0, f"{self.nonfinite} answer tokens with NaN/inf logits")
        return failed

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(passed=self.passed, failures=self.failures)
        return _finite_or_null(data)

    def to_markdown(self) -> str:
        t = self.thresholds
        verdict = "PASS" if self.passed else "FAIL: " + "; ".join(self.failures)
        lines = [
            f"# Logit gate: {self.backend} vs {self.reference}: {verdict}",
            "",
            (
                f"Model `{self.model}` ({self.dtype}, {self.device}); {self.texts} texts, {self.tokens} answer tokens, "
                f"batches of {self.batch_size}, {self.padding_side}-padded, {self.mode} mode"
                + (f" (prompt prefilled by {self.prefill})." if self.prefill else ".")
            ),
            "",
            "| metric | value | bound |",
            "|---|---|---|",
            f"| mean KL(ref ‖ backend) per token (nats) | {self.mean_kl:.3g} | <= {t.mean_kl:g} |",
            f"| max KL (nats) | {self.max_kl:.3g} | <= {t.max_kl:g} |",
            f"| top-1 agreement | {self.top1_agreement:.4f} | >= {t.min_top1:g} |",
            f"| max abs Δ log p(gold) | {self.max_abs_dlogprob:.3g} | (reported) |",
            f"| mean abs Δ log p(gold) | {self.mean_abs_dlogprob:.3g} | (reported) |",
            f"| tokens with NaN/inf logits | {self.nonfinite} | 0 |",
        ]
        if self.worst:
            lines += ["", "Worst tokens:", ""]
            lines += ["| text | answer token | gold | KL | ref top-1 | backend top-1 |", "|---|---|---|---|---|---|"]
            lines += [
                f"| {w.text} | {w.position} | {w.token!r} | {w.kl:.3g} | {w.reference_top!r} | {w.backend_top!r} |"
                for w in self.worst
            ]
        if self.versions:
            lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(self.versions.items()))]
        if self.numerics:
            lines += ["", "Numerics: " + ", ".join(f"{k} {v}" for k, v in sorted(self.numerics.items()))]
        return "\n".join(lines) + "\n"


def _finite_or_null(value: Any) -> Any:
    """NaN and inf (a backend that produced them) as JSON null; the failures say what happened."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_null(v) for v in value]
    return value


@dataclass
class _Batch:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T]
    scored: list[torch.Tensor]  # per text: positions t whose logits predict answer token t + 1
    gold: list[torch.Tensor]  # per text: the answer tokens
    kept: torch.Tensor  # the positions any text scores, sorted: the only ones the LM head computes
    rows: list[torch.Tensor]  # per text: where its scored positions sit in ``kept``
    prompt_width: int = 0  # decode mode: columns prefilled in one call; each later one is a decode step

    @property
    def forward_passes(self) -> int:
        """Model calls per scoring run: one in prefill mode, the prompt plus a step per scored
        column in decode mode."""
        return 1 + len(self.kept) if self.prompt_width else 1


def _encode(tokenizer: Any, text: ScoredText) -> tuple[list[int], int]:
    prompt = tokenizer(text.prompt, add_special_tokens=True)["input_ids"]
    answer = tokenizer(text.continuation, add_special_tokens=False)["input_ids"]
    if not prompt or not answer:
        raise GateInputError(f"empty prompt or continuation after tokenization: {text!r}")
    return prompt + answer, len(prompt)


def _batch(tokenizer: Any, texts: Sequence[ScoredText], padding_side: str, device: torch.device) -> _Batch:
    """Prefill mode: whole texts, padded on ``padding_side``; every answer token is scored."""
    encoded = [_encode(tokenizer, t) for t in texts]
    width = max(len(ids) for ids, _ in encoded)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(texts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(texts), width), dtype=torch.long)
    scored, gold = [], []
    for b, (tokens, prompt_len) in enumerate(encoded):
        start = width - len(tokens) if padding_side == "left" else 0
        ids[b, start : start + len(tokens)] = torch.tensor(tokens)
        mask[b, start : start + len(tokens)] = 1
        scored.append(torch.arange(start + prompt_len - 1, start + len(tokens) - 1))
        gold.append(torch.tensor(tokens[prompt_len:]))
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    kept = torch.unique(torch.cat(scored))  # sorted
    rows = [torch.searchsorted(kept, positions) for positions in scored]
    to = lambda t: t.to(device)
    return _Batch(to(ids), to(mask), to(position_ids), scored, [to(g) for g in gold], to(kept), [to(r) for r in rows])


def _decode_batch(tokenizer: Any, texts: Sequence[ScoredText], device: torch.device) -> _Batch:
    """Decode mode: prompts left-padded to one width, then the answers one column per decode step
    (a finished answer is followed by pad tokens fed as real tokens, never scored, so that every
    step has one query per sequence). Scored: the predictions of answer tokens 1.. (token 0 is
    predicted by the prefill)."""
    encoded = [_encode(tokenizer, t) for t in texts]
    prompt_width = max(n for _, n in encoded)
    answer_width = max(len(ids) - n for ids, n in encoded)
    ids = torch.full((len(texts), prompt_width + answer_width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.ones_like(ids)
    scored, gold = [], []
    for b, (tokens, prompt_len) in enumerate(encoded):
        ids[b, prompt_width - prompt_len : prompt_width] = torch.tensor(tokens[:prompt_len])
        mask[b, : prompt_width - prompt_len] = 0
        ids[b, prompt_width : prompt_width + len(tokens) - prompt_len] = torch.tensor(tokens[prompt_len:])
        scored.append(torch.arange(prompt_width, prompt_width + len(tokens) - prompt_len - 1))
        gold.append(torch.tensor(tokens[prompt_len + 1 :]))
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    kept = torch.arange(prompt_width, prompt_width + answer_width - 1)
    rows = [positions - prompt_width for positions in scored]
    to = lambda t: t.to(device)
    gold, rows = [to(g) for g in gold], [to(r) for r in rows]
    return _Batch(to(ids), to(mask), to(position_ids), scored, gold, to(kept), rows, prompt_width)


def _logits(model: Any, implementation: str, batch: _Batch, after_forward: Callable[[], None]) -> torch.Tensor:
    """[B, len(batch.kept), V]: the vocabulary projection of the scored positions only (the prompt
    tokens' would be most of the LM head's work and memory). Decode mode: one forward for the
    prompt, then one per answer column through the KV cache. ``after_forward()`` after each."""
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        if not batch.prompt_width:
            logits = model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                use_cache=False, logits_to_keep=batch.kept,
            ).logits
            after_forward()
            return logits
        from transformers import DynamicCache

        p = batch.prompt_width
        cache = DynamicCache(config=model.config)
        model(input_ids=batch.input_ids[:, :p], attention_mask=batch.attention_mask[:, :p],
              position_ids=batch.position_ids[:, :p], past_key_values=cache, use_cache=True, logits_to_keep=1)
        after_forward()
        steps = []
        for column in batch.kept.tolist():
            out = model(
                input_ids=batch.input_ids[:, column : column + 1], attention_mask=batch.attention_mask[:, : column + 1],
                position_ids=batch.position_ids[:, column : column + 1], past_key_values=cache, use_cache=True,
            )
            steps.append(out.logits[:, -1])
            after_forward()
        return torch.stack(steps, 1) if steps else batch.input_ids.new_zeros(len(batch.rows), 0, 0).float()


class TokenMetrics(NamedTuple):
    """Per scored token (float64): KL(reference || backend) in nats (inf where the backend's logits
    are not finite), |change of the gold token's log-prob|, both argmaxes."""

    kl: torch.Tensor
    abs_dlogprob: torch.Tensor
    reference_top: torch.Tensor
    backend_top: torch.Tensor
    finite: torch.Tensor


def token_metrics(reference_logits: torch.Tensor, backend_logits: torch.Tensor, gold: torch.Tensor) -> TokenMetrics:
    """Compare two [N, V] logit rows per token, in float64 (the KL of near-equal distributions is
    ~1e-12 in float32 runs: float32 arithmetic would bury it in its own rounding)."""
    ref = torch.log_softmax(reference_logits.double(), -1)
    raw = backend_logits.double()
    finite = torch.isfinite(raw).all(-1)
    test = torch.log_softmax(raw, -1)
    kl = torch.where(finite, (ref.exp() * (ref - test)).sum(-1), float("inf"))
    dlogp = (ref.gather(-1, gold[:, None]) - test.gather(-1, gold[:, None]))[:, 0].abs()
    return TokenMetrics(kl, dlogp, ref.argmax(-1), test.argmax(-1), finite)


_NEED_BATCH_AND_TEXT = "need batch_size >= 1 and at least one text"


@dataclass(frozen=True)
class LogitGateConfig:
    """How the logit gate runs: ``backend`` and ``reference`` are swap specs (see
    ``attn_implementation_for``); ``thresholds`` default to ``THRESHOLDS`` for the model's dtype;
    ``worst``: how many of the worst tokens the result lists. Checked when made.

    ``mode="prefill"``: each batch is one forward (teacher forcing over whole texts).
    ``mode="decode"``: the prompt is prefilled, then the answer is fed one token per step through
    the KV cache and the decode steps are scored; in the backend's run the prompt is prefilled by
    ``prefill`` (default: the reference, or the oracle for a stock ``hf:`` reference; a stock ``hf:``
    backend prefills itself), so both runs start from the same KV cache and only the decode steps
    differ."""

    backend: str | Backend
    reference: str = "oracle"
    batch_size: int = 8
    padding_side: str = "left"
    mode: str = "prefill"
    prefill: str | None = None
    page_size: int | None = None
    seed: int = 0
    thresholds: Thresholds | None = None
    worst: int = 5

    def __post_init__(self) -> None:
        if self.padding_side not in ("left", "right"):
            raise GateInputError(f"padding_side must be 'left' or 'right', got {self.padding_side!r}")
        if self.mode not in ("prefill", "decode"):
            raise GateInputError(f"mode must be 'prefill' or 'decode', got {self.mode!r}")
        if self.mode == "decode" and self.padding_side != "left":
            raise GateInputError("decode mode left-pads the prompts (right padding would leave holes before the answer)")
        if self.mode == "prefill" and self.prefill is not None:
            raise GateInputError("prefill= names the prefill backend of decode mode")
        if self.batch_size < 1:
            raise GateInputError(_NEED_BATCH_AND_TEXT)

    @property
    def backend_name(self) -> str:
        return self.backend if isinstance(self.backend, str) else self.backend.name

    @property
    def backend_prefill(self) -> str | None:
        """What prefills the prompt in the backend's run: None in prefill mode and for a stock
        ``hf:`` backend (it prefills itself)."""
        stock_backend = isinstance(self.backend, str) and self.backend.startswith(STOCK_PREFIX)
        if self.mode == "decode" and self.prefill is None and not stock_backend:
            return "oracle" if self.reference.startswith(STOCK_PREFIX) else self.reference
        return self.prefill

    def thresholds_for(self, dtype: str) -> Thresholds:
        if self.thresholds is not None:
            return self.thresholds
        if dtype not in THRESHOLDS:
            raise GateInputError(f"no calibrated thresholds for dtype {dtype}; pass thresholds=")
        return THRESHOLDS[dtype]


def run_logit_gate(
    model: Any,
    tokenizer: Any,
    texts: Sequence[ScoredText],
    config: LogitGateConfig,
    *,
    model_name: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> LogitGateResult:
    """Score ``texts`` under ``config.reference`` and ``config.backend`` and judge the difference.
    ``progress(done, total)`` is called after each forward pass of the model (``total`` of them in
    both runs, known up front: every batch is tokenized first)."""
    if not texts:
        raise GateInputError(_NEED_BATCH_AND_TEXT)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    thresholds = config.thresholds_for(dtype)
    prefill = config.backend_prefill
    reference_impl = attn_implementation_for(config.reference, page_size=config.page_size, seed=config.seed)
    backend_impl = attn_implementation_for(config.backend, page_size=config.page_size, seed=config.seed + 1,
                                           prefill=prefill)
    device = next(model.parameters()).device
    batches = _batches(tokenizer, texts, config, device)
    counter = _ForwardCounter(2 * sum(batch.forward_passes for _, batch in batches), progress)
    tally = _Tally(config.worst)
    for first, batch in batches:
        ref_logits = _logits(model, reference_impl, batch, counter)
        test_logits = _logits(model, backend_impl, batch, counter)
        tally.add(first, batch, ref_logits, test_logits)
    kl_all, agree_all, dlogp_all = torch.cat(tally.kls), torch.cat(tally.agree), torch.cat(tally.dlogp)
    return LogitGateResult(
        model=model_name or type(model).__name__,
        backend=config.backend_name,
        reference=config.reference,
        dtype=dtype,
        device=str(device),
        texts=len(texts),
        tokens=len(kl_all),
        batch_size=config.batch_size,
        padding_side=config.padding_side,
        mode=config.mode,
        prefill=prefill,
        mean_kl=float(kl_all.mean()),
        max_kl=float(kl_all.max()),
        top1_agreement=float(agree_all.double().mean()),
        max_abs_dlogprob=float(dlogp_all.max()),
        mean_abs_dlogprob=float(dlogp_all.mean()),
        nonfinite=tally.nonfinite,
        thresholds=thresholds,
        worst=tally.worst_tokens(tokenizer),
        versions=_versions(reference_impl, backend_impl),
        numerics=numerics(),
    )


def _batches(tokenizer: Any, texts: Sequence[ScoredText], config: LogitGateConfig,
             device: torch.device) -> list[tuple[int, _Batch]]:
    """Every batch of ``texts``, tokenized up front: (index of its first text, batch)."""
    batches = []
    for first in range(0, len(texts), config.batch_size):
        chunk = texts[first : first + config.batch_size]
        if config.mode == "prefill":
            batches.append((first, _batch(tokenizer, chunk, config.padding_side, device)))
        else:
            batches.append((first, _decode_batch(tokenizer, chunk, device)))
    return batches


class _ForwardCounter:
    """Called after each forward pass: counts them and tells ``progress(done, total)``."""

    def __init__(self, total: int, progress: Callable[[int, int], None] | None) -> None:
        self.total, self.done, self.progress = total, 0, progress

    def __call__(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)


class _Tally:
    """The per-token metrics of every scored text, and the ``worst`` highest-KL tokens of each text
    (from which the result's worst tokens overall are picked)."""

    def __init__(self, worst: int) -> None:
        self.worst = worst
        self.kls: list[torch.Tensor] = []
        self.agree: list[torch.Tensor] = []
        self.dlogp: list[torch.Tensor] = []
        self.candidates: list[tuple[float, int, int, int, int, int]] = []  # kl, text, position, gold, ref top, top
        self.nonfinite = 0

    def add(self, first: int, batch: _Batch, ref_logits: torch.Tensor, test_logits: torch.Tensor) -> None:
        for b in range(len(batch.gold)):
            rows, gold = batch.rows[b], batch.gold[b]
            m = token_metrics(ref_logits[b, rows], test_logits[b, rows], gold)
            self.nonfinite += int((~m.finite).sum())
            self.kls.append(m.kl)
            self.agree.append(m.reference_top == m.backend_top)
            self.dlogp.append(m.abs_dlogprob)
            top = torch.topk(m.kl, min(self.worst, len(m.kl)))
            self.candidates += [
                (float(v), first + b, int(i), int(gold[i]), int(m.reference_top[i]), int(m.backend_top[i]))
                for v, i in zip(top.values, top.indices)
            ]

    def worst_tokens(self, tokenizer: Any) -> list[WorstToken]:
        """The ``worst`` highest-KL tokens, highest first (NaN last), decoded."""
        decode = lambda token: tokenizer.decode([token])
        ranked = sorted(self.candidates, key=lambda c: -c[0] if not math.isnan(c[0]) else -math.inf)
        return [WorstToken(t, p, decode(g), kl, decode(r), decode(s)) for kl, t, p, g, r, s in ranked[: self.worst]]


def numerics() -> dict[str, str]:
    """torch's process-wide switches that change float32 matmul precision (TF32, bf16 passes) and its thread
    count, as they were during the gate: a float32 gate is calibrated at full precision, so a switch another
    library or test flipped explains a failure (one CI run measured mean KL 8.8e-08 where 2e-12 is usual)."""
    found = {"threads": str(torch.get_num_threads())}
    try:
        found["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    except RuntimeError:  # torch >= 2.9 refuses the legacy getter once the new API was used
        found["float32_matmul_precision"] = "mixed legacy and fp32_precision settings"
    for name in ("", "cuda.matmul", "mkldnn.matmul", "mkldnn.conv", "cudnn.conv"):
        where: Any = torch.backends
        for part in filter(None, name.split(".")):
            where = getattr(where, part, None)
        value = getattr(where, "fp32_precision", None)
        if value is not None:
            found[f"{name or 'backends'}.fp32_precision"] = str(value)
    return found


def _versions(*implementations: str) -> dict[str, str]:
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    for implementation in implementations:
        try:
            versions.update(registered_swap(implementation).backend.versions())
        except KeyError:  # stock transformers attention
            pass
    return versions


def write_result(result: LogitGateResult, folder: Any) -> None:
    """``result.json`` and ``report.md`` in ``folder``."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "result.json").write_text(json.dumps(result.to_json(), indent=1) + "\n")
    (folder / "report.md").write_text(result.to_markdown())
