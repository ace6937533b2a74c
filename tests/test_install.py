"""The package as a user gets it: a wheel of this checkout installed into a fresh venv, run from
an empty folder (not the checkout). The venv reaches the running interpreter's third-party
packages (torch, Hypothesis, pytest) through a ``.pth`` file, but not the checkout, so
``pa_oracle`` resolves to the wheel's copy. The wheel is built once per test session (shared by
xdist workers through a lock); building it fetches setuptools from the package registry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from filelock import FileLock

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parents[1]
NOT_PACKAGED = (".git", ".venv", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache", "pa-findings",
                "pa-gates", ".device", ".device-scripts", "shared", "*.egg-info")


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _build_venv(where: Path) -> Path:
    """A copy of the checkout built into a wheel, installed into a fresh venv at ``where/venv``."""
    source = where / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_PACKAGED))
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(where / "wheel"), str(source)],
                 where, dict(os.environ))
    assert built.returncode == 0, f"building the wheel failed:\n{built.stdout}\n{built.stderr}"
    (wheel,) = (where / "wheel").glob("paged_attention_oracle-*.whl")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], where,
                     _user_env(where)).stdout.strip())
    # the running interpreter's third-party packages, not the checkout (nor an editable install's finder:
    # a .pth file's own .pth files are not run)
    ours = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))] or [sysconfig.get_paths()["purelib"]]
    (site / "third-party.pth").write_text("".join(f"{p}\n" for p in ours))
    installed = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                     where, dict(os.environ))
    assert installed.returncode == 0, f"installing the wheel failed:\n{installed.stdout}\n{installed.stderr}"
    return venv


def _user_env(base: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "VIRTUAL_ENV")}
    env["XDG_CACHE_HOME"] = str(base / "cache")  # the CLI's Hypothesis cache goes there, not into ~/.cache
    return env


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: one wheel for all workers
    where = shared / "pa-oracle-install"
    with FileLock(str(shared / "pa-oracle-install.lock")):
        done = where / "venv" / "ready"
        if not done.exists():
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir()
            _build_venv(where)
            done.write_text("ok\n")
    return where / "venv"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty working folder, as a user's project starts."""
    folder = tmp_path / "project"
    folder.mkdir()
    return folder


def _in(venv: Path, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(list(args), project, _user_env(project.parent))


def test_the_package_resolves_to_the_wheel_and_its_golden_data(venv: Path, project: Path) -> None:
    code = ("import json, pa_oracle, pa_oracle.fuzz.cli; from pa_oracle import golden; "
            "print(json.dumps([pa_oracle.__file__, pa_oracle.fuzz.cli.__file__, str(golden.ledger_path())]))")
    done = _in(venv, project, str(venv / "bin" / "python"), "-c", code)
    assert done.returncode == 0, done.stderr
    for path in json.loads(done.stdout):
        assert Path(path).is_relative_to(venv) and Path(path).exists(), path


def test_the_readme_main_job_runs_from_an_empty_folder(venv: Path, project: Path) -> None:
    done = _in(venv, project, str(venv / "bin" / "pa-oracle"), "fuzz", "-b", "sdpa-math", "-n", "5", "--out", "X", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = json.loads(done.stdout)
    assert result["backend"] == "sdpa-math" and result["examples"] == 5 and result["finding"] is None
    assert sorted(p.name for p in project.iterdir()) == ["X"], "nothing written into the working folder but --out"


def test_a_users_own_backends_package_is_fuzzable(venv: Path, project: Path) -> None:
    (project / "backends").mkdir()
    (project / "backends" / "__init__.py").write_text("")
    (project / "backends" / "mine.py").write_text(textwrap.dedent("""
        from pa_oracle.fuzz.quality.planted import correct_attention

        attn = correct_attention
        """))
    done = _in(venv, project, str(venv / "bin" / "pa-oracle"), "fuzz", "--kernel", "backends.mine:attn", "-n", "5",
               "--out", "X", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = json.loads(done.stdout)
    assert result["backend"] == "backends.mine:attn" and result["examples"] == 5 and result["finding"] is None


def test_a_projects_own_hypothesis_profile_survives_the_installed_plugin(venv: Path, project: Path) -> None:
    (project / "conftest.py").write_text(textwrap.dedent("""
        from hypothesis import settings

        settings.register_profile("theirs", max_examples=7, deadline=1234)
        settings.load_profile("theirs")
        """))
    (project / "test_theirs.py").write_text(textwrap.dedent(f"""
        import datetime

        from hypothesis import settings


        def test_their_profile_is_in_force(request):
            assert settings.default.max_examples == 7
            assert settings.default.deadline == datetime.timedelta(milliseconds=1234)
            plugin = request.config.pluginmanager.get_plugin("pa_oracle")
            assert plugin is not None and plugin.__file__.startswith({str(venv)!r}), plugin
        """))
    done = _in(venv, project, str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout


def test_pytest_pa_kernel_alone_runs_the_conformance_test_and_keeps_the_report(venv: Path, project: Path) -> None:
    (project / "mymod.py").write_text("from pa_oracle.fuzz.quality.planted import wrong_gqa_map as attn\n")
    (project / "test_theirs.py").write_text("def test_theirs():\n    raise AssertionError('not collected')\n")
    done = _in(venv, project, str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-q",
               "--pa-kernel", "mymod:attn", "--pa-examples", "100")
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "1 failed" in done.stdout, output
    assert "test_kernel_agrees_with_oracle[mymod:attn]" in done.stdout and "test_theirs" not in done.stdout, output
    assert "repro: pa-oracle replay" in done.stdout, output
    assert list((project / "pa-findings").rglob("report.md")), "the finding's report is kept in ./pa-findings"
    assert not (project / ".hypothesis").exists(), "no Hypothesis folder in the working directory"
