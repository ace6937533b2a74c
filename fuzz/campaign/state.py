"""A campaign's state, kept in its output folder so that a killed campaign resumes where it was.

Per backend: chunks done (the next Hypothesis seed follows from it), counters, findings, coverage
counts and the ids of the cases already drawn (a resumed or later chunk never runs one again). The
file is rewritten atomically (temp file + ``os.replace``) after a chunk, about every second
(``Checkpoints``), so a kill leaves the state of a finished chunk, and a Ctrl-C that of the last.
Unsharded: ``OUT/campaign.json``; shard i of n: ``OUT/shards/campaign-i-of-n.json``.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
import time
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from pa_oracle.fuzz.campaign.coverage import Coverage
from pa_oracle.fuzz.campaign.findings import allowed_clause
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.checks.append import WRITE_CHECK
from pa_oracle.fuzz.checks.registry import ALL_CHECKS
from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.oracle.case import read_json
from pa_oracle.oracle.errors import BadInput
from pa_oracle.oracle.schema import convert

SCHEMA_VERSION = 1
# "Ran nothing" is no verdict: an oracle campaign of at least UNSUPPORTED_MIN examples whose share of
# unsupported cases is above UNSUPPORTED_BOUND judged too little of what its backend declares to be ok (a
# correct CPU backend declines none within its declared capabilities; a kernel declining 16 of 20 did).
UNSUPPORTED_BOUND, UNSUPPORTED_MIN = 0.9, 20
Status = Literal["pending", "running", "done", "finding", "exhausted", "incomplete"]
_RUN_ONLY = ("finding", "finding_dir", "repro")


class CampaignStateError(BadInput):
    """A campaign state file that cannot be read or resumed; the message says why and what to do."""


@dataclass
class FindingRecord:
    case_id: str
    status: str  # "fail" or "crash"
    message: str  # first line of the verdict or the crash
    case: str  # Case.summary() of the shrunk case
    dir: str | None
    repro: str | None
    check: str = "oracle"  # which check found it (``pa_oracle.fuzz.checks.registry.ALL_CHECKS``)


@dataclass
class BackendResult:
    """One backend's campaign of one check so far (on one shard, or merged over shards)."""

    backend: str
    examples: int = 0
    passed: int = 0
    unsupported: int = 0
    skipped_known: int = 0  # distinct drawn cases that a ledger entry's predicate matched
    seconds: float = 0.0
    worst_ratio: float = 0.0  # largest kernel/control max-error ratio among passing examples whose control had an error
    worst_allowed: float = 0.0  # largest max error over the allowed max (floor included: 1.0 is the limit) of a pass
    chunks_done: int = 0
    status: Status = "pending"
    findings: list[FindingRecord] = field(default_factory=list)
    coverage: Coverage = field(default_factory=Coverage)
    declared: dict[str, list[str]] = field(default_factory=dict)  # pa_oracle.fuzz.campaign.coverage.declared of the backend
    seen: list[str] = field(default_factory=list)  # case ids drawn, in order
    notes: list[str] = field(default_factory=list)
    exact: int = 0  # of the passing kernel-vs-kernel comparisons, how many were bit-exact
    skip_reasons: dict[str, int] = field(default_factory=dict)  # first line of a skip's reason -> count
    not_applicable: str | None = None  # why the check cannot apply to this backend (then nothing ran)
    check: str = "oracle"  # which check (``pa_oracle.fuzz.checks.registry.ALL_CHECKS``)
    start_seconds: float = 0.0  # of ``seconds``: starting worker processes (spawn, CUDA context, imports)
    compile_seconds: float = 0.0  # of ``seconds``: builds ahead of the first case and first cases of unbuilt variants
    not_built: str | None = None  # why it judged nothing: no variant of it was built in the run's compile plan
    no_keys: int = 0  # judged (not unsupported) cases in which no query row attends any key: they test nothing
    # this run only (not persisted): the latest finding as an Outcome, where it was saved, its repro
    finding: Outcome | None = field(default=None, compare=False)
    finding_dir: Path | None = field(default=None, compare=False)
    repro: str | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        """Its name in a campaign state: the backend's for the oracle comparison, else BACKEND:CHECK."""
        return self.backend if self.check == "oracle" else f"{self.backend}:{self.check}"

    @property
    def is_complete(self) -> bool:
        """It ran to its example count, its time budget or a finding, and judged something
        (``pa_oracle.fuzz.campaign.verdict.why_incomplete``, the one definition): "incomplete" (reason in ``notes``)
        and "exhausted" are not, nor is a run that judged no example. A check that cannot apply to the
        backend is complete."""
        from pa_oracle.fuzz.campaign.verdict import why_incomplete

        return why_incomplete(self) is None

    def judged_nothing(self) -> str | None:
        """Why its examples are no verdict although it ran, or None: no example ran, every one was
        unsupported, every judged case attended no key (``no_keys``), or (the oracle comparison) more than
        ``UNSUPPORTED_BOUND`` of at least ``UNSUPPORTED_MIN`` examples were unsupported, the examples judged
        without an attended key left out of both counts. A finding is a verdict."""
        if self.findings or self.not_applicable is not None or self.not_built is not None:
            return None
        judged = self.examples - self.unsupported
        if self.examples == 0:
            return "no example ran"
        if judged <= 0:
            return f"all {self.examples} examples were unsupported"
        if judged <= self.no_keys:
            return (f"every judged case attended no key ({self.no_keys} such case(s), {self.unsupported} unsupported "
                    f"of {self.examples}): nothing was compared")
        real = self.examples - self.no_keys  # a case judged without a key does not count for the kernel (it compared nothing)
        if self.check == "oracle" and real >= UNSUPPORTED_MIN and self.unsupported > UNSUPPORTED_BOUND * real:
            besides = f", besides {self.no_keys} judged without an attended key" if self.no_keys else ""
            return (f"{self.unsupported} of {real} examples were unsupported (more than {UNSUPPORTED_BOUND:.0%}{besides}): "
                    "the kernel declined nearly every case drawn within its declared capabilities")
        return None

    @property
    def judge_seconds(self) -> float:
        """Of ``seconds``: drawing and judging cases (neither starting workers nor compiling)."""
        return max(self.seconds - self.start_seconds - self.compile_seconds, 0.0)

    def time_split(self) -> str:
        """>>> BackendResult("b", seconds=10.0, start_seconds=2.0, compile_seconds=3.0).time_split()
        'start 2.0s, compile 3.0s, judge 5.0s'"""
        return f"start {self.start_seconds:.1f}s, compile {self.compile_seconds:.1f}s, judge {self.judge_seconds:.1f}s"

    @property
    def coverage_fraction(self) -> float:
        return self.coverage.fraction(self.declared)

    def line(self) -> str:
        if self.check != "oracle":
            return self._check_line()
        rate = self.examples / self.seconds if self.seconds else 0.0
        if self.not_built is not None and not self.examples:
            return f"{self.backend}: NOT BUILT ({self.not_built[:300]}); 0 examples, {self.seconds:.1f}s ({self.time_split()})"
        state = f"{len(self.findings)} FINDING(S){self._findings_at()}" if self.findings else "ok"
        if not self.is_complete:
            state = f"INCOMPLETE ({self._why_incomplete()[:160]})" + (f", {state}" if self.findings else "")
        skipped = f", {self.skipped_known} skipped as known" if self.skipped_known else ""
        refused = "".join(f": {count} {reason}" for reason, count in self.skip_reasons.items())  # "refuses views"
        return (
            f"{self.backend}: {state}, {self.examples} examples ({self.passed} passed, {self.unsupported} unsupported"
            f"{refused}"
            f"{skipped}) in {self.seconds:.1f}s ({rate:.1f}/s; {self.time_split()}), coverage {self.coverage_fraction:.0%}, "
            f"worst pass at {self.worst_allowed:.2f} of the allowed error ({self.worst_ratio:.2f}x the control's)"
        )

    def _findings_at(self) -> str:
        """Where the findings' errors stand against the allowed error, on the scale of ``worst_allowed`` (so that
        ``1 FINDING(S)`` is never read beside only the passes' 0.00): ``' (at 250x the allowed error)'``, the worst
        finding's; '' when no finding's message states an error over its allowed one (a crash, a hang)."""
        return allowed_clause(f.message for f in self.findings)

    def _why_incomplete(self) -> str:
        if self.status in ("done", "finding", "running") and (nothing := self.judged_nothing()) is not None:
            return nothing  # the status is no reason: it ran, and judged nothing
        return self.notes[-1] if self.notes else self.status

    def _check_line(self) -> str:
        head = f"{self.backend} {self.check}"
        if self.not_applicable:
            return f"{head}: not applicable: {self.not_applicable}"
        state = f"VIOLATED ({self.findings[-1].message[:160]})" if self.findings else "ok"
        if not self.is_complete:
            state = f"INCOMPLETE ({self._why_incomplete()[:160]})" + (f", {state}" if self.findings else "")
        skips = ""
        if self.skip_reasons:
            reason, count = max(self.skip_reasons.items(), key=lambda item: item[1])
            skips = f" (most often: {reason[:90]!r} x{count})"
        known = f", {self.skipped_known} skipped as known" if self.skipped_known else ""
        return (
            f"{head}: {state}; {self.passed}/{self.examples} held ({self.exact} bit-exact), "
            f"{self.unsupported} skipped{skips}{known}, {self.seconds:.1f}s"
        )

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _RUN_ONLY}
        data["findings"] = [asdict(f) for f in self.findings]
        data["coverage"] = self.coverage.counts
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], *, where: str = "backend result", field: str = "") -> BackendResult:
        """A result as ``to_json`` wrote it, checked strictly (``_BackendFile``); a
        ``CampaignStateError`` names ``where`` and the field."""
        raw = convert(data, _BackendFile, where=where, error=CampaignStateError, field=field)
        given = _given(raw)
        findings = [FindingRecord(**_given(f)) for f in given.pop("findings", [])]  # an absent optional field: its default
        coverage = Coverage(counts=given.pop("coverage", {}))
        result = cls(**given, findings=findings, coverage=coverage)
        if (contradiction := result._contradiction()) is not None:
            name, why = contradiction
            raise CampaignStateError(f"{where}: {field + '.' if field else ''}{name}: {why}")
        return result

    def _contradiction(self) -> tuple[str, str] | None:
        """(field, why) where the counters cannot all be true (no run writes them so), or None. Every
        counted case, judged or skipped as known, was drawn first: its id is in ``seen``."""
        judged = self.examples - self.unsupported
        if self.examples + self.skipped_known > len(self.seen):
            return ("examples", f"{self.examples} examples and {self.skipped_known} skipped as known, but only "
                    f"{len(self.seen)} case ids drawn (seen): every counted case was drawn")
        if self.passed + self.unsupported > self.examples:
            return ("passed", f"{self.passed} passed and {self.unsupported} unsupported of {self.examples} examples")
        if self.exact > self.passed:
            return ("exact", f"{self.exact} bit-exact of {self.passed} passed")
        if self.no_keys > judged:
            return ("no_keys", f"{self.no_keys} cases without an attended key of {judged} judged")
        if sum(self.skip_reasons.values()) > self.unsupported:
            return ("skip_reasons", f"{sum(self.skip_reasons.values())} skips counted by reason, {self.unsupported} unsupported")
        if self.status == "finding" and not self.findings:
            return ("status", "'finding' with no finding recorded (findings is empty)")
        for i, finding in enumerate(self.findings):
            if finding.check != self.check:  # a pair's findings are its own check's
                return (f"findings[{i}].check", f"{finding.check!r}, but the result is the {self.check}'s (its check)")
        return None


@dataclass
class CampaignState:
    """``config`` is what decides the draws (seed, shard, limits, narrowing, backends); a resume
    must ask for the same."""

    config: dict[str, Any]
    results: dict[str, BackendResult] = field(default_factory=dict)

    def save(self, path: Path, as_of: dict[str, dict[str, Any]] | None = None) -> None:
        """Write the state; ``as_of`` gives some results as they were earlier (``snapshot``), not as they are."""
        backends = {name: (as_of or {}).get(name) or r.to_json() for name, r in self.results.items()}
        payload = {"schema_version": SCHEMA_VERSION, "config": self.config, "backends": backends}
        write_atomically(path, json.dumps(payload, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> CampaignState:
        """Read a state file, strictly: a ``CampaignStateError`` names the file and the field."""
        if not Path(path).exists():
            raise CampaignStateError(f"{path}: no campaign state to resume (start one without --resume)")
        data = read_json(Path(path), CampaignStateError)
        if not isinstance(data, dict):
            raise CampaignStateError(f"{path}: a campaign state is a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION or isinstance(version, bool):
            raise CampaignStateError(f"{path}: unknown campaign schema_version {version!r}; this version reads {SCHEMA_VERSION}")
        where = f"{path}: malformed campaign state"
        state = convert(data, _StateFile, where=where, error=CampaignStateError)
        if state.config.shard is not msgspec.UNSET:
            try:
                shard = Shard.parse(state.config.shard)
            except ValueError as exc:
                raise CampaignStateError(f"{where}: config.shard: {exc}") from None
            named = _shard_named(Path(path))
            if named is not None and named != shard:
                raise CampaignStateError(f"{where}: config.shard: {state.config.shard!r}, but {Path(path).name} holds shard "
                                         f"{named}'s state (its cases and seeds would be another shard's)")
        results = {}
        for name, raw in state.backends.items():
            result = BackendResult.from_json(raw, where=where, field=f"backends.{name}")
            if result.key != name:
                raise CampaignStateError(f"{where}: backends.{name}.backend is {result.backend!r}, not the name it is kept under")
            results[name] = result
        return cls(dict(data["config"]), results)


# --- the file schema, for reading (``save`` writes what the dataclasses hold) ------------------

_Count = Annotated[int, msgspec.Meta(ge=0, le=2**53)]  # (1e18 examples is no count a campaign reaches)
_NonNegative = Annotated[float, msgspec.Meta(ge=0, le=1e300)]  # NaN and infinity fail it too


def _file_schema(cls: type, overrides: dict[str, Any], exclude: tuple[str, ...] = ()) -> Any:
    """A strict msgspec struct of dataclass ``cls``'s fields (a field added there is read too): an
    int is a count (>= 0), a float >= 0; a field with a default may be absent."""
    hints = typing.get_type_hints(cls)
    spec: list[Any] = []
    for f in fields(cls):
        if f.name in exclude:
            continue
        kind = overrides.get(f.name, {int: _Count, float: _NonNegative}.get(hints[f.name], hints[f.name]))
        optional = f.default is not MISSING or f.default_factory is not MISSING
        spec.append((f.name, typing.Union[kind, msgspec.UnsetType], msgspec.UNSET) if optional else (f.name, kind))
    return msgspec.defstruct(f"_{cls.__name__}File", spec, forbid_unknown_fields=True)


def _given(raw: Any) -> dict[str, Any]:
    """The fields a file gives of a struct ``_file_schema`` read (absent ones left out: the dataclass's default)."""
    return {k: v for k, v in msgspec.structs.asdict(raw).items() if v is not msgspec.UNSET}


_FindingFile = _file_schema(FindingRecord, {"check": Annotated[str, msgspec.Meta(min_length=1)]})
_BackendFile = _file_schema(
    BackendResult,
    {"findings": list[_FindingFile], "coverage": dict[str, dict[str, _Count]]},  # type: ignore[valid-type]
    exclude=_RUN_ONLY,
)


class _ConfigFile(msgspec.Struct):
    """The options a campaign was started with; any may be absent, and a key this version does not
    know is kept (a newer option)."""

    seed: int | msgspec.UnsetType = msgspec.UNSET
    max_batch: Annotated[int, msgspec.Meta(ge=1)] | msgspec.UnsetType = msgspec.UNSET
    max_kv_len: _Count | msgspec.UnsetType = msgspec.UNSET
    only: list[str] | msgspec.UnsetType = msgspec.UNSET
    backends: list[str] | msgspec.UnsetType = msgspec.UNSET
    kernels: list[str] | msgspec.UnsetType = msgspec.UNSET
    shard: str | msgspec.UnsetType = msgspec.UNSET
    checks: Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(min_length=1)] | msgspec.UnsetType = msgspec.UNSET


class _StateFile(msgspec.Struct, forbid_unknown_fields=True):
    schema_version: int
    config: _ConfigFile
    backends: dict[str, Any]  # each is read by BackendResult.from_json, so a message names it


def snapshot(result: BackendResult) -> dict[str, Any]:
    """``result.to_json()`` as it is now, sharing nothing the engine changes later (a list of drawn ids is copied,
    not deep-copied: its strings do not change)."""
    data = result.to_json()
    seen = data.pop("seen")
    data = copy.deepcopy(data)
    data["seen"] = list(seen)
    return data


class Checkpoints:
    """Saves a campaign's state after a pair's chunk, but not after every one: a save writes every drawn id
    (~33 ms at 80,000 on the development machine's core), and saving after each of a 5-minute campaign's ~1,900 chunks took ~15% of
    it. A chunk is saved once ``EVERY`` seconds have passed since the last save, and no sooner than ``SHARE`` of
    the time since then went to saving; a chunk that ends a pair's run (any status but "running") is saved at
    once, and ``flush`` saves at a turn's end. Every chunk's result is kept as a snapshot, so that a run cut in
    the middle of a chunk (Ctrl-C, an error of the tool) saves the last whole chunk of each pair (``flush``
    with ``broken``). A kill loses at most the chunks of the last ``EVERY`` seconds (or so): a resume draws them
    again, the same cases."""

    EVERY = 1.0
    SHARE = 0.05

    def __init__(self, state: CampaignState, path: Path) -> None:
        self.state, self.path = state, path
        self._whole = {key: snapshot(r) for key, r in state.results.items()}  # each pair's result at its last whole chunk
        self._next = 0.0  # monotonic time after which a chunk is saved

    def __call__(self, result: BackendResult) -> None:
        self.state.results[result.key] = result
        self._whole[result.key] = snapshot(result)
        if result.status != "running" or time.monotonic() >= self._next:
            self._save()

    def _save(self) -> None:
        started = time.monotonic()
        self.state.save(self.path, as_of=self._whole)
        ended = time.monotonic()
        self._next = ended + max(self.EVERY, (ended - started) / self.SHARE)

    def flush(self, broken: bool = False) -> None:
        """Save each pair as it is now (between turns, when every pair is whole: a turn's end adds notes after its
        last chunk), or, ``broken`` (the run stopped in the middle of a chunk), as of its last whole chunk."""
        if not broken:
            self._whole = {key: snapshot(r) for key, r in self.state.results.items()}
        self._save()


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader (or a kill) sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


CAMPAIGN, CHECKS_CAMPAIGN = "campaign", "checks"  # state file names: ``fuzz``'s and ``metamorphic``'s


def state_path(out_dir: Path, shard: Shard, kind: str = CAMPAIGN) -> Path:
    if shard.count == 1:
        return Path(out_dir) / f"{kind}.json"
    return Path(out_dir) / "shards" / f"{kind}-{shard.index}-of-{shard.count}.json"


def resumed_checks(state: CampaignState, path: Path, kind: str) -> list[str] | None:
    """The checks a resumed campaign runs (its ``config.checks``; None: not kept, the command's own), when they are
    those of the campaign the state of ``kind`` holds: the oracle comparison alone in ``campaign.json``, checks of
    attention kernels in ``checks.json``, the write check alone in the write campaign's; else a
    ``CampaignStateError`` naming the file and the field."""
    checks = state.config.get("checks")
    if checks is None:
        return None
    where = f"{path}: malformed campaign state: config.checks"
    for i, name in enumerate(checks):
        if name not in ALL_CHECKS and name != WRITE_CHECK:
            close = difflib.get_close_matches(name, [*ALL_CHECKS, WRITE_CHECK], n=2)
            hint = f"; did you mean {' or '.join(close)}?" if close else f" (known: {', '.join([*ALL_CHECKS, WRITE_CHECK])})"
            raise CampaignStateError(f"{where}[{i}]: {name!r} is no check{hint}")
        if name in checks[:i]:
            raise CampaignStateError(f"{where}[{i}]: {name!r} again (a campaign runs each check once)")
    if kind == CAMPAIGN and checks != ["oracle"]:
        raise CampaignStateError(f"{where}: {checks}, but {Path(path).name} holds the oracle comparison's campaign")
    if kind not in (CAMPAIGN, CHECKS_CAMPAIGN) and checks != [WRITE_CHECK]:
        raise CampaignStateError(f"{where}: {checks}, but {Path(path).name} holds a write campaign (the write check alone)")
    if kind == CHECKS_CAMPAIGN and WRITE_CHECK in checks:
        raise CampaignStateError(f"{where}[{checks.index(WRITE_CHECK)}]: {WRITE_CHECK!r} judges write kernels: its "
                                 f"campaign is kept in writes-state.json, not {Path(path).name}")
    return list(checks)


def _shard_named(path: Path) -> Shard | None:
    """The shard whose state ``state_path`` keeps at ``path`` (None: a name it does not write)."""
    if path.name in (f"{CAMPAIGN}.json", f"{CHECKS_CAMPAIGN}.json"):
        return Shard()
    m = re.fullmatch(rf"(?:{CAMPAIGN}|{CHECKS_CAMPAIGN})-(\d+)-of-(\d+)\.json", path.name, re.ASCII)
    if m is None or path.parent.name != "shards" or m[1] != str(int(m[1])) or m[2] != str(int(m[2])):
        return None
    try:
        return Shard(int(m[1]), int(m[2]))
    except ValueError:
        return None


def load_shards(out_dir: Path, kind: str = CAMPAIGN) -> list[CampaignState]:
    """The states of every shard in ``out_dir/shards``, checked to be one campaign's, else a
    ``CampaignStateError`` naming the file and field (exit 2): one shard count, each shard once (its file
    name is ``KIND-I-of-N.json`` and its ``config.shard`` says ``I/N``), every option but the shard the
    same (seed, limits, backends, kernels, ...), no case drawn by two shards (they never draw one: a
    shard's state copied under another name). A shard with no state yet (not run, or stopped before its
    first save) is named in the notes of every loaded result, which is then incomplete: a merge
    without it is no verdict over the campaign (exit 3, ``pa_oracle.fuzz.exits``)."""
    folder = Path(out_dir) / "shards"
    pattern = re.compile(rf"{re.escape(kind)}-(\d+)-of-(\d+)\.json", re.ASCII)
    found = sorted(
        (int(m[2]), int(m[1]), p) for p in folder.glob(f"{kind}-*-of-*.json") if (m := pattern.fullmatch(p.name))
    )
    counts = {count for count, _, _ in found}
    if not found:
        raise CampaignStateError(f"{folder} holds no shard state ({kind}-I-of-N.json) to merge")
    if len(counts) > 1:
        raise CampaignStateError(f"{folder} mixes shard counts {sorted(counts)}: merge one campaign at a time")
    named: dict[int, Path] = {}
    for count, index, path in found:
        try:
            Shard(index, count)
        except ValueError as exc:
            raise CampaignStateError(f"{path}: its name is no shard of the campaign: {exc}") from None
        if path.name != f"{kind}-{index}-of-{count}.json" or index in named:
            other = named.get(index, folder / f"{kind}-{index}-of-{count}.json")
            raise CampaignStateError(f"{path}: shard {index}/{count} again (it is {other.name}'s): a shard is merged once")
        named[index] = path
    states = [CampaignState.load(path) for _, _, path in found]
    first_path, first = found[0][2], states[0]
    drawn: dict[tuple[str, str], Path] = {}
    for (count, index, path), state in zip(found, states):
        if state.config.get("shard") != f"{index}/{count}":
            raise CampaignStateError(f"{path}: config.shard is {state.config.get('shard')!r}, but the file is shard "
                                     f"{index}/{count}'s: a state moved to another shard's name")
        for key in sorted((state.config.keys() | first.config.keys()) - {"shard"}):
            if state.config.get(key) != first.config.get(key):
                raise CampaignStateError(
                    f"{path}: config.{key} is {state.config.get(key)!r}, but {first.config.get(key)!r} in {first_path.name}: "
                    "the shards of one campaign share every option but --shard (merge one campaign at a time)")
        for name, result in state.results.items():
            for case_id in result.seen:
                other = drawn.setdefault((name, case_id), path)
                if other != path:
                    raise CampaignStateError(f"{path}: backends.{name}.seen: case {case_id} was drawn by {other.name} too: "
                                             "two shards never draw one case (a shard's state copied?)")
    missing = missing_shards(states)
    if missing:
        note = (f"merged without shard(s) {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''} "
                f"({len(missing)} of {found[0][0]}: no state yet, not run or stopped before its first save)")
        for state in states:
            for result in state.results.values():
                result.notes.append(note)
                result.status = "incomplete"
    return states


def missing_shards(states: list[CampaignState]) -> list[str]:
    """The shards of the campaign that have no state among ``states`` (e.g. tasks not run yet)."""
    shards = [Shard.parse(s.config["shard"]) for s in states]
    present = {shard.index for shard in shards}
    return [str(Shard(i, shards[0].count)) for i in range(shards[0].count) if i not in present] if shards else []


def merge_results(per_shard: list[list[BackendResult]]) -> list[BackendResult]:
    """One result per backend over shards: counters and coverage add up, findings are concatenated,
    ``seconds`` is the slowest shard's (they ran side by side), ``seen`` is the union."""
    merged: dict[str, BackendResult] = {}
    for results in per_shard:
        for r in results:
            m = merged.setdefault(r.key, BackendResult(r.backend, check=r.check, declared=r.declared, status="running",
                                                       not_applicable=r.not_applicable))
            m.examples += r.examples
            m.passed += r.passed
            m.unsupported += r.unsupported
            m.skipped_known += r.skipped_known
            m.chunks_done += r.chunks_done
            m.seconds = max(m.seconds, r.seconds)
            m.start_seconds = max(m.start_seconds, r.start_seconds)  # like seconds: the shards ran side by side
            m.compile_seconds = max(m.compile_seconds, r.compile_seconds)
            m.worst_ratio = max(m.worst_ratio, r.worst_ratio)
            m.worst_allowed = max(m.worst_allowed, r.worst_allowed)
            m.findings += r.findings
            m.coverage.merge(r.coverage)
            m.seen += r.seen
            m.notes += [note for note in r.notes if note not in m.notes]  # (a merge's own note is in every shard)
            m.exact += r.exact
            m.no_keys += r.no_keys
            for reason, count in r.skip_reasons.items():
                m.skip_reasons[reason] = m.skip_reasons.get(reason, 0) + count
    for name, m in merged.items():
        statuses = {r.status for results in per_shard for r in results if r.key == name}
        m.status = (  # a shard that is no verdict makes the merge none, findings or not (exit 3 wins over 1)
            "incomplete" if statuses & {"incomplete", "exhausted"} else "finding" if m.findings
            else "done" if statuses <= {"done"} else "running"
        )
    return list(merged.values())
