"""What a hostile review of the first version broke, one test each: a case whose values overflow
the kernel's dtype (a NaN limit passed everything), replay/triage without a verdict exiting 0, a
user's file under --out replaced, tensor subclasses and odd dtypes slipping past the judge, and an
exception whose ``__str__`` raises."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from fuzz.cli import main
from oracle.case import Case
from oracle.tensors import _raw_bits, make_tensors

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
            arrays[name + "__bits"] = _raw_bits(tensor).numpy().copy()
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
