"""What a hostile review of the first version broke, one test each: a case whose values overflow
the kernel's dtype (a NaN limit passed everything), replay/triage without a verdict exiting 0, a
user's file under --out replaced, tensor subclasses and odd dtypes slipping past the judge, and an
exception whose ``__str__`` raises."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import raw_bits, make_tensors

from pa_oracle.cli import main

MODULE = "tests.reliability.bad_kernels"
CASE = {"schema_version": 1, "layout": {"qo_indptr": [0, 2, 3], "kv_indptr": [0, 2, 3], "kv_indices": [0, 2, 1],
                                         "kv_last_page_len": [3, 4], "page_size": 4, "num_pages": 4},
        "heads": {"num_qo_heads": 2, "num_kv_heads": 1, "head_dim_qk": 8, "head_dim_vo": 8},
        "options": {"causal": True, "q_dtype": "float32", "kv_dtype": "float32"}, "seed": 0, "distribution": "normal",
        "tensors_file": None, "meta": {}}


def cli(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, list(args))


def write_case(folder: Path, q_value: float | None = None, **options: object) -> Path:
    data = json.loads(json.dumps(CASE))
    data["options"].update(options)
    if q_value is not None:
        arrays = {}
        for name, tensor in make_tensors(Case.from_json(data), "cpu").as_dict().items():
            arrays[name + "__bits"] = raw_bits(tensor).numpy().copy()
            arrays[name + "__dtype"] = np.array("float32")
        arrays["q__bits"].view(np.float32)[:] = q_value  # finite in float32, but its logits overflow
        np.savez(folder / "t.npz", **arrays)
        data["tensors_file"] = "t.npz"
    (folder / "case.json").write_text(json.dumps(data))
    return folder / "case.json"


def test_a_case_that_overflows_the_dtype_is_no_verdict_for_any_kernel(tmp_path) -> None:
    case = write_case(tmp_path, q_value=3e38)
    for args in (["-b", "sdpa-math"], ["-k", f"{MODULE}:returns_zeros"]):
        result = cli("replay", str(case), *args)
        assert result.exit_code == 2, result.output  # neither a false finding nor a false pass
        assert "overflow torch.float32" in result.output and "no kernel can be judged" in result.output


def test_replay_of_an_unsupported_case_is_no_verdict(tmp_path) -> None:
    case = write_case(tmp_path, alibi_slopes=[0.5, 0.25])
    result = cli("replay", str(case), "-k", f"{MODULE}:refuses_alibi")
    assert result.exit_code == 3 and "UNSUPPORTED" in result.output, result.output


def test_triage_that_judged_nothing_exits_3(tmp_path) -> None:
    case = write_case(tmp_path, alibi_slopes=[0.5, 0.25])
    result = cli("triage", str(case), "-k", f"{MODULE}:refuses_alibi", "--no-minimize", "--out", str(tmp_path / "t"))
    assert result.exit_code == 3, result.output


def test_a_users_summary_json_under_out_is_not_replaced(tmp_path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.json").write_text("MINE\n")
    result = cli("fuzz", "-b", "sdpa-math", "-n", "3", "--out", str(out))
    assert result.exit_code == 2 and "holds a campaign (summary.json)" in result.output, result.output
    assert (out / "summary.json").read_text() == "MINE\n"


def test_a_workers_campaign_is_not_overrun_by_a_plain_one(tmp_path) -> None:
    out = tmp_path / "w"
    (out / "shards").mkdir(parents=True)
    (out / "shards" / "campaign-0-of-2.json").write_text("{}")
    result = cli("fuzz", "-b", "sdpa-math", "-n", "3", "--out", str(out))
    assert result.exit_code == 2 and "shards/campaign-0-of-2.json" in result.output, result.output


def test_odd_returns_and_unprintable_exceptions_are_findings(tmp_path) -> None:
    expected = {
        "returns_lying_subclass": "kernel contract: out is a tensor subclass",
        "returns_complex_lse": "kernel contract: lse has dtype torch.complex64",
        "returns_fp8_out": "kernel contract: out has dtype torch.float8_e4m3fn",
        "raises_unprintable": "_StrRaises whose __str__ raised",
    }
    for kernel, message in expected.items():
        result = cli("fuzz", "-k", f"{MODULE}:{kernel}", "-n", "5", "--no-isolate", "--out", str(tmp_path / kernel))
        assert result.exit_code == 1 and f"FINDING in {MODULE}:{kernel}" in result.output, result.output
        assert message in result.output, result.output


def test_a_kernel_module_that_fails_to_import_is_bad_input(tmp_path, monkeypatch) -> None:
    (tmp_path / "broken_at_import.py").write_text("raise RuntimeError('no GPU here')\n")
    (tmp_path / "broken_syntax.py").write_text("def f(:\n")
    monkeypatch.chdir(tmp_path)
    for module, why in (("broken_at_import", "RuntimeError: no GPU here"), ("broken_syntax", "SyntaxError")):
        result = cli("fuzz", "-k", f"{module}:attn", "-n", "2", "--out", str(tmp_path / module))
        assert result.exit_code == 2 and f"--kernel {module}:attn: cannot import it ({why}" in result.output, result.output
    missing = cli("fuzz", "-k", "no_such_module:attn", "-n", "2", "--out", str(tmp_path / "missing"))
    assert missing.exit_code == 2 and "No module named 'no_such_module'" in missing.output, missing.output


def test_an_integer_past_pythons_parsing_limit_is_bad_input(tmp_path) -> None:
    data = json.loads(json.dumps(CASE))
    (tmp_path / "case.json").write_text(json.dumps(data).replace('"seed": 0', '"seed": ' + "9" * 5000))
    result = cli("replay", str(tmp_path / "case.json"), "-b", "sdpa-math")
    assert result.exit_code == 2 and "case.json: not valid JSON" in result.output, result.output


def test_an_npz_with_a_duplicate_member_is_bad_input(tmp_path) -> None:
    import zipfile

    case = write_case(tmp_path, q_value=1.0)
    with zipfile.ZipFile(tmp_path / "t.npz", "a") as archive:
        archive.writestr("q__bits.npy", b"garbage")  # a second member of the same name
    result = cli("replay", str(case), "-b", "sdpa-math")
    assert result.exit_code == 2 and "t.npz" in result.output and "Traceback" not in result.output, result.output
