"""The one minimizer of a finding: delta debugging on the case itself. ddmin over the requests,
then greedy one-step reductions (page pool, lengths, heads, options and memory layout, head dims, data)
repeated until a whole round changes nothing or the budget of kernel runs is spent. The campaign calls it after
Hypothesis with a few runs and the requests pass only (``fewer_requests``: ``B=6,
kv_lens=[0,0,0,0,0,1]`` becomes ``B=1`` before the finding is saved); triage with its full budget and
every pass (``minimize``).

Why two stages and not three: Hypothesis's shrinking is the search's own shrinker and stays. It
works on the choice sequence inside the search, where every shrunk case is one the strategy draws
(within the capabilities and the compiled variants) and ledger entries are rejected as they come;
but it cannot make a reduction that the choice sequence does not express: drop one request while
the others keep their pages and data, renumber pages, keep fewer heads of the same group. Those
work on the ``Case``, cost a kernel run per candidate and need a notion of "the same failure". The
campaign's request dropper and triage's delta debugger did this twice, with two notions (status
only; status and failure kinds), so a saved case could fail another way than the one Hypothesis
found. One stage after the search, with the caller's budget and passes, is all it takes.

Verification model: a candidate is kept only if it is a valid case (``pa_oracle.oracle.case``), the backend
supports it (``unsupported_reason``), no ledger entry covers it (``known``), it is strictly smaller
(``size``: no measure grows, one shrinks) and it *reproduces* the original failure (``Signature``):
the same status and, for a failure, a non-empty subset of the original's failure kinds (for a crash:
the same exception type), so a reduction never swaps the bug for another one or for a known one; and
an oracle failure's strength (``strength``): each quantity (out, LSE) the original fails strongly (its
worst, and any at 2x or more) still fails, by at least a tenth of the original's ratio to the allowed error
and at least 2x (``strength.required_ratio``), so a reduction never turns an output 1,800x off into an LSE
at 1.00x (issue 43). At
the end, when the budget was not spent and every pass ran, no single reduction of the result
(``one_step_reductions``) reproduces the failure.

A write case (``pa_oracle.oracle.append.AppendCase``, judged byte for byte by the write check) is minimized
by the same search (``minimize_write``): ddmin over its appended requests, then fewer appended tokens and padding
rows (``WRITE_PASSES``), under the same ``Signature``; the kinds of a write failure are the kinds of its wrong bytes
(``WRONG_BYTES``: a line its judge adds to the verdict's message, e.g. ``wrong bytes: placement, not written``).

EXTENDING: a reduction is a generator of ``(description, Workload)`` added to ``PASSES`` (``WriteWork``: ``WRITE_PASSES``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

from pa_oracle.backends.base import Backend
from pa_oracle.fuzz.campaign.findings import ratio_words
from pa_oracle.fuzz.campaign.strength import Strength, keeps, kept, required_ratio, strengths
from pa_oracle.fuzz.campaign.workload import (
    Workload,
    keep_heads,
    keep_requests,
    default_storage,
    regenerate,
    relabel_pages,
    resize,
    set_options,
    shrink_head_dims,
)
from pa_oracle.fuzz.run.runner import CONTRACT, Outcome, check_case
from pa_oracle.oracle.append import AppendCase
from pa_oracle.oracle.case import Case, CaseError
from pa_oracle.oracle.tolerance import Tolerance

Candidates = Iterator[tuple[str, Callable[[], Workload]]]  # description, builder

CAMPAIGN_RUNS = 16  # kernel runs the campaign's step may spend after Hypothesis
TRIAGE_RUNS = 200  # triage's default budget (``--budget``), the first run of the case included
HANG = "hang:"  # a hang costs a whole case timeout per candidate: neither step minimizes one
WRONG_BYTES = "wrong bytes: "  # a write failure's line naming the kinds of its wrong bytes (``signature``)
_WRITE_CHECK, _MUTATED = "write", "mutated: "  # pa_oracle.fuzz.checks.append's WRITE_CHECK and MUTATED

# (substring of a Verdict failure line, its kind): the first match names the line's kind
_FAILURE_KINDS = (
    ("out has shape", "out shape"),
    ("lse has shape", "lse shape"),
    ("out dtype", "out dtype"),
    ("non-finite elements", "out non-finite"),
    ("empty rows (no key", "empty row out"),
    ("empty rows have lse", "empty row lse"),
    ("non-finite values", "lse non-finite"),
    ("out max error", "out error"),
    ("out mean error", "out error"),
    ("lse max error", "lse error"),
    ("modified its inputs", "writes inputs"),
    ("kernel contract", "contract"),
)


@dataclass(frozen=True)
class Signature:
    """What kind of failure an outcome is: its status and failure kinds (or exception type), and how far each
    failing quantity is beyond its limit (``strength``; not part of the kind, so not compared)."""

    status: str
    kinds: frozenset[str]
    strengths: tuple[Strength, ...] = field(default=(), compare=False)

    def reproduced_by(self, other: Signature) -> bool:
        """``other`` is the same failure: the same status, a non-empty subset of the kinds, and (an oracle
        failure) the lead quantity failed at least ``strength.required_ratio`` as strongly."""
        if other.status != self.status:
            return False
        if self.status in ("fail", "crash"):
            return bool(other.kinds) and other.kinds <= self.kinds and keeps(self.strengths, other.strengths)
        return True

    def describe(self) -> str:
        rule = ", ".join(f"{s.quantity} >= {ratio_words(required_ratio(s.ratio))}x" for s in kept(self.strengths))
        rule = f"; kept at {rule} the allowed error" if rule else ""
        return self.status + (f" ({', '.join(sorted(self.kinds))}{rule})" if self.kinds else "")


def signature(outcome: Outcome) -> Signature:
    """The outcome's failure: a crash by its exception type (or "hang", or "worker process died
    (signal SIGSEGV) ..."); an oracle failure by the kinds of its verdict's lines; a failure of a
    check beyond the oracle (no verdict) by the check's name, or "contract" for a contract breach."""
    if outcome.status == "crash":
        return Signature("crash", frozenset({outcome.message.split(":", 1)[0].split(" (worker restarted)")[0]}))
    if outcome.status == "fail" and outcome.check == _WRITE_CHECK:
        return Signature("fail", _write_kinds(outcome.message))
    if outcome.status == "fail" and outcome.verdict is not None:
        kinds = set()
        for line in outcome.verdict.failures:
            kinds.add(next((kind for text, kind in _FAILURE_KINDS if text in line), line.split(" ")[0]))
        return Signature("fail", frozenset(kinds), strengths(outcome.verdict))
    if outcome.status == "fail":
        return Signature("fail", frozenset({"contract" if outcome.message.startswith(CONTRACT) else outcome.check}))
    return Signature(outcome.status, frozenset())


def _write_kinds(message: str) -> frozenset[str]:
    """A write failure's kinds: "mutated" (it changed its inputs), else the kinds its ``WRONG_BYTES`` line names
    (placement, value, not written, canary written, padding written), else "wrong bytes"."""
    if message.startswith(_MUTATED):
        return frozenset({"mutated"})
    for line in message.splitlines():
        if line.startswith(WRONG_BYTES):
            return frozenset(kind.strip() for kind in line.removeprefix(WRONG_BYTES).split(",") if kind.strip())
    return frozenset({"wrong bytes"})


def size(work: Workload) -> tuple[int, ...]:
    """Measures that a reduction may only lower (a partial order; see ``smaller``). The page order
    counts its inversions, which dropping a request or a page never raises (the pool stays)."""
    case = work.case
    lay, heads, opts = case.layout, case.heads, case.options
    options_on = sum(
        (
            opts.causal, opts.window_left >= 0, opts.logits_soft_cap > 0, opts.alibi_slopes is not None,
            opts.sinks is not None, opts.sm_scale is not None, opts.k_scale != 1, opts.v_scale != 1, opts.is_fp8,
            opts.rope is not None, case.storage is not None,
        )
    )
    data = work.explicit + (case.distribution != "normal") + (case.seed != 0)
    return (
        lay.batch_size, lay.total_q, sum(lay.kv_lens), lay.num_pages, _inversions(lay.kv_indices),
        heads.num_qo_heads, heads.num_kv_heads, heads.head_dim_qk, heads.head_dim_vo, options_on, data,
    )


def _inversions(pages: tuple[int, ...]) -> int:
    """Pairs of pages out of order (a Fenwick tree over their ranks: fast on long page tables)."""
    rank = {page: r for r, page in enumerate(sorted(set(pages)), start=1)}
    tree, count = [0] * (len(rank) + 1), 0
    for seen, page in enumerate(pages):
        i, not_above = rank[page], 0
        while i > 0:  # pages seen so far that are <= this one
            not_above, i = not_above + tree[i], i - (i & -i)
        count += seen - not_above
        i = rank[page]
        while i < len(tree):
            tree[i], i = tree[i] + 1, i + (i & -i)
    return count


def smaller(a: Workload, b: Workload) -> bool:
    """``a`` is strictly smaller than ``b``: no measure larger, at least one smaller."""
    sa, sb = size(a), size(b)
    return sa != sb and all(x <= y for x, y in zip(sa, sb))


# --- one-step reductions ------------------------------------------------------------------------


def drop_one_request(work: Workload) -> Candidates:
    batch = work.case.layout.batch_size
    for b in range(batch) if batch > 1 else ():
        yield f"drop request {b}", partial(keep_requests, work, [i for i in range(batch) if i != b])


def compact_pages(work: Workload) -> Candidates:
    yield "renumber pages 0..n-1 in order of use (unused pages dropped)", partial(relabel_pages, work, keep_order=False)
    yield "drop unused pages (page order kept)", partial(relabel_pages, work, keep_order=True)


def _cuts(n: int) -> list[tuple[str, int, int]]:
    """Sub-ranges of ``range(n)``, coarse to fine: halves, then one element less at each end."""
    cuts = [("second half", n // 2, n), ("first half", 0, n - n // 2), ("drop the first", 1, n), ("drop the last", 0, n - 1)]
    seen, out = {(0, n)}, []
    for name, a, e in cuts:
        if 0 <= a <= e <= n and (a, e) not in seen:
            seen.add((a, e))
            out.append((name, a, e))
    return out


def shorten(work: Workload) -> Candidates:
    """Fewer keys (halve, then step; a prefix keeps positions from 0, a suffix keeps the query's
    distance to the last keys) and fewer queries (a suffix keeps the queries' positions)."""
    lay = work.case.layout
    batch = range(lay.batch_size)
    for name, *_ in _cuts(max(lay.kv_lens)):  # every request at once first (uniform-length kernels)
        cut = {b: (a, e) for b in batch for n, a, e in _cuts(lay.kv_lens[b]) if n == name}
        if len(cut) == lay.batch_size and lay.batch_size > 1:
            yield f"keys: {name} of every request", partial(resize, work, {}, cut)
    for name, *_ in _cuts(max(lay.qo_lens)):
        cut = {b: (a, e) for b in batch for n, a, e in _cuts(lay.qo_lens[b]) if n == name}
        if len(cut) == lay.batch_size and lay.batch_size > 1:
            yield f"queries: {name} of every request", partial(resize, work, cut, {})
    for b in batch:
        for name, a, e in _cuts(lay.kv_lens[b]):
            yield f"request {b} keys: {name} ({lay.kv_lens[b]} -> {e - a})", partial(resize, work, {}, {b: (a, e)})
        for name, a, e in _cuts(lay.qo_lens[b]):
            yield f"request {b} queries: {name} ({lay.qo_lens[b]} -> {e - a})", partial(resize, work, {b: (a, e)}, {})


def fewer_heads(work: Workload) -> Candidates:
    """Fewer KV heads at the same group size, then a smaller group."""
    heads = work.case.heads
    every_member = list(range(heads.group_size))
    for name, a, e in _cuts(heads.num_kv_heads):
        if e > a:
            yield f"kv heads: {name} ({heads.num_kv_heads} -> {e - a})", partial(keep_heads, work, range(a, e), every_member)
    for name, a, e in _cuts(heads.group_size):
        if e > a:
            yield f"group: {name} ({heads.group_size} -> {e - a})", partial(keep_heads, work, range(heads.num_kv_heads), range(a, e))


def options_off(work: Workload) -> Candidates:
    opts = work.case.options
    offs: list[tuple[str, bool, dict[str, Any]]] = [
        ("causal off", opts.causal, {"causal": False}),
        ("window off", opts.window_left >= 0, {"window_left": -1}),
        ("soft cap off", opts.logits_soft_cap > 0, {"logits_soft_cap": 0.0}),
        ("alibi off", opts.alibi_slopes is not None, {"alibi_slopes": None}),
        ("sinks off", opts.sinks is not None, {"sinks": None}),
        ("rope off", opts.rope is not None, {"rope": None}),
        ("default sm_scale", opts.sm_scale is not None, {"sm_scale": None}),
        ("fp8 scales 1", opts.k_scale != 1 or opts.v_scale != 1, {"k_scale": 1.0, "v_scale": 1.0}),
        (f"kv dtype {opts.q_dtype} (fp8 off)", opts.is_fp8, {"kv_dtype": opts.q_dtype, "k_scale": 1.0, "v_scale": 1.0}),
    ]
    for name, on, changes in offs:
        if on:
            yield name, partial(set_options, work, **changes)
    if work.case.storage is not None:  # the same values, contiguous q and NHD caches (what repro.py hands a kernel)
        yield f"storage {work.case.storage.label()} off", partial(default_storage, work)


def smaller_head_dims(work: Workload) -> Candidates:
    h = work.case.heads
    if h.head_dim_qk != h.head_dim_vo:
        dim = min(h.head_dim_qk, h.head_dim_vo)
        yield f"head dims {h.head_dim_qk}/{h.head_dim_vo} -> {dim}/{dim}", partial(shrink_head_dims, work, dim, dim)
    pairs = [(h.head_dim_qk // 2, h.head_dim_vo // 2), (h.head_dim_qk // 2, h.head_dim_vo), (h.head_dim_qk, h.head_dim_vo // 2)]
    for qk, vo in dict.fromkeys(pairs):
        if qk >= 1 and vo >= 1 and (qk, vo) != (h.head_dim_qk, h.head_dim_vo):
            yield f"head dims {h.head_dim_qk}/{h.head_dim_vo} -> {qk}/{vo}", partial(shrink_head_dims, work, qk, vo)


def simpler_data(work: Workload) -> Candidates:
    case = work.case
    if work.explicit:
        yield "tensors generated from seed 0, normal (npz dropped)", partial(regenerate, work, seed=0, distribution="normal")
        if (case.seed, case.distribution) != (0, "normal"):
            yield f"tensors generated from seed {case.seed}, {case.distribution}", partial(
                regenerate, work, seed=case.seed, distribution=case.distribution
            )
        return
    if case.distribution != "normal":
        yield f"distribution {case.distribution} -> normal", partial(regenerate, work, seed=case.seed, distribution="normal")
    if case.seed != 0:
        yield f"seed {case.seed} -> 0", partial(regenerate, work, seed=0, distribution=case.distribution)


PASSES: tuple[tuple[str, Callable[[Workload], Candidates]], ...] = (
    ("requests", drop_one_request),
    ("pages", compact_pages),
    ("lengths", shorten),
    ("heads", fewer_heads),
    ("options", options_off),
    ("head dims", smaller_head_dims),
    ("data", simpler_data),
)
ALL_PASSES = tuple(kind for kind, _ in PASSES)  # triage's


def one_step_reductions(work: Workload) -> Iterator[tuple[str, Workload]]:
    """Every single reduction of ``work`` that builds a valid case (not yet filtered by backend)."""
    for _, make in PASSES:
        yield from _valid(make(work))


def _valid(candidates: Candidates) -> Iterator[tuple[str, Workload]]:
    """Build each candidate; an invalid one (``CaseError``, out-of-range cut) is skipped."""
    for description, build in candidates:
        try:
            yield description, build()
        except ValueError:  # CaseError is a ValueError
            continue


# --- the search --------------------------------------------------------------------------------


@dataclass
class Step:
    kind: str  # the pass that made it
    description: str
    summary: str  # the case after the step


W = TypeVar("W")  # what is minimized: a ``Workload`` (an attention case) or a ``WriteWork``


@dataclass
class Minimized(Generic[W]):
    original: W
    work: W
    outcome: Outcome  # the minimized case's outcome
    signature: Signature
    steps: list[Step] = field(default_factory=list)
    runs: int = 0  # kernel runs spent
    budget: int = 0
    exhausted: bool = False  # the budget ran out (or the judge stopped) before a round without progress

    @property
    def reduced(self) -> bool:
        return bool(self.steps)


@dataclass(frozen=True)
class _Shape:
    """What the search needs of a kind of case: its request count, a subset of its requests, its partial order
    and its passes after the requests."""

    requests: Callable[[Any], int]
    keep: Callable[[Any, list[int]], Any]
    smaller: Callable[[Any, Any], bool]
    passes: tuple[tuple[str, Callable[[Any], Iterator[tuple[str, Callable[[], Any]]]]], ...]


_ATTENTION = _Shape(lambda work: work.case.layout.batch_size, keep_requests, smaller, PASSES[1:])


class _Stop(Exception):
    """The budget is spent, or (the campaign's step) the judge could not run a candidate."""


@dataclass
class _Tester:
    """Runs candidates within a budget, caching by workload key; a candidate that is invalid, unsupported
    or known (a ledger entry covers it) is never run and never reproduces."""

    check: Callable[[Any], Outcome]
    target: Signature
    budget: int
    folder: Path | None = None  # where explicit data is written (None: seed-generated cases only)
    unsupported: Callable[[Case], str | None] = lambda _: None
    known: Callable[[Case], bool] = lambda _: False
    runs: int = 0
    seen: dict[str, Outcome | None] = field(default_factory=dict)
    shape: _Shape = field(default_factory=lambda: _ATTENTION)  # the kind of case: attention (``Workload``) or write

    def outcome(self, work: Any) -> Outcome | None:
        """The candidate's outcome, or None if it is not a valid, supported, unknown case."""
        key = work.key()
        if key not in self.seen:
            self.seen[key] = self._run(work)
        return self.seen[key]

    def _run(self, work: Any) -> Outcome | None:
        if self.unsupported(work.case) is not None or self.known(work.case):
            return None
        if self.runs >= self.budget:
            raise _Stop
        try:
            assert work.data is None or self.folder is not None, "explicit data needs a folder to be written to"
            case = work.case if self.folder is None else work.materialize(self.folder)
            self.runs += 1
            result = self.check(case)
        except CaseError:  # e.g. near-uniform data after slicing: not a case the oracle judges
            self.runs -= 1
            return None
        return None if result.status == "unsupported" else result

    def reproduces(self, work: Any) -> bool:
        outcome = self.outcome(work)
        return outcome is not None and self.target.reproduced_by(signature(outcome))


def _ddmin_requests(work: Any, tester: _Tester, steps: list[Step], say: Callable[[str], None]) -> Any:
    """Zeller's ddmin over the request list (subsets, then complements, finer and finer)."""
    shape = tester.shape
    items = list(range(shape.requests(work)))
    base, n = work, 2
    while len(items) >= 2:
        chunk = -(-len(items) // n)
        subsets = [items[i : i + chunk] for i in range(0, len(items), chunk)]
        tries = [(s, "keep requests") for s in subsets] + [
            ([i for i in items if i not in s], "drop requests") for s in subsets if len(subsets) > 2
        ]
        for subset, verb in tries:
            try:
                candidate = shape.keep(base, subset)
            except ValueError:  # CaseError: e.g. a custom mask that does not follow the requests
                continue
            if shape.smaller(candidate, work) and tester.reproduces(candidate):
                shown = subset if verb == "keep requests" else [i for i in items if i not in subset]
                steps.append(Step("requests", f"{verb} {shown} of {items}", candidate.case.summary()))
                say(f"  requests: {steps[-1].description}")
                items, work = subset, candidate
                n = 2 if verb == "keep requests" else max(n - 1, 2)
                break
        else:
            if n >= len(items):
                break
            n = min(len(items), 2 * n)
    return work


def _greedy(kind: str, make: Callable[[Any], Candidates], result: Minimized[Any], tester: _Tester,
            say: Callable[[str], None]) -> bool:
    """Take the first smaller candidate of ``make`` that reproduces, until none does; True if any did."""
    changed, progress_made = False, True
    while progress_made:
        progress_made = False
        for description, candidate in _valid(make(result.work)):
            if tester.shape.smaller(candidate, result.work) and tester.reproduces(candidate):
                result.work = candidate
                result.steps.append(Step(kind, description, candidate.case.summary()))
                say(f"  {kind}: {description}")
                progress_made = changed = True
                break
    return changed


def _search(result: Minimized[W], tester: _Tester, passes: tuple[str, ...], say: Callable[[str], None]) -> Minimized[W]:
    """Rounds of ddmin over the requests, then each other pass of ``passes``, until a round changes nothing."""
    try:
        changed = True
        while changed:
            changed = False
            if "requests" in passes:
                reduced = _ddmin_requests(result.work, tester, result.steps, say)
                changed |= reduced is not result.work
                result.work = reduced
            for kind, make in tester.shape.passes:
                if kind in passes:
                    changed |= _greedy(kind, make, result, tester, say)
    except _Stop:
        result.exhausted = True
    result.runs = tester.runs
    work: Any = result.work
    result.outcome = tester.seen.get(work.key()) or result.outcome
    return result


def minimize(
    backend: Backend,
    work: Workload,
    *,
    budget: int = TRIAGE_RUNS,
    tolerance: Tolerance = Tolerance(),
    progress: Callable[[str], None] | None = None,
    check: Callable[[Case], Outcome] | None = None,
    known: Callable[[Case], bool] | None = None,
    passes: tuple[str, ...] = ALL_PASSES,
) -> Minimized[Workload]:
    """Triage's step: reduce ``work`` while it reproduces its failure on ``backend``, with at most
    ``budget`` kernel runs (the first run, of the original case, included). ``check`` judges a candidate
    (default: ``check_case`` in this process; triage passes an isolated one, so a candidate that
    crashes the worker the same way reproduces the crash instead of killing the triage); ``known``
    says which candidates a ledger entry covers (never taken)."""
    say = progress or (lambda _: None)
    with tempfile.TemporaryDirectory(prefix="pa-triage-") as tmp:
        tester = _Tester(check or partial(check_case, backend, tolerance=tolerance), Signature("pass", frozenset()),
                         max(budget, 1), Path(tmp), backend.unsupported_reason)
        first = tester.outcome(work)  # (the case itself may be a known one: only its reductions are avoided)
        if first is None or not first.is_finding:
            status = "unsupported" if first is None else first.status
            raise ValueError(f"{backend.name} does not fail this case ({status}); nothing to minimize")
        tester.target, tester.known = signature(first), known or tester.known
        return _search(Minimized(work, work, first, tester.target, budget=budget), tester, passes, say)


def fewer_requests(outcome: Outcome, judge: Callable[[Case], Outcome], known: Callable[[Case], bool] = lambda _: False,
                   max_runs: int = CAMPAIGN_RUNS) -> Outcome:
    """The campaign's step after Hypothesis: the finding ``outcome`` with the requests it does not need
    dropped (ddmin, at most ``max_runs`` runs of ``judge``; the finding itself is not judged again).
    Only the requests: the case keeps its seed's data and its compiled variant. A judge that raises
    (out of time, a worker that will not start) ends the step with the smallest case so far."""
    if outcome.case.tensors_file is not None or outcome.message.startswith(HANG):
        return outcome  # explicit tensors would be rewritten to a temporary file; a hang costs a timeout per try

    def judged(case: Case) -> Outcome:
        try:
            return judge(case)
        except CaseError:
            raise  # not a case the oracle judges: an invalid candidate, as in triage
        except Exception as exc:  # noqa: BLE001 - the tool could not judge: keep what we have
            raise _Stop from exc

    work = Workload(outcome.case)
    tester = _Tester(judged, signature(outcome), max_runs, known=known, seen={work.key(): outcome})
    return _search(Minimized(work, work, outcome, tester.target, budget=max_runs), tester, ("requests",), lambda _: None).outcome


# --- write cases --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteWork:
    """A write case as the search holds it: its data is always its seed's (``make_inputs``)."""

    case: AppendCase
    data: None = None

    def key(self) -> str:
        return json.dumps(self.case.to_json(), sort_keys=True)


def keep_write_requests(work: WriteWork, keep: list[int]) -> WriteWork:
    """The write case of the requests ``keep`` (in order): their lengths before and appended, the rest as it was."""
    case = work.case
    return WriteWork(case.replace(seq_lens_before=tuple(case.seq_lens_before[b] for b in keep),
                                  append_lens=tuple(case.append_lens[b] for b in keep)))


def write_size(work: WriteWork) -> tuple[int, ...]:
    """Measures a write reduction may only lower: requests, appended tokens, the longest append, padding rows."""
    case = work.case
    return case.batch_size, case.total_appended, max(case.append_lens), case.padding


def write_smaller(a: WriteWork, b: WriteWork) -> bool:
    sa, sb = write_size(a), write_size(b)
    return sa != sb and all(x <= y for x, y in zip(sa, sb))


WriteCandidates = Iterator[tuple[str, Callable[[], WriteWork]]]


def fewer_tokens(work: WriteWork) -> WriteCandidates:
    """Fewer appended tokens: every request at once (halved, one less), then each request (halved, one less)."""
    lens = work.case.append_lens

    def appending(new: tuple[int, ...]) -> Callable[[], WriteWork]:
        return lambda: WriteWork(work.case.replace(append_lens=new))

    for name, cut in (("halved", lambda n: n // 2), ("one less", lambda n: max(n - 1, 0))):
        if len(lens) > 1:
            yield f"appended tokens of every request {name}: {lens}", appending(tuple(cut(n) for n in lens))
        for b, n in enumerate(lens):
            if n:
                yield f"request {b} appends {cut(n)} tokens ({n} -> {cut(n)})", appending(lens[:b] + (cut(n),) + lens[b + 1:])


def fewer_padding(work: WriteWork) -> WriteCandidates:
    padding = work.case.padding
    for fewer in dict.fromkeys((0, 1, padding // 2, padding - 1)):
        if 0 <= fewer < padding:
            yield f"padding rows {padding} -> {fewer}", partial(lambda n: WriteWork(work.case.replace(padding=n)), fewer)


WRITE_PASSES: tuple[tuple[str, Callable[[WriteWork], WriteCandidates]], ...] = (("tokens", fewer_tokens), ("padding", fewer_padding))
ALL_WRITE_PASSES = ("requests", *(kind for kind, _ in WRITE_PASSES))
_WRITES = _Shape(lambda work: work.case.batch_size, keep_write_requests, write_smaller, WRITE_PASSES)


def minimize_write(check: Callable[[AppendCase], Outcome], case: AppendCase, *, budget: int = TRIAGE_RUNS,
                   progress: Callable[[str], None] | None = None, first: Outcome | None = None,
                   passes: tuple[str, ...] = ALL_WRITE_PASSES) -> Minimized[WriteWork]:
    """Triage's step for a write finding: reduce ``case`` while ``check`` (the write check, whose failures name
    the kinds of their wrong bytes: ``WRONG_BYTES``) reproduces its failure, with at most ``budget`` runs (the
    first, of ``case``, included unless ``first`` is its outcome already). ddmin over the requests, then
    fewer appended tokens and padding rows, under the same ``Signature`` as an attention case."""
    say = progress or (lambda _: None)
    work = WriteWork(case)
    tester = _Tester(check, Signature("pass", frozenset()), max(budget, 1), shape=_WRITES)
    if first is not None:
        tester.seen[work.key()], tester.runs = first, 1
    outcome = tester.outcome(work)
    if outcome is None or not outcome.is_finding:
        raise ValueError(f"the kernel does not fail this write case ({'unsupported' if outcome is None else outcome.status}); "
                         "nothing to minimize")
    tester.target = signature(outcome)
    return _search(Minimized(work, work, outcome, tester.target, budget=budget), tester, passes, say)
