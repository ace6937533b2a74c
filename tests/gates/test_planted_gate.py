"""The planted bug the GSM8k gate must catch: correct except for the last key of long requests."""

import torch
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.quality.planted import DropsLastKeyOfLongRequests
from pa_oracle.gates.swap import resolve_backend
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.reference import reference
from pa_oracle.oracle.tensors import Tensors, make_tensors


class DropsPast40(DropsLastKeyOfLongRequests):
    min_kv_len = 40


def _case(qo_lens: list[int], kv_lens: list[int]) -> Case:
    return Case(Layout.from_lengths(qo_lens, kv_lens, 16), Heads(6, 2, 16, 16), Options(causal=True))


def test_only_the_last_query_of_a_long_request_changes():
    # request 0 is short (32 keys), request 1 long (57 > 40) with a 3-token prefill, request 2 a long decode
    case = _case([4, 3, 1], [32, 57, 45])
    tensors = make_tensors(case)
    planted, correct = DropsPast40(), get_backend("sdpa-math")
    out = planted.run(planted.plan(case), tensors).out
    expected = correct.run(correct.plan(case), tensors).out
    changed = (out - expected).abs().amax(dim=(1, 2)) > 0
    assert changed.tolist() == [False] * 4 + [False, False, True] + [True]  # rows: 4 + 3 + 1
    # what it computes on a changed row is attention without that key: the oracle on kv_len - 1 keys
    # with the query moved to the end, i.e. the same query over keys 0..kv_len-2, non-causal
    for row, (b, kv_len) in ((6, (1, 57)), (7, (2, 45))):
        pages = case.layout.pages_of(b)
        short = Case(Layout.from_lengths([1], [kv_len - 1], 16), case.heads, Options(causal=False))
        k = tensors.k_cache[list(pages)].flatten(0, 1)[: kv_len - 1]
        v = tensors.v_cache[list(pages)].flatten(0, 1)[: kv_len - 1]
        pad = (-len(k)) % 16
        k_pages = torch.cat([k, k.new_zeros(pad, *k.shape[1:])]).view(-1, 16, *k.shape[1:])
        v_pages = torch.cat([v, v.new_zeros(pad, *v.shape[1:])]).view(-1, 16, *v.shape[1:])
        ref = reference(short, Tensors(tensors.q[row : row + 1], k_pages, v_pages)).out[0]
        torch.testing.assert_close(out[row].double(), ref, atol=1e-5, rtol=1e-5)


def test_short_requests_are_untouched_and_the_bug_resolves_by_name():
    case = _case([5, 1], [40, 12])  # 40 keys: not above the threshold
    tensors = make_tensors(case)
    planted, correct = DropsPast40(), get_backend("sdpa-math")
    assert torch.equal(planted.run(case, tensors).out, correct.run(case, tensors).out)
    backend = resolve_backend("pa_oracle.fuzz.quality.planted:drops_last_key_past_1024")
    assert isinstance(backend, DropsLastKeyOfLongRequests) and backend.min_kv_len == 1024
    assert backend.unsupported_reason(case) in (None, "")
