"""GSM8k problems from a local folder of JSONL files (``{split}.jsonl``, fields ``question`` and
``answer``, the answer ending ``#### N``), as the hub's ``openai/gsm8k`` ``main`` ships them.
Gates never download data."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pa_oracle.gates.errors import GateInputError


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # worked solution, ending "#### <number>"

    @property
    def final_answer(self) -> str:
        """The number after ``####``, without thousands separators."""
        return self.answer.rsplit("####", 1)[-1].strip().replace(",", "")


def read_gsm8k(folder: str | Path, *, split: str = "test", limit: int | None = None) -> list[Problem]:
    """The first ``limit`` problems (all if None) of ``folder/{split}.jsonl``, in file order."""
    path = Path(folder) / f"{split}.jsonl"
    if not path.is_file():
        raise GateInputError(f"no GSM8k file {path} (expected {split}.jsonl with question/answer fields)")
    if limit is not None and limit < 1:
        raise GateInputError(f"limit must be >= 1, got {limit}")
    problems = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                problem = Problem(str(record["question"]), str(record["answer"]))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise GateInputError(f"{path}:{number}: not a GSM8k record with question and answer ({exc})") from None
            if "####" not in problem.answer:
                raise GateInputError(f"{path}:{number}: the answer has no '#### <number>' line")
            problems.append(problem)
            if limit is not None and len(problems) == limit:
                break
    if not problems:
        raise GateInputError(f"{path} holds no problems")
    return problems
