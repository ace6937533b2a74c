"""Triage of a write finding (``KERNEL-CASEID/writes.json``, saved by ``pa-oracle writes``): run it again on its
kernel (REPRODUCED or not), minimize it with the one minimizer (``pa_oracle.fuzz.campaign.minimize.minimize_write``:
ddmin over the appended requests, then fewer appended tokens and padding rows, keeping the same kind of wrong
bytes), localize the wrong bytes (which request, token, page, slot, head; expected and found; the right values at
the wrong slot or not) and write ``triage.md`` with the minimal ``minimized/writes.json`` and its replay command.

The verdict is the write check's (``pa_oracle.fuzz.checks.append.WRITE``, isolated as the campaign runs it). The
kinds of the wrong bytes need the pools, which a verdict does not carry: for a failure with wrong bytes the kernel
runs once more here, in this process, on the same inputs (``localize_write``), and the kinds are added to the
verdict's message as a ``wrong bytes: ...`` line, which ``minimize.signature`` reads. Kinds, per wrong
(tensor, page, slot, head) row: ``placement`` (it holds an appended row that belongs elsewhere: the right values at
the wrong slot, head or tensor), ``not written`` (an appended slot still holds its canary), ``value`` (an appended
slot holds bytes that are no appended row), ``canary written`` (a slot outside the appended ones holds bytes that
are no appended row), ``padding written`` (it holds a padding row, which a correct write stores nowhere)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pa_oracle.backends.base import Backend
from pa_oracle.fuzz.campaign.finding_record import FindingError, FindingMeta, FoundBy, today
from pa_oracle.fuzz.campaign.findings import WRITE_FINDING, first_line
from pa_oracle.fuzz.campaign.write_files import read_saved_write
from pa_oracle.fuzz.campaign.minimize import HANG, TRIAGE_RUNS, WRONG_BYTES, Minimized, WriteWork, minimize_write
from pa_oracle.fuzz.checks.append import MUTATED, WRITE, WRITE_CHECK, engine_case
from pa_oracle.fuzz.run.isolation import default_case_timeout
from pa_oracle.fuzz.run.judge import case_judge
from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.oracle.append import AppendCase, compare_pools, make_inputs, quantised_values
from pa_oracle.oracle.tensors import raw_bits

SHOWN = 20  # wrong rows listed in the report


@dataclass(frozen=True)
class SavedWriteFinding:
    """A ``writes.json``: its case, the kernel it names and its finding record."""

    path: Path
    case: AppendCase
    meta: FindingMeta


def read_write_finding(path: Path) -> SavedWriteFinding:
    """The case and record of a ``writes.json``, read strictly (``read_saved_write``: exact types, bounded sizes and
    pool); a ``CaseError`` or ``FindingError`` naming the file and field."""
    case, meta = read_saved_write(Path(path))
    if meta is None:
        raise FindingError(f"{path}: meta: a write finding holds its finding record as a JSON object under 'meta'")
    return SavedWriteFinding(Path(path), case, meta)


# --- localization -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WrongRow:
    """One (tensor, page, slot, head) whose bytes are wrong, and what they are."""

    which: str  # "k" or "v"
    page: int
    slot: int
    head: int
    kind: str  # placement, not written, value, canary written, padding written
    expected: str  # whose value this slot should hold ("its canary" outside the appended slots)
    found: str  # whose bytes it holds
    request: int | None = None  # the request / appended token / position the slot belongs to (None: not appended)
    token: int | None = None
    position: int | None = None
    value_at: str | None = None  # where the value this slot should hold was written instead, if anywhere


@dataclass
class WriteLocalization:
    rows: list[WrongRow] = field(default_factory=list)  # every wrong row, in pool order (k first)

    @property
    def kinds(self) -> list[str]:
        return sorted({row.kind for row in self.rows})

    @property
    def requests(self) -> list[int]:
        return sorted({row.request for row in self.rows if row.request is not None})


def _nhd(case: AppendCase, pool: torch.Tensor) -> torch.Tensor:
    """The pool's bits as [pages, page, heads, dim] on the CPU."""
    view = pool if case.kv_layout == "NHD" else pool.permute(0, 2, 1, 3)
    return raw_bits(view.detach().cpu().contiguous())


def _rows(case: AppendCase, values: torch.Tensor, scale: float) -> torch.Tensor:
    """Appended rows as a correct write stores them (fp8: quantised once), as bits [rows, heads, dim]."""
    values = values.detach().cpu()
    return raw_bits(quantised_values(case, values, scale)[0] if case.quantised else values)


def _row_index(case: AppendCase, before: Any) -> dict[bytes, str]:
    """Bytes of each appended row (and padding row) -> who it is."""
    real = int(case.total_appended)
    index: dict[bytes, str] = {}
    for which, values, scale in (("k", before.append_k, case.k_scale), ("v", before.append_v, case.v_scale)):
        bits = _rows(case, values, scale)
        for t in range(bits.shape[0]):
            for h in range(case.num_kv_heads):
                who = (f"{which} of token {t} head {h}" if t < real else f"{which} of padding row {t - real} head {h}")
                index.setdefault(bits[t, h].numpy().tobytes(), who)
    return index


def _owners(case: AppendCase, before: Any) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(page, slot) of each appended token -> (request, token, position)."""
    slots, batch, positions = (before.slot_mapping.cpu().tolist(), before.batch_indices.cpu().tolist(),
                               before.positions.cpu().tolist())
    return {(s // case.page_size, s % case.page_size): (b, t, p)
            for t, (s, b, p) in enumerate(zip(slots, batch, positions)) if s >= 0}


def localize_pools(case: AppendCase, before: Any, k_after: torch.Tensor, v_after: torch.Tensor) -> WriteLocalization:
    """Every wrong row of the pools a kernel left (``compare_pools``'s rows, all of them), classified."""
    verdict = compare_pools(case, before, k_after, v_after, limit=1 << 62)
    index, owners = _row_index(case, before), _owners(case, before)
    canary = {"k": _nhd(case, before.k_pool), "v": _nhd(case, before.v_pool)}
    after = {"k": _nhd(case, k_after), "v": _nhd(case, v_after)}
    where: dict[str, str] = {}  # who -> a wrong row that holds it
    for m in verdict.mismatches:
        who = index.get(after[m.which][m.page, m.slot, m.head].numpy().tobytes())
        if who is not None:
            where.setdefault(who, f"{m.which} page {m.page} slot {m.slot} head {m.head}")
    loc = WriteLocalization()
    for m in verdict.mismatches:
        got = after[m.which][m.page, m.slot, m.head].numpy().tobytes()
        owner = owners.get((m.page, m.slot))
        found = index.get(got)
        if got == canary[m.which][m.page, m.slot, m.head].numpy().tobytes():
            kind, found = "not written", "its canary"
        elif found is not None and "padding" in found:
            kind = "padding written"
        elif found is not None:
            kind = "placement"
        else:
            kind, found = ("value" if owner else "canary written"), "other bytes"
        expected = f"{m.which} of token {owner[1]} head {m.head}" if owner else "its canary (no appended token here)"
        request, token, position = owner if owner else (None, None, None)
        loc.rows.append(WrongRow(m.which, m.page, m.slot, m.head, kind, expected, found, request=request, token=token,
                                 position=position, value_at=where.get(expected) if owner else None))
    return loc


def localize_write(case: AppendCase, backend: Backend) -> WriteLocalization:
    """Run the write kernel of ``backend`` on ``case`` here (the inputs of the seed, as the write check makes
    them) and classify every wrong row. Raises what the kernel raises."""
    kernel = backend.kernel  # type: ignore[attr-defined]  # a WriteBackend
    inputs = make_inputs(case, kernel.device)
    before = inputs._replace(k_pool=inputs.k_pool.clone(), v_pool=inputs.v_pool.clone())
    kernel.append(case, inputs)
    return localize_pools(case, before, inputs.k_pool, inputs.v_pool)


@contextmanager
def write_judge(backend: Backend, progress: Callable[[str], None]) -> Iterator[Callable[[AppendCase], Outcome]]:
    """The write check on ``backend`` (isolated as the campaign runs it), its failures with wrong bytes given a
    ``wrong bytes: KINDS`` line (a run of the kernel here, ``localize_write``)."""
    with case_judge(backend, timeout=default_case_timeout(), judge=WRITE) as judge:

        def judged(case: AppendCase) -> Outcome:
            outcome = judge(engine_case(case))
            if outcome.status != "fail" or outcome.message.startswith(MUTATED):
                return outcome
            try:
                kinds = localize_write(case, backend).kinds
            except Exception as exc:  # noqa: BLE001 - the second run raised: the kinds are unknown, the verdict stands
                progress(f"could not localize the wrong bytes here ({type(exc).__name__}: {exc})")
                return outcome
            return dataclasses.replace(outcome, message=f"{outcome.message}\n{WRONG_BYTES}{', '.join(kinds) or 'none'}")

        yield judged


# --- the triage ---------------------------------------------------------------------------------


@dataclass
class WriteTriage:
    saved: SavedWriteFinding
    backend: str
    user: bool
    outcome: Outcome  # the finding run again
    minimized: Minimized[WriteWork] | None = None
    minimized_path: Path | None = None  # minimized/writes.json
    localized: list[tuple[str, AppendCase, WriteLocalization]] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        return self.outcome.is_finding

    @property
    def final_case(self) -> AppendCase:
        return self.minimized.work.case if self.minimized is not None else self.saved.case

    def replay(self, path: Path) -> str:
        """``pa-oracle replay PATH`` on this kernel."""
        return shlex.join(["pa-oracle", "replay", str(path), "--kernel" if self.user else "-b", self.backend])


def triage_write(saved: SavedWriteFinding, backend: Backend, out_dir: Path, *, minimize_case: bool = True,
                 budget: int = TRIAGE_RUNS, progress: Callable[[str], None] | None = None) -> WriteTriage:
    """Run the saved case on ``backend``, minimize it if it still fails, localize the original and the minimal
    case and save the minimal one as ``out_dir/minimized/writes.json``."""
    say = progress or (lambda _: None)
    with write_judge(backend, say) as judge:
        say(f"running {backend.name} on {saved.path} ...")
        result = WriteTriage(saved, backend.name, bool(getattr(backend, "user", False)), judge(saved.case))
        if not result.reproduced:
            return result
        if result.outcome.message.startswith(HANG):
            say("not minimizing a hang: every candidate that hangs costs a whole case timeout")
            return result
        if minimize_case:
            say(f"minimizing for {backend.name} (budget {budget} kernel runs) ...")
            result.minimized = minimize_write(judge, saved.case, budget=budget, progress=say, first=result.outcome)
            result.minimized_path = save_minimized(result, backend, Path(out_dir) / "minimized")  # (the same if not reduced)
    cases = [("original case", saved.case)]
    if result.minimized is not None and result.minimized.reduced:
        cases.insert(0, ("minimized case", result.minimized.work.case))
    for label, case in cases:
        if result.outcome.status == "fail" and not result.outcome.message.startswith(MUTATED):
            say(f"localizing the {label} ...")
            result.localized.append((label, case, localize_write(case, backend)))
    return result


def save_minimized(result: WriteTriage, backend: Backend, folder: Path) -> Path:
    """The minimal case as a write finding's ``writes.json`` (the record says triage made it, from which case)."""
    assert result.minimized is not None
    outcome, case = result.minimized.outcome, result.minimized.work.case
    meta = FindingMeta(found_by=FoundBy(
        command="pa-oracle triage", check=WRITE_CHECK, backend=backend.name, kernel=backend.name if result.user else None,
        status=outcome.status, message=first_line(outcome.message),
        versions={k: str(v) for k, v in backend.versions().items()}, date=today()),
        check=WRITE_CHECK, minimized_from=result.saved.case.case_id)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / WRITE_FINDING
    path.write_text(json.dumps({"kernel": backend.name, "case": case.to_json(), "status": outcome.status,
                                "detail": outcome.message, "meta": meta.to_json()}, indent=1, sort_keys=True) + "\n")
    return path
