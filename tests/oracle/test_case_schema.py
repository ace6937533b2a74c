"""The case file's strict schema is made from the case dataclasses (``oracle.schema.file_fields``):
one declaration of each field, read strictly as JSON gives it."""

from __future__ import annotations

import dataclasses

import msgspec
import msgspec.inspect
import pytest
from pa_oracle.oracle import case as case_model
from pa_oracle.oracle.case import Case, CaseError, CustomMask, Heads, Layout, Options, Rope, Storage
from pa_oracle.oracle.schema import file_fields

LAYOUT = {"qo_indptr": [0, 1], "kv_indptr": [0, 1], "kv_indices": [0], "kv_last_page_len": [1], "page_size": 1, "num_pages": 1}
HEADS = {"num_qo_heads": 1, "num_kv_heads": 1, "head_dim_qk": 8, "head_dim_vo": 8}


def _file_names(struct: type) -> list[str]:
    return [f.name for f in msgspec.inspect.type_info(struct).fields]


@pytest.mark.parametrize("model", [Layout, Heads, Options, CustomMask, Storage])
def test_each_file_struct_has_its_dataclass_fields_in_order(model):
    assert _file_names(case_model._FILE_STRUCTS[model]) == [f.name for f in dataclasses.fields(model)]


def test_the_case_file_adds_only_schema_version_and_case_id():
    names = [f.name for f in dataclasses.fields(Case)]
    assert _file_names(case_model._CaseFile) == ["schema_version", *names[:names.index("meta") + 1], "case_id",
                                                 *names[names.index("meta") + 1:]]


def test_required_fields_are_the_ones_without_a_default():
    required = {f.name for f in msgspec.inspect.type_info(case_model._FILE_STRUCTS[Heads]).fields if f.required}
    assert required == {"num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo"}  # mla has a default


def test_a_float_field_takes_an_int_and_keeps_it_an_int_where_an_int_field_refuses_a_float():
    rope = msgspec.convert({"theta": 10000}, case_model._RopeFile, strict=True)
    assert rope.theta == 10000 and isinstance(rope.theta, int)
    with pytest.raises(CaseError, match=r"case JSON: layout.page_size: expected int, got float 1.5"):
        Case.from_json({"schema_version": 1, "layout": {**LAYOUT, "page_size": 1.5}, "heads": HEADS})


def test_a_mask_field_may_be_absent_but_not_null():
    with pytest.raises(CaseError, match=r"custom_mask.bits: expected str, got null"):
        Case.from_json({"schema_version": 1, "layout": LAYOUT, "heads": HEADS, "custom_mask": {"bits": None}})


@dataclasses.dataclass
class Inner:
    x: float


@dataclasses.dataclass
class Outer:
    xs: tuple[int, ...]
    inner: Inner | None = None


def test_file_fields_maps_tuples_to_lists_and_nested_dataclasses_to_their_structs():
    inner = msgspec.defstruct("InnerFile", file_fields(Inner), forbid_unknown_fields=True)
    outer = msgspec.defstruct("OuterFile", file_fields(Outer, {Inner: inner}), forbid_unknown_fields=True)
    got = msgspec.convert({"xs": [1, 2], "inner": {"x": 1}}, outer, strict=True)
    assert got.xs == [1, 2] and got.inner.x == 1
    assert msgspec.convert({"xs": []}, outer, strict=True).inner is msgspec.UNSET
    with pytest.raises(msgspec.ValidationError, match="Expected `array`, got `str`"):
        msgspec.convert({"xs": "12"}, outer, strict=True)


def test_a_case_round_trips_through_the_generated_schema():
    case = Case(Layout(**LAYOUT), Heads(**HEADS), Options(rope=Rope(theta=5e5), causal=True), seed=3,
                storage=Storage(kv="combined"))
    again = Case.from_json(case.to_json())
    assert again == case and again.case_id == case.case_id
