"""Hostile case files and npz sidecars: each is a CaseError whose message names the file and the
field (or array), never a traceback, a silent coercion or a case that loads wrong."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from pa_oracle.fuzz.campaign.ledger import golden_cases
from pa_oracle.oracle.case import Case, CaseError, Heads, Layout, Options
from pa_oracle.oracle.tensors import load_case, make_tensors, save_case, save_tensors, token_slots

CASE = Case(Layout.from_lengths([1, 2], [5, 3], 4, page_order=[2, 0, 1, 3], extra_pages=1), Heads(2, 1, 8, 8), seed=7)
BASE = json.loads(json.dumps(CASE.to_json()))
BASE.pop("case_id")  # the edits change the content; a stale id would be the first error


def at(*keys: str | int, value: object):
    """An edit that sets ``BASE[keys...] = value``."""

    def edit(data: dict) -> None:
        target = data
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return edit


def drop(*keys: str):
    def edit(data: dict) -> None:
        target = data
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]

    return edit


# (edit of the valid case, the field the message must name, what it must say)
HOSTILE_FIELDS = [
    (at("layout", "qo_indptr", value="014"), "layout.qo_indptr", "expected list, got str"),
    (at("layout", "qo_indptr", value=[0, 1.7, 3]), "layout.qo_indptr[1]", "expected int, got float 1.7"),
    (at("layout", "qo_indptr", value=[0, 1.0, 3]), "layout.qo_indptr[1]", "expected int, got float 1.0"),
    (at("layout", "qo_indptr", value=[0, True, 3]), "layout.qo_indptr[1]", "expected int, got bool"),
    (at("layout", "kv_indices", value=[True, 0]), "layout.kv_indices[0]", "expected int, got bool"),
    (at("layout", "kv_indices", value=[2, 0, "1"]), "layout.kv_indices[2]", "expected int, got str"),
    (at("layout", "page_size", value=True), "layout.page_size", "expected int, got bool"),
    (at("layout", "page_size", value=1.5), "layout.page_size", "expected int, got float 1.5"),
    (at("layout", "page_size", value="4"), "layout.page_size", "expected int, got str"),
    (at("layout", "page_size", value=2**31), "layout.page_size", "must be <= 2147483647"),
    (at("layout", "num_pages", value=2**70), "layout.num_pages", "must be <= 2147483647"),
    (at("layout", "kv_last_page_len", value=[1, 2**70]), "layout.kv_last_page_len[1]", "must be <= 2147483647"),
    (at("layout", "kv_indptr", value=None), "layout.kv_indptr", "expected list, got null"),
    (at("layout", "qo_indptr", value=[0, 3, 1]), "layout.qo_indptr", "is not monotone"),
    (at("layout", "bogus", value=1), "layout.bogus", "unknown field (known: qo_indptr"),
    (drop("layout", "page_size"), "layout.page_size", "missing"),
    (at("heads", "num_qo_heads", value=2.0), "heads.num_qo_heads", "expected int, got float 2.0"),
    (at("heads", "num_kv_heads", value=0), "heads.num_kv_heads", "must be >= 1"),
    (at("heads", "head_dim_qk", value=2**40), "heads.head_dim_qk", "must be <= 2147483647"),
    (at("heads", "head_dim_vo", value="8"), "heads.head_dim_vo", "expected int, got str"),
    (drop("heads", "num_kv_heads"), "heads.num_kv_heads", "missing"),
    (at("options", "window_left", value=2.5), "options.window_left", "expected int, got float 2.5"),
    (at("options", "window_left", value=2**70), "options.window_left", "must be <= 2147483647"),
    (at("options", "window_left", value=-2), "options.window_left", "must be -1 (off) or >= 0"),
    (at("options", "window_left", value=False), "options.window_left", "expected int, got bool"),
    (at("options", "causal", value=1), "options.causal", "expected bool, got int 1"),
    (at("options", "causal", value="true"), "options.causal", "expected bool, got str"),
    (at("options", "sm_scale", value=1e308), "options.sm_scale", "must be in [1e-06, 1000]"),
    (at("options", "sm_scale", value=1e-9), "options.sm_scale", "must be in [1e-06, 1000]"),
    (at("options", "sm_scale", value=0), "options.sm_scale", "must be in [1e-06, 1000]"),
    (at("options", "sm_scale", value=-0.5), "options.sm_scale", "must be in [1e-06, 1000]"),
    (at("options", "sm_scale", value=float("nan")), "options.sm_scale", "must be finite, got nan"),
    (at("options", "sm_scale", value=float("inf")), "options.sm_scale", "must be finite, got inf"),
    (at("options", "sm_scale", value=10**400), "options.sm_scale", "must be finite"),
    (at("options", "sm_scale", value="0.5"), "options.sm_scale", "expected number | null, got str"),
    (at("options", "sm_scale", value=True), "options.sm_scale", "expected number | null, got bool"),
    (at("options", "logits_soft_cap", value=float("nan")), "options.logits_soft_cap", "must be finite"),
    (at("options", "logits_soft_cap", value=-1.0), "options.logits_soft_cap", "must be in [0, 1e+06]"),
    (at("options", "logits_soft_cap", value=1e7), "options.logits_soft_cap", "must be in [0, 1e+06]"),
    (at("options", "logits_soft_cap", value=1e-9), "options.logits_soft_cap", "must be 0 (off) or in [1e-06"),
    (at("options", "logits_soft_cap", value="30"), "options.logits_soft_cap", "expected number, got str"),
    (at("options", "alibi_slopes", value=[float("nan"), 0.5]), "options.alibi_slopes[0]", "must be finite, got nan"),
    (at("options", "alibi_slopes", value=[0.5, float("-inf")]), "options.alibi_slopes[1]", "must be finite"),
    (at("options", "alibi_slopes", value=[0.5, 1e4]), "options.alibi_slopes[1]", "must be in [-1000, 1000]"),
    (at("options", "alibi_slopes", value="0.5"), "options.alibi_slopes", "expected list | null, got str"),
    (at("options", "alibi_slopes", value=[True, 0.5]), "options.alibi_slopes[0]", "expected number, got bool"),
    (at("options", "alibi_slopes", value=[0.5]), "options.alibi_slopes", "has 1 entries, expected num_qo_heads=2"),
    (at("options", "sinks", value=[float("nan"), 0.0]), "options.sinks[0]", "must be finite, got nan"),
    (at("options", "sinks", value=[0.0, -1e5]), "options.sinks[1]", "must be in [-1000, 1000]"),
    (at("options", "sinks", value=[0.0, 10**400]), "options.sinks[1]", "must be finite"),
    (at("options", "sinks", value=[0.0, "1"]), "options.sinks[1]", "expected number, got str"),
    (at("options", "q_dtype", value="float64"), "options.q_dtype", "must be one of"),
    (at("options", "kv_dtype", value=16), "options.kv_dtype", "expected str, got int 16"),
    (at("options", "k_scale", value=0.5), "options.k_scale", "needs an fp8 kv_dtype"),
    (at("options", "k_scale", value=0), "options.k_scale", "must be in [1e-06, 1000]"),
    (at("options", "v_scale", value=float("nan")), "options.v_scale", "must be finite"),
    (at("options", "v_scale", value=1e308), "options.v_scale", "must be in [1e-06, 1000]"),
    (at("options", "wndow_left", value=3), "options.wndow_left", "unknown field (known: causal"),
    (at("options", value=[]), "options", "expected object, got list"),
    (at("seed", value=2**64), "seed", "must be <= 9223372036854775807"),
    (at("seed", value=2**70), "seed", "must be <= 9223372036854775807"),
    (at("seed", value=-1), "seed", "must be >= 0"),
    (at("seed", value=1.5), "seed", "expected int, got float 1.5"),
    (at("seed", value="7"), "seed", "expected int, got str"),
    (at("seed", value=True), "seed", "expected int, got bool"),
    (at("distribution", value="uniform"), "distribution", "must be one of"),
    (at("distribution", value=3), "distribution", "expected str, got int 3"),
    (at("tensors_file", value=3), "tensors_file", "expected str | null, got int 3"),
    (at("meta", value=[]), "meta", "expected object, got list"),
    (at("case_id", value=5), "case_id", "expected str, got int 5"),
    (at("case_id", value="000000000000"), "case_id", "does not match the case's content"),
    (at("extra", value=1), "extra", "unknown field (known: schema_version"),
    (drop("layout"), "layout", "missing"),
    (at("schema_version", value=2), "schema_version", "unknown case schema_version 2"),
    (at("schema_version", value="1"), "schema_version", "unknown case schema_version '1'"),
    (at("schema_version", value=True), "schema_version", "unknown case schema_version True"),
]


@pytest.mark.parametrize("edit, field, says", HOSTILE_FIELDS, ids=[f"{f}: {s}" for _, f, s in HOSTILE_FIELDS])
def test_a_malformed_field_is_refused_naming_file_and_field(tmp_path, edit, field, says) -> None:
    data = copy.deepcopy(BASE)
    edit(data)
    path = tmp_path / "case.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CaseError) as caught:
        load_case(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    assert re.search(rf"(^|[:\s]){re.escape(field)}(?![\w.\[])", message), f"the field {field} is not named: {message}"
    assert says in message, message


HOSTILE_TEXTS = [
    ("", "not valid JSON"),
    ('{"schema_version": 1, "layout": {"qo_indptr": [0,', "not valid JSON"),
    ("{nope", "not valid JSON"),
    ("[1, 2]", "a case is a JSON object, got list"),
    ("null", "a case is a JSON object, got NoneType"),
    ('"case"', "a case is a JSON object, got str"),
    ('{"schema_version": 1, "schema_version": 1}', "key 'schema_version' given twice"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
]


@pytest.mark.parametrize("text, says", HOSTILE_TEXTS, ids=[s for _, s in HOSTILE_TEXTS])
def test_a_file_that_is_no_case_object_is_refused_naming_the_file(tmp_path, text, says) -> None:
    path = tmp_path / "case.json"
    path.write_text(text)
    with pytest.raises(CaseError, match=re.escape(f"{path}: ")) as caught:
        load_case(path)
    assert says in str(caught.value)


def test_unreadable_case_files_are_refused_naming_the_file(tmp_path) -> None:
    for path, says in ((tmp_path / "missing.json", "cannot read it"), (tmp_path, "cannot read it")):
        with pytest.raises(CaseError, match=re.escape(f"{path}: {says}")):
            load_case(path)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CaseError, match="binary.json: not valid JSON"):
        load_case(tmp_path / "binary.json")


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda: Options(window_left=2.5), "window_left: expected int, got float 2.5"),
        (lambda: Options(window_left=2**70), "window_left must be <= 2147483647"),
        (lambda: Options(sm_scale=1e308), "sm_scale must be in"),
        (lambda: Options(alibi_slopes=(float("nan"),)), r"alibi_slopes\[0\] must be finite"),
        (lambda: Options(sinks="01"), "sinks: expected a list of numbers, got str"),
        (lambda: Options(causal=1), "causal: expected bool"),
        (lambda: Heads(True, 1, 8, 8), "num_qo_heads: expected int, got bool"),
        (lambda: Layout("01", (0, 1), (0,), (1,), 4, 1), "qo_indptr: expected a list of int, got str"),
        (lambda: Layout((0, 1.0), (0, 1), (0,), (1,), 4, 1), r"qo_indptr\[1\]: expected int, got float"),
        (lambda: Case(Layout.from_lengths([1], [1], 4), Heads(1, 1, 8, 8), seed=2**64), "seed must be <="),
    ],
)
def test_cases_built_in_python_get_the_same_checks(make, says) -> None:
    with pytest.raises(CaseError, match=says):
        make()


def test_cases_built_in_python_keep_working() -> None:
    case = Case(Layout.from_lengths([1, 2], [5, 3], 4), Heads(4, 2, 8, 8), Options(sm_scale=1, logits_soft_cap=30, alibi_slopes=(0.5, 0.25, 0.1, 1)))
    assert case.options.sm_scale == 1 and isinstance(case.options.sm_scale, int), "an int sm_scale is kept (its case_id too)"
    assert Case.from_json(case.to_json()) == case and Case.from_json(case.to_json()).case_id == case.case_id
    moved = case.replace(seed=np.int64(5), layout=Layout(*(np.array(x) if isinstance(x, tuple) else x for x in (
        case.layout.qo_indptr, case.layout.kv_indptr, case.layout.kv_indices, case.layout.kv_last_page_len, 4, 3))))
    assert moved.seed == 5 and type(moved.seed) is int and moved.layout == case.layout  # numpy ints are ints


@pytest.mark.parametrize("path", golden_cases(), ids=lambda p: p.stem)
def test_every_golden_case_loads_to_the_same_content_and_id(path: Path) -> None:
    data = json.loads(path.read_text())
    case = Case.from_json(data)
    body = json.loads(json.dumps(case.to_json()))
    # the loaded case writes back exactly the fields it was read from: its content, hence its case_id, did not change
    assert {k: v for k, v in body.items() if k != "case_id"} == {k: v for k, v in data.items() if k != "case_id"}
    assert case.case_id == data["case_id"], "a golden case without a sidecar keeps its id; one with a sidecar names its content"
    loaded = load_case(path)  # the sidecar is read and checked too
    assert loaded.case_id == data["case_id"], "the id does not depend on where the sidecar is"


def test_the_same_case_in_two_folders_has_one_id(tmp_path: Path) -> None:
    case = Case(Layout.from_lengths([1, 2], [5, 3], 4, extra_pages=1), Heads(2, 1, 8, 8), seed=3)
    saved = save_case(case, tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "elsewhere" / "b")
    ids = {saved.case_id, load_case(tmp_path / "a" / "case.json").case_id, load_case(tmp_path / "elsewhere" / "b" / "case.json").case_id}
    assert ids == {json.loads((tmp_path / "a" / "case.json").read_text())["case_id"]}
    assert saved.case_id != case.case_id or saved.tensors_sha256 is None


def test_a_sidecar_that_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    case = Case(Layout.from_lengths([1], [5], 4), Heads(2, 1, 8, 8), seed=3)
    save_case(case, tmp_path / "a")
    save_tensors(make_tensors(case.replace(seed=4)), tmp_path / "a" / "tensors.npz")
    with pytest.raises(CaseError, match="does not hold the tensors the case names"):
        load_case(tmp_path / "a" / "case.json")


# --- npz sidecars ---------------------------------------------------------------------------------

NPZ_CASE = Case(
    Layout.from_lengths([1, 2], [5, 3], 4, page_order=[2, 0, 1, 3], extra_pages=1),
    Heads(2, 1, 8, 8), Options(q_dtype="float16", kv_dtype="float16"), seed=7,
)
FP16_NAN, FP16_INF = np.int16(0x7E00), np.int16(0x7C00)


def sidecar(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A valid case with its npz sidecar; returns the case file and the sidecar's arrays."""
    npz = save_tensors(make_tensors(NPZ_CASE), tmp_path / "tensors.npz")
    path = NPZ_CASE.replace(tensors_file="tensors.npz").save(tmp_path / "case.json")
    with np.load(npz) as data:
        return path, {name: data[name] for name in data.files}


def referenced_slot(case: Case, token: int) -> tuple[int, int]:
    return divmod(int(token_slots(case)[token]), case.layout.page_size)


def set_bits(name: str, index, value) -> object:  # type: ignore[no-untyped-def]
    def edit(arrays: dict[str, np.ndarray]) -> None:
        bits = arrays[f"{name}__bits"].copy()
        bits[index] = value
        arrays[f"{name}__bits"] = bits

    return edit


def replace(name: str, value: object) -> object:
    def edit(arrays: dict[str, np.ndarray]) -> None:
        arrays[name] = value  # type: ignore[assignment]

    return edit


def remove(name: str) -> object:
    return lambda arrays: arrays.pop(name)


K_PAGE, K_SLOT = referenced_slot(NPZ_CASE, 0)  # request 0, key 0
V_PAGE, V_SLOT = referenced_slot(NPZ_CASE, 6)  # request 1, key 1
HOSTILE_ARRAYS = [
    (remove("k_cache__bits"), "k_cache__bits", "missing arrays"),
    (replace("extra", np.zeros(3)), "extra", "unknown arrays"),
    (replace("q__dtype", np.array("float32")), "q", "is 'float32', the case needs float16"),
    (replace("q__dtype", np.array(3)), "q__dtype", "must be one string"),
    (replace("k_cache__dtype", np.array(["float16", "float16"])), "k_cache__dtype", "must be one string"),
    (replace("v_cache__bits", np.zeros((4, 4, 1, 8), dtype=np.float64)), "v_cache__bits", "is float64, the raw bits of float16 are int16"),
    (replace("v_cache__bits", np.zeros((4, 4, 1, 8), dtype=">i2")), "v_cache__bits", "the raw bits of float16 are int16"),
    (replace("k_cache__bits", np.zeros((4, 4, 2, 8), dtype=np.int16)), "k_cache", "is (4, 4, 2, 8) float16, the case needs (4, 4, 1, 8)"),
    (replace("q__bits", np.zeros((2, 2, 8), dtype=np.int16)), "q", "the case needs (3, 2, 8)"),
    (replace("q__bits", np.array([object()], dtype=object)), "q__bits", "Object arrays cannot be loaded"),
    (set_bits("q", (2, 1, 3), FP16_NAN), "q row 2", "holds a NaN or inf"),
    (set_bits("q", (0, 0, 0), FP16_INF), "q row 0", "holds a NaN or inf"),
    (set_bits("k_cache", (K_PAGE, K_SLOT, 0, 5), FP16_NAN), f"k_cache[page {K_PAGE}, slot {K_SLOT}] (request 0, key 0)", "a slot the case reads must be finite"),
    (set_bits("v_cache", (V_PAGE, V_SLOT, 0, 0), FP16_INF), f"v_cache[page {V_PAGE}, slot {V_SLOT}] (request 1, key 1)", "must be finite"),
]


@pytest.mark.parametrize("edit, array, says", HOSTILE_ARRAYS, ids=[f"{a}: {s}" for _, a, s in HOSTILE_ARRAYS])
def test_a_bad_sidecar_is_refused_when_the_case_loads_naming_file_and_array(tmp_path, edit, array, says) -> None:
    path, arrays = sidecar(tmp_path)
    edit(arrays)
    np.savez(tmp_path / "tensors.npz", **arrays)  # allow_pickle's default: an object array is pickled into the file
    with pytest.raises(CaseError) as caught:
        load_case(path)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'tensors.npz'}: ") and array in message and says in message, message


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _corrupt_member(data: bytes) -> bytes:
    middle = len(data) // 2  # inside a member's compressed bytes: the archive opens, reading the array fails
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 64]) + data[middle + 64 :]


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda data: b"", "not a readable npz archive"),
        (lambda data: b"not an npz at all", "not a readable npz archive"),
        (_truncated, "not a readable npz archive"),
        (_corrupt_member, "is unreadable"),
    ],
    ids=["empty", "text", "truncated", "corrupt member"],
)
def test_a_damaged_sidecar_is_refused_naming_the_file(tmp_path, damage, says) -> None:
    path, _ = sidecar(tmp_path)
    npz = tmp_path / "tensors.npz"
    npz.write_bytes(damage(npz.read_bytes()))
    with pytest.raises(CaseError, match=re.escape(f"{npz}: ")) as caught:
        load_case(path)
    assert says in str(caught.value), str(caught.value)


def test_a_missing_sidecar_or_a_single_array_is_refused_naming_the_file(tmp_path) -> None:
    path, arrays = sidecar(tmp_path)
    (tmp_path / "tensors.npz").unlink()
    with pytest.raises(CaseError, match=re.escape(f"{tmp_path / 'tensors.npz'}: tensors file not found")):
        load_case(path)
    with open(tmp_path / "tensors.npz", "wb") as f:
        np.save(f, arrays["q__bits"])  # an .npy under the sidecar's name
    with pytest.raises(CaseError, match="holds one array, not an npz archive"):
        load_case(path)


def test_unreferenced_slots_may_hold_anything_and_a_good_sidecar_loads_bit_exact(tmp_path) -> None:
    path, arrays = sidecar(tmp_path)
    used = {divmod(int(s), NPZ_CASE.layout.page_size) for s in token_slots(NPZ_CASE)}
    free = next((p, s) for p in range(NPZ_CASE.layout.num_pages) for s in range(NPZ_CASE.layout.page_size) if (p, s) not in used)
    for name in ("k_cache__bits", "v_cache__bits"):
        arrays[name][free] = FP16_INF
    np.savez(tmp_path / "tensors.npz", **arrays)
    loaded = load_case(path)
    tensors = make_tensors(loaded)
    assert tensors.k_cache[free].isinf().all() and tensors.fingerprint()["q"] == make_tensors(NPZ_CASE).fingerprint()["q"]
