"""A finding's record: what a saved case's ``meta`` says of how it was found (``FoundBy``: the command, the
kernel, its verdict, the versions, the date, the seed) and of what the case is (its role in a finding, the
check that judges it, a golden entry's guard and source). Written (``FindingMeta.to_json``) and read
(``read_meta``, ``read_finding``: a finding folder or a case file) here only, for the campaign, triage,
golden, the upstream reports and replay.

Older files read as well, into the same record: a finding's flat meta (``found_by`` the command, the kernel,
verdict and versions beside it) and a golden case's (``found_by`` that flat meta, or a tool's name). The
meta is no part of a case's id (``Case.meta`` is left out of it), so reading or rewriting it changes no id.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
from pa_oracle.fuzz.run.runner import ORACLE_CHECK, Status
from pa_oracle.oracle.case import Case, CaseError
from pa_oracle.oracle.schema import convert
from pa_oracle.oracle.tensors import load_case

FIRST_FAILING = "original.json"  # beside a finding's case.json: its first failing case, before shrinking
FIRST_FAILING_TENSORS = "original.npz"
CHECK_COMMAND = "pa-oracle metamorphic --check "  # how a check's finding names the command that found it

_Text = Annotated[str, msgspec.Meta(min_length=1)]
_Date = Annotated[str, msgspec.Meta(pattern=r"^\d{4}-\d{2}-\d{2}$")]


class FindingError(CaseError):
    """A finding's meta or folder that cannot be read: the message names the file and the field."""


class GeneratedFrom(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What the case's tensors were drawn from (a case with no sidecar of its own, or rebuilt from one)."""

    seed: int
    distribution: str | None = None
    case_id: str | None = None  # the case it was rebuilt from, when it is not this one
    note: str | None = None


class FoundBy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """How the case was found: by which command (or tool), on which kernel, with what verdict, where."""

    command: _Text | None = None  # "pa-oracle fuzz", "pa-oracle metamorphic --check NAME", "pa-oracle triage", a tool
    check: _Text = ORACLE_CHECK  # the check that found it
    backend: _Text | None = None  # the registered backend, or the user kernel's spec
    kernel: _Text | None = None  # a user kernel as MODULE:FUNCTION (never imported by reading it)
    status: Status | None = None  # the verdict it got: fail or crash (a finding), error (unjudged)
    message: str = ""  # the verdict's first line
    versions: dict[str, str] = {}
    date: _Date | None = None  # ISO date it was saved
    generated_from: GeneratedFrom | None = None
    also: str | None = None  # by hand: what else was seen of it
    note: str | None = None  # by hand: how the case was made


class FindingMeta(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A saved case's meta. Empty for a case no finding wrote (drawn, or written by hand)."""

    found_by: FoundBy | None = None
    check: _Text | None = None  # the check replay judges this case through (default: the oracle)
    role: str | None = None  # which case of a finding it is: a check's "original", "padded", ...; the first failing
    minimized_from: str | None = None  # triage: the id of the case it was shrunk from
    guards: str | None = None  # a golden case: what it guards against
    source: str | None = None  # a golden case: the issue or PR that tracks it

    def to_json(self) -> dict[str, Any]:
        """The one form a case file holds (``Case.meta``): the fields set, in this order; checked to read back
        (a value of the wrong type is this tool's error, a ``ValueError``, never a file it cannot read)."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        convert(data, FindingMeta, where="the finding meta being written", error=ValueError, field="meta")
        return data

    @property
    def backend(self) -> str | None:
        return self.found_by.backend if self.found_by else None

    @property
    def kernel(self) -> str | None:
        return self.found_by.kernel if self.found_by else None

    @property
    def found_check(self) -> str:
        """The check that found the case (the oracle when the meta does not say)."""
        return self.found_by.check if self.found_by else ORACLE_CHECK

    def replace(self, **changes: Any) -> FindingMeta:
        return msgspec.structs.replace(self, **changes)

    def seen(self, **changes: Any) -> FindingMeta:
        """This record with ``changes`` to its ``found_by`` (e.g. another status and message)."""
        return self.replace(found_by=msgspec.structs.replace(self.found_by or FoundBy(), **changes))


def today() -> str:
    return datetime.date.today().isoformat()


# --- reading ---------------------------------------------------------------------------------------------

_FLAT = tuple(f for f in FoundBy.__struct_fields__ if f not in ("command", "check"))  # beside found_by, before


def _upgraded(meta: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``meta`` in this record's shape, and for each field moved, where the file has it (for messages).
    A flat finding meta (``found_by`` the command, ``backend``... beside it) gets its ``found_by`` built;
    a golden case's ``found_by`` holding such a flat meta, its command renamed."""
    data, moved = dict(meta), {}
    found = data.get("found_by")
    if isinstance(found, str) or (found is None and any(k in data for k in _FLAT)):
        inner = {k: data.pop(k) for k in _FLAT if k in data}
        moved = {f"found_by.{k}": k for k in inner}
        data["found_by"] = {**({"command": found} if found is not None else {}), **inner}
        moved["found_by.command"] = "found_by"
        found = data["found_by"]
    if isinstance(found, dict) and "found_by" in found and "command" not in found:
        found = {("command" if k == "found_by" else k): v for k, v in found.items()}
        data["found_by"] = found
        moved["found_by.command"] = "found_by.found_by"
    named = found.get("command") if isinstance(found, dict) and "check" not in found else None
    if isinstance(found, dict) and isinstance(named, str) and named.startswith(CHECK_COMMAND):  # older: in the command only
        data["found_by"] = {**found, "check": (named.removeprefix(CHECK_COMMAND).split() or [""])[0]}
        moved["found_by.check"] = moved.get("found_by.command", "found_by.command")
    return data, moved


def read_meta(meta: Mapping[str, Any], where: str | Path) -> FindingMeta:
    """A case's ``meta`` as the record, in this shape or an older one; ``FindingError`` names ``where`` (the
    case file) and the field as the file spells it, e.g. ``case.json: meta.status: invalid value 'failed'``."""
    if not isinstance(meta, Mapping):
        raise FindingError(f"{where}: meta: expected object, got {type(meta).__name__}")
    data, moved = _upgraded(meta)
    try:
        return convert(data, FindingMeta, where=str(where), error=FindingError, field="meta")
    except FindingError as exc:
        raise FindingError(_as_spelled(str(exc), str(where), moved)) from None


def _as_spelled(message: str, where: str, moved: dict[str, str]) -> str:
    """``message`` (``WHERE: meta.PATH: ...``) with PATH as the file spells it, where the field was moved."""
    head = f"{where}: meta."
    if not message.startswith(head):
        return message
    path, sep, rest = message[len(head):].partition(": ")
    for new in sorted(moved, key=len, reverse=True):
        if path == new or path.startswith((f"{new}.", f"{new}[")):
            return f"{head}{moved[new]}{path[len(new):]}{sep}{rest}"
    return message


def meta_of(case: Case, where: str | Path) -> FindingMeta:
    """The record of a case read from ``where``."""
    return read_meta(case.meta, where)


@dataclass(frozen=True)
class Finding:
    """A saved case as a finding folder or a case file holds it."""

    case: Case
    case_json: Path
    meta: FindingMeta


def finding_case_file(path: Path) -> Path:
    """The case file of ``path``: itself, or a finding folder's ``case.json`` (a check's finding: the case
    it started from, ``original/case.json``); ``FindingError`` when the folder holds neither."""
    path = Path(path)
    if not path.is_dir():
        return path
    for candidate in (path / "case.json", path / "original" / "case.json"):
        if candidate.is_file():
            return candidate
    raise FindingError(f"{path}: not a finding folder: it has no case.json (nor original/case.json); give a folder "
                       "written by pa-oracle fuzz or triage, or a case file")


def read_finding(path: Path) -> Finding:
    """The one reader of a finding folder or case file: the case (its sidecar checked) and its record."""
    case_json = finding_case_file(path)
    case = load_case(case_json)
    return Finding(case, case_json, meta_of(case, case_json))


def read_first_failing(case_json: Path, say: Callable[[str], None] = lambda _: None) -> Case | None:
    """A finding's first failing case before the campaign shrank it (``FIRST_FAILING`` beside its ``case.json``),
    or None when there is none or it cannot be read (said)."""
    path = Path(case_json).parent / FIRST_FAILING
    if Path(case_json).name != "case.json" or not path.is_file():
        return None
    try:
        return load_case(path)
    except CaseError as exc:
        say(f"not read {path}: {exc}")
        return None


def holds_finding(path: Path, case: Case) -> bool:
    """Whether the case file at ``path`` is ``case`` as saved: the same case, and the same record on any date
    (a folder saved before, in an older shape of the meta, counts)."""
    try:
        kept = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    new = json.loads(json.dumps(case.to_json()))  # tuples as lists, as read back
    if not isinstance(kept, dict) or {**kept, "meta": None} != {**new, "meta": None}:
        return False
    try:
        old_meta, new_meta = read_meta(kept.get("meta", {}), path), read_meta(new["meta"], "the new case")
    except FindingError:
        return False
    return _undated(old_meta) == _undated(new_meta)


def _undated(meta: FindingMeta) -> FindingMeta:
    return meta.seen(date=None) if meta.found_by else meta
