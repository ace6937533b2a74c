"""Replay a corpus of saved cases (the golden cases, or any case files; attention cases on attention kernels,
saved write cases on write kernels) on backends and record,
per case and backend, the verdict, what the ledger makes of it (known, fixed in X, new finding)
and the environment's versions; a case whose ``meta.check`` names a check is judged through it (``pa-oracle replay --json``); compare two such records taken on
two environments (``pa-oracle replay-compare``: fixed / regressed / same / new)."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from pa_oracle.fuzz.campaign.finding_record import read_finding
from pa_oracle.fuzz.campaign.ledger import Entry, check_mismatches, golden_check, ledger_verdict, lookup, quarantined_class
from pa_oracle.fuzz.campaign.write_files import holds_write_case, read_write_case
from pa_oracle.fuzz.checks.append import WRITE, WRITE_CHECK, engine_case
from pa_oracle.fuzz.checks.registry import ALL_CHECKS
from pa_oracle.fuzz.run.runner import ORACLE_CHECK
from pa_oracle.oracle.append import AppendCase
from pa_oracle.oracle.case import Case, CaseError, read_json
from pa_oracle.oracle.errors import BadInput
from pa_oracle.oracle.schema import convert

REPLAY_SCHEMA = 1
REPLAY_KIND = "pa-oracle-replay"
FAILING = ("fail", "crash")


class ReplayError(BadInput):
    """A corpus or replay record that cannot be read: the message names the file."""


@dataclass(frozen=True)
class Record:
    """One case on one backend."""

    case: str  # the file stem (a golden case's ledger name)
    file: str
    case_id: str
    backend: str
    family: str
    status: str  # pass, fail, crash, unsupported, error, or "quarantine" (never launched)
    message: str
    ledger: str  # LedgerVerdict.kind
    ledger_message: str
    versions: dict[str, str]
    check: str = ORACLE_CHECK  # the check that judged it (the case's meta.check)


def corpus_files(paths: Iterable[Path]) -> list[Path]:
    """The case files named: a folder gives its ``*.json`` (sorted), a file itself."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(path.glob("*.json"))
            if not found:
                raise ReplayError(f"{path}: no case files (*.json) in this folder")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ReplayError(f"{path}: no such case file or folder")
    if not files:
        raise ReplayError("give case files or a folder of them (e.g. the golden cases)")
    return files


def environment(backends: list[Any], unavailable: dict[str, str]) -> dict[str, Any]:
    """Where the replay ran: Python, torch, the GPU, and every available backend's versions."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    packages: dict[str, str] = {}
    for backend in backends:
        packages.update(backend.versions())
    return {"python": platform.python_version(), "torch": torch.__version__, "gpu": gpu,
            "packages": dict(sorted(packages.items())), "unavailable": unavailable}



def replay_corpus(
    files: list[Path],
    backends: list[Any],
    ledger: list[Entry],
    judge_for: Callable[[Any, Any], Any],
    progress: Callable[[Record], None] = lambda record: None,
) -> list[Record]:
    """Judge every case on every backend of its kind (``corpus_case``: a write case by the write check) through the
    check its ``meta.check`` names (default: the oracle); ``judge_for(backend, check)`` is a context manager yielding a judge, e.g.
    ``case_judge(backend, judge=check)``, opened once per backend and check that has cases. A check
    that cannot apply to a backend is ``unsupported`` there (not launched), quarantined pairs are
    not launched. A case that does not load, names no known check, or whose ledger entry names
    another check is bad input (``ReplayError``), never a verdict."""
    cases = [corpus_case(path) for path in files]
    mismatched = check_mismatches(ledger, {path.stem: check for path, _, check in cases})
    if mismatched:
        raise ReplayError("; ".join(mismatched))
    records: list[Record] = []
    for backend in backends:
        versions, family = backend.versions(), backend.kernel_family
        with ExitStack() as stack:
            judges: dict[str, Callable[[Any], Any]] = {}
            for path, case, check_name in cases:
                if (check_name == WRITE_CHECK) != (backend.kind == "write"):
                    continue  # a case is judged on the kernels of its kind only
                check = WRITE if check_name == WRITE_CHECK else ALL_CHECKS[check_name]
                entry = lookup(ledger, path.stem, backend.name, versions, family, check_name)
                if entry is None:  # a case inside a quarantined class of another entry is not launched either
                    entry = quarantined_class(ledger, path.stem, case, backend.name, versions, family, check_name)
                applies = check.capabilities(backend)
                if entry is not None and entry.status == "quarantine":
                    status, message = "quarantine", "not launched"
                elif isinstance(applies, str):
                    status, message = "unsupported", f"{check_name}: {applies}"
                else:
                    if check_name not in judges:
                        judges[check_name] = stack.enter_context(judge_for(backend, check))
                    outcome = judges[check_name](engine_case(case) if isinstance(case, AppendCase) else case)
                    status, message = outcome.status, outcome.message
                verdict = ledger_verdict(ledger, path.stem, backend.name, versions,
                                         None if status == "quarantine" else status, family, check_name, case)
                record = Record(path.stem, str(path), _file_case_id(case), backend.name, family, status, message,
                                verdict.kind, verdict.message, versions, check_name)
                records.append(record)
                progress(record)
    return records


def _file_case_id(case: Any) -> str:
    """The id of the case as its file names it (a sidecar by its file name, not this machine's path)."""
    sidecar = getattr(case, "tensors_file", None)  # (a write case has none)
    return case.replace(tensors_file=Path(sidecar).name).case_id if sidecar else case.case_id


def corpus_case(path: Path) -> tuple[Path, Case | AppendCase, str]:
    """A corpus file, its case and the check that judges it: a saved write case (``holds_write_case``) the write
    check, an attention case its ``meta.check`` (default: the oracle); ``ReplayError`` naming the file and field."""
    try:
        if holds_write_case(path):
            return path, read_write_case(path), WRITE_CHECK
        case = read_finding(path).case  # the case, its sidecar and its meta (the finding record) checked
        return path, case, golden_check(case, path)
    except CaseError as exc:
        raise ReplayError(str(exc)) from None


def corpus_kinds(files: list[Path]) -> dict[str, list[Path]]:
    """The corpus's files by the kind of kernel that judges them ("attention", "write"), in their order."""
    kinds: dict[str, list[Path]] = {}
    for path in files:
        kinds.setdefault("write" if holds_write_case(path) else "attention", []).append(path)
    return kinds


def corpus_backends(kinds: dict[str, list[Path]], names: tuple[str, ...],
                    kernels: tuple[str, ...]) -> tuple[list[Any], dict[str, str]]:
    """The kernels a corpus (``corpus_kinds``) replays on, and why the others are unavailable: for each kind of case
    it holds, the kernels of that kind named (``-b`` by its registry's kind; ``--kernel`` when it holds one kind),
    else every one available here. A kind of case no kernel judges, or ``--kernel`` with cases of both kinds, is a
    ``ReplayError`` naming the files (a ``BackendSpecError`` for a name that cannot be used)."""
    from pa_oracle.backends import available, resolve
    from pa_oracle.backends import names as registered

    if kernels and len(kinds) > 1:
        raise ReplayError(f"--kernel {kernels[0]}: a kernel of your own is of one kind, and this corpus holds attention "
                          f"cases ({kinds['attention'][0]}, ...) and write cases ({kinds['write'][0]}, ...): replay each "
                          "kind apart, or name registered kernels of both kinds with -b")
    registry = registered(None)
    chosen: list[Any] = []
    unavailable: dict[str, str] = {}
    for kind, files in kinds.items():
        mine = names if len(kinds) == 1 else tuple(n for n in names if registry.get(n, "attention") == kind)
        if names and not mine and not kernels:
            raise ReplayError(f"{files[0]}: {_a(kind)} case, but no {kind} kernel was given (-b {' -b '.join(names)}): "
                              f"name one with -b (pa-oracle env lists them), or replay the {kind} cases apart")
        if mine or kernels:
            backends = resolve(mine, kernels, kind=kind)
        else:
            backends, missing = available(kind)
            unavailable.update(missing)
        if not backends:
            raise ReplayError(f"{files[0]}: {_a(kind)} case, and no {kind} kernel can run here (pa-oracle env says why)")
        chosen += backends
    return chosen, unavailable


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def replay_document(records: list[Record], env: dict[str, Any]) -> dict[str, Any]:
    """The record ``replay --json`` writes: with the cases and backends it replayed, so that a record cut short
    is told from a whole one (``load_replay``)."""
    return {"schema_version": REPLAY_SCHEMA, "kind": REPLAY_KIND, "environment": env,
            "cases": list(dict.fromkeys(r.case for r in records)), "backends": list(dict.fromkeys(r.backend for r in records)),
            "results": [asdict(r) for r in records]}


RecordStatus = Literal["pass", "fail", "crash", "unsupported", "error", "quarantine"]
LedgerKind = Literal["pass", "known", "fixed", "finding", "unexpected-pass", "error", "no-verdict", "quarantine"]
_Text = Annotated[str, msgspec.Meta(min_length=1)]
_Unset = msgspec.UnsetType


class _RecordFile(msgspec.Struct, forbid_unknown_fields=True):
    """One result of a record, as ``Record`` writes it: case, backend and status given, the rest may
    be absent (a hand-made record) but is of its type when given."""

    case: _Text
    backend: _Text
    status: RecordStatus
    file: str | _Unset = msgspec.UNSET
    case_id: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{12}$")] | _Unset = msgspec.UNSET
    family: str | _Unset = msgspec.UNSET
    message: str | _Unset = msgspec.UNSET
    ledger: LedgerKind | _Unset = msgspec.UNSET
    ledger_message: str | _Unset = msgspec.UNSET
    versions: dict[str, str] | _Unset = msgspec.UNSET
    check: _Text | _Unset = msgspec.UNSET


class _EnvironmentFile(msgspec.Struct, forbid_unknown_fields=True):
    python: str | None | _Unset = msgspec.UNSET
    torch: str | None | _Unset = msgspec.UNSET
    gpu: str | None | _Unset = msgspec.UNSET
    packages: dict[str, str] | _Unset = msgspec.UNSET
    unavailable: dict[str, str] | _Unset = msgspec.UNSET


class _ReplayFile(msgspec.Struct, forbid_unknown_fields=True):
    schema_version: int
    kind: str
    results: list[_RecordFile]
    environment: _EnvironmentFile | _Unset = msgspec.UNSET
    cases: list[_Text] | _Unset = msgspec.UNSET  # what was replayed (absent from records written before they were kept)
    backends: list[_Text] | _Unset = msgspec.UNSET


class ReplayDocument(dict[str, Any]):
    """A record as read (its JSON object), with the file it came from, for messages."""

    path: Path


def load_replay(path: Path) -> dict[str, Any]:
    """A ``replay --json`` document, read strictly (``ReplayError`` names the file and the field): the
    schema above (exact statuses, no unknown field, an object where one belongs), each (case, backend)
    once, and one case id per case."""
    data = read_json(Path(path), ReplayError)  # a key given twice, nesting too deep: refused here
    if not isinstance(data, dict) or data.get("kind") != REPLAY_KIND or data.get("schema_version") != REPLAY_SCHEMA \
            or isinstance(data.get("schema_version"), bool):
        raise ReplayError(f"{path}: not a pa-oracle replay record (write one with pa-oracle replay --json CASES...)")
    record = convert(data, _ReplayFile, where=f"{path}", error=ReplayError)
    where: dict[tuple[str, str], int] = {}
    ids: dict[str, tuple[str, int]] = {}
    for i, r in enumerate(record.results):
        if (first := where.setdefault((r.case, r.backend), i)) != i:
            raise ReplayError(f"{path}: results[{i}]: case {r.case!r} on {r.backend!r} again (first at results[{first}]): "
                              "a record judges each case on each backend once")
        if r.case_id is not msgspec.UNSET:
            known, at = ids.setdefault(r.case, (r.case_id, i))
            if known != r.case_id:
                raise ReplayError(f"{path}: results[{i}].case_id: case {r.case!r} is {r.case_id} here but {known} at "
                                  f"results[{at}]: one name, two cases")
    _refuse_cut_short(path, record)
    document = ReplayDocument(data)
    document.path = Path(path)
    return document


def _refuse_cut_short(path: Path, record: _ReplayFile) -> None:
    """``ReplayError`` for a record that is no whole replay: no result, a case or backend it lists without one, or
    a case without a result on a kernel of its kind that judged other cases (a replay judges every case on every
    kernel of its kind: attention cases on attention kernels, write cases on write kernels)."""
    results = record.results
    if not results:
        raise ReplayError(f"{path}: results: empty: a replay record holds a result for each case on each backend "
                          "(a record cut short, or a replay that judged nothing)")
    for field, listed in (("case", record.cases), ("backend", record.backends)):
        if not isinstance(listed, list):
            continue
        names = [getattr(r, field) for r in results]
        if missing := [name for name in listed if name not in names]:
            where = f"no result for {missing[0]!r}" if field == "case" else f"no result on {missing[0]!r}"
            raise ReplayError(f"{path}: results: {where}, one of the record's {field}s: a record cut short")
        if stray := [i for i, name in enumerate(names) if name not in listed]:
            raise ReplayError(f"{path}: results[{stray[0]}].{field}: {names[stray[0]]!r} is not among the record's {field}s")
    for write in (False, True):
        rows = [r for r in results if (r.check == WRITE_CHECK) == write]
        have = {(r.case, r.backend) for r in rows}
        for backend in dict.fromkeys(r.backend for r in rows):
            if case := next((r.case for r in rows if (r.case, backend) not in have), None):
                raise ReplayError(f"{path}: results: case {case!r} has no result on {backend!r}, which judged the "
                                  "record's other cases: a record cut short")


def _same_cases(before: dict[str, Any], after: dict[str, Any]) -> None:
    """``ReplayError`` when a case has one id in ``before`` and another in ``after``: the case file
    changed between the records, so its statuses are not the same case's to compare."""
    ids = {r["case"]: r["case_id"] for r in before["results"] if "case_id" in r}
    for i, r in enumerate(after["results"]):
        if "case_id" in r and r["case"] in ids and ids[r["case"]] != r["case_id"]:
            raise ReplayError(f"{getattr(after, 'path', 'the second record')}: results[{i}].case_id: case {r['case']!r} is "
                              f"{r['case_id']} here but {ids[r['case']]} in {getattr(before, 'path', 'the first record')}: "
                              "the case changed between the records "
                              "(replay one corpus on both environments)")


@dataclass(frozen=True)
class Change:
    kind: str  # fixed, regressed, same, changed, new, gone
    case: str
    backend: str
    before: str | None
    after: str | None


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[Change]:
    """Per (case, backend): ``fixed`` (failed, passes), ``regressed`` (passed, fails or crashes),
    ``same``, ``changed`` (any other status change, e.g. pass -> unsupported), ``new`` (only in
    ``after``), ``gone`` (only in ``before``). A case whose id differs between the records is
    ``ReplayError`` (naming the records' files when ``load_replay`` read them)."""
    _same_cases(before, after)
    old = {(r["case"], r["backend"]): r["status"] for r in before["results"]}
    new = {(r["case"], r["backend"]): r["status"] for r in after["results"]}
    changes = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if a is None:
            kind = "new"
        elif b is None:
            kind = "gone"
        elif a == b:
            kind = "same"
        elif a in FAILING and b == "pass":
            kind = "fixed"
        elif a == "pass" and b in FAILING:
            kind = "regressed"
        else:
            kind = "changed"
        changes.append(Change(kind, key[0], key[1], a, b))
    return changes


def version_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``package: A -> B`` for each package whose version differs between the environments."""
    a = before.get("environment", {}).get("packages", {}) or {}
    b = after.get("environment", {}).get("packages", {}) or {}
    return [f"{k}: {a.get(k, '-')} -> {b.get(k, '-')}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def comparison_lines(changes: list[Change], versions: list[str]) -> list[str]:
    """Text: the version changes, every change but ``same`` (one line each), then counts."""
    lines = [f"versions: {', '.join(versions)}" if versions else "versions: the same packages"]
    order = ("regressed", "fixed", "changed", "new", "gone")
    for kind in order:
        for c in (c for c in changes if c.kind == kind):
            lines.append(f"{kind.upper():9} {c.case} on {c.backend}: {c.before or '-'} -> {c.after or '-'}")
    counts = {kind: sum(c.kind == kind for c in changes) for kind in (*order[:2], "same", *order[2:])}
    lines.append(", ".join(f"{n} {kind}" for kind, n in counts.items()))
    return lines


def record_line(record: Record) -> str:
    """One text line per record; a fix or a finding is shouted."""
    loud = record.ledger in ("fixed", "finding", "unexpected-pass", "error")
    through = "" if record.check == ORACLE_CHECK else f" ({record.check})"
    head = f"{record.case} on {record.backend}{through}: {record.status}"
    tail = record.ledger_message if record.ledger not in ("pass",) else ""
    if record.status in ("unsupported", "error") and record.message:
        tail = record.message
    return f"{'>>> ' if loud else '    '}{head}{' - ' + tail if tail else ''}"
