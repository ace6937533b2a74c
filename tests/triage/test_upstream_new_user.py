"""Issue 35, as a new user walks it: ISSUE.md names every option that is not its default (``window_left=0``
included), ``python repro.py`` from the kernel's folder imports a user kernel, and a kernel made by a factory,
a decorator or ``functools.partial`` gets a repro by the name the user gave."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.fuzz.triage.upstream import Seen, issue_markdown, options_line, write_upstream
from pa_oracle.oracle.case import ALIBI_THEN_CAP, Options, Rope

from .conftest import mixed_case
from .test_upstream import _kernel_module

# one value other than the default per Options field, with what it needs beside it (an fp8 dtype for a scale)
NON_DEFAULT: dict[str, tuple[object, dict[str, object]]] = {
    "causal": (True, {}),
    "sm_scale": (0.25, {}),
    "window_left": (0, {}),
    "logits_soft_cap": (30.0, {}),
    "alibi_slopes": ((0.5, 0.25, 0.125, 0.0625), {}),
    "sinks": ((0.0, 1.0, -1.0, 2.0), {}),
    "q_dtype": ("bfloat16", {}),
    "kv_dtype": ("float16", {}),
    "k_scale": (0.5, {"kv_dtype": "float8_e4m3fn"}),
    "v_scale": (2.0, {"kv_dtype": "float8_e4m3fn"}),
    "soft_cap_alibi_order": (ALIBI_THEN_CAP, {}),
    "rope": (Rope(theta=500.0), {}),
    "q_scale": (0.5, {"q_dtype": "float8_e4m3fn", "kv_dtype": "float8_e4m3fn", "o_dtype": "bfloat16"}),
    "o_dtype": ("float16", {"q_dtype": "float8_e4m3fn", "kv_dtype": "float8_e4m3fn"}),
}


def _options_in_issue(text: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith("- options: ")]
    return line.removeprefix("- options: ").rsplit("; sm_scale", 1)[0]


def test_the_table_covers_every_option_field() -> None:
    assert set(NON_DEFAULT) == {f.name for f in fields(Options)}, "a new Options field needs a non-default value here"


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_every_option_not_at_its_default_is_in_the_options_line(name: str) -> None:
    value, beside = NON_DEFAULT[name]
    opts = Options(**{**beside, name: value})
    default = next(f.default for f in fields(Options) if f.name == name)
    assert repr(value) != repr(default)
    line = options_line(opts)
    assert line.startswith(f"{name}={value}") or f", {name}={value}" in line, line


def test_an_option_at_its_default_is_left_out_but_the_dtypes() -> None:
    assert options_line(Options()) == "q_dtype=float32, kv_dtype=float32"
    assert "logits_soft_cap=0" in options_line(Options(logits_soft_cap=0))  # an int 0: not the default 0.0 as given


def test_issue_md_of_the_window_left_0_finding_names_window_left_0() -> None:
    backend = UserKernel.from_spec("pa_oracle.fuzz.quality.planted:window_off_by_one")
    case = mixed_case(window_left=0, causal=True)
    outcome = check_case(backend, case)
    assert outcome.status == "fail", outcome.message
    options = _options_in_issue(issue_markdown(case, backend, Seen("fail", outcome.message)))
    assert "window_left=0" in options.split(", ") and "causal=True" in options.split(", ")


# --- repro.py run from the kernel's folder, as ISSUE.md says ----------------------------------------------------


def test_repro_run_from_the_kernels_folder_imports_the_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = _kernel_module(tmp_path / "kernels")
    monkeypatch.syspath_prepend(str(kernels))
    try:
        backend = UserKernel.from_spec("standalone_kernels:buggy")
        case = mixed_case(window_left=3)
        outcome = check_case(backend, case)
        assert outcome.status == "fail", outcome.message
        written = write_upstream(tmp_path / "report", case, backend, Seen("fail", outcome.message, {}, "cpu"))
    finally:
        sys.modules.pop("standalone_kernels", None)
    issue = written["issue"].read_text()
    assert "Run it from the folder `standalone_kernels` is imported from" in issue and "PYTHONPATH" in issue
    # the script lies in another folder; the kernel's folder is the current one and on no path
    deps = sorted({str(Path(torch.__file__).parents[1]), str(Path(np.__file__).parents[1])})
    env = {"PYTHONPATH": ":".join(deps), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-S", str(written["repro"])], cwd=kernels, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REPRODUCED" in done.stdout and "ModuleNotFoundError" not in done.stderr
    elsewhere = subprocess.run([sys.executable, "-S", str(written["repro"])], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=120)
    assert elsewhere.returncode == 2 and "ModuleNotFoundError" in elsewhere.stderr  # the folder is what makes it run


def test_a_registry_adapters_repro_does_not_touch_the_path() -> None:
    from pa_oracle.backends import discover
    from pa_oracle.fuzz.triage.upstream import repro_script

    backend = discover()["flashinfer-decode"]()
    source, _ = repro_script(mixed_case(), backend, Seen("fail", "x"))
    assert "sys.path.insert" not in source


# --- kernels made by a factory, a decorator or functools.partial ------------------------------------------------

_FACTORY_MODULE = '''
import functools

from standalone_kernels import _paged_attention


def make(bug):
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap):
        return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                                window_left=window_left, logits_soft_cap=logits_soft_cap, bug=bug)
    return kernel


def traced(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    wrapper.__qualname__ = "traced.<locals>.wrapper"  # as a compile wrapper leaves it
    return wrapper


def _base(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
          window_left, logits_soft_cap, bug):
    return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                            kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                            window_left=window_left, logits_soft_cap=logits_soft_cap, bug=bug)


from_factory = make("window_off_by_one")
decorated = traced(make("window_off_by_one"))
partial_kernel = functools.partial(_base, bug="window_off_by_one")
'''


@pytest.mark.parametrize("name", ["from_factory", "decorated", "partial_kernel"])
def test_a_kernel_made_by_a_factory_or_wrapper_gets_a_repro_by_the_given_name(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = _kernel_module(tmp_path / "kernels")
    (kernels / "made_kernels.py").write_text(textwrap.dedent(_FACTORY_MODULE))
    monkeypatch.syspath_prepend(str(kernels))
    try:
        backend = UserKernel.from_spec(f"made_kernels:{name}")
        assert getattr(backend.fn, "__qualname__", None) != name  # its own name is not the importable one
        case = mixed_case(window_left=3)
        outcome = check_case(backend, case)
        assert outcome.status == "fail", outcome.message
        call = backend.call_source(case)
        assert call is not None and f"from made_kernels import {name}\n" in call
        written = write_upstream(tmp_path / "report", case, backend, Seen("fail", outcome.message, {}, "cpu"))
        assert backend.versions()["module_file"] == str(kernels / "made_kernels.py")
    finally:
        for module in ("standalone_kernels", "made_kernels"):
            sys.modules.pop(module, None)
    deps = sorted({str(Path(torch.__file__).parents[1]), str(Path(np.__file__).parents[1])})
    done = subprocess.run([sys.executable, "-S", str(written["repro"])], cwd=kernels,
                          env={"PYTHONPATH": ":".join(deps), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "REPRODUCED" in done.stdout, done.stdout + done.stderr


def test_a_name_that_is_not_the_function_falls_back_to_its_own_name() -> None:
    from pa_oracle.fuzz.quality import planted

    backend = UserKernel(planted.window_off_by_one, name="my label")
    assert backend.import_spec() == ("pa_oracle.fuzz.quality.planted", "window_off_by_one")
    closure = UserKernel(lambda q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len: q)
    assert closure.import_spec() is None and closure.call_source(mixed_case()) is None
