"""Saving a finding of any check: one folder under ``--out/BACKEND/`` published whole
(``pa_oracle.fuzz.campaign.outdir.publish_folder``: temp folder, fsync, rename; nothing is ever
replaced), holding every case it involved (``case.json`` + ``tensors.npz``, written by
``pa_oracle.oracle.tensors.write_case``), a ``report.md`` and the repro command
(``repro_command``).

Layout: an oracle finding is ``BACKEND/CASE_ID/{case.json,tensors.npz,report.md}``, plus
``output.npz`` (the kernel's raw ``out``/``lse``, ``load_output``) when the kernel returned a
well-formed wrong output, so triage can read it instead of running the kernel again; a finding of
another check is ``BACKEND/CHECK-CASE_ID/{original,...}/{case.json,tensors.npz}`` + ``report.md``.
An oracle finding shrunk from a larger case also keeps the first failing case, as drawn before
shrinking, in ``original.json`` + ``original.npz`` (``FIRST_FAILING``): a one-key minimal case cannot
always tell apart what the error needs, and triage localizes on the larger one then.
``CASE_ID`` is the saved case's own id (it names its sidecar's content), so the folder name, the
``case_id`` in case.json, replay and triage all show the same id. Each case's ``meta`` is the finding's
record (``pa_oracle.fuzz.campaign.finding_record``: ``finding_meta`` here, read back by ``read_finding``).
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from pa_oracle.backends.base import Backend, KernelOutput
from pa_oracle.fuzz.campaign.finding_record import (
    CHECK_COMMAND,
    FIRST_FAILING,
    FIRST_FAILING_TENSORS,
    FindingMeta,
    FoundBy,
    GeneratedFrom,
    holds_finding,
    today,
)
from pa_oracle.fuzz.campaign.outdir import FindingNotSaved, publish_folder, rescue
from pa_oracle.fuzz.checks.registry import expectation
from pa_oracle.fuzz.run.runner import ORACLE_CHECK, Outcome
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.report import format_report
from pa_oracle.oracle.tensors import Tensors, make_tensors, raw_bits, save_tensors, saved_form, write_case
from pa_oracle.oracle.tolerance import Verdict


class SavedFinding(NamedTuple):
    folder: Path
    case_id: str  # the id of the saved (original) case: the folder's name ends with it
    repro: str


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def finding_meta(outcome: Outcome, backend: Backend, kernel_spec: str | None) -> FindingMeta:
    """The record of a finding of ``outcome`` on ``backend`` (``kernel_spec``: a user kernel's MODULE:FUNCTION)."""
    command = "pa-oracle fuzz" if outcome.check == ORACLE_CHECK else f"{CHECK_COMMAND}{outcome.check}"
    return FindingMeta(found_by=FoundBy(
        command=command, check=outcome.check, backend=backend.name, kernel=kernel_spec, status=outcome.status,
        message=first_line(outcome.message), versions={k: str(v) for k, v in backend.versions().items()},
        date=today(), generated_from=GeneratedFrom(outcome.case.seed, outcome.case.distribution)))


def first_line(message: str) -> str:
    return message.splitlines()[0] if message else ""


def repro_command(case_path: str, backend: str, kernel: str | None = None, check: str | None = None) -> str:
    """The command that re-runs one saved case on one backend (a user ``kernel`` as
    MODULE:FUNCTION, else the registered ``backend``): ``pa-oracle replay`` for the comparison
    with the oracle (``check`` None or "oracle"), ``pa-oracle metamorphic --check`` for any other check.

    >>> repro_command("out/a b/case.json", "sdpa-math", check="relabel")
    "pa-oracle metamorphic --case 'out/a b/case.json' --check relabel --backend sdpa-math"
    """
    if check in (None, "oracle"):
        args = ["pa-oracle", "replay", str(case_path)]
    else:
        args = ["pa-oracle", "metamorphic", "--case", str(case_path), "--check", check]
    args += ["--kernel", kernel] if kernel else ["--backend", backend]
    return shlex.join(args)


# "out max error 0.244 > 0.000977 allowed", "lse mean error ... > ... allowed": what ``tolerance.compare`` writes
_ERROR_OVER_ALLOWED = re.compile(r"\b(?:out|lse) (?:max|mean) error (\S+) > (\S+) allowed")


def finding_ratio(message: str) -> float | None:
    """The largest error over its allowed error that a finding's verdict message states (1.0 is the limit, the
    floor included, as a pass's ``worst_allowed``), or None when it states none (a crash, a hang, NaN only, a
    violated relation). Read from the message, so a result resumed or merged from a state file shows it too.

    >>> round(finding_ratio("FAIL: out max error 0.244 > 0.000977 allowed (3 x control 0 + floor 0.000977); 16 / 16 mismatch"), 1)
    249.7
    >>> finding_ratio("IndexError: index 1 is out of bounds") is None
    True
    """
    ratios = []
    for error, allowed in _ERROR_OVER_ALLOWED.findall(message):
        try:
            err, lim = float(error), float(allowed)
        except ValueError:
            continue
        ratios.append(err / lim if lim > 0 else math.inf if err > 0 else 0.0)
    return max(ratios) if ratios else None


def allowed_clause(messages: Iterable[str]) -> str:
    """``' (at 250x the allowed error)'``: the worst of ``messages``' ``finding_ratio``, as result and finding lines
    say it; '' when none states an error over its allowed one (a crash, a hang)."""
    ratios = [r for message in messages if (r := finding_ratio(message)) is not None]
    return f" (at {ratio_words(max(ratios))}x the allowed error)" if ratios else ""


def ratio_words(ratio: float) -> str:
    """A ratio to the allowed error as a result line prints it: ``'0.04'``, ``'1.31'``, ``'250'``, ``'12,345'``."""
    return f"{ratio:,.0f}" if math.isfinite(ratio) and ratio >= 100 else f"{ratio:.2f}"


def save_finding(outcome: Outcome, backend: Backend, out_dir: Path, kernel_spec: str | None = None,
                 first: Outcome | None = None) -> Path:
    """Write the finding's folder (``publish_finding``) and return it."""
    return publish_finding(outcome, backend, out_dir, kernel_spec, first=first).folder


def publish_finding(outcome: Outcome, backend: Backend, out_dir: Path, kernel_spec: str | None = None,
                    first: Outcome | None = None) -> SavedFinding:
    """Write the finding's folder and return it with the saved case's id and the repro command.
    ``first`` is the first failing outcome of the search, before shrinking: an oracle finding keeps
    its case as ``FIRST_FAILING`` beside the minimal one when it is another case. The same finding
    found again is left as it was (and returned); a different one with the same name goes beside it
    (``NAME-2``). Raises ``FindingNotSaved`` when it cannot be written, after rescuing the original
    case.json to a temp folder if possible."""
    meta = finding_meta(outcome, backend, kernel_spec)
    if outcome.check == ORACLE_CHECK:
        labelled: list[tuple[str, Case, Tensors | None]] = [("", outcome.case, None)]
    else:  # a crash or hang reported by an isolated worker names the original case only
        labelled = outcome.cases or [("original", outcome.case, None)]
    saved: list[tuple[str, Case, Tensors]] = []
    for label, case, tensors in labelled:
        tensors = tensors if tensors is not None else make_tensors(case, "cpu")
        saved.append((label, saved_form(case, tensors, (meta.replace(role=label) if label else meta).to_json()), tensors))
    original = saved[0][1]
    larger = _first_failing(first, outcome, meta)
    name = original.case_id if outcome.check == ORACLE_CHECK else f"{outcome.check}-{original.case_id}"
    parent = Path(out_dir) / safe_name(backend.name)
    first_label = saved[0][0]

    def repro(folder: Path) -> str:
        return repro_command(str(folder / first_label / "case.json"), backend.name, kernel_spec, outcome.check)

    def same(folder: Path) -> bool:
        return all(holds_finding(folder / label / "case.json", case) for label, case, _ in saved)

    def write(tmp: Path, final: Path) -> None:
        for label, case, tensors in saved:
            write_case(case, tensors, tmp / label)
        if larger is not None:
            save_tensors(larger[1], tmp / FIRST_FAILING_TENSORS)
            larger[0].save(tmp / FIRST_FAILING)
        if outcome.output is not None:
            save_output(outcome.output, tmp / first_label / OUTPUT_FILE)
        (tmp / "report.md").write_text(finding_report(outcome, backend.name, original, repro(final), backend.conversions(original)))

    try:
        folder = publish_folder(parent, name, write, already_saved=same)
    except OSError as exc:
        what = outcome.status if outcome.check == ORACLE_CHECK else f"{outcome.check} {outcome.status}"
        finding = f"{backend.name} {what}: {first_line(outcome.message)}; case {original.summary()}"
        case_json = original.replace(tensors_file=None).to_json()
        raise FindingNotSaved(parent, finding, exc, rescue("case.json", json.dumps(case_json, indent=1) + "\n")) from exc
    return SavedFinding(folder, original.case_id, repro(folder))


def _first_failing(first: Outcome | None, outcome: Outcome, meta: FindingMeta) -> tuple[Case, Tensors] | None:
    """The first failing case in its saved form (sidecar ``FIRST_FAILING_TENSORS``), when it is another
    case than the minimal one of an oracle finding; else None."""
    if first is None or outcome.check != ORACLE_CHECK or not first.is_finding or first.case.case_id == outcome.case.case_id:
        return None
    tensors = make_tensors(first.case, "cpu")
    first_meta = meta.seen(status=first.status, message=first_line(first.message)).replace(
        role="the first failing case, before shrinking (case.json is the minimal one)")
    return saved_form(first.case, tensors, first_meta.to_json()).replace(tensors_file=FIRST_FAILING_TENSORS), tensors


def save_unjudged(outcome: Outcome, backend: Backend, out_dir: Path, kernel_spec: str | None = None) -> Path:
    """Save a case the oracle could not judge (a tool error, never a finding) as
    ``BACKEND/unjudged-CASE_ID/{case.json,tensors.npz,error.txt}``, so it can be replayed and the
    error read without running the campaign again: its meta names the user kernel (``kernel``) and
    a check beyond the oracle (``check``, which ``pa-oracle replay`` judges it through), and
    ``error.txt`` starts with the command that re-runs it. Raises what writing it raised."""
    meta = finding_meta(outcome, backend, kernel_spec).seen(command="pa-oracle (the oracle could not judge this case)")
    if outcome.check != ORACLE_CHECK:
        meta = meta.replace(check=outcome.check)
    tensors = make_tensors(outcome.case, "cpu")
    saved = saved_form(outcome.case, tensors, meta.to_json())

    def write(tmp: Path, final: Path) -> None:
        write_case(saved, tensors, tmp)
        repro = repro_command(str(final / "case.json"), backend.name, kernel_spec, outcome.check)
        (tmp / "error.txt").write_text(f"To re-run it: {repro}\n\n{outcome.message}\n")

    return publish_folder(Path(out_dir) / safe_name(backend.name), f"unjudged-{saved.case_id}", write,
                          already_saved=lambda folder: holds_finding(folder / "case.json", saved))


OUTPUT_FILE = "output.npz"


def save_output(output: KernelOutput, path: Path) -> Path:
    """The kernel's raw output as bits plus dtype names (bf16 has no numpy dtype), like a sidecar."""
    arrays: dict[str, Any] = {}  # np.savez_compressed's keywords: arrays by name
    for name, t in (("out", output.out), ("lse", output.lse)):
        if t is not None:
            t = t.detach().cpu()
            arrays[f"{name}__bits"] = raw_bits(t).numpy()
            arrays[f"{name}__dtype"] = np.array(str(t.dtype).removeprefix("torch."))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    return path


def load_output(path: Path) -> KernelOutput:
    """What ``save_output`` wrote (never unpickled): the kernel's ``out`` and ``lse`` (None if it gave none)."""
    with np.load(path, allow_pickle=False) as archive:
        tensors = {
            name: torch.from_numpy(archive[f"{name}__bits"].copy()).view(getattr(torch, str(archive[f"{name}__dtype"])))
            for name in ("out", "lse") if f"{name}__bits" in archive.files
        }
    return KernelOutput(tensors["out"], tensors.get("lse"))


def _crash_verdict(outcome: Outcome) -> Verdict:
    return Verdict(False, [f"crash: {outcome.message.splitlines()[0]}"])


def finding_report(outcome: Outcome, backend: str, saved: Case, repro: str | None = None,
                   conversions: tuple[str, ...] = ()) -> str:
    """Markdown for a finding: the oracle's failure report, or a check's expectation, what
    happened, where, its cases; both with the repro command and a crash's traceback."""
    if outcome.check == ORACLE_CHECK:
        report = format_report(saved, backend, outcome.verdict or _crash_verdict(outcome), repro, conversions)
        if outcome.status == "crash":
            report += f"\n## Crash\n\n```\n{outcome.message}\n```\n"
        return report
    return format_check_report(outcome, repro, saved.case_id)


def format_check_report(outcome: Outcome, repro: str | None = None, case_id: str | None = None) -> str:
    """Markdown: the check and its expectation, what happened, where, the cases, the repro."""
    original = outcome.cases[0][1] if outcome.cases else outcome.case
    word = {"fail": "VIOLATED"}.get(outcome.status, outcome.status.upper())
    lines = [f"# {outcome.backend}: {outcome.check} {word} on case {case_id or original.case_id}", ""]
    expected = expectation(outcome.check)
    if expected is not None:
        lines.append(f"- expected: {expected[0]} ({expected[1]})")
    lines += [f"- {line}" for line in outcome.message.splitlines()[:1]]
    if outcome.worst is not None:
        lines.append(f"- largest difference at {outcome.worst.describe()}")
    if repro:
        lines += ["", "To recreate this report, run:", "", f"    {repro}"]
    lines += ["", "## Cases", ""]
    for label, case, _ in outcome.cases or [("original", original, None)]:
        lay = case.layout
        lines += [
            f"- **{label}** (`{label}/case.json`): {case.summary()}",
            f"  - qo_indptr {list(lay.qo_indptr)}; kv_indptr {list(lay.kv_indptr)}",
            f"  - kv_indices {list(lay.kv_indices)}; kv_last_page_len {list(lay.kv_last_page_len)}",
        ]
    if outcome.status == "crash":
        lines += ["", "## Crash", "", "```", outcome.message, "```"]
    return "\n".join(lines) + "\n"


WRITE_FINDING = "writes.json"  # a write finding's one file: the case, the kernel, its verdict and the record (``meta``)


def write_repro(folder: Path, backend: Backend) -> str:
    """``pa-oracle writes --case FOLDER/writes.json`` on the kernel that failed it (``-b NAME`` or ``--kernel``)."""
    flag = "--kernel" if getattr(backend, "user", False) else "-b"
    return shlex.join(["pa-oracle", "writes", flag, backend.name, "--case", str(folder / WRITE_FINDING)])


def publish_write_finding(outcome: Outcome, backend: Backend, out_dir: Path) -> tuple[Path, str]:
    """A write check's finding (``pa_oracle.fuzz.checks.append.WRITE``) as ``OUT/KERNEL-CASE_ID/writes.json`` (the
    case as ``AppendCase.to_json``, ``kernel``, ``status``, ``detail`` as before the engine ran writes, and ``meta``:
    the finding record, ``FindingMeta``, as a case.json's) + ``report.md``; (folder, repro). Never overwrites one."""
    from pa_oracle.fuzz.checks.append import write_case

    case = write_case(outcome)
    user = getattr(backend, "user", False)
    meta = FindingMeta(found_by=FoundBy(
        command="pa-oracle writes", check=outcome.check, backend=backend.name, kernel=backend.name if user else None,
        status=outcome.status, message=first_line(outcome.message),
        versions={k: str(v) for k, v in backend.versions().items()}, date=today(),
        generated_from=GeneratedFrom(case.seed)), check=outcome.check)
    body = json.dumps({"kernel": backend.name, "case": case.to_json(), "status": outcome.status, "detail": outcome.message,
                       "meta": meta.to_json()}, indent=1, sort_keys=True)

    def write(tmp: Path, final: Path) -> None:
        (tmp / WRITE_FINDING).write_text(body + "\n")
        (tmp / "report.md").write_text(
            f"# {backend.name}: write {outcome.status}\n\n{outcome.message}\n\nCase {case.case_id}: {case.summary()}\n\n"
            f"```\n{write_repro(final, backend)}\n```\n")

    folder = publish_folder(Path(out_dir), f"{safe_name(backend.name)}-{case.case_id}", write)
    return folder, write_repro(folder, backend)
