"""What ``pa-oracle``'s exit status means, decided in one place: 0 no finding, 1 a finding, 2 bad
input or usage, 3 the tool itself failed (130: interrupted). ``ExitCodeGroup`` maps what escapes
a command to those codes, so no command shows a traceback for bad input; ``campaign_exit_code``
turns a campaign's results into one.

A campaign that ran and judged nothing is no verdict (3), never 0: no example ran, every example was
unsupported, every judged case attended no key, or (the oracle comparison, at least 20 examples besides
those judged without an attended key) more than 90% of them were unsupported
(``pa_oracle.fuzz.campaign.state.UNSUPPORTED_BOUND``).
``--merge`` of shard states: states that cannot be one campaign's (another seed, backends, kernels or
shard count; a shard twice, under a name that is not its own, or out of range; a case drawn by two
shards) are bad input (2, naming the file and field); a campaign with a shard that has no state yet is
no verdict over the campaign (3, naming the shards): its merged results are incomplete, as are those of
a shard that stopped early, findings or not.
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import click
from pa_oracle.fuzz.campaign.verdict import why_incomplete

NO_FINDING, FINDING, BAD_INPUT, TOOL_FAILED, INTERRUPTED = 0, 1, 2, 3, 130

EPILOG = """Exit status (every command):

\b
  0    no finding (a gate: passed)
  1    a finding (a gate: failed)
  2    bad input or usage: a case file, ledger, campaign state or option; --out in use by
       another campaign, or holding one (without --resume or --overwrite)
  3    the tool itself failed: I/O under --out (a finding that could not be saved), an
       internal error (one line, plus the file that holds the trace), an oracle
       disagreement, a backend that ran no example, judged nothing (every case
       unsupported or without an attended key; over 90% unsupported) or stopped
       early, a --merge missing a shard's state
  130  interrupted (the campaign state is kept: --resume continues it)
"""

OUT_DIR_KEY = "pa_oracle.out_dir"  # ctx.meta: where a command writes, so an internal error's trace goes there


class BadInputExit(click.ClickException):
    """Exit 2 with one line: what every ``pa_oracle.oracle.errors.BadInput`` a command raises becomes."""

    exit_code = BAD_INPUT


class ToolFailed(click.ClickException):
    exit_code = TOOL_FAILED


class Interrupted(ToolFailed):
    """The user's Ctrl-C (exit 130)."""

    exit_code = INTERRUPTED


def remember_out_dir(ctx: click.Context, out_dir: Path) -> None:
    """Tell the group where this command writes (``ctx.meta`` is shared by the whole command line)."""
    ctx.meta[OUT_DIR_KEY] = Path(out_dir)


def _bad_input_errors() -> tuple[type[BaseException], ...]:
    from pa_oracle.oracle.errors import BadInput

    return (BadInput,)


def write_trace(exc: BaseException, out_dir: Path | None) -> Path | None:
    """The full traceback of ``exc`` in a file under ``out_dir`` (if it is a writable folder), else
    in a temp file; its path, or None if neither could be written."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    text = (
        f"pa-oracle {' '.join(sys.argv[1:])}\n{datetime.datetime.now().isoformat()}\n\n"
        + "".join(traceback.format_exception(exc))
    )
    if out_dir is not None and Path(out_dir).is_dir():
        path = Path(out_dir) / f"pa-oracle-error-{stamp}-{os.getpid()}.txt"
        try:
            path.write_text(text)
            return path
        except OSError:
            pass  # e.g. the error is that --out cannot be written: use a temp file
    try:
        fd, name = tempfile.mkstemp(prefix=f"pa-oracle-error-{stamp}-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return Path(name)
    except OSError:
        return None


def tool_failure(exc: BaseException, out_dir: Path | None) -> ToolFailed:
    """One line for an error of the tool itself, naming the file that holds the full trace."""
    from pa_oracle.fuzz.campaign.outdir import FindingNotSaved
    from pa_oracle.fuzz.run.runner import OracleDisagreement

    if isinstance(exc, FindingNotSaved):
        return ToolFailed(str(exc))  # says where, what the finding was and where it was rescued
    trace = write_trace(exc, out_dir)
    where = f" (full trace: {trace})" if trace else ""
    first = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, OSError):
        return ToolFailed(f"I/O error: {first}{where}")
    if isinstance(exc, OracleDisagreement):
        return ToolFailed(f"oracle disagreement (a bug in pa-oracle, not a finding): {first}{where}")
    return ToolFailed(f"internal error: {type(exc).__name__}: {first}{where}")


class ExitCodeGroup(click.Group):
    """A click group whose every command exits with one of the codes above."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except click.ClickException as exc:
            if exc.exit_code == FINDING:  # ClickException's default, but 1 means a finding: a refusal is bad input
                setattr(exc, "exit_code", BAD_INPUT)  # this instance's (click declares the code on the class)
            raise
        except SystemExit as exc:
            if exc.code in (FINDING, BAD_INPUT, TOOL_FAILED, INTERRUPTED):
                raise
            # the commands end with return or a code above: this came from inside, e.g. a kernel's sys.exit(0)
            raise ToolFailed(f"the run was ended by sys.exit({exc.code!r}) from inside it (a kernel?): no verdict") from None
        except KeyboardInterrupt:
            raise Interrupted("interrupted (a campaign's state is kept after each chunk: --resume continues it)") from None
        except Exception as exc:  # noqa: BLE001 - mapped to a code here, once for every command
            if isinstance(exc, _bad_input_errors()):
                raise BadInputExit(str(exc)) from None
            raise tool_failure(exc, ctx.meta.get(OUT_DIR_KEY)) from None


def campaign_exit_code(results: Iterable[Any], *, may_be_empty: bool = False,
                       worker_codes: Sequence[int] = ()) -> tuple[int, list[str]]:
    """(exit code, why) for a campaign's ``BackendResult``s and its workers' exit codes. A worker's
    bad input (2; the others then have no results either) wins over a failure of the tool (3),
    which wins over a finding (1): the run did not do what was asked; its findings are printed
    and saved all the same."""
    results = list(results)
    shards = len(worker_codes)
    bad = [f"shard {i}/{shards} exited with 2 (bad input)" for i, c in enumerate(worker_codes) if c == BAD_INPUT]
    if bad:
        return BAD_INPUT, bad
    failed = [f"shard {i}/{shards} exited with {c}" for i, c in enumerate(worker_codes) if c not in (NO_FINDING, FINDING)]
    failed += [why for r in results if (why := why_incomplete(r, may_be_empty=may_be_empty))]
    if not results:
        failed.append("no backend ran")
    elif all(getattr(r, "not_built", None) is not None and not r.examples for r in results):
        failed.append("no backend judged a case: none of their variants was built in the run")
    if failed:
        return TOOL_FAILED, failed
    return (FINDING if any(r.findings for r in results) else NO_FINDING), []
