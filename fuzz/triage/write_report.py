"""The triage report of a write finding (``triage.md``): reproduced or not, the minimization's steps, the wrong
bytes of the minimal and the original case (kinds, which requests, a table of the first rows) and the replay
commands of the minimal ``writes.json``."""

from __future__ import annotations

from pathlib import Path

from pa_oracle.fuzz.triage.writes import SHOWN, WriteLocalization, WriteTriage
from pa_oracle.oracle.append import AppendCase

_MEANING = {
    "placement": "the right values at the wrong slot, head or tensor",
    "not written": "an appended slot still holds its canary",
    "value": "an appended slot holds bytes that are no appended row",
    "canary written": "a slot outside the appended ones was overwritten",
    "padding written": "a padding row (slot -1) was stored",
}


def _case_lines(case: AppendCase) -> list[str]:
    return [f"- {case.summary()} (case id `{case.case_id}`)",
            f"- seq_lens_before {list(case.seq_lens_before)}, append_lens {list(case.append_lens)}, "
            f"page_size {case.page_size}, spare_pages {case.spare_pages}, seed {case.seed}"]


def _localization_lines(label: str, case: AppendCase, loc: WriteLocalization) -> list[str]:
    lines = [f"## Wrong bytes, {label}", "", *_case_lines(case),
             f"- {len(loc.rows)} (tensor, page, slot, head) rows hold wrong bytes; requests {loc.requests or 'none'} "
             "own some of them", ""]
    lines += [f"- **{kind}** ({sum(r.kind == kind for r in loc.rows)} rows): {_MEANING.get(kind, kind)}" for kind in loc.kinds]
    if "placement" in loc.kinds:
        lines += ["", "Placement: appended values were written, at a slot (or head, or tensor) they do not belong to."]
    lost = [r for r in loc.rows if r.kind == "not written" and r.value_at is None]
    if lost:
        lines += ["", f"{len(lost)} appended rows are nowhere among the wrong bytes: written nowhere, or written and then "
                  "overwritten by another token (a placement bug that lands two tokens on one slot reads so)."]
    lines += ["", "| tensor | page | slot | head | request | token | position | kind | expected | found | its value is at |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in loc.rows[:SHOWN]:
        cells = [r.which, r.page, r.slot, r.head, _or_dash(r.request), _or_dash(r.token), _or_dash(r.position), r.kind,
                 r.expected, r.found, r.value_at or "-"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if len(loc.rows) > SHOWN:
        lines.append(f"\n({len(loc.rows) - SHOWN} more rows not shown)")
    return lines + [""]


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def render_write_triage(result: WriteTriage) -> str:
    """The markdown of ``triage.md``."""
    out = result.outcome
    head = "REPRODUCED" if result.reproduced else "NOT REPRODUCED"
    lines = [f"# Write triage: {result.backend}: {head}", "", f"Finding: `{result.saved.path}`", "",
             *_case_lines(result.saved.case), "", f"Run again: **{out.status}**: {out.message}", ""]
    m = result.minimized
    if m is not None:
        lines += ["## Minimization", "",
                  f"{m.runs} kernel runs of a budget of {m.budget}{' (spent before a round without progress)' if m.exhausted else ''};"
                  f" the same failure: {m.signature.describe()}", ""]
        lines += [f"{i}. {step.kind}: {step.description}" for i, step in enumerate(m.steps, 1)] or ["No reduction reproduces it."]
        lines += ["", *_case_lines(m.work.case), ""]
    for label, case, loc in result.localized:
        lines += _localization_lines(label, case, loc)
    if result.minimized_path is not None:
        lines += ["## Replay", "", f"The minimal case: `{result.minimized_path}`", "", "```",
                  result.replay(result.minimized_path.parent), "```", ""]
    elif result.reproduced:
        lines += ["## Replay", "", "```", result.replay(result.saved.path.parent), "```", ""]
    return "\n".join(lines)


def write_write_report(result: WriteTriage, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "triage.md"
    path.write_text(render_write_triage(result))
    return path
