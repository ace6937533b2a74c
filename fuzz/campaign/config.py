"""What a campaign runs, fixed before it starts: ``CampaignConfig`` (frozen and checked once, as
Hypothesis's ``settings`` are), and what the caller watches it through (``Hooks``).

Verification model: every value is checked when the config is made, so a bad one is refused before
anything is drawn or written (``ValueError``; the CLI's own option types refuse them earlier, with
exit 2). A config never changes: ``replace`` makes another, checked again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pa_oracle.fuzz.campaign.ledger import Entry
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.fuzz.run.isolation import CASE_TIMEOUT, check_timeout
from pa_oracle.fuzz.run.runner import ORACLE, CaseCheck
from pa_oracle.oracle.tolerance import Tolerance

if TYPE_CHECKING:
    from pa_oracle.fuzz.campaign.drawers import Drawers
    from pa_oracle.fuzz.campaign.state import BackendResult
    from pa_oracle.fuzz.campaign.variants import VariantPlan


@dataclass(frozen=True)
class CampaignConfig:
    """A campaign's settings, for every (backend, check) pair it runs.

    ``examples``: the campaign's total per pair (a shard runs its share); ``seed``: the base seed (the same
    seed draws the same cases); ``isolate``: every case in a worker process (None: per backend,
    ``pa_oracle.fuzz.run.isolation.isolated_by_default``), a case longer than ``case_timeout`` seconds a
    hang; ``ledger``: drawn cases an entry covers are skipped as known (None: none skipped); ``out_dir``:
    where findings are saved (None: not saved); ``pipeline``: an isolated backend's next cases are judged
    while this one is counted (``pa_oracle.fuzz.campaign.chunks``); ``time_budget`` / ``compile_budget``:
    seconds for the whole run and for its builds (None: no bound); ``rerun_findings``: a resumed pair that
    stopped at a finding runs again; ``shrink_seconds``: a bound on shrinking a finding (the selftest asks
    "found?", not "how small")."""

    examples: int = 200
    seed: int = 0
    limits: Limits = Limits()
    tolerance: Tolerance = Tolerance()
    checks: tuple[CaseCheck, ...] = (ORACLE,)
    isolate: bool | None = None
    case_timeout: float = CASE_TIMEOUT
    shard: Shard = Shard()
    ledger: Sequence[Entry] | None = None  # kept as a tuple
    out_dir: Path | None = None
    pipeline: bool = True
    time_budget: float | None = None
    compile_budget: float | None = None
    rerun_findings: bool = False
    shrink_seconds: float | None = None  # a finding's shrinking ends after this long (the finding so far is kept)

    def __post_init__(self) -> None:
        if not isinstance(self.examples, int) or isinstance(self.examples, bool) or self.examples < 0:
            raise ValueError(f"campaign config: examples must be an integer >= 0, got {self.examples!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"campaign config: seed must be an integer, got {self.seed!r}")
        object.__setattr__(self, "case_timeout", check_timeout(self.case_timeout))
        for name in ("time_budget", "compile_budget", "shrink_seconds"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise ValueError(f"campaign config: {name} must be None or a finite number of seconds > 0, got {value!r}")
        if not self.checks:
            raise ValueError("campaign config: checks must name at least one check")
        object.__setattr__(self, "checks", tuple(self.checks))
        if self.ledger is not None:
            object.__setattr__(self, "ledger", tuple(self.ledger))
        if self.out_dir is not None:
            object.__setattr__(self, "out_dir", Path(self.out_dir))

    def replace(self, **changes: Any) -> CampaignConfig:
        """Another config with ``changes``, checked again."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Hooks:
    """What the caller is told while a pair runs: ``progress`` and ``checkpoint`` after every chunk (the
    result so far; ``checkpoint`` saves it), ``on_case`` after every judged case (False: a shrink step)."""

    progress: Callable[[BackendResult], None] | None = None
    checkpoint: Callable[[BackendResult], None] | None = None
    on_case: Callable[[BackendResult, bool], None] | None = None


@dataclass
class Shared:
    """What one turn of a pair shares with the rest of its campaign: the run's monotonic ``deadline`` for
    starting a case and ``cutoff`` for an isolated case running (default: ``deadline``), the worker process
    per device (``workers``, closed by the campaign), the draw processes (``drawers``) and the pair's built
    variants (``variants``, ``pa_oracle.fuzz.campaign.variants``). The default: a run of its own."""

    deadline: float | None = None
    cutoff: float | None = None
    workers: dict[str, Any] | None = None
    drawers: Drawers | None = None
    variants: VariantPlan | None = None

    @property
    def stop_at(self) -> float | None:
        """When an isolated case still running is cut off as out of time."""
        return self.cutoff or self.deadline
