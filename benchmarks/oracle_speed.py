"""Oracle speed, printed as ratios measured in one run (a benchmark, not a timed test).

    python benchmarks/oracle_speed.py            # fuzz-sized batch: oracle vs a per-sequence loop
    python benchmarks/oracle_speed.py --serving  # the mixed serving batch (CUDA): oracle vs the loop
                                                 # and vs FlashInfer decode(tensor cores) + prefill
    python benchmarks/oracle_speed.py --serving --device cpu --repeat 1  # the same batch on the CPU
                                                                         # (minutes), without FlashInfer
    python benchmarks/oracle_speed.py --tiling   # one causal request per shape: tiled vs whole
    python benchmarks/oracle_speed.py --serving --profile  # torch.profiler tables of one oracle call

Every mode prints the oracle's planning (host) time apart from its total.

The per-sequence loop is the style vLLM's ``ref_paged_attn`` and FlashInfer's tests use: one
dense float64 attention per request, in Python.
"""

from __future__ import annotations

import argparse
import random
import time
from unittest import mock

import pa_oracle.oracle.buckets as buckets
import torch
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.reference import reference
from pa_oracle.oracle.tensors import make_tensors, token_addresses


def per_sequence_loop(case: Case, tensors) -> torch.Tensor:  # type: ignore[no-untyped-def]
    lay, heads = case.layout, case.heads
    pages, slots = (t.to(tensors.q.device) for t in token_addresses(case))
    keys, values = tensors.k_cache[pages, slots].double(), tensors.v_cache[pages, slots].double()
    outs, start = [], 0
    for b in range(lay.batch_size):
        qo, kv = lay.qo_lens[b], lay.kv_lens[b]
        q = tensors.q[lay.qo_indptr[b] : lay.qo_indptr[b + 1]].double()
        k = keys[start : start + kv].repeat_interleave(heads.group_size, 1)
        v = values[start : start + kv].repeat_interleave(heads.group_size, 1)
        start += kv
        s = torch.einsum("qhd,khd->hqk", q, k) * case.sm_scale
        mask = torch.triu(torch.ones(qo, kv, dtype=torch.bool, device=q.device), diagonal=kv - qo + 1)
        s.masked_fill_(mask, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v))
    return torch.cat(outs)


def timed(fn, device: str, repeat: int = 3) -> float:  # type: ignore[no-untyped-def]
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def fuzz_sized_case() -> Case:
    rng = random.Random(0)
    kv = [rng.randint(1, 300) for _ in range(16)]
    qo = [rng.choice([1, 1, 4, rng.randint(1, k)]) for k in kv]
    return Case(Layout.from_lengths(qo, kv, 16), Heads(8, 2, 64, 64), Options(causal=True, q_dtype="bfloat16", kv_dtype="bfloat16"))


def serving_case() -> Case:
    rng = random.Random(0)
    kv = [rng.randint(512, 4096) for _ in range(48)] + [rng.randint(1024, 4096) for _ in range(16)]
    qo = [1] * 48 + [rng.randint(256, 512) for _ in range(16)]
    order = list(range(sum(-(-n // 16) for n in kv)))
    rng.shuffle(order)
    return Case(Layout.from_lengths(qo, kv, 16, page_order=order), Heads(32, 8, 128, 128), Options(causal=True, q_dtype="bfloat16", kv_dtype="bfloat16"))


def flashinfer_time(case: Case, tensors) -> float:  # type: ignore[no-untyped-def]
    from pa_oracle.backends.flashinfer import FlashInferDecodeTensorCores, FlashInferPrefillFA2

    lay = case.layout
    split = lambda keep: Layout.from_lengths(  # noqa: E731
        [q for q in lay.qo_lens if keep(q)], [k for q, k in zip(lay.qo_lens, lay.kv_lens) if keep(q)], lay.page_size
    )
    decode = case.replace(layout=split(lambda q: q == 1))
    prefill = case.replace(layout=split(lambda q: q > 1))
    dec, pre = FlashInferDecodeTensorCores(), FlashInferPrefillFA2()
    dec_plan, pre_plan = dec.plan(decode), pre.plan(prefill)
    dec_t, pre_t = make_tensors(decode, "cuda"), make_tensors(prefill, "cuda")
    return timed(lambda: (dec.run(dec_plan, dec_t), pre.run(pre_plan, pre_t)), "cuda", repeat=10)


def tiling_report(device: str, repeat: int) -> None:
    """Time one causal request per shape with the tiling rule forced on, then off."""
    heads = Heads(32, 8, 128, 128) if device == "cuda" else Heads(8, 2, 64, 64)
    tile = buckets._Q_TILE.get(device, buckets._Q_TILE["cpu"])
    print(f"tiles of {tile} rows, {heads.num_qo_heads}/{heads.num_kv_heads} heads, dim {heads.head_dim_qk}, {device}")
    for qo, kv in ((512, 4096), (1024, 4096), (1024, 2048), (2048, 2048), (4096, 4096)):
        case = Case(Layout.from_lengths([qo], [kv], 16), heads, Options(causal=True, q_dtype="bfloat16", kv_dtype="bfloat16"))
        tensors = make_tensors(case, device)
        times = {}
        for name, saving in (("tiled", float("-inf")), ("whole", float("inf"))):
            with mock.patch.dict(buckets._TILE_MIN_SAVING, {device: saving}):
                times[name] = timed(lambda: reference(case, tensors, engine="torch"), device, repeat)
        rule = bool(buckets.tiled(*(torch.tensor([n]).numpy() for n in (qo, kv)), device)[0])
        print(f"qo {qo:5} kv {kv:5}: tiled {times['tiled'] * 1e3:8.2f} ms  whole {times['whole'] * 1e3:8.2f} ms"
              f"  whole/tiled {times['whole'] / times['tiled']:.2f}  (the rule {'tiles' if rule else 'keeps it whole'})")


def profile_report(case: Case, tensors, device: str) -> None:  # type: ignore[no-untyped-def]
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    reference(case, tensors, engine="torch")
    if device == "cuda":
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        reference(case, tensors, engine="torch")
        if device == "cuda":
            torch.cuda.synchronize()
    table = prof.key_averages()
    if device == "cuda":
        print(table.table(sort_by="cuda_time_total", row_limit=20))
    print(table.table(sort_by="cpu_time_total", row_limit=20))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serving", action="store_true", help="the mixed serving batch (FlashInfer too on CUDA)")
    parser.add_argument("--tiling", action="store_true", help="causal requests: the oracle with tiles vs whole")
    parser.add_argument("--profile", action="store_true", help="torch.profiler tables of one oracle call")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs after a warm-up; the best counts")
    args = parser.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    if args.tiling:
        tiling_report(device, args.repeat)
        return
    case = serving_case() if args.serving else fuzz_sized_case()
    tensors = make_tensors(case, device)
    if args.profile:
        profile_report(case, tensors, device)
        return
    planning = timed(lambda: buckets.plan_buckets(case, torch.device(device)), "cpu", args.repeat)
    oracle = timed(lambda: reference(case, tensors, engine="torch"), device, args.repeat)
    loop = timed(lambda: per_sequence_loop(case, tensors), device, args.repeat)
    lay = case.layout
    print(f"case: {lay.batch_size} requests, {lay.total_q} queries, {sum(lay.kv_lens)} keys, {case.heads.num_qo_heads}/{case.heads.num_kv_heads} heads, dim {case.heads.head_dim_qk}, {device}")
    print(f"oracle (float64): {oracle * 1e3:.2f} ms, of which planning (host, {len(buckets.plan_buckets(case, torch.device(device)).buckets)} buckets): {planning * 1e3:.2f} ms")
    print(f"per-sequence loop (float64): {loop * 1e3:.2f} ms -> oracle is {loop / oracle:.1f}x faster")
    if args.serving and device == "cuda":
        kernel = flashinfer_time(case, tensors)
        print(f"FlashInfer decode(tc) + prefill(fa2): {kernel * 1e3:.3f} ms -> oracle / kernel = {oracle / kernel:.1f}x")


if __name__ == "__main__":
    main()
