"""pytest plugin (``pytest11`` entry point ``pa_oracle``): kernel selection options, the
conformance test, a report header with backend versions, and pytest-xdist GPU pinning.

    pytest --pa-backend sdpa-math --pa-examples 300        # collects and runs the conformance test
    pytest --pa-kernel my_pkg.attn:paged_attention
    pytest -n 4 --pa-backend flashinfer-decode             # 4 workers, one GPU each, 4 shards

The plugin is **inert unless a ``--pa-*`` option is given**: installed in an environment, it
changes no other pytest session (no kernel library is imported, no header line, no
``CUDA_VISIBLE_DEVICES``, no Hypothesis home), and it never loads a Hypothesis profile (the conformance test sets its
own settings per run, so a project's profile stays in force). With ``--pa-backend``/``--pa-kernel``
and no test paths of the user's it collects ``fuzz/test_conformance.py`` by itself. Findings land in
``--pa-out`` (default ``./pa-findings``), never in pytest's tmp dirs, which pytest deletes;
Hypothesis' cache goes to the user's cache folder, not ``./.hypothesis``.

Under xdist (with a ``--pa-*`` option, e.g. ``--pa-pin-gpus``) the controller hands worker ``gwN``
the N-th visible GPU (round-robin) and the worker sets ``CUDA_VISIBLE_DEVICES`` in
``pytest_configure``, before any test initializes CUDA. Seeds belong to shards, not workers: the
conformance test is parametrized over ``--pa-shards`` shards (default: the number of xdist
workers), each with its own Hypothesis and case seeds (``pa_oracle.fuzz.campaign.shard``), so the workers fuzz
disjoint examples and a rerun draws the same ones whichever worker gets which shard.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

CONFORMANCE_TEST = Path(__file__).with_name("test_conformance.py")
_SELECTING = ("pa_backend", "pa_kernel")  # options that name what to fuzz
_KEY = pytest.StashKey[bool]()


def _at_least(least: int, what: str) -> Any:
    """An argparse type: an integer >= ``least`` (pytest reports anything else as a usage error, exit 4)."""
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = what  # argparse names the type in its message
    return parse


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pa-oracle", "paged-attention oracle (inert unless a --pa-* option is given)")
    group.addoption("--pa-backend", action="append", default=[], help="backend to fuzz (repeatable; default: all available)")
    group.addoption("--pa-kernel", action="append", default=[], help="user kernel MODULE:FUNCTION to fuzz (repeatable)")
    group.addoption("--pa-examples", type=_at_least(1, "an integer >= 1"), default=None, help="examples per backend (default 100)")
    group.addoption("--pa-seed", type=int, default=None, help="base seed of the fuzz run (default 0)")
    group.addoption("--pa-out", default=None, help="folder for findings (default ./pa-findings)")
    group.addoption("--pa-shards", type=_at_least(1, "an integer >= 1"), default=None, help="split each backend's examples into N shards (default: xdist workers, or 1)")
    group.addoption("--pa-ledger", default=None, help="known-failure ledger whose 'matches' predicates are skipped (default: golden/ledger.json)")
    group.addoption("--pa-no-skip-known", action="store_true", default=None, help="run cases that a ledger entry already covers")
    group.addoption("--pa-pin-gpus", action="store_true", default=None, help="under xdist, pin each worker to one GPU (implied by any --pa-* option)")


def is_active(config: pytest.Config) -> bool:
    """True if any ``--pa-*`` option was given (on the command line or in the ini's addopts)."""
    return config.stash.get(_KEY, False)


def _given(config: pytest.Config) -> bool:
    names = [opt.dest for opt in config._parser.getgroup("pa-oracle").options]  # noqa: SLF001 - our own group
    return any(config.getoption(name) not in (None, []) for name in names)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "pa_cuda_visible_devices" in workerinput:
        os.environ["CUDA_VISIBLE_DEVICES"] = workerinput["pa_cuda_visible_devices"]
    active = _given(config)
    config.stash[_KEY] = active
    if not active:
        return
    if workerinput is None and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistGpuPinning(), "pa_oracle_gpu_pinning")
    config.addinivalue_line("markers", "gpu: needs a CUDA device")
    config.addinivalue_line("markers", "slow: compiles kernels or runs long fuzz campaigns")
    from pa_oracle.fuzz.hypothesis_home import keep_hypothesis_out_of_the_working_directory

    keep_hypothesis_out_of_the_working_directory()  # no ./.hypothesis: a run writes under --pa-out only
    from pa_oracle.fuzz.caches import CacheDirError, use_compile_caches

    try:
        use_compile_caches()  # PA_ORACLE_CACHE_DIR: the kernel compile caches of the run
    except CacheDirError as exc:
        raise pytest.UsageError(str(exc)) from None  # (pytest's exit 4, one line)
    if any(config.getoption(name) for name in _SELECTING):
        _check_selection(config)
        _collect_conformance(config)


def _check_selection(config: pytest.Config) -> None:
    """An unknown ``--pa-backend`` or a ``--pa-kernel`` that cannot be imported is a usage error (pytest's
    exit 4, one line), not a failing test with a traceback. Availability is the test's to report."""
    from pa_oracle.backends import discover, get_backend
    from pa_oracle.backends.user import UserKernel
    from pa_oracle.backends.base import exception_text

    discover()
    for name in config.getoption("--pa-backend"):
        try:
            get_backend(name)
        except (KeyError, ValueError) as exc:
            raise pytest.UsageError(f"--pa-backend {name}: {exc.args[0] if exc.args else exc}") from None
    for spec in config.getoption("--pa-kernel"):
        try:
            UserKernel.from_spec(spec)
        except ValueError as exc:
            raise pytest.UsageError(f"--pa-kernel {spec}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the user's module failed to import, or has no such function
            raise pytest.UsageError(f"--pa-kernel {spec}: cannot import it ({type(exc).__name__}: {exception_text(exc)})") from None


def _collect_conformance(config: pytest.Config) -> None:
    """``pytest --pa-kernel m:f`` alone runs the conformance test; test paths the user named run beside it. Its folder
    is collected, not the file: pytest names a file given outside the rootdir by an empty path ("::test_..." in every
    report line); ``pytest_ignore_collect`` keeps the folder's other modules out."""
    named = config.args_source == pytest.Config.ArgsSource.ARGS
    if not named:
        config.args[:] = [str(CONFORMANCE_TEST.parent)]
    elif not any("test_conformance" in arg or arg == str(CONFORMANCE_TEST.parent) for arg in config.args):
        config.args.append(str(CONFORMANCE_TEST.parent))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Of this package's folder, only the conformance test is collected (whatever the user's ``python_files``)."""
    if not config.stash.get(_KEY, False):
        return None
    folder = CONFORMANCE_TEST.parent
    if collection_path.is_relative_to(folder) and collection_path not in (folder, CONFORMANCE_TEST):
        return True
    return None


class XdistGpuPinning:
    """Controller side: give each xdist worker one visible GPU, round-robin."""

    def __init__(self) -> None:
        self.gpus: list[str] | None = None

    def pytest_configure_node(self, node: Any) -> None:
        from pa_oracle.fuzz.run.workers import assign_gpus, visible_gpus

        if self.gpus is None:
            self.gpus = visible_gpus()
        index = int(node.gateway.id.removeprefix("gw"))
        gpu = assign_gpus(index + 1, self.gpus)[index]
        if gpu is not None:
            node.workerinput["pa_cuda_visible_devices"] = gpu


def shard_count(config: pytest.Config) -> int:
    """``--pa-shards``, else one shard per xdist worker (when this process is one), else 1."""
    workerinput = getattr(config, "workerinput", None)
    return config.getoption("--pa-shards") or (int(workerinput["workercount"]) if workerinput else 1)


def selected_backends(config: pytest.Config) -> list[str]:
    """Names (backends) and MODULE:FUNCTION specs (kernels) chosen on the command line."""
    chosen = list(config.getoption("--pa-backend")) + list(config.getoption("--pa-kernel"))
    if chosen:
        return chosen
    from pa_oracle.backends import available

    return [b.name for b in available()[0]]


def pytest_report_header(config: pytest.Config) -> list[str]:
    """One line: torch, the device, and the selected backends with their library versions."""
    if not is_active(config):
        return []
    import torch

    cuda = f"cuda {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "no cuda"
    chosen = list(config.getoption("--pa-backend")) + list(config.getoption("--pa-kernel"))
    return [f"pa-oracle: torch {torch.__version__}, {cuda}; backends: {', '.join(chosen) or 'every available one'}"]
