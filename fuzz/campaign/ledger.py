"""The known-failure ledger (``golden/ledger.json``): each entry names a golden case, the
kernels it applies to (``families``: the kernel an adapter wraps, ``Backend.kernel_family``, and/or
``backends``: adapter names), the library versions it was seen on, a reason, where it is tracked,
and a status:

* ``tolerated``: the case still runs and must still fail; an unexpected pass fails loudly so the
  entry gets removed (or its version range narrowed);
* ``quarantine``: never launched (for crashers that poison the CUDA context).

``versions`` maps a package (the keys of ``Backend.versions()``: ``flashinfer``, ``flash_attn``,
``sglang``, ``triton``) to a PEP 440 specifier (``">=0.6.18.post1,<0.7.2.post1"``) or one version
(``"0.6.18.post1"``, i.e. ``==``). Outside its range an entry does not apply: a case that passes
there is reported as fixed in the installed version (``ledger_verdict``), one that still fails is a
finding again (the range must be extended).

Tracking: ``"issue"`` is the URL of the upstream issue or pull request (``https://github.com/ORG/REPO/issues/N``
or ``/pull/N`` for the project's own ledger), or ``"reported": false`` with ``"report"``: a
ready-to-file report, a path relative to the ledger file.

``check`` (schema_version 2) names the check that judges the case (``pa_oracle.fuzz.checks.registry.ALL_CHECKS``;
default ``"oracle"``, the comparison with the oracle): a finding of ``mask-replan`` fails only
through that check, the oracle alone passes it. The golden case names the same check in its
``meta.check`` (``golden_check``); a replay judges it through that check, and an entry applies to
that check's replay only. In a campaign, an entry of another check applies to that check's
campaigns only, an entry of the oracle to the oracle's and to those of the checks that judge each
run against the oracle (``Check.expect == "oracle"``: a case that fails the oracle fails them too),
not to the relations between two outputs (bit-exact or within tolerance of each other).

An entry of the write check (``"check": "write"``, ``pa_oracle.fuzz.checks.append``) covers write kernels' cases
(``pa-oracle writes --ledger``): its ``matches`` is over write-case features (``WRITE_FEATURES``: ``dtype``,
``kv_layout``, ``page_size``, ``padding``, ``scaled``, ...); an attention entry never covers a write case.

An entry may also carry ``matches``, a predicate over drawn cases (``pa_oracle.fuzz.draw.features``): every key
is a feature name, a scalar value must equal the case's feature and a list must contain it, e.g.
``{"kv_len_0_with_queries": true}`` or ``{"alibi": true, "logits_soft_cap": true}`` or
``{"group_size": [5]}``. A campaign skips drawn cases that an entry matches, so it surfaces new
findings, not the known ones.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import msgspec
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pa_oracle.fuzz.checks.append import WRITE_CHECK, WRITE_FEATURES, write_features
from pa_oracle.fuzz.checks.registry import ALL_CHECKS
from pa_oracle.fuzz.draw.features import FEATURES, Feature, case_features
from pa_oracle.fuzz.run.runner import ORACLE_CHECK
from pa_oracle.oracle.append import AppendCase
from pa_oracle.oracle.case import Case, CaseError, read_json
from pa_oracle.oracle.schema import convert

from pa_oracle import golden

GOLDEN = golden.root()  # the installed corpus, or $PA_ORACLE_GOLDEN
SCHEMA_VERSION = 2  # 2 added ``check``; version 1 files (no ``check``) are read as they are
READABLE_VERSIONS = (1, 2)


@dataclass(frozen=True)
class Entry:
    case: str  # golden case name (file stem under golden/cases/)
    backends: tuple[str, ...]  # adapter names
    versions: dict[str, str]  # package -> PEP 440 specifier ("==X" for a bare version)
    status: Literal["tolerated", "quarantine"]
    reason: str
    issue: str | None  # upstream issue or PR URL; None: not reported (see ``report``)
    matches: dict[str, Feature | tuple[Feature, ...]] | None = None
    families: tuple[str, ...] = ()  # kernel families (``Backend.kernel_family``)
    report: str | None = None  # a ready-to-file report, relative to the ledger, when not reported
    check: str = ORACLE_CHECK  # the check that judges the case (a name of ``ALL_CHECKS``)

    def applies(self, case_name: str, backend: str, versions: dict[str, str], family: str | None = None,
                check: str = ORACLE_CHECK) -> bool:
        """True if the entry is the one for golden case ``case_name`` replayed through ``check``."""
        return case_name == self.case and check == self.check and self.covers(backend, versions, family)

    def skips_in(self, check: str) -> bool:
        """True if a campaign of ``check`` skips what the entry's predicate matches (module docstring)."""
        if self.check == check:
            return True
        return self.check == ORACLE_CHECK and getattr(ALL_CHECKS.get(check), "expect", None) == "oracle"

    def names(self, backend: str, family: str | None = None) -> bool:
        """True if the entry names ``backend`` or its kernel ``family`` (at any version)."""
        return backend in self.backends or (family or backend) in self.families

    def covers(self, backend: str, versions: dict[str, str], family: str | None = None) -> bool:
        return self.names(backend, family) and self.in_range(versions)

    def in_range(self, versions: dict[str, str]) -> bool:
        """True if every pinned package is installed at a version inside the entry's range."""
        return not self.out_of_range(versions)

    def out_of_range(self, versions: dict[str, str]) -> dict[str, str]:
        """The pinned packages whose installed version is outside the range (or not installed)."""
        return {k: versions.get(k, "not installed") for k, spec in self.versions.items() if not _within(versions.get(k), spec)}

    def matches_case(self, case: Case | AppendCase) -> bool:
        """True if the ``matches`` predicate holds for ``case`` (False for an entry without one). A write case
        (``AppendCase``) is matched by an entry of the write check only, over ``WRITE_FEATURES``."""
        if not self.matches:
            return False
        if isinstance(case, AppendCase) != (self.check == WRITE_CHECK):
            return False  # an attention entry never covers a write case, nor a write entry an attention case
        features = write_features(case) if isinstance(case, AppendCase) else case_features(case)
        return all(
            features[name] in want if isinstance(want, tuple) else features[name] == want
            for name, want in self.matches.items()
        )

    @property
    def tracked_at(self) -> str:
        return self.issue or f"not reported upstream; report: {self.report}"


def specifier(text: str) -> SpecifierSet:
    """A ledger ``versions`` value as a specifier set: a bare version means ``==`` that version."""
    text = text.strip()
    return SpecifierSet(f"=={text}" if text[:1].isdigit() else text)


def _within(installed: str | None, spec: str) -> bool:
    if installed is None:
        return False
    try:
        return specifier(spec).contains(Version(installed), prereleases=True)
    except InvalidVersion:  # a version the package reports that PEP 440 cannot read: only equality
        return installed == spec.strip().removeprefix("==")


class _EntryFile(msgspec.Struct, forbid_unknown_fields=True):
    """One ledger entry as written in the file: types only (``_entry`` checks the values)."""

    case: str
    backends: list[str] = []
    status: str = ""
    reason: str = ""
    issue: str = ""  # absent: "" (a reported entry then fails the URL check)
    versions: dict[str, str] = {}
    matches: dict[str, Any] | None = None
    families: list[str] = []
    reported: bool = True
    report: str | None = None
    check: str = ORACLE_CHECK


class _LedgerFile(msgspec.Struct, forbid_unknown_fields=True):
    schema_version: int
    entries: list[Any]  # each entry is converted on its own, so a message can say "entry 3"


# what each field must be, added to a type error so that the message says what to write
_HINTS = {
    "case": "must name its golden case ('case')",
    "backends": "'backends' must be a non-empty list of backend names",
    "families": "'families' must be a list of kernel families",
    "versions": "'versions' must map package names to version strings",
    "status": "status must be 'tolerated' or 'quarantine'",
    "reason": "must cite a reason and an issue URL",
    "issue": "must cite a reason and an issue URL",
    "reported": "'reported': false goes with 'report', the path of a ready-to-file report",
    "report": "'report' is the path of a ready-to-file report, relative to the ledger",
    "matches": "'matches' must be a non-empty object of feature: value",
    "check": "'check' names the check that judges the case, e.g. 'mask-replan' (default 'oracle')",
}
GITHUB_ISSUE = re.compile(r"^https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/(issues|pull)/[0-9]+$")


def load_ledger(path: Path = GOLDEN / "ledger.json") -> list[Entry]:
    """Read and strictly validate a ledger file; a ``CaseError`` names the entry and field at fault."""
    data = read_json(Path(path), CaseError)
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise CaseError(f"{path}: unknown ledger schema_version {version!r} (this version reads {', '.join(map(str, READABLE_VERSIONS))})")
    if set(data) != {"schema_version", "entries"} or not isinstance(data["entries"], list):
        raise CaseError(f"{path}: a ledger holds exactly 'schema_version' and a list 'entries'")
    ledger = convert(data, _LedgerFile, where=str(path), error=CaseError)
    return [_entry(raw, f"{path}: entry {i}", version) for i, raw in enumerate(ledger.entries)]


def _entry(raw: Any, where: str, version: int = SCHEMA_VERSION) -> Entry:
    if not isinstance(raw, dict):
        raise CaseError(f"{where} must be an object")
    if version < 2 and "check" in raw:
        raise CaseError(f"{where}: check: a ledger entry names its check from schema_version 2 on (this file says {version})")
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
    _tracking(entry, where)
    if not entry.case.strip():
        raise CaseError(f"{where} must name its golden case ('case')")
    if not (entry.backends or entry.families) or not all(b.strip() for b in (*entry.backends, *entry.families)):
        raise CaseError(f"{where} 'backends' must be a non-empty list of backend names (or give 'families')")
    for package, spec in entry.versions.items():
        try:
            specifier(spec)
        except InvalidSpecifier:
            raise CaseError(f"{where} versions[{package!r}]: {spec!r} is no version or PEP 440 specifier (e.g. '>=0.6.18.post1,<0.7.2.post1')") from None
    features = WRITE_FEATURES if entry.check == WRITE_CHECK else FEATURES
    matches = None if entry.matches is None else _predicate(entry.matches, where, features)
    if entry.check != WRITE_CHECK:
        check_name(entry.check, f"{where} check", CaseError)
    status: Literal["tolerated", "quarantine"] = "tolerated" if entry.status == "tolerated" else "quarantine"
    return Entry(entry.case, tuple(entry.backends), dict(entry.versions), status, entry.reason, entry.issue or None, matches,
                 tuple(entry.families), entry.report, entry.check)


def check_name(name: Any, where: str, error: type[Exception]) -> str:
    """``name`` if it names a check of ``ALL_CHECKS``, else ``error`` naming ``where`` (the file and field)."""
    if isinstance(name, str) and name in ALL_CHECKS:
        return name
    close = difflib.get_close_matches(str(name), ALL_CHECKS, n=2)
    hint = f"; did you mean {' or '.join(close)}?" if close else f" (known: {', '.join(ALL_CHECKS)})"
    raise error(f"{where}: {name!r} is no check{hint}")


def golden_check(case: Case, path: Path | str) -> str:
    """The check that judges golden case ``case`` (read from ``path``): its ``meta.check``, by default
    the oracle; a name that is no check is a ``CaseError`` naming the file and field."""
    return check_name(case.meta.get("check", ORACLE_CHECK), f"{path}: meta.check", CaseError)


def check_mismatches(entries: list[Entry], checks: dict[str, str]) -> list[str]:
    """For ``checks`` (golden case name -> the check its file names): one line per entry whose
    ``check`` is another (the entry would never apply to its own case's replay)."""
    return [f"the ledger entry for {e.case!r} names check {e.check!r}, its golden case's meta.check is {checks[e.case]!r}"
            for e in entries if e.case in checks and e.check != checks[e.case]]


def _tracking(entry: _EntryFile, where: str) -> None:
    """An upstream issue URL, or ``reported: false`` with the path of a ready-to-file report."""
    if not entry.reported:
        if entry.issue:
            raise CaseError(f"{where}: 'reported': false with an 'issue' URL: give one of the two")
        if not entry.report or not entry.report.strip() or Path(entry.report).is_absolute():
            raise CaseError(f"{where}: 'reported': false needs 'report', the path of a ready-to-file report relative to the ledger")
        return
    if entry.report is not None:
        raise CaseError(f"{where}: 'report' goes with 'reported': false")
    url = urlparse(entry.issue)
    if url.scheme not in ("http", "https") or not url.netloc or any(c.isspace() for c in entry.issue):
        raise CaseError(f"{where}: issue {entry.issue!r} is not an http(s) URL: must cite a reason and an issue URL "
                        "(or 'reported': false with a 'report')")


def _predicate(raw: Any, where: str, known: dict[str, Any] = FEATURES) -> dict[str, Feature | tuple[Feature, ...]]:
    """``matches`` over the features ``known`` (an attention entry's ``FEATURES``, a write entry's ``WRITE_FEATURES``)."""
    if not isinstance(raw, dict) or not raw:
        raise CaseError(f"{where} 'matches' must be a non-empty object of feature: value")
    predicate: dict[str, Feature | tuple[Feature, ...]] = {}
    for name, want in raw.items():
        if name not in known:
            close = difflib.get_close_matches(name, known, n=2)
            hint = f"; did you mean {' or '.join(close)}?" if close else f" (known: {', '.join(known)})"
            raise CaseError(f"{where} 'matches' names unknown feature {name!r}{hint}")
        values = want if isinstance(want, list) else [want]
        if not values:
            raise CaseError(f"{where} 'matches' {name}: an empty list matches nothing")
        kind = known[name]
        for value in values:
            ok = value in kind if isinstance(kind, tuple) else type(value) is kind
            if not ok:
                expected = f"one of {kind}" if isinstance(kind, tuple) else kind.__name__
                raise CaseError(f"{where} 'matches' {name}: {value!r} is not {expected}")
        predicate[name] = tuple(values) if isinstance(want, list) else want
    return predicate


def lookup(entries: list[Entry], case_name: str, backend: str, versions: dict[str, str], family: str | None = None,
           check: str = ORACLE_CHECK) -> Entry | None:
    """The entry for golden case ``case_name`` judged by ``check`` on ``backend`` (kernel ``family``)
    at ``versions``, if any."""
    return next((e for e in entries if e.applies(case_name, backend, versions, family, check)), None)


def known_finding(entries: list[Entry], case: Case, backend: str, versions: dict[str, str], family: str | None = None,
                  check: str = ORACLE_CHECK) -> Entry | None:
    """The entry whose ``matches`` predicate covers a drawn ``case`` on ``backend`` in a campaign of
    ``check``, if any (``Entry.skips_in``)."""
    return next(iter(known_classes(entries, case, backend, versions, family, check)), None)


def known_classes(entries: list[Entry], case: Case | AppendCase, backend: str, versions: dict[str, str], family: str | None = None,
                  check: str = ORACLE_CHECK) -> list[Entry]:
    """Every entry whose ``matches`` predicate covers ``case`` on ``backend`` (``known_finding``: the first)."""
    return [e for e in entries if e.skips_in(check) and e.covers(backend, versions, family) and e.matches_case(case)]


def named_entry(entries: list[Entry], case_name: str, backend: str, family: str | None = None,
                check: str = ORACLE_CHECK) -> Entry | None:
    """An entry of the case's own name for ``backend`` (or its family) and ``check``, at any version."""
    return next((e for e in entries if e.case == case_name and e.check == check and e.names(backend, family)), None)


def quarantined_class(entries: list[Entry], case_name: str, case: Case | AppendCase, backend: str, versions: dict[str, str],
                      family: str | None = None, check: str = ORACLE_CHECK) -> Entry | None:
    """A quarantine entry whose class covers golden ``case`` (never launched, as a campaign never launches it),
    unless an entry of the case's own name speaks for this backend (then that entry decides)."""
    if named_entry(entries, case_name, backend, family, check) is not None:
        return None
    return next((e for e in known_classes(entries, case, backend, versions, family, check) if e.status == "quarantine"), None)


@dataclass(frozen=True)
class LedgerVerdict:
    """What a golden replay's outcome means given the ledger.

    ``kind``: ``pass`` (no entry, passes), ``finding`` (no entry applies, fails: new, or an entry
    seen at other versions still fails here), ``known`` (an entry applies and it fails, as
    expected), ``unexpected-pass`` (an entry applies and it passes: remove or narrow the entry),
    ``fixed`` (an entry exists for other versions and it passes here: fixed in the installed version),
    ``quarantine`` (never launched), ``no-verdict`` (unsupported, or not run), ``error`` (the tool
    could not judge: never ok).
    """

    kind: str
    message: str
    entry: Entry | None = None

    @property
    def ok(self) -> bool:
        return self.kind in ("pass", "known", "fixed", "quarantine", "no-verdict")


def ledger_verdict(
    entries: list[Entry], case_name: str, backend: str, versions: dict[str, str], status: str | None, family: str | None = None,
    check: str = ORACLE_CHECK, case: Case | AppendCase | None = None,
) -> LedgerVerdict:
    """Judge a golden case's ``status`` (``pass``, ``fail``, ``crash``, ``unsupported``, ``error``; None:
    not launched) through ``check`` on ``backend`` at ``versions`` against the ledger. An entry of the case's
    own name decides; with none for this backend, a failing ``case`` inside another entry's ``matches`` (what a
    campaign would skip as known) is that entry's known finding, not a new one; only a wrong result ("fail")
    is: a crash or an error inside a class of wrong numbers is still new, and a quarantined class is not
    launched (``quarantined_class``)."""
    entry = lookup(entries, case_name, backend, versions, family, check)
    elsewhere = named_entry(entries, case_name, backend, family, check)  # its own entry, maybe at other versions
    if entry is None and elsewhere is None and case is not None and status in ("fail", None):
        classes = known_classes(entries, case, backend, versions, family, check)
        entry = next((e for e in classes if e.status == "quarantine"), None)  # ``quarantined_class``
        if entry is None and status == "fail":
            entry = next((e for e in classes if e.status == "tolerated"), None)
    if entry is not None and entry.status == "quarantine":
        return LedgerVerdict("quarantine", f"quarantined: {entry.reason} ({entry.tracked_at})", entry)
    if status == "error":
        return LedgerVerdict("error", "the tool could not judge the case (an error, not a verdict)", entry)
    if status in ("unsupported", None):
        return LedgerVerdict("no-verdict", f"no verdict ({status or 'not run'})", entry)
    failed = status != "pass"
    if entry is not None:
        if failed:
            return LedgerVerdict("known", f"known finding ({entry.tracked_at})", entry)
        pinned = ", ".join(f"{k} {versions.get(k)}" for k in entry.versions) or "every version"
        return LedgerVerdict("unexpected-pass", f"passes at {pinned}, inside the range of its ledger entry: remove the entry "
                             f"or narrow its versions ({entry.tracked_at})", entry)
    if elsewhere is None:
        return LedgerVerdict("finding", "fails and no ledger entry covers it", None) if failed else LedgerVerdict("pass", "pass")
    outside = elsewhere.out_of_range(versions)
    where = ", ".join(f"{k} {v}" for k, v in outside.items())
    seen = ", ".join(f"{k} {v}" for k, v in elsewhere.versions.items())
    if failed:
        return LedgerVerdict("finding", f"still fails at {where}, outside its ledger entry's versions ({seen}): "
                             f"extend the range if it is the same bug ({elsewhere.tracked_at})", elsewhere)
    return LedgerVerdict("fixed", f"FIXED in {where}: passes here; its ledger entry covers {seen} ({elsewhere.tracked_at})", elsewhere)


def missing_reports(entries: list[Entry], ledger_path: Path) -> list[str]:
    """The ``report`` paths of unreported entries that do not exist beside ``ledger_path``."""
    folder = Path(ledger_path).parent
    return [e.report for e in entries if e.report is not None and not (folder / e.report).is_file()]


def golden_cases(folder: Path = GOLDEN / "cases") -> list[Path]:
    return sorted(folder.glob("*.json"))
