from __future__ import annotations

from hypothesis import given, settings
from pa_oracle.backends.flashinfer import _FLASHINFER
from pa_oracle.backends.flashinfer_cascade import split_layouts
from pa_oracle.fuzz.draw.strategies import cases
from pa_oracle.oracle.case import Case


@settings(max_examples=60)
@given(case=cases(_FLASHINFER.replace(devices=("cpu",), window_left=False, alibi=False)))
def test_cascade_split_covers_each_request_once_before_its_queries(case: Case) -> None:
    prefix, suffix = split_layouts(case)
    lay = case.layout
    for b in range(lay.batch_size):
        assert prefix.kv_lens[b] + suffix.kv_lens[b] == lay.kv_lens[b]
        assert prefix.pages_of(b) + suffix.pages_of(b) == lay.pages_of(b)
        assert prefix.kv_lens[b] % lay.page_size == 0
        assert prefix.kv_lens[b] <= max(lay.kv_lens[b] - lay.qo_lens[b], 0)
