"""The same seed draws the same cases: in any process, whatever else it imported, and for every kernel
that does not declare a newer case dimension (RoPE, a memory layout), the cases it drew before that
dimension existed.

Hypothesis also draws integers near the literals of every local module loaded, so without
``pa_oracle.fuzz.draw.determinism.seed_only_draws`` a new literal anywhere, an editable install or a
user's own module moved every kernel's draws. The ids below were drawn (``seed_only_draws``, seed
1234, 30 examples) on main at b758f9d, before Storage and Rope; kernels that declare a storage are
narrowed to the default one.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from collections.abc import Callable

from hypothesis import HealthCheck, Phase, given, seed, settings
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.draw.determinism import seed_only_draws
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.oracle.case import Case

PINNED = {
    "sdpa-math": ["7caec8101447", "271cd287ec80", "987772bc318c", "b5ffdce70ae0", "f4ef5554827e", "26dd467c228b", "1538508fd952", "1d8eee9ffc5f"],
    "flashinfer-decode": ["01a42bdc44ba", "432240ab77b4", "dae3af809e64", "ba3131df9f5c", "3244b03c1662", "d5ded7d3fa0d", "4fa59f46e7e3", "e6494bfd2c29"],
    "flashinfer-prefill-fa2": ["01a42bdc44ba", "432240ab77b4", "dae3af809e64", "3eccfcb876e7", "149c3e27a1df", "709f7456ed4d", "79c6136babe5", "95cfce232148"],
    "flash-attn-kvcache-paged": ["998711708009", "cfc41d1e8e44", "62da885fb35e", "a97e86f720df", "343cb009caa2", "fda4528e3217", "9f6db82c6464", "17315856408c"],
    "flashinfer-decode-hnd": ["01a42bdc44ba", "432240ab77b4", "dae3af809e64", "ba3131df9f5c", "3244b03c1662", "d5ded7d3fa0d", "4fa59f46e7e3", "e6494bfd2c29"],
    "sdpa-efficient": ["7caec8101447", "271cd287ec80", "987772bc318c", "b5ffdce70ae0", "f4ef5554827e", "26dd467c228b", "1538508fd952", "1d8eee9ffc5f"],
    "flex": ["7caec8101447", "271cd287ec80", "1f612e2a43f8", "36904b0815ea", "458404765318", "1b929eeb67ae", "0c858d28e5d8", "573147d02dab"],
}
ENGINE = ["7caec8101447", "0aea747ce2a0", "395a4e6c3fb7", "a29b7c22fe1a", "df463e92f855", "8b585ff02db0", "fc339c794590",
          "918566bb8791", "186f2534a7a1", "f465c10d64a6", "8d1a7a854d69", "9a5232831638"]  # fuzz -b sdpa-math --seed 0


def _drawn(name: str, count: int = 8, show: Callable[[Case], str] = lambda case: case.case_id, narrow: bool = True) -> list[str]:
    caps = get_backend(name).capabilities
    if narrow and "storages" in {f.name for f in dataclasses.fields(caps)}:
        caps = caps.replace(storages=("contiguous",))
    ids: list[str] = []

    @seed(1234)
    @settings(max_examples=30, database=None, deadline=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(cases(caps, Limits()))
    def take(case):  # type: ignore[no-untyped-def]
        ids.append(show(case))

    with seed_only_draws():
        take()
    return ids[:count]


def test_kernels_without_the_newer_dimensions_draw_the_cases_they_drew_before() -> None:
    assert {name: _drawn(name) for name in PINNED} == PINNED


def test_a_campaign_draws_the_same_cases_whatever_else_the_process_imported(tmp_path, monkeypatch) -> None:
    assert fuzz_backend(get_backend("sdpa-math"), CampaignConfig(examples=12, seed=0, isolate=False)).seen == ENGINE
    # a local module full of integer literals (as a user's kernel module would be): Hypothesis would draw near them
    (tmp_path / "literals_of_a_user.py").write_text(textwrap.dedent(f"""
        SIZES = {list(range(3, 300, 7))}
        PAGES = {[17, 33, 65, 129, 257, 1023, 4095]}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import literals_of_a_user  # noqa: F401

    assert "literals_of_a_user" in sys.modules
    assert fuzz_backend(get_backend("sdpa-math"), CampaignConfig(examples=12, seed=0, isolate=False)).seen == ENGINE
    assert _drawn("flashinfer-decode") == PINNED["flashinfer-decode"]


def test_strategies_built_once_draw_what_strategies_built_per_draw_drew(monkeypatch) -> None:
    """``pa_oracle.fuzz.draw.built`` reuses one strategy object per set of arguments (Hypothesis validates each new
    object on its first draw); the cases are those of objects built anew at every draw, for every part of a case."""
    from hypothesis import strategies as st
    from pa_oracle.fuzz.draw import built

    assert built.sampled_from([1, 2]) is built.sampled_from((1, 2))
    assert built.permutations(range(5)) is built.permutations([0, 1, 2, 3, 4])
    equal_values = [(False, True), (0, 1), (0.0, 1.0), (-0.0, 1.0)]  # equal tuples, four strategies
    assert len({id(built.sampled_from(values)) for values in equal_values}) == len(equal_values)
    assert built.integers(0, 1) is not built.integers(False, True)
    names = ["sdpa-math", "flashinfer-decode", "flashinfer-prefill-packed-mask", "flashinfer-mla", "flashinfer-decode-rope",
             "flashinfer-sinks", "flashinfer-pod"]
    def drawn() -> dict[str, list[str]]:  # repr: an id does not tell False from 0; decode's storages too
        return {**{name: _drawn(name, 30, repr) for name in names}, "storages": _drawn("flashinfer-decode", 30, repr, narrow=False)}

    reused = drawn()
    for name in ("booleans", "integers", "one_of"):
        monkeypatch.setattr(built, name, getattr(st, name))
    monkeypatch.setattr(built, "_lists", st.lists)
    monkeypatch.setattr(built, "_of_values", lambda make, values: make(tuple(values)))
    assert drawn() == reused
    assert len({i for ids in reused.values() for i in ids}) > 60  # the draws are varied, not one case again
