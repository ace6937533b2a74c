"""The memory layout of a drawn case (``oracle.case.Storage``), within what the kernel declares.

Verification model: ``storage(case, caps)`` gives ``case`` a storage built only from the features
``caps.storages`` names (``oracle.case.ALL_STORAGE_FEATURES``) that apply to it (no combined K/V when the
head dims differ; MLA keeps its latent layout: no combined K/V, no HND). It is drawn only for a kernel
that declares a feature besides "contiguous" (``wants_storage``), so every other kernel's choice
sequence, and so its cases, are what they were; the strided pools (``STRIDE_STORAGES``: padded pages,
a layer of a cross-layer pool, a head-dim stride) are drawn only for a kernel that names them, after
every other feature's draw. With "contiguous" declared the default storage stays possible (and is what
shrinking goes to); without it, every case has one.

EXTENDING: a new storage feature is one more field of ``Storage``, a name in ``ALL_STORAGE_FEATURES``,
one labelled ``draw`` here and its place in ``oracle.tensors.pool_layout``.
"""

from __future__ import annotations

from hypothesis import strategies as st
from pa_oracle.backends.base import Capabilities
from pa_oracle.fuzz.draw import built
from pa_oracle.oracle.case import POOL_OFFSET_MULTIPLE, STRIDE_STORAGES, Case, Storage

# elements before the caches in their pool: 64, 448, 4096. Written as multiples of numbers the package
# already holds: Hypothesis draws integers near the literals of every local module it has loaded
# (``hypothesis.internal.constants_ast``), so a new literal would change every kernel's draws.
POOL_OFFSETS = tuple(POOL_OFFSET_MULTIPLE * k for k in (1, 7, POOL_OFFSET_MULTIPLE))
PAGE_PADDINGS = POOL_OFFSETS[:2]  # poison elements after each page: 64, 448
LAYER_COUNTS = (2, 3)  # layers of a cross-layer pool (each one allocated: kept small)
DIM_STRIDE = 2  # the head dim interleaved with as many poison elements (a last dim of 2 * D, every other one read)
MLA_FEATURES = ("fused_qkv", "pool_offset", "padded_pages", "cross_layer", "dim_stride")  # the latent layout stays


def wants_storage(caps: Capabilities) -> bool:
    """True if ``caps`` declares a storage besides the default (only then is one drawn)."""
    return any(name != "contiguous" for name in caps.storages)


def applicable(case: Case, caps: Capabilities) -> list[str]:
    """The declared storage features ``case`` can have."""
    features = [name for name in caps.storages if name != "contiguous"]
    if case.heads.mla:
        features = [name for name in features if name in MLA_FEATURES]
    if case.heads.head_dim_qk != case.heads.head_dim_vo:
        features = [name for name in features if name != "combined"]
    return features


@st.composite
def storage(draw: st.DrawFn, case: Case, caps: Capabilities) -> Case:
    """``case`` with a storage drawn from ``caps.storages`` (module docstring)."""
    features = applicable(case, caps)
    if not features or ("contiguous" in caps.storages and not draw(built.booleans(), label="storage")):
        return case
    chosen = {name: draw(built.booleans(), label=name) for name in features}
    if not any(chosen.values()):  # the default storage is not declared: one feature at least
        chosen[draw(built.sampled_from(features), label="storage feature")] = True
    offset = draw(built.sampled_from(POOL_OFFSETS), label="pool_offset") if chosen.get("pool_offset") else 0
    return case.replace(storage=Storage(
        kv="combined" if chosen.get("combined") else "separate",
        kv_layout="HND" if chosen.get("HND") else "NHD",
        q="fused_qkv" if chosen.get("fused_qkv") else "contiguous",
        pool_offset=offset,
        # drawn only when one is chosen: no new draw (nor span) for a kernel that declares none
        **(draw(strides(chosen), label="strides") if any(chosen.get(name) for name in STRIDE_STORAGES) else {}),
    ))


@st.composite
def strides(draw: st.DrawFn, chosen: dict[str, bool]) -> dict[str, int]:
    """The ``Storage`` fields of the chosen strided features (none drawn for a kernel that declares none)."""
    fields: dict[str, int] = {}
    if chosen.get("padded_pages"):
        fields["page_padding"] = draw(built.sampled_from(PAGE_PADDINGS), label="page_padding")
    if chosen.get("cross_layer"):
        layers = draw(built.sampled_from(LAYER_COUNTS), label="layers")
        fields.update(layers=layers, layer=draw(built.integers(0, layers - 1), label="layer"))
    if chosen.get("dim_stride"):
        fields["dim_stride"] = DIM_STRIDE
    return fields
