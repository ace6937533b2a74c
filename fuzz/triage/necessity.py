"""Which of a failing case's options the failure needs: each option that is on (causal, window, soft cap,
ALiBi, sinks, fp8 KV, RoPE, and a non-default memory layout: the case's ``storage``) is turned off alone
and the case judged again; an option whose removal makes the kernel pass is necessary. A heuristic like
the others: options can also interact with the data."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pa_oracle.backends.base import Backend
from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.fuzz.triage.localize import Clue
from pa_oracle.oracle.case import Case, CaseError, Options

# option name -> (is it on, the options with it off)
SWITCHES: dict[str, tuple[Callable[[Options], bool], Callable[[Options], Options]]] = {
    "causal": (lambda o: o.causal, lambda o: dataclasses.replace(o, causal=False)),
    "window": (lambda o: o.window_left >= 0, lambda o: dataclasses.replace(o, window_left=-1)),
    "soft cap": (lambda o: o.logits_soft_cap > 0, lambda o: dataclasses.replace(o, logits_soft_cap=0.0)),
    "ALiBi": (lambda o: o.alibi_slopes is not None, lambda o: dataclasses.replace(o, alibi_slopes=None)),
    "sinks": (lambda o: o.sinks is not None, lambda o: dataclasses.replace(o, sinks=None)),
    "fp8 KV": (lambda o: o.is_fp8, lambda o: dataclasses.replace(o, kv_dtype=o.q_dtype, k_scale=1.0, v_scale=1.0)),
    "RoPE": (lambda o: o.rope is not None, lambda o: dataclasses.replace(o, rope=None)),
}


def necessary_options(case: Case, backend: Backend, check: Callable[[Case], Outcome]) -> Clue:
    """Judge ``case`` once per option that is on, with that option off (``check`` runs the kernel)."""
    results: dict[str, str] = {}
    for name, (is_on, off) in SWITCHES.items():
        if not is_on(case.options):
            continue
        if name == "fp8 KV" and case.tensors_file is not None:
            results[name] = "not tried (the tensors come from an npz in the fp8 dtype)"
            continue
        try:
            variant = case.replace(options=off(case.options))
        except CaseError as exc:
            results[name] = f"not tried ({exc})"
            continue
        reason = backend.unsupported_reason(variant)
        results[name] = f"not tried ({reason})" if reason else check(variant).status
    if case.storage is not None:  # the same values in the default memory layout
        results[f"storage {case.storage.label()}"] = check(case.replace(storage=None)).status
    if not results:
        return Clue("options needed", "n/a", "the case has no option on (causal, window, soft cap, ALiBi, sinks, fp8 KV, RoPE)")
    needed = [name for name, status in results.items() if status == "pass"]
    kept = [name for name, status in results.items() if status in ("fail", "crash")]
    evidence = tuple(f"{name} off: {status}" for name, status in results.items())
    if needed:
        rest = f"; with {', '.join(kept)} off it still fails" if kept else ""
        return Clue("options needed", "pattern",
                     f"the failure needs {' and '.join(needed)}: turning {'it' if len(needed) == 1 else 'any of them'} off makes it pass{rest}",
                     evidence)
    return Clue("options needed", "no pattern", "no single option is needed: the case fails with each one off" if kept
                 else "no option could be turned off and judged", evidence)


def needed(clue: Clue) -> tuple[str, ...]:
    """The options a ``necessary_options`` clue found the failure needs (turned off, the kernel passed)."""
    return tuple(item.removesuffix(" off: pass") for item in clue.evidence if item.endswith(" off: pass"))
