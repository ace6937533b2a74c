"""The known-failure ledger (``golden/ledger.json``): each entry names a golden case, the
backends and versions it applies to, a reason and an issue URL, and a status:

* ``tolerated``: the case still runs and must still fail; an unexpected pass fails loudly so the
  entry gets removed;
* ``quarantine``: never launched (for crashers that poison the CUDA context).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from oracle.case import CaseError

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Entry:
    case: str  # golden case name (file stem under golden/cases/)
    backends: tuple[str, ...]
    versions: dict[str, str]
    status: Literal["tolerated", "quarantine"]
    reason: str
    issue: str

    def applies(self, case_name: str, backend: str, versions: dict[str, str]) -> bool:
        return (
            case_name == self.case
            and backend in self.backends
            and all(versions.get(k) == v for k, v in self.versions.items())
        )


def load_ledger(path: Path = GOLDEN / "ledger.json") -> list[Entry]:
    data = json.loads(path.read_text())
    if data.get("schema_version") != SCHEMA_VERSION:
        raise CaseError(f"{path}: unknown ledger schema_version {data.get('schema_version')!r}")
    entries = []
    for i, raw in enumerate(data["entries"]):
        if raw.get("status") not in ("tolerated", "quarantine"):
            raise CaseError(f"{path}: entry {i} status must be 'tolerated' or 'quarantine'")
        if not raw.get("reason") or not str(raw.get("issue", "")).startswith("http"):
            raise CaseError(f"{path}: entry {i} must cite a reason and an issue URL")
        entries.append(Entry(raw["case"], tuple(raw["backends"]), dict(raw.get("versions", {})), raw["status"], raw["reason"], raw["issue"]))
    return entries


def lookup(entries: list[Entry], case_name: str, backend: str, versions: dict[str, str]) -> Entry | None:
    return next((e for e in entries if e.applies(case_name, backend, versions)), None)


def golden_cases(folder: Path = GOLDEN / "cases") -> list[Path]:
    return sorted(folder.glob("*.json"))
