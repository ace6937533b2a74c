"""``pa-oracle env``: what this machine runs the oracle with: versions, devices, each kernel
library (its version, or why it is missing), the caches kernels compile into, the golden corpus
in use and which backends are available (and why not)."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
from pathlib import Path
from typing import Any

import click

# the kernel libraries the adapters call, by import name (the backends' ``package`` names and the
# libraries whose adapters check for them themselves)
LIBRARIES = ("flashinfer", "flash_attn", "flash_attn_interface", "sglang", "vllm", "triton")

# every PA_ORACLE_* variable the package reads, with what it sets when unset (tests/test_env.py checks the list
# against the source, so none is read and left out here)
SETTINGS = {
    "PA_ORACLE_CACHE_DIR": "the one folder of compile caches (FlashInfer JIT, Triton, inductor); "
                           "unset: $XDG_CACHE_HOME/paged-attention-oracle/compile",
    "PA_ORACLE_GOLDEN": "another golden corpus (cases/, ledger.json, reports/); unset: the installed one",
    "PA_ORACLE_ENGINE": "the float64 oracle's engine: auto, torch or fused; unset: auto",
    "PA_ORACLE_CASE_TIMEOUT": "seconds one case may take in replay and triage before it is a hang; "
                              "unset: {case_timeout:g}",
    "PA_ORACLE_WORKER_PROCESSES": "isolated worker processes per accelerator backend; unset: by host cores",
    "PA_ORACLE_JUDGE_THREADS": "judge threads per worker; unset: by device",
    "PA_ORACLE_DRAW_PROCESSES": "processes drawing cases ahead for a campaign; unset: by host cores",
}


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, dict[str, Any]]:
    """{import name: {"version": ...} or {"missing": why}} for each kernel library."""
    distributions = importlib.metadata.packages_distributions()
    found: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is why it is missing
            first = (str(exc).strip().splitlines() or [""])[0]
            found[name] = {"missing": "not installed" if isinstance(exc, ModuleNotFoundError) and exc.name == name
                           else f"{type(exc).__name__}: {first}"}
            continue
        dists = distributions.get(name, ())  # the installed distribution's version, else the module's own
        version = importlib.metadata.version(dists[0]) if dists else getattr(module, "__version__", None)
        found[name] = {"version": str(version or "?")}
    return found


def _triton_cache() -> str:
    if os.environ.get("TRITON_CACHE_DIR"):
        return os.environ["TRITON_CACHE_DIR"]
    try:
        from triton import knobs  # type: ignore[import-untyped]  # triton ships no type information

        return str(knobs.cache.dir)
    except Exception:  # noqa: BLE001 - older Triton, or none: its documented default
        return str(Path.home() / ".triton" / "cache")


def _flashinfer_cache() -> str:
    try:
        from flashinfer.jit import env as flashinfer_env

        return str(flashinfer_env.FLASHINFER_WORKSPACE_DIR)
    except Exception:  # noqa: BLE001 - not installed: where it would compile to
        base = os.environ.get("FLASHINFER_WORKSPACE_BASE") or str(Path.home())
        return str(Path(base) / ".cache" / "flashinfer")


def _inductor_cache() -> str:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return str(cache_dir())
    except Exception:  # noqa: BLE001 - a torch without it: the environment variable, if set
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR", "(torch default)")


def caches() -> dict[str, str]:
    """Where compiled kernels are cached (a stale or unwritable cache explains many a slow or failing run)."""
    from pa_oracle.fuzz.caches import cache_dir

    return {"compile (PA_ORACLE_CACHE_DIR)": str(cache_dir()), "triton": _triton_cache(), "flashinfer_jit": _flashinfer_cache(),
            "inductor": _inductor_cache()}


def golden_in_use() -> dict[str, Any]:
    from pa_oracle import golden

    root = golden.root()
    cases = sorted(golden.cases_dir().glob("*.json")) if golden.cases_dir().is_dir() else []
    return {"root": str(root), "from": f"${golden.ENV}" if os.environ.get(golden.ENV, "").strip() else "package data",
            "exists": root.is_dir(), "cases": len(cases), "ledger": golden.ledger_path().is_file()}


def _oracle_engines() -> dict[str, str]:
    """Which engine computes the float64 oracle per device type (``reference(engine=...)``)."""
    import importlib.util

    import torch
    from pa_oracle.oracle.reference import default_engine

    engine = default_engine()
    triton = importlib.util.find_spec("triton") is not None
    engines = {"cpu": "torch"}
    if torch.cuda.is_available():
        fused = engine != "torch" and triton
        engines["cuda"] = "fused (float64 Triton kernel; failures re-judged by torch)" if fused else "torch"
    return engines


def _when_unset(name: str) -> str:
    """What ``name`` sets when it is unset (the end of its ``SETTINGS`` line)."""
    from pa_oracle.fuzz.run.isolation import CASE_TIMEOUT

    return SETTINGS[name].split("; unset: ")[-1].format(case_timeout=CASE_TIMEOUT)


def environment() -> dict[str, Any]:
    """Everything ``pa-oracle env`` shows, as JSON-able data."""
    import torch
    from pa_oracle.backends import available

    from pa_oracle.backends import names

    usable, missing = available(None)  # both kinds of kernel: attention (pa-oracle fuzz) and write (pa-oracle writes)
    kinds = names()
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "devices": ["cpu"] + [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "oracle": _oracle_engines(),
        "libraries": library_versions(),
        "caches": caches(),
        "golden": golden_in_use(),
        "settings": {name: os.environ.get(name) for name in SETTINGS},
        "settings_unset": {name: _when_unset(name) for name in SETTINGS},
        "backends": {b.name: {"kind": b.kind, "available": True, "device": b.device, "versions": b.versions()} for b in usable},
    }
    info["backends"].update({name: {"kind": kinds[name], "available": False, "why": why} for name, why in missing.items()})
    return info


def render(info: dict[str, Any]) -> list[str]:
    """``info`` as aligned ``name  value`` rows under section titles."""
    cuda = f"CUDA {info['cuda']}" if info["cuda"] else "no CUDA build"
    cuda += "" if info["cuda_available"] else " (no GPU visible)" if info["cuda"] else ""
    gold = info["golden"]
    sections: list[tuple[str, list[tuple[str, str]]]] = [
        ("runtime", [("python", info["python"]), ("torch", f"{info['torch']}, {cuda}"),
                     ("devices", ", ".join(info["devices"])),
                     *((f"oracle on {d}", e) for d, e in info["oracle"].items())]),
        ("kernel libraries", [(name, entry.get("version") or f"missing: {entry['missing']}")
                              for name, entry in info["libraries"].items()]),
        ("settings (environment variables)", [(name, f"{value}" if (value := info["settings"][name]) is not None
                                                else f"unset: {info['settings_unset'][name]}")
                                               for name in SETTINGS]),
        ("caches", [("compile (PA_ORACLE_CACHE_DIR)", info["caches"]["compile (PA_ORACLE_CACHE_DIR)"]),
                    ("TRITON_CACHE_DIR", info["caches"]["triton"]),
                    ("FlashInfer JIT", info["caches"]["flashinfer_jit"]),
                    ("inductor", info["caches"]["inductor"])]),
        ("golden corpus", [("root", f"{gold['root']} ({gold['from']})" + ("" if gold["exists"] else ": MISSING")),
                           ("content", f"{gold['cases']} cases, ledger.json " + ("present" if gold["ledger"] else "MISSING"))]),
        ("backends", [(name, (f"available on {e['device']}" if e["available"] else f"unavailable: {e['why']}")
                       + f" ({e['kind']} kernel)") for name, e in sorted(info["backends"].items())]),
    ]
    width = max(len(key) for _, rows in sections for key, _ in rows)
    lines: list[str] = []
    for title, rows in sections:
        lines += ([""] if lines else []) + [title]
        lines += [f"  {key:<{width}}  {value}" for key, value in rows]
    return lines


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the environment as JSON.")
def env(as_json: bool) -> None:
    """Versions, devices, kernel libraries, PA_ORACLE_* settings, caches and the golden corpus in use.

    Also which backends are available here, and why the others are not."""
    info = environment()
    click.echo(json.dumps(info, indent=1) if as_json else "\n".join(render(info)))
