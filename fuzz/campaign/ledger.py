"""The known-failure ledger (``golden/ledger.json``): each entry names a golden case, the
backends and versions it applies to, a reason and an issue URL, and a status:

* ``tolerated``: the case still runs and must still fail; an unexpected pass fails loudly so the
  entry gets removed;
* ``quarantine``: never launched (for crashers that poison the CUDA context).

An entry may also carry ``matches``, a predicate over drawn cases (``pa_oracle.fuzz.draw.features``): every key
is a feature name, a scalar value must equal the case's feature and a list must contain it, e.g.
``{"kv_len_0_with_queries": true}`` or ``{"alibi": true, "logits_soft_cap": true}`` or
``{"group_size": [5]}``. A campaign skips drawn cases that an entry matches, so it surfaces new
findings, not the known ones.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import msgspec
from pa_oracle.fuzz.draw.features import FEATURES, Feature, case_features
from pa_oracle.oracle.case import Case, CaseError, read_json
from pa_oracle.oracle.schema import convert

from pa_oracle import golden

GOLDEN = golden.root()  # the installed corpus, or $PA_ORACLE_GOLDEN
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Entry:
    case: str  # golden case name (file stem under golden/cases/)
    backends: tuple[str, ...]
    versions: dict[str, str]
    status: Literal["tolerated", "quarantine"]
    reason: str
    issue: str
    matches: dict[str, Feature | tuple[Feature, ...]] | None = None

    def applies(self, case_name: str, backend: str, versions: dict[str, str]) -> bool:
        return case_name == self.case and self.covers(backend, versions)

    def covers(self, backend: str, versions: dict[str, str]) -> bool:
        return backend in self.backends and all(versions.get(k) == v for k, v in self.versions.items())

    def matches_case(self, case: Case) -> bool:
        """True if the ``matches`` predicate holds for ``case`` (False for an entry without one)."""
        if not self.matches:
            return False
        features = case_features(case)
        return all(
            features[name] in want if isinstance(want, tuple) else features[name] == want
            for name, want in self.matches.items()
        )


class _EntryFile(msgspec.Struct, forbid_unknown_fields=True):
    """One ledger entry as written in the file: types only (``_entry`` checks the values)."""

    case: str
    backends: list[str]
    status: str
    reason: str
    issue: str
    versions: dict[str, str] = {}
    matches: dict[str, Any] | None = None


class _LedgerFile(msgspec.Struct, forbid_unknown_fields=True):
    schema_version: int
    entries: list[Any]  # each entry is converted on its own, so a message can say "entry 3"


# what each field must be, added to a type error so that the message says what to write
_HINTS = {
    "case": "must name its golden case ('case')",
    "backends": "'backends' must be a non-empty list of backend names",
    "versions": "'versions' must map package names to version strings",
    "status": "status must be 'tolerated' or 'quarantine'",
    "reason": "must cite a reason and an issue URL",
    "issue": "must cite a reason and an issue URL",
    "matches": "'matches' must be a non-empty object of feature: value",
}


def load_ledger(path: Path = GOLDEN / "ledger.json") -> list[Entry]:
    """Read and strictly validate a ledger file; a ``CaseError`` names the entry and field at fault."""
    data = read_json(Path(path), CaseError)
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION or isinstance(data.get("schema_version"), bool):
        version = data.get("schema_version") if isinstance(data, dict) else None
        raise CaseError(f"{path}: unknown ledger schema_version {version!r}")
    if set(data) != {"schema_version", "entries"} or not isinstance(data["entries"], list):
        raise CaseError(f"{path}: a ledger holds exactly 'schema_version' and a list 'entries'")
    ledger = convert(data, _LedgerFile, where=str(path), error=CaseError)
    return [_entry(raw, f"{path}: entry {i}") for i, raw in enumerate(ledger.entries)]


def _entry(raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise CaseError(f"{where} must be an object")
    try:
        entry = convert(raw, _EntryFile, where=where, error=CaseError)
    except CaseError as exc:
        field = str(exc).removeprefix(f"{where}: ").split(":")[0].split(".")[0].split("[")[0]
        hint = _HINTS.get(field)
        raise CaseError(f"{exc} ({hint})" if hint else str(exc)) from None
    if entry.status not in ("tolerated", "quarantine"):
        raise CaseError(f"{where} status must be 'tolerated' or 'quarantine', got {entry.status!r}")
    if not entry.reason.strip():
        raise CaseError(f"{where}: reason is blank: must cite a reason and an issue URL")
    url = urlparse(entry.issue)
    if url.scheme not in ("http", "https") or not url.netloc or any(c.isspace() for c in entry.issue):
        raise CaseError(f"{where}: issue {entry.issue!r} is not an http(s) URL: must cite a reason and an issue URL")
    if not entry.case.strip():
        raise CaseError(f"{where} must name its golden case ('case')")
    if not entry.backends or not all(b.strip() for b in entry.backends):
        raise CaseError(f"{where} 'backends' must be a non-empty list of backend names")
    matches = None if entry.matches is None else _predicate(entry.matches, where)
    status: Literal["tolerated", "quarantine"] = "tolerated" if entry.status == "tolerated" else "quarantine"
    return Entry(entry.case, tuple(entry.backends), dict(entry.versions), status, entry.reason, entry.issue, matches)


def _predicate(raw: Any, where: str) -> dict[str, Feature | tuple[Feature, ...]]:
    if not isinstance(raw, dict) or not raw:
        raise CaseError(f"{where} 'matches' must be a non-empty object of feature: value")
    predicate: dict[str, Feature | tuple[Feature, ...]] = {}
    for name, want in raw.items():
        if name not in FEATURES:
            close = difflib.get_close_matches(name, FEATURES, n=2)
            hint = f"; did you mean {' or '.join(close)}?" if close else f" (known: {', '.join(FEATURES)})"
            raise CaseError(f"{where} 'matches' names unknown feature {name!r}{hint}")
        values = want if isinstance(want, list) else [want]
        if not values:
            raise CaseError(f"{where} 'matches' {name}: an empty list matches nothing")
        kind = FEATURES[name]
        for value in values:
            ok = value in kind if isinstance(kind, tuple) else type(value) is kind
            if not ok:
                expected = f"one of {kind}" if isinstance(kind, tuple) else kind.__name__
                raise CaseError(f"{where} 'matches' {name}: {value!r} is not {expected}")
        predicate[name] = tuple(values) if isinstance(want, list) else want
    return predicate


def lookup(entries: list[Entry], case_name: str, backend: str, versions: dict[str, str]) -> Entry | None:
    """The entry for golden case ``case_name`` on ``backend`` at ``versions``, if any."""
    return next((e for e in entries if e.applies(case_name, backend, versions)), None)


def known_finding(entries: list[Entry], case: Case, backend: str, versions: dict[str, str]) -> Entry | None:
    """The entry whose ``matches`` predicate covers a drawn ``case`` on ``backend``, if any."""
    return next((e for e in entries if e.covers(backend, versions) and e.matches_case(case)), None)


def golden_cases(folder: Path = GOLDEN / "cases") -> list[Path]:
    return sorted(folder.glob("*.json"))
