"""After Hypothesis: drop the requests a finding does not need (``B=6, kv_lens=[0,0,0,0,0,1]`` becomes
``B=1``) before the case is saved and printed. Greedy, one request at a time, a few kernel runs: a
candidate is kept only when it fails the same way (status; exception type for a crash) and is not a
known ledger finding. Triage's delta debugging (``pa_oracle.fuzz.triage.minimize``) goes further."""

from __future__ import annotations

from collections.abc import Callable

from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.oracle.case import Case, CaseError, Layout

MAX_RUNS = 16  # kernel runs this step may spend


def without_request(case: Case, drop: int) -> Case:
    """``case`` without request ``drop`` (the other requests keep their pages; the pool is unchanged)."""
    lay = case.layout
    keep = [b for b in range(lay.batch_size) if b != drop]
    qo_indptr, kv_indptr, kv_indices, last = [0], [0], list[int](), list[int]()
    for b in keep:
        qo_indptr.append(qo_indptr[-1] + lay.qo_lens[b])
        kv_indices += lay.pages_of(b)
        kv_indptr.append(len(kv_indices))
        last.append(lay.kv_last_page_len[b])
    layout = Layout(tuple(qo_indptr), tuple(kv_indptr), tuple(kv_indices), tuple(last), lay.page_size, lay.num_pages)
    return case.replace(layout=layout)


def _same_failure(a: Outcome, b: Outcome) -> bool:
    if a.status != b.status:
        return False
    if a.status == "crash":
        return a.message.split(":", 1)[0] == b.message.split(":", 1)[0]
    return True


def fewer_requests(outcome: Outcome, judge: Callable[[Case], Outcome], known: Callable[[Case], bool] = lambda _: False,
                   max_runs: int = MAX_RUNS) -> Outcome:
    """The finding with every request it does not need dropped (within ``max_runs`` kernel runs)."""
    if outcome.case.tensors_file is not None or outcome.message.startswith("hang:"):
        return outcome  # explicit tensors follow the rows; a hang costs a whole timeout per try
    runs, b = 0, outcome.case.layout.batch_size - 1
    while b >= 0 and runs < max_runs and outcome.case.layout.batch_size > 1:
        try:
            candidate = without_request(outcome.case, b)
        except CaseError:
            b -= 1
            continue
        if not known(candidate):
            runs += 1
            try:
                tried = judge(candidate)
            except Exception:  # noqa: BLE001 - out of time, a worker that will not start: keep what we have
                return outcome
            if _same_failure(outcome, tried):
                outcome = tried
        b = min(b - 1, outcome.case.layout.batch_size - 1)
    return outcome
