"""GSM8k accuracy gate: lm-eval's own ``gsm8k`` task (prompt, 5-shot, "strict-match" and
"flexible-extract" filters, exact-match metric) runs twice on one loaded model, its attention
through the backend and through the reference; the per-question outcomes are paired by doc id.

The gate fails if the exact McNemar test finds the backend significantly worse (one-sided), or,
when a golden expected accuracy exists (``golden/gsm8k/<model>.json``), if the backend's one-sided
Wilson lower bound lies below the expected accuracy minus a margin. ``lm_eval`` is imported lazily.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from pa_oracle.gates.stats import (
    McNemar,
    mcnemar_detectable_drop,
    mcnemar_exact,
    wilson_interval,
    wilson_lower_bound,
    wilson_margin,
)
from pa_oracle.gates.errors import GateInputError

from pa_oracle import golden

FILTERS = ("strict-match", "flexible-extract")  # lm-eval gsm8k.yaml's filter_list
EXPECTED_DIR = golden.gsm8k_dir()  # expected results shipped with the package
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TaskSettings:
    """What changes the score and so must match between an expected file and a run."""

    num_fewshot: int = 5
    max_gen_toks: int = 256  # lm-eval HFLM's default generation budget
    task: str = "gsm8k"

    def __post_init__(self) -> None:
        if self.num_fewshot < 0 or self.max_gen_toks < 1:
            raise GateInputError(f"need num_fewshot >= 0 and max_gen_toks >= 1, got {self}")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1-based, ``--shard 2/4``): the questions whose doc id is
    ``index - 1`` modulo ``count``. Every question keeps the prompt (few-shot examples) it has in an
    unsharded run, so shards merge into the unsharded run's questions."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.index <= self.count:
            raise GateInputError(f"shard {self.index}/{self.count}: need 1 <= I <= N")

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not match:
            raise GateInputError(f"--shard takes I/N (e.g. 1/4), got {text!r}")
        return cls(int(match[1]), int(match[2]))

    def holds(self, doc_id: int) -> bool:
        return doc_id % self.count == self.index - 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


# ---------------------------------------------------------------- the lm-eval task
def stock_task_yaml() -> Path:
    import lm_eval  # type: ignore[import-untyped]  # lm-eval ships no py.typed

    return Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"


def local_task_yaml(data_dir: Path) -> str:
    """A task config that includes lm-eval's own gsm8k.yaml (prompt, filters, metric) and reads the
    problems from ``data_dir/test.jsonl``, the few-shot examples from ``data_dir/train.jsonl``."""
    files = {split: (data_dir / f"{split}.jsonl").resolve() for split in ("train", "test")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise GateInputError(f"--data {data_dir}: missing {', '.join(missing)} (GSM8k JSONL: question, answer)")
    return (
        f"include: {json.dumps(str(stock_task_yaml()))}\n"
        "task: gsm8k\n"
        "dataset_path: json\n"
        "dataset_name: null\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    train: {json.dumps(str(files['train']))}\n"
        f"    test: {json.dumps(str(files['test']))}\n"
    )


def task_manager(data_dir: Path | None, workdir: Path) -> Any:
    """lm-eval's TaskManager: the stock tasks, or (``data_dir``) only the local gsm8k config,
    written to ``workdir`` and found through ``include_path``."""
    from lm_eval.tasks import TaskManager  # type: ignore[import-untyped]  # lm-eval ships no py.typed

    if data_dir is None:
        return TaskManager()
    (workdir / "gsm8k_local.yaml").write_text(local_task_yaml(data_dir))
    return TaskManager(include_path=str(workdir), include_defaults=False)


# ---------------------------------------------------------------- one run
@dataclass(frozen=True)
class Question:
    doc_id: int
    question: str
    target: str  # the gold final answer (after "#### ")
    prompt_hash: str  # lm-eval's hash of the full few-shot prompt: both runs must have seen the same one


@dataclass
class RunOutcome:
    """One lm-eval run: per filter, doc id -> answered right; the raw and extracted answers."""

    label: str
    correct: dict[str, dict[int, bool]]
    responses: dict[int, str]
    extracted: dict[str, dict[int, str]]
    questions: dict[int, Question]
    seconds: float = 0.0

    def accuracy(self, filter_name: str) -> float:
        outcomes = self.correct[filter_name]
        return sum(outcomes.values()) / len(outcomes)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "seconds": round(self.seconds, 3),
            "questions": [
                {
                    **asdict(q), "response": self.responses.get(i, ""),
                    "correct": {f: self.correct[f][i] for f in self.correct if i in self.correct[f]},
                    "extracted": {f: self.extracted[f][i] for f in self.extracted if i in self.extracted[f]},
                }
                for i, q in sorted(self.questions.items())
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunOutcome:
        try:
            correct: dict[str, dict[int, bool]] = {}
            extracted: dict[str, dict[int, str]] = {}
            responses, questions = {}, {}
            for record in data["questions"]:
                q = Question(int(record["doc_id"]), str(record["question"]), str(record["target"]), str(record["prompt_hash"]))
                questions[q.doc_id], responses[q.doc_id] = q, str(record["response"])
                for f, ok in record["correct"].items():
                    correct.setdefault(f, {})[q.doc_id] = bool(ok)
                for f, text in record["extracted"].items():
                    extracted.setdefault(f, {})[q.doc_id] = str(text)
            return cls(str(data["label"]), correct, responses, extracted, questions, float(data["seconds"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise GateInputError(f"a saved run lacks a field or has a malformed one ({exc!r})") from None


def merge_outcomes(parts: list[RunOutcome]) -> RunOutcome:
    """One run from runs over disjoint questions (shards) of one attention; wall times add up."""
    labels = {p.label for p in parts}
    if len(labels) != 1:
        raise GateInputError(f"cannot merge runs of different attentions: {sorted(labels)}")
    merged = RunOutcome(parts[0].label, {}, {}, {}, {}, sum(p.seconds for p in parts))
    for part in parts:
        twice = sorted(set(merged.questions) & set(part.questions))
        if twice:
            raise GateInputError(f"{part.label}: doc ids {twice[:10]} appear in more than one shard")
        merged.questions.update(part.questions)
        merged.responses.update(part.responses)
        for f, outcomes in part.correct.items():
            merged.correct.setdefault(f, {}).update(outcomes)
        for f, texts in part.extracted.items():
            merged.extracted.setdefault(f, {}).update(texts)
    return merged


def outcome_from_samples(label: str, samples: list[dict[str, Any]], *, seconds: float = 0.0) -> RunOutcome:
    """Per-question correctness from lm-eval's logged samples (``log_samples=True``): one entry per
    (doc, filter) with ``doc_id``, ``filter``, ``exact_match``, ``resps``, ``filtered_resps``."""
    correct: dict[str, dict[int, bool]] = {}
    extracted: dict[str, dict[int, str]] = {}
    responses: dict[int, str] = {}
    questions: dict[int, Question] = {}
    for sample in samples:
        try:
            doc_id, filter_name, score = int(sample["doc_id"]), str(sample["filter"]), float(sample["exact_match"])
        except (KeyError, TypeError, ValueError) as exc:
            raise GateInputError(f"{label}: a logged sample lacks doc_id/filter/exact_match ({exc!r})") from None
        if score not in (0.0, 1.0):
            raise GateInputError(f"{label}: doc {doc_id} {filter_name}: exact_match {score} is not 0 or 1")
        if doc_id in correct.setdefault(filter_name, {}):
            raise GateInputError(f"{label}: doc {doc_id} logged twice for filter {filter_name}")
        correct[filter_name][doc_id] = score == 1.0
        extracted.setdefault(filter_name, {})[doc_id] = _first_text(sample.get("filtered_resps"))
        responses.setdefault(doc_id, _first_text(sample.get("resps")))
        doc = sample.get("doc") or {}
        questions.setdefault(
            doc_id,
            Question(doc_id, str(doc.get("question", "")), str(sample.get("target", "")).rsplit("####", 1)[-1].strip(),
                     str(sample.get("prompt_hash", ""))),
        )
    if not correct:
        raise GateInputError(f"{label}: lm-eval logged no samples")
    return RunOutcome(label, correct, responses, extracted, questions, seconds)


def _first_text(value: Any) -> str:
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return "" if isinstance(value, (list, tuple)) or value is None else str(value)


@dataclass(frozen=True)
class Questions:
    """Which test questions a run answers: the first ``limit`` (None: all), of them only ``shard``'s;
    read from ``data_dir`` (test.jsonl, train.jsonl) or, None, lm-eval's hub dataset."""

    limit: int | None = None
    shard: Shard | None = None
    data_dir: Path | None = None


def run_gsm8k(
    model: Any,
    tokenizer: Any,
    *,
    attn_implementation: str,
    label: str,
    settings: TaskSettings,
    questions: Questions,
    batch_size: int = 1,
) -> RunOutcome:
    """lm-eval's gsm8k on ``model`` switched to ``attn_implementation``; greedy, as the task says.
    With ``questions.shard``, only that shard's questions are generated (the others get an empty answer and
    are dropped from the outcome), after lm-eval has built every prompt as in an unsharded run."""
    import lm_eval  # type: ignore[import-untyped]  # lm-eval ships no py.typed
    from lm_eval.models.huggingface import HFLM  # type: ignore[import-untyped]  # lm-eval ships no py.typed
    from pa_oracle.gates.swap import registered_swap

    try:
        swap = registered_swap(attn_implementation)
    except KeyError:  # a stock transformers implementation
        swap = None
    calls_before = swap.calls if swap else 0
    model.set_attn_implementation(attn_implementation)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pa-gsm8k-") as workdir, _without_env_dump():
        manager = task_manager(questions.data_dir, Path(workdir))
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
        if questions.shard is not None:
            _generate_only(lm, questions.shard)
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=[settings.task],
            task_manager=manager,
            num_fewshot=settings.num_fewshot,
            limit=questions.limit,
            log_samples=True,
            gen_kwargs={"max_gen_toks": settings.max_gen_toks},
            bootstrap_iters=0,
        )
    if swap is not None and swap.calls == calls_before:
        raise GateInputError(f"{label}: the model never called the swapped attention ({attn_implementation})")
    samples = results["samples"][settings.task]
    outcome = outcome_from_samples(label, samples, seconds=time.monotonic() - start)
    for filter_name in outcome.correct:  # our tally (over every logged question) must be lm-eval's own score
        reported = results["results"][settings.task].get(f"exact_match,{filter_name}")
        if reported is not None and abs(float(reported) - outcome.accuracy(filter_name)) > 1e-9:
            raise GateInputError(f"{label}: {filter_name} per-question mean {outcome.accuracy(filter_name)} != lm-eval's {reported}")
    if questions.shard is not None:
        shard = questions.shard
        outcome = outcome_from_samples(label, [x for x in samples if shard.holds(int(x["doc_id"]))], seconds=outcome.seconds)
    return outcome


def _generate_only(lm: Any, shard: Shard) -> None:
    """Make ``lm`` generate only for ``shard``'s questions; the others get "" (scored wrong, then
    dropped). Filtering here rather than through lm-eval's ``samples`` keeps each question's prompt:
    lm-eval draws the few-shot examples from one random stream in doc order."""
    generate = lm.generate_until

    def generate_until(requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        chosen = [i for i, request in enumerate(requests) if shard.holds(int(request.doc_id))]
        answers = generate([requests[i] for i in chosen], disable_tqdm=disable_tqdm) if chosen else []
        out = [""] * len(requests)
        for i, answer in zip(chosen, answers, strict=True):
            out[i] = answer
        return out

    lm.generate_until = generate_until


@contextlib.contextmanager
def _without_env_dump() -> Iterator[None]:
    """lm-eval ends every run with torch's collect_env (``pip list`` and friends in subprocesses:
    seconds per run) for a report field the gate never reads; skip it."""
    import lm_eval.evaluator  # type: ignore[import-untyped]  # lm-eval ships no py.typed

    if not hasattr(lm_eval.evaluator, "add_env_info"):
        yield
        return
    with mock.patch.object(lm_eval.evaluator, "add_env_info", lambda results: None):
        yield


# ---------------------------------------------------------------- expected accuracy (golden)
@dataclass(frozen=True)
class Expected:
    """A golden accuracy: ``golden/gsm8k/<model>.json``."""

    model: str
    task: TaskSettings
    n: int
    accuracy: dict[str, float]  # per filter
    date: str
    lm_eval_version: str
    reference: str = ""  # the attention implementation that measured it
    model_sha256: str = ""  # of the GGUF file ("" for a model folder)
    dtype: str = ""  # the dtype the model ran in
    seconds: float = 0.0  # the reference run's wall time
    schema_version: int = SCHEMA_VERSION


def model_key(model: str, gguf_file: str | None = None) -> str:
    """The name of a model's golden file: the GGUF file's stem, else the folder name or hub id."""
    if gguf_file or str(model).endswith(".gguf"):
        name = Path(gguf_file or model).stem
    elif Path(model).exists():
        name = Path(model).resolve().name
    else:
        name = model.replace("/", "--")
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def load_expected(path: Path) -> Expected:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise GateInputError(f"expected file {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise GateInputError(f"expected file {path}: schema_version {data.get('schema_version') if isinstance(data, dict) else None!r}, this version reads {SCHEMA_VERSION}")
    try:
        expected = Expected(
            model=str(data["model"]), task=TaskSettings(**data["task"]), n=int(data["n"]),
            accuracy={str(k): float(v) for k, v in data["accuracy"].items()}, date=str(data["date"]),
            lm_eval_version=str(data["lm_eval_version"]), reference=str(data.get("reference", "")),
            model_sha256=str(data.get("model_sha256", "")), dtype=str(data.get("dtype", "")),
            seconds=float(data.get("seconds", 0.0)),
        )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise GateInputError(f"expected file {path}: missing or malformed field ({exc!r}); fields: {', '.join(Expected.__dataclass_fields__)}") from None
    bad = {k: v for k, v in expected.accuracy.items() if k not in FILTERS or not 0 <= v <= 1}
    if bad or expected.n < 1:
        raise GateInputError(f"expected file {path}: accuracies must be in [0, 1] for filters {FILTERS} and n >= 1, got {bad or expected.n}")
    return expected


def save_expected(path: Path, expected: Expected) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = asdict(expected)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def check_expected(expected: Expected, *, model: str, settings: TaskSettings, model_sha256: str = "") -> None:
    """An expected accuracy applies only to the same model (and model file, where both know its hash)
    and task settings."""
    if expected.task != settings:
        raise GateInputError(f"expected accuracy was measured with {expected.task}, this run uses {settings}")
    if expected.model != model:
        raise GateInputError(f"expected accuracy is for model {expected.model!r}, this run is {model!r}")
    if expected.model_sha256 and model_sha256 and expected.model_sha256 != model_sha256:
        raise GateInputError(
            f"expected accuracy is for a model file with sha256 {expected.model_sha256[:16]}..., this one is {model_sha256[:16]}..."
        )


def expected_from_run(
    outcome: RunOutcome, *, model: str, settings: TaskSettings, model_sha256: str = "", dtype: str = ""
) -> Expected:
    from importlib.metadata import version

    return Expected(
        model=model, task=settings, n=len(outcome.questions),
        accuracy={f: round(outcome.accuracy(f), 6) for f in outcome.correct}, date=datetime.date.today().isoformat(),
        lm_eval_version=version("lm-eval"), reference=outcome.label, model_sha256=model_sha256, dtype=dtype,
        seconds=round(outcome.seconds, 1),
    )


def file_sha256(path: str | Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- saved runs (shards, a reused reference)
RUNS_FILE = "runs.json"


@dataclass
class SavedRuns:
    """What one gate invocation ran (``runs.json`` beside its report): enough to merge shards into
    one verdict, or to reuse its reference run against another backend."""

    model: str
    settings: TaskSettings
    limit: int | None
    shard: Shard | None
    backend: str
    reference: str
    outcomes: dict[str, RunOutcome]  # by label: the backend's and the reference's (only the latter, mid-gate)
    model_sha256: str = ""
    dtype: str = ""
    lm_eval_version: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "model": self.model, "model_sha256": self.model_sha256, "dtype": self.dtype,
            "task": asdict(self.settings), "limit": self.limit, "shard": None if self.shard is None else str(self.shard),
            "lm_eval_version": self.lm_eval_version, "backend": self.backend, "reference": self.reference,
            "runs": {label: run.to_json() for label, run in self.outcomes.items()},
        }

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / RUNS_FILE
        path.write_text(json.dumps(self.to_json()) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> SavedRuns:
        path = Path(path)
        path = path / RUNS_FILE if path.is_dir() else path
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise GateInputError(f"saved runs {path}: {exc}") from None
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise GateInputError(f"saved runs {path}: not a {RUNS_FILE} of schema_version {SCHEMA_VERSION}")
        try:
            return cls(
                model=str(data["model"]), settings=TaskSettings(**data["task"]), limit=data["limit"],
                shard=None if data["shard"] is None else Shard.parse(data["shard"]), backend=str(data["backend"]),
                reference=str(data["reference"]),
                outcomes={label: RunOutcome.from_json(run) for label, run in data["runs"].items()},
                model_sha256=str(data.get("model_sha256", "")), dtype=str(data.get("dtype", "")),
                lm_eval_version=str(data.get("lm_eval_version", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GateInputError(f"saved runs {path}: missing or malformed field ({exc!r})") from None

    def same_task(self, other: SavedRuns, *, what: str) -> None:
        """Raise unless ``other`` ran the same model (file), task settings, limit and dtype."""
        mine = (self.model, self.model_sha256, self.settings, self.limit, self.dtype)
        theirs = (other.model, other.model_sha256, other.settings, other.limit, other.dtype)
        if mine != theirs:
            raise GateInputError(
                f"{what}: (model, sha256, task, limit, dtype) {theirs} differ from {mine}"
            )


def merge_saved(parts: list[SavedRuns]) -> SavedRuns:
    """The shards ``1/N`` .. ``N/N`` of one gate as one unsharded gate (each shard once)."""
    if not parts:
        raise GateInputError("nothing to merge")
    first = parts[0]
    for part in parts[1:]:
        first.same_task(part, what=f"shard {part.shard}")
        if (part.backend, part.reference) != (first.backend, first.reference):
            raise GateInputError(f"shard {part.shard} ran {part.backend} vs {part.reference}, shard {first.shard} {first.backend} vs {first.reference}")
    shards = [p.shard for p in parts if p.shard is not None]
    counts = {shard.count for shard in shards}
    if len(shards) != len(parts) or len(counts) != 1:
        raise GateInputError(f"merge takes the shards of one --shard I/N split, got {sorted(str(p.shard) for p in parts)}")
    count = counts.pop()
    indices = sorted(shard.index for shard in shards)
    if indices != list(range(1, count + 1)):
        raise GateInputError(f"need each of the shards 1/{count} .. {count}/{count} once, got {', '.join(f'{i}/{count}' for i in indices)}")
    for part in parts:
        missing = [label for label in (first.backend, first.reference) if label not in part.outcomes]
        if missing:
            raise GateInputError(f"shard {part.shard} has no run of {', '.join(missing)} (cut short?)")
    outcomes = {label: merge_outcomes([p.outcomes[label] for p in parts]) for label in (first.backend, first.reference)}
    return SavedRuns(first.model, first.settings, first.limit, None, first.backend, first.reference, outcomes,
                     first.model_sha256, first.dtype, first.lm_eval_version)


# ---------------------------------------------------------------- the verdict
@dataclass(frozen=True)
class FilterVerdict:
    filter: str
    n: int
    backend_correct: int
    reference_correct: int
    backend_interval: tuple[float, float]  # Wilson 95%
    reference_interval: tuple[float, float]
    mcnemar: McNemar
    detectable_drop: float  # what McNemar detects with 80% power at this n, noise = the observed wins
    expected: float | None = None
    margin: float | None = None
    backend_lower_bound: float | None = None  # one-sided Wilson at 1 - alpha
    failures: tuple[str, ...] = ()

    @property
    def backend_accuracy(self) -> float:
        return self.backend_correct / self.n

    @property
    def reference_accuracy(self) -> float:
        return self.reference_correct / self.n


@dataclass(frozen=True)
class GateResult:
    backend: str
    reference: str
    model: str
    settings: TaskSettings
    alpha: float
    gated: tuple[str, ...]
    verdicts: dict[str, FilterVerdict]
    identical_responses: int
    losses: dict[str, list[int]] = field(default_factory=dict)  # per filter, doc ids the backend lost
    wins: dict[str, list[int]] = field(default_factory=dict)
    expected_source: str | None = None

    @property
    def failures(self) -> list[str]:
        return [f"{name}: {why}" for name in self.gated for why in self.verdicts[name].failures]

    @property
    def passed(self) -> bool:
        return not self.failures


def pair(backend: RunOutcome, reference: RunOutcome, filter_name: str) -> list[tuple[int, bool, bool]]:
    """(doc id, backend right, reference right) for every question; both runs must cover the same
    questions with the same prompts."""
    for run in (backend, reference):
        if filter_name not in run.correct:
            raise GateInputError(f"{run.label}: no outcomes for filter {filter_name!r} (has {sorted(run.correct)})")
    ids_b, ids_r = set(backend.correct[filter_name]), set(reference.correct[filter_name])
    if ids_b != ids_r:
        raise GateInputError(
            f"runs cover different questions: only {backend.label}: {sorted(ids_b - ids_r)[:10]}, "
            f"only {reference.label}: {sorted(ids_r - ids_b)[:10]}"
        )
    for doc_id in sorted(ids_b):
        qb, qr = backend.questions.get(doc_id), reference.questions.get(doc_id)
        if qb and qr and qb.prompt_hash != qr.prompt_hash:
            raise GateInputError(f"doc {doc_id}: the two runs saw different prompts (few-shot examples or seed differ)")
    return [(i, backend.correct[filter_name][i], reference.correct[filter_name][i]) for i in sorted(ids_b)]


@dataclass(frozen=True)
class Criteria:
    """How the runs are judged: ``gated`` filters decide pass/fail at significance ``alpha``; ``margin``
    below the expected accuracy is allowed (None: the smallest margin at which a backend exactly at
    the expected accuracy fails with probability <= alpha, ``stats.wilson_margin``)."""

    alpha: float = 0.05
    gated: tuple[str, ...] = ("flexible-extract",)
    margin: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise GateInputError(f"alpha must lie in (0, 0.5), got {self.alpha}")


def judge(
    backend: RunOutcome,
    reference: RunOutcome,
    *,
    model: str,
    settings: TaskSettings,
    criteria: Criteria = Criteria(),
    expected: Expected | None = None,
    expected_source: str | None = None,
) -> GateResult:
    """Pair the runs and judge every filter by ``criteria``, against ``expected`` where given."""
    if expected is not None:
        check_expected(expected, model=model, settings=settings)
    verdicts, losses, wins = {}, {}, {}
    for filter_name in FILTERS:
        if filter_name not in backend.correct and filter_name not in criteria.gated:
            continue
        pairs = pair(backend, reference, filter_name)
        losses[filter_name] = [i for i, b, r in pairs if r and not b]
        wins[filter_name] = [i for i, b, r in pairs if b and not r]
        target = expected.accuracy.get(filter_name) if expected else None
        verdicts[filter_name] = _filter_verdict(filter_name, pairs, criteria, target)
    identical = sum(backend.responses.get(i) == reference.responses.get(i) for i in reference.responses)
    return GateResult(
        backend.label, reference.label, model, settings, criteria.alpha, tuple(criteria.gated), verdicts, identical,
        losses, wins, expected_source,
    )


def _filter_verdict(filter_name: str, pairs: list[tuple[int, bool, bool]], criteria: Criteria,
                    target: float | None) -> FilterVerdict:
    """One filter's verdict on the paired outcomes: McNemar, and the Wilson bound against ``target``
    (the expected accuracy, if any)."""
    alpha, n = criteria.alpha, len(pairs)
    b_right, r_right = sum(b for _, b, _ in pairs), sum(r for _, _, r in pairs)
    test = mcnemar_exact(sum(r and not b for _, b, r in pairs), sum(b and not r for _, b, r in pairs))
    failures = []
    if test.p_backend_worse <= alpha:
        failures.append(
            f"McNemar: backend loses {test.losses} questions the reference answers and wins {test.wins}, "
            f"one-sided p = {test.p_backend_worse:.3g} <= alpha {alpha}"
        )
    baseline = r_right / n
    noise = min(test.wins / n, baseline, 1 - baseline)
    used_margin = bound = None
    if target is not None:
        used_margin = wilson_margin(n, expected=target, alpha=alpha) if criteria.margin is None else criteria.margin
        bound = wilson_lower_bound(b_right, n, alpha=alpha)
        if bound < target - used_margin:
            failures.append(
                f"Wilson lower bound {bound:.4f} ({b_right}/{n} right) < expected {target:.4f} - margin {used_margin:.4f}"
            )
    return FilterVerdict(
        filter_name, n, b_right, r_right, wilson_interval(b_right, n), wilson_interval(r_right, n), test,
        mcnemar_detectable_drop(n, baseline=baseline, discordance=noise, alpha=alpha), target, used_margin, bound,
        tuple(failures),
    )


# ---------------------------------------------------------------- reports
def result_json(result: GateResult, backend: RunOutcome, reference: RunOutcome) -> dict[str, Any]:
    def filter_json(v: FilterVerdict) -> dict[str, Any]:
        return {
            "n": v.n, "backend_accuracy": v.backend_accuracy, "reference_accuracy": v.reference_accuracy,
            "backend_wilson95": list(v.backend_interval), "reference_wilson95": list(v.reference_interval),
            "losses": v.mcnemar.losses, "wins": v.mcnemar.wins, "mcnemar_p_two_sided": v.mcnemar.p_two_sided,
            "mcnemar_p_backend_worse": v.mcnemar.p_backend_worse, "detectable_drop_80pct": _finite(v.detectable_drop),
            "expected": v.expected, "margin": v.margin, "backend_lower_bound": v.backend_lower_bound,
            "gated": v.filter in result.gated, "failures": list(v.failures),
            "lost_doc_ids": result.losses.get(v.filter, []), "won_doc_ids": result.wins.get(v.filter, []),
        }

    return {
        "gate": "gsm8k", "passed": result.passed, "failures": result.failures, "model": result.model,
        "backend": result.backend, "reference": result.reference, "task": asdict(result.settings), "alpha": result.alpha,
        "expected_file": result.expected_source, "identical_responses": result.identical_responses,
        "seconds": {backend.label: round(backend.seconds, 1), reference.label: round(reference.seconds, 1)},
        "accuracy": {
            run.label: {f: run.accuracy(f) for f in result.verdicts if f in run.correct} for run in (backend, reference)
        },
        "filters": {name: filter_json(v) for name, v in result.verdicts.items()},
        "questions": [
            {
                "doc_id": i, "target": q.target,
                "backend": {f: backend.correct[f][i] for f in result.verdicts},
                "reference": {f: reference.correct[f][i] for f in result.verdicts},
                "backend_answer": {f: backend.extracted[f][i] for f in result.verdicts},
                "reference_answer": {f: reference.extracted[f][i] for f in result.verdicts},
                "same_generation": backend.responses.get(i) == reference.responses.get(i),
            }
            for i, q in sorted(reference.questions.items())
        ],
    }


def _finite(x: float) -> float | None:
    return None if x == float("inf") else x


def _ids(ids: list[int], shown: int = 40) -> str:
    if not ids:
        return "none"
    return ", ".join(map(str, ids[:shown])) + (f", ... ({len(ids)} in all)" if len(ids) > shown else "")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def result_markdown(result: GateResult, backend: RunOutcome, reference: RunOutcome, *, command: str = "", shown: int = 5) -> str:
    lines = [
        f"# GSM8k gate: {'PASS' if result.passed else 'FAIL'} ({result.backend} vs {result.reference})", "",
        *([f"- {f}" for f in result.failures] or ["No gated check failed."]), "",
    ]
    if command:
        lines += ["To recreate this report, run:", "", f"    {command}", ""]
    s = result.settings
    lines += [
        (
            f"Model `{result.model}`; lm-eval task `{s.task}`, {s.num_fewshot}-shot, greedy, max {s.max_gen_toks} new "
            f"tokens; alpha {result.alpha}; gated filters: {', '.join(result.gated)}; "
            f"expected: {result.expected_source or 'none'}."
        ),
        (
            f"Identical generations: {result.identical_responses}/{len(reference.responses)}. "
            f"Time: backend {backend.seconds:.0f} s, reference {reference.seconds:.0f} s."
        ),
        "",
        "| filter | n | backend (Wilson 95%) | reference (Wilson 95%) | lost / won | McNemar p (worse / two-sided) | detects (80%) | expected - margin | backend lower bound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in result.verdicts.values():
        lo_b, hi_b = v.backend_interval
        lo_r, hi_r = v.reference_interval
        floor = None if v.expected is None or v.margin is None else v.expected - v.margin
        detects = "no drop" if v.detectable_drop == float("inf") else f"{100 * v.detectable_drop:.1f} pts"
        lines.append(
            f"| {v.filter}{' (gated)' if v.filter in result.gated else ''} | {v.n} | {_pct(v.backend_accuracy)} ({_pct(lo_b)}-{_pct(hi_b)}) "
            f"| {_pct(v.reference_accuracy)} ({_pct(lo_r)}-{_pct(hi_r)}) | {v.mcnemar.losses} / {v.mcnemar.wins} "
            f"| {v.mcnemar.p_backend_worse:.3g} / {v.mcnemar.p_two_sided:.3g} | {detects} | {_pct(floor)} | {_pct(v.backend_lower_bound)} |"
        )
    lines.append("")
    for v in result.verdicts.values():
        lost, won = result.losses.get(v.filter, []), result.wins.get(v.filter, [])
        lines.append(f"- {v.filter}: lost doc ids {_ids(lost)}; won doc ids {_ids(won)}")
    lines += [
        "",
        (
            "'detects': the drop the one-sided McNemar test catches with 80% power at this n, taking the observed "
            "wins as the noise rate; 'no drop' when the reference answers too few questions right."
        ),
        "",
    ]
    for name in result.gated:
        lost = result.losses.get(name, [])
        if lost:
            lines += [f"## Questions the backend lost ({name}: {len(lost)}, first {min(shown, len(lost))})", ""]
            for doc_id in lost[:shown]:
                q = reference.questions[doc_id]
                lines += [
                    f"### doc {doc_id} (answer {q.target})", "", f"> {q.question}", "",
                    f"reference -> `{reference.extracted[name].get(doc_id, '')}`:", "", "```", reference.responses.get(doc_id, "").strip(), "```",
                    f"backend -> `{backend.extracted[name].get(doc_id, '')}`:", "", "```", backend.responses.get(doc_id, "").strip(), "```", "",
                ]
    return "\n".join(lines)


def write_reports(out_dir: Path, result: GateResult, backend: RunOutcome, reference: RunOutcome, *, command: str = "") -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "gsm8k.json", out_dir / "gsm8k.md"
    json_path.write_text(json.dumps(result_json(result, backend, reference), indent=1) + "\n")
    md_path.write_text(result_markdown(result, backend, reference, command=command))
    return json_path, md_path

