"""A saved write case on disk (``writes.json``, or the case object alone), read strictly: what ``writes --case``,
``pa-oracle replay`` and triage read (``read_write_case``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

import msgspec

from pa_oracle.oracle.append import AppendCase

if TYPE_CHECKING:
    from pa_oracle.fuzz.campaign.finding_record import FindingMeta

# what a saved write case may ask for: a pool (K and V, float32 at most) beyond this is refused before
# anything is allocated; far above what `writes` draws (tens of pages) and what a test device holds
MAX_POOL_BYTES = 4 << 30
MAX_REQUESTS, MAX_TOKENS = 4096, 1 << 24


_Size = Annotated[int, msgspec.Meta(ge=1, le=1 << 16)]
_Length = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)]
_Lengths = Annotated[list[_Length], msgspec.Meta(min_length=1, max_length=MAX_REQUESTS)]


class WriteCase(msgspec.Struct, forbid_unknown_fields=True):
    """A write case as a file holds it (``oracle.append.AppendCase``'s fields, strictly typed and bounded)."""

    seq_lens_before: _Lengths
    append_lens: _Lengths
    page_size: _Size
    num_kv_heads: _Size
    head_dim: _Size
    dtype: Literal["bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2"] = "bfloat16"
    kv_layout: Literal["NHD", "HND"] = "NHD"
    combined: bool = False
    spare_pages: Annotated[int, msgspec.Meta(ge=0, le=1 << 16)] = 2
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0
    append_dtype: Optional[Literal["bfloat16", "float16", "float32"]] = None
    k_scale: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    v_scale: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    padding: Annotated[int, msgspec.Meta(ge=0, le=1 << 16)] = 0


class SavedWrite(msgspec.Struct, forbid_unknown_fields=True):
    """A ``writes.json`` that ``writes`` saved: the case, the kernel, what it did and the finding record (``meta``,
    read by ``pa_oracle.fuzz.campaign.finding_record.read_meta``)."""

    case: WriteCase
    kernel: Optional[str] = None
    status: Optional[str] = None
    detail: Optional[str] = None
    meta: Optional[dict[str, Any]] = None



def write_finding_path(source: Path) -> Path | None:
    """A write finding's ``writes.json`` (``source`` itself, or the one in the folder ``source``, when no other case
    file is beside it: a folder of several is a corpus), else None."""
    from pa_oracle.fuzz.campaign.findings import WRITE_FINDING

    source = Path(source)
    if source.is_dir():
        found = source / WRITE_FINDING
        return found if found.is_file() and [p.name for p in source.glob("*.json")] == [WRITE_FINDING] else None
    return source if source.name == WRITE_FINDING else None


def holds_write_case(path: Path) -> bool:
    """Whether the case file ``path`` is a saved write case rather than an attention case: named ``writes.json``, or
    a JSON object of a write case (its ``case``, or its own fields) with no attention case's ``schema_version``.
    Only told apart here: either kind is read strictly by its own reader."""
    from pa_oracle.fuzz.campaign.findings import WRITE_FINDING

    if Path(path).name == WRITE_FINDING:
        return True
    try:
        data = json.loads(Path(path).read_bytes())
    except (OSError, ValueError, RecursionError):
        return False  # (the attention reader says what is wrong with it)
    if not isinstance(data, dict) or "schema_version" in data:
        return False
    case = data.get("case", data)
    return isinstance(case, dict) and "append_lens" in case


def read_write_case(path: Path) -> AppendCase:
    """The write case in ``path`` (``read_saved_write``)."""
    return read_saved_write(path)[0]


def read_saved_write(path: Path) -> tuple[AppendCase, FindingMeta | None]:
    """The write case in ``path`` (a saved ``writes.json``, or the case object alone) and its finding record (None:
    none saved), read once and strictly: no float or bool for an int, no unknown field, bounded sizes, and a pool of
    at most ``MAX_POOL_BYTES``; anything else is a ``CaseError`` (or ``FindingError``, exit 2) naming the file and
    the field, before a tensor is allocated."""
    from pa_oracle.fuzz.campaign.finding_record import read_meta
    from pa_oracle.oracle.case import CaseError, read_json
    from pa_oracle.oracle.schema import convert

    data = read_json(path, CaseError)
    if not isinstance(data, dict):
        raise CaseError(f"{path}: expected a JSON object (a write case), got {type(data).__name__} {json.dumps(data)[:60]}")
    meta = None
    if "case" in data:
        saved = convert(data, SavedWrite, where=str(path), error=CaseError)
        if saved.meta is not None:
            meta = read_meta(saved.meta, path)  # the finding record, strictly (a FindingError names the file and field)
        fields = msgspec.structs.asdict(saved.case)
    else:
        fields = msgspec.structs.asdict(convert(data, WriteCase, where=str(path), error=CaseError))
    try:
        case = AppendCase.from_json(fields)
    except CaseError as exc:
        raise CaseError(f"{path}: {exc}") from None
    element = 4 if case.dtype == "float32" else 2
    pool_bytes = 2 * case.num_pages * case.page_size * case.num_kv_heads * case.head_dim * element
    if pool_bytes > MAX_POOL_BYTES:
        raise CaseError(f"{path}: case: its K/V pool would take {pool_bytes / 2**30:.3g} GiB ({case.num_pages} pages x "
                        f"page_size {case.page_size} x num_kv_heads {case.num_kv_heads} x head_dim {case.head_dim} x "
                        f"{case.dtype}), more than the {MAX_POOL_BYTES >> 30} GiB a write case may use")
    return case, meta
