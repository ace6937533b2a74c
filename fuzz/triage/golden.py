"""Promote a saved finding into the regression corpus: ``golden/cases/NAME.json`` + ``NAME.npz``
and a ledger entry (reason and issue URL required), keeping ``ledger.json``'s format. A finding of
a check beyond the oracle (``mask-replan``, ...) keeps its check: the case's ``meta.check`` and the
entry's ``check`` name it, and the case is judged through it."""

from __future__ import annotations

import difflib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pa_oracle.backends.base import Backend
from pa_oracle.fuzz.campaign.finding_record import Finding, FindingError, FindingMeta, finding_case_file, read_finding
from pa_oracle.fuzz.campaign.ledger import SCHEMA_VERSION, check_name, load_ledger
from pa_oracle.fuzz.run.runner import ORACLE_CHECK
from pa_oracle.oracle.case import Case, CaseError
from pa_oracle.oracle.errors import BadInput
from pa_oracle.oracle.tensors import load_case, load_tensors, make_tensors, save_tensors, tensors_digest

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_NOT_VERSIONS = ("kernel", "module_file")  # machine-specific entries of a user kernel's versions()


class GoldenError(BadInput):
    """A promotion refused: the message says why and what to pass."""


@dataclass(frozen=True)
class Promoted:
    case_path: Path
    tensors_path: Path
    ledger_path: Path
    entry: dict[str, Any]
    verdicts: dict[str, str] = field(default_factory=dict)  # backend -> status here, or why it was not run


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.") or "case"


def ledger_versions(versions: dict[str, str]) -> dict[str, str]:
    """The versions an entry is pinned to: the kernel packages (torch only when there is none)."""
    kept = {k: v for k, v in versions.items() if k not in _NOT_VERSIONS}
    packages = {k: v for k, v in kept.items() if k != "torch"}
    return packages or kept


def _finding(path: Path) -> Finding:
    """The finding to promote (``read_finding``), its tensors made: the sidecar loads, matches the case's
    shapes and carries signal."""
    try:
        finding = read_finding(path)
        make_tensors(finding.case)
    except FindingError as exc:
        raise GoldenError(str(exc)) from None
    except CaseError as exc:
        raise GoldenError(f"{finding_case_file(path)}: the case does not load: {exc}") from None
    return finding


def _backends(names: tuple[str, ...]) -> list[Backend]:
    """The entry's backends (registered names or MODULE:FUNCTION kernels); an unknown name is refused."""
    from pa_oracle.backends import discover
    from pa_oracle.backends.user import UserKernel

    known = discover()
    found: list[Backend] = []
    for name in names:
        if ":" in name:
            try:
                found.append(UserKernel.from_spec(name))
            except (ImportError, ValueError) as exc:
                raise GoldenError(f"--backend {name!r}: no such kernel ({exc})") from None
        elif name in known:
            found.append(known[name]())
        else:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {' or '.join(close)}?" if close else " (pa-oracle env lists the backends)"
            raise GoldenError(f"--backend {name!r} is no known backend{hint}")
    return found


def finding_check(meta: FindingMeta, given: str | None) -> str:
    """The check the finding is of: ``given`` (``--check``), else the one that found it (its record's
    ``found_by.check``; the oracle when it names none); a name that is no check is refused."""
    return check_name(given or meta.found_check, "--check", GoldenError)


def _verdicts(case: Case, backends: list[Any], status: str, check: str = ORACLE_CHECK) -> dict[str, str]:
    """Run the case through ``check`` on each of the entry's backends that is available here and
    refuse it if one passes: the case would be no finding, or the golden suite would report an
    unexpected pass. Quarantined cases are never launched (they crash), here neither."""
    from pa_oracle.fuzz.checks.registry import ALL_CHECKS
    from pa_oracle.fuzz.run.isolation import default_case_timeout
    from pa_oracle.fuzz.run.judge import case_judge

    judge = ALL_CHECKS[check]
    verdicts: dict[str, str] = {}
    for backend in backends:
        reason = backend.unavailable_reason()
        applies = judge.capabilities(backend)
        if status == "quarantine":
            verdicts[backend.name] = "not run (quarantine entries are never launched)"
        elif reason:
            verdicts[backend.name] = f"not run (unavailable here: {reason})"
        elif isinstance(applies, str):
            verdicts[backend.name] = f"not run ({check} does not apply: {applies})"
        else:
            with case_judge(backend, timeout=default_case_timeout(), judge=judge) as run:  # isolated: a crash is a verdict
                verdicts[backend.name] = run(case).status
    ran = {name: verdict for name, verdict in verdicts.items() if not verdict.startswith("not run")}
    passing = [name for name, verdict in ran.items() if verdict == "pass"]
    failing = [name for name, verdict in ran.items() if verdict in ("fail", "crash")]
    if ran and not failing:
        how = (f"passes on every backend it was run on ({', '.join(passing)})" if len(passing) == len(ran)
               else f"fails on no backend it was run on ({', '.join(f'{n}: {v}' for n, v in ran.items())})")
        raise GoldenError(f"the case {how}: it is not a finding (a tolerated entry must fail where it applies)")
    if passing:
        raise GoldenError(
            f"the case passes on {', '.join(passing)} (fails on {', '.join(failing)}): a tolerated entry must fail on "
            "every backend it names; drop the passing ones from --backend"
        )
    return verdicts


def promote(
    finding: Path,
    *,
    reason: str | None,
    issue: str | None,
    golden_dir: Path,
    name: str | None = None,
    status: Literal["tolerated", "quarantine"] = "tolerated",
    backends: tuple[str, ...] = (),
    check: str | None = None,
) -> Promoted:
    """Copy the finding's case (+ tensors) into ``golden_dir/cases`` and append a ledger entry;
    ``check``: the check that judges it (default: the one that found it, ``finding_check``)."""
    if not reason or not reason.strip():
        raise GoldenError("a ledger entry needs --reason: what is wrong, on which kernel and version, where it was seen")
    if not issue or not issue.startswith(("http://", "https://")):
        raise GoldenError(f"a ledger entry needs --issue with the URL of the issue or PR that tracks it (got {issue!r})")
    found = _finding(Path(finding))
    case, case_json, meta = found.case, found.case_json, found.meta
    check = finding_check(meta, check)
    backends = backends or ((meta.backend,) if meta.backend else ())
    if not backends:
        raise GoldenError(f"{case_json} names no backend: pass --backend NAME (repeatable)")
    name = name or slug(f"{backends[0]}-{case.case_id}")
    if not _NAME.match(name):
        raise GoldenError(f"--name {name!r}: use lowercase letters, digits, '-', '_' and '.'")
    cases_dir, ledger_path = Path(golden_dir) / "cases", Path(golden_dir) / "ledger.json"
    target_json, target_npz = cases_dir / f"{name}.json", cases_dir / f"{name}.npz"
    for path in (target_json, target_npz):
        if path.exists():
            raise GoldenError(f"{path} already exists: choose another --name (golden add never overwrites)")
    if ledger_path.exists():
        try:
            load_ledger(ledger_path)  # the entry is appended to a ledger that loads
        except CaseError as exc:
            raise GoldenError(f"the ledger does not load: {exc}") from None
    verdicts = _verdicts(case, _backends(backends), status, check)
    data = json.loads(ledger_path.read_text()) if ledger_path.exists() else {"entries": []}
    data = {"schema_version": SCHEMA_VERSION, "entries": data["entries"]}  # this version's format reads the older ones
    entry: dict[str, Any] = {
        "case": name,
        "backends": list(backends),
        "versions": ledger_versions(dict(meta.found_by.versions) if meta.found_by else {}),
        "status": status,
        "reason": reason.strip(),
        "issue": issue,
    }
    if check != ORACLE_CHECK:
        entry["check"] = check
    data["entries"].append(entry)
    text = json.dumps(data, indent=1) + "\n"
    with tempfile.TemporaryDirectory() as tmp:  # the ledger's own loader must accept the result
        (Path(tmp) / "ledger.json").write_text(text)
        try:
            load_ledger(Path(tmp) / "ledger.json")
        except CaseError as exc:
            raise GoldenError(str(exc).replace(str(Path(tmp) / "ledger.json"), str(ledger_path))) from None
    cases_dir.mkdir(parents=True, exist_ok=True)
    if case.tensors_file is not None:
        shutil.copyfile(case.tensors_file, target_npz)
        tensors = load_tensors(case, case.tensors_file)
    else:
        tensors = make_tensors(case)
        save_tensors(tensors, target_npz)
    golden_meta = FindingMeta(found_by=meta.found_by, check=None if check == ORACLE_CHECK else check,
                              minimized_from=meta.minimized_from, guards=reason.strip(), source=issue)
    # named by the sidecar's content (tensors_sha256), so the golden case's id is the finding's, wherever it lies
    case.replace(tensors_file=target_npz.name, tensors_sha256=tensors_digest(tensors),
                 meta=golden_meta.to_json()).save(target_json)
    try:
        make_tensors(load_case(target_json))
    except CaseError as exc:
        target_json.unlink()
        target_npz.unlink()
        raise GoldenError(f"the promoted case does not load back: {exc}") from None
    ledger_path.write_text(text)
    return Promoted(target_json, target_npz, ledger_path, entry, verdicts)
