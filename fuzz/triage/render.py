"""The triage report, written twice from one list of blocks: markdown (plots as PNG files beside it)
and a self-contained HTML page (plots embedded as base64 PNG). It ends with the repro command and
a ready-to-paste pytest test that is red while the kernel is wrong and green once it is fixed.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path

from pa_oracle.fuzz.triage import plots
from pa_oracle.fuzz.triage.localize import Localization
from pa_oracle.fuzz.triage.pipeline import Triage, verdict_line, weakening
from pa_oracle.oracle.report import format_report


@dataclass(frozen=True)
class Heading:
    text: str
    level: int


@dataclass(frozen=True)
class Text:
    text: str  # `code` and **bold** spans are rendered


@dataclass(frozen=True)
class Items:
    items: list[str]


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Code:
    text: str
    language: str = ""


@dataclass(frozen=True)
class Image:
    name: str  # the PNG's file name under plots/
    png: bytes
    caption: str


@dataclass(frozen=True)
class Details:
    text: str  # markdown, shown folded
    summary: str


Block = Heading | Text | Items | Table | Code | Image | Details  # what a report is made of, in order


def pytest_snippet(case_path: Path, backend: str, kernel_spec: str | None, case_id: str) -> str:
    """A test that loads the case and asserts the backend passes it (red now, green when fixed)."""
    name = "test_" + re.sub(r"\W+", "_", f"{backend}_{case_id}").strip("_").lower()
    if kernel_spec:
        make, imports = f"UserKernel.from_spec({kernel_spec!r})", "from pa_oracle.backends.user import UserKernel"
    else:
        make, imports = f"get_backend({backend!r})", "from pa_oracle.backends import get_backend"
    return f'''\
# Regression test from `pa-oracle triage`: fails while {backend} is wrong on this case, passes once fixed.
from pathlib import Path

import pytest

{imports}
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.tensors import load_case
from pa_oracle.oracle.case import Case

CASE = Path({str(Path(case_path).resolve())!r})


def {name}() -> None:
    backend = {make}
    reason = backend.unavailable_reason()
    if reason:
        pytest.skip(reason)
    outcome = check_case(backend, load_case(CASE))
    assert outcome.status == "pass", outcome.message
'''


def _localization_blocks(label: str, loc: Localization, images: dict[str, tuple[bytes, str]]) -> list[Block]:
    blocks: list[Block] = [Heading(f"Where the error is ({label})", 2), Text(f"`{loc.case.summary()}` on {loc.backend}")]
    rows = [[c.name, c.result, c.finding] for c in loc.checks]
    blocks.append(Table(["check", "result", "finding"], rows))
    evidence = [f"**{c.name}**: " + "; ".join(c.evidence) for c in loc.checks if c.evidence and c.result != "n/a"]
    if evidence:
        blocks += [Text("Evidence:"), Items(evidence)]
    if loc.worst:
        blocks += [Text("Worst elements:"), Items([w.describe() for w in loc.worst[:5]])]
    for name, (png, caption) in images.items():
        blocks.append(Image(f"{label.split()[0]}-{name}.png", png, caption))
    return blocks


def build(triage: Triage) -> list[Block]:
    case = triage.case
    failing, agree = triage.failing, [r for r in triage.survey if r.agrees]
    unsupported = [r for r in triage.survey if r.status == "unsupported"]
    blocks: list[Block] = [
        Heading(f"Triage of case {case.case_id}", 1),
        Text(f"`{case.summary()}` from `{triage.source}`"),
        Text(f"{len(failing)} backend(s) disagree with the oracle, {len(agree)} agree, {len(unsupported)} do not support the case."),
        Heading("Backends", 2),
        Table(["backend", "verdict", "detail"], [[r.backend, r.status.upper(), r.message] for r in triage.survey]),
    ]
    if triage.focus is None:
        return blocks + [Text("No backend fails this case: nothing to minimize or localize.")]
    m = triage.minimized
    if m is not None:
        blocks += [Heading(f"Minimized for {triage.focus}", 2)]
        state = (
            "budget spent: a further reduction may exist (raise `--budget`)" if m.exhausted
            else "no single further reduction reproduces the failure"
        )
        items = [
            f"original: `{m.original.case.summary()}`",
            f"minimized: `{m.work.case.summary()}`",
            f"failure kept: {m.signature.describe()}",
            f"{m.runs} kernel runs of a budget of {m.budget}; {state}",
        ]
        if m.reduced:
            items.insert(2, f"the minimized case fails: {verdict_line(m.outcome)}")
            items[3:3] = [f"weaker than the original: {line}" for line in weakening(m)]
        if triage.minimized_path:
            items.append(f"saved: `{triage.minimized_path}`")
        blocks.append(Items(items))
        if m.steps:
            blocks.append(Items([f"{s.kind}: {s.description}" for s in m.steps]))
        else:
            blocks.append(Text("No reduction kept the failure: the case is already minimal for these reductions."))
    no_plots = plots.unavailable_reason()
    for label, loc in triage.localized:
        blocks += _localization_blocks(label, loc, plots.figures(loc))
    if no_plots:
        blocks.append(Text(f"No plots: {no_plots}."))
    if triage.localized:
        label, loc = triage.localized[0]
        if loc.verdict is not None:
            blocks.append(Details(format_report(loc.case, triage.focus, loc.verdict), f"Full verdict report ({label})"))
    blocks += [
        Heading("Reproduce", 2),
        Code(triage.repro or "", "sh"),
        Text("Regression test, ready to paste (red now, green when the kernel is fixed):"),
        Code(pytest_snippet(triage.case_path, triage.focus, triage.kernel_spec, case.case_id), "python"),
        Text("To keep the case in the regression corpus: "
              f"`pa-oracle golden add {triage.case_path.parent} --reason TEXT --issue URL`."),
    ]
    return blocks


def to_markdown(blocks: list[Block], image_dir: str = "plots") -> str:
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            lines += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Text):
            lines += [block.text, ""]
        elif isinstance(block, Items):
            lines += [f"- {item}" for item in block.items] + [""]
        elif isinstance(block, Table):
            lines += ["| " + " | ".join(block.header) + " |", "|" + "---|" * len(block.header)]
            lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in block.rows] + [""]
        elif isinstance(block, Code):
            lines += [f"```{block.language}", block.text.rstrip("\n"), "```", ""]
        elif isinstance(block, Image):
            lines += [f"![{block.caption}]({image_dir}/{block.name})", "", f"*{block.caption}*", ""]
        else:
            body = re.sub(r"^(#+) ", r"\1### ", block.text, flags=re.MULTILINE)  # nest its headings
            lines += [f"### {block.summary}", "", body, ""]
    return "\n".join(lines)


_CSS = (
    "body{font-family:sans-serif;max-width:70em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}"
    "pre{background:#f6f6f6;padding:8px;overflow-x:auto}img{max-width:100%}figcaption{font-size:90%;color:#555}"
)


def _inline(text: str) -> str:
    """Escape, then render `code` and **bold** spans."""
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)


def to_html(blocks: list[Block], title: str) -> str:
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{_inline(block.text)}</h{block.level}>")
        elif isinstance(block, Text):
            parts.append(f"<p>{_inline(block.text)}</p>")
        elif isinstance(block, Items):
            parts.append("<ul>" + "".join(f"<li>{_inline(str(i))}</li>" for i in block.items) + "</ul>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{html.escape(h)}</th>" for h in block.header)
            body = "".join("<tr>" + "".join(f"<td>{_inline(str(c))}</td>" for c in row) + "</tr>" for row in block.rows)
            parts.append(f"<table><tr>{head}</tr>{body}</table>")
        elif isinstance(block, Code):
            parts.append(f"<pre><code>{html.escape(block.text)}</code></pre>")
        elif isinstance(block, Image):
            data = base64.b64encode(block.png).decode()
            parts.append(f"<figure><img alt='{html.escape(block.caption)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{html.escape(block.caption)}</figcaption></figure>")
        else:
            parts.append(f"<details><summary>{html.escape(block.summary)}</summary><pre>{html.escape(block.text)}</pre></details>")
    return "\n".join(parts) + "\n</body></html>\n"


def write_report(triage: Triage, out_dir: Path) -> dict[str, Path]:
    """Write ``triage.md``, ``triage.html``, ``plots/*.png`` and ``test_regression.py``; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    blocks = build(triage)
    written = {"markdown": out_dir / "triage.md", "html": out_dir / "triage.html"}
    for block in blocks:
        if isinstance(block, Image):
            (out_dir / "plots").mkdir(exist_ok=True)
            (out_dir / "plots" / block.name).write_bytes(block.png)
    written["markdown"].write_text(to_markdown(blocks))
    written["html"].write_text(to_html(blocks, f"Triage of case {triage.case.case_id}"))
    if triage.focus is not None:
        written["test"] = out_dir / "test_regression.py"
        written["test"].write_text(pytest_snippet(triage.case_path, triage.focus, triage.kernel_spec, triage.case.case_id))
    return written
