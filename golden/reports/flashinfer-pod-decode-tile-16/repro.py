#!/usr/bin/env python3
"""FlashInfer BatchPODWithPagedKVCacheWrapper: with more than 16 query heads per KV head, the decode
side leaves part of every decode row's heads unwritten (out and LSE).

Standalone reproducer: needs only torch and flashinfer (CUDA). Exit 1: the problem reproduces, as
predicted below and nothing else is wrong; 0: every row is right (fixed?); 2: flashinfer or the
kernel could not be run; 3: something is wrong, but not as predicted.
Written for paged-attention-oracle's golden case flashinfer-pod-decode-heads-past-16.

The cause, as read in the source (0.6.18.post1 and 0.7.2.post1): plan() plans the decode batch with
the fa2 prefill scheduler, which picks cta_tile_q from the mean packed qo length (= group size for
qo_len-1 requests): 64 for a group of 17..64 (128 above, on sm80+), so a request's group_size packed
rows form one tile. batch_pod.cu launches the decode side with CTA_TILE_Q_D hard-coded to 16, so
that one tile computes packed rows 0..15 only: qo heads kv_head * group + 16 .. +group-1 are never
written. The rows then hold whatever the freshly allocated output held. To make that visible,
flashinfer.pod's torch.empty / torch.empty_like are wrapped during run() so that POD's outputs start
as NaN (a canary); the standalone paged prefill (fa2) runs on the same requests with out= and lse=
filled with NaN and must overwrite every row.
"""
import math
import sys
import traceback

import torch

PAGE, DIM = 16, 128
DEVICE = "cuda"
CASES = [  # (name, qo_lens, kv_lens, num_qo_heads, num_kv_heads); qo_len 1 = a decode request, POD's decode side
    ("found by the fuzzer (no keys at all)", [1, 2], [0, 0], 32, 1),
    ("the same with keys", [1, 2], [5, 7], 32, 1),
    ("two KV heads, two decode requests", [1, 1, 3], [9, 4, 20], 64, 2),
    ("control: group 16", [1, 2], [5, 7], 16, 1),
]


def unwritten_heads(num_qo_heads, num_kv_heads):
    """qo heads of each decode row that POD's decode side does not write (sm80+, head_dim 128): the plan's
    tile (FA2DetermineCtaTileQ of the group size: 16, 64 or 128) against the kernel's 16 rows per tile."""
    group = num_qo_heads // num_kv_heads
    plan_tile = 16 if group <= 16 else 64 if group <= 64 else 128
    written = 16 * math.ceil(group / plan_tile)  # tile t computes packed rows 16 t .. 16 t + 15
    return [kv * group + r for kv in range(num_kv_heads) for r in range(group) if r >= written]


class CanaryTorch:
    """flashinfer.pod's view of torch: empty / empty_like return tensors filled with NaN (POD's outputs)."""

    def __init__(self, real):
        self._real, self.made = real, []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _canary(self, x):
        if x.is_floating_point():
            x.fill_(float("nan"))
        self.made.append(x)
        return x

    def empty(self, *args, **kwargs):
        return self._canary(self._real.empty(*args, **kwargs))

    def empty_like(self, *args, **kwargs):
        return self._canary(self._real.empty_like(*args, **kwargs))


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def make_case(qo_lens, kv_lens, hq, hkv):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(sum(qo_lens), hq, DIM, generator=gen).to(torch.bfloat16)
    pages = [-(-kv // PAGE) for kv in kv_lens]
    total = max(sum(pages), 1)
    k = torch.randn(total, PAGE, hkv, DIM, generator=gen).to(torch.bfloat16)
    v = torch.randn(total, PAGE, hkv, DIM, generator=gen).to(torch.bfloat16)
    if sum(pages) == 0:  # no request has a key: the one page is NaN, as in the fuzzer's case (never read)
        k.fill_(float("nan"))
        v.fill_(float("nan"))
    return q, k, v, pages


def layout(requests, qo_lens, kv_lens, pages):
    """CSR layout of ``requests`` over the shared pool (each request keeps its own pages)."""
    starts = [sum(pages[:b]) for b in range(len(pages))]
    qo, kvp, idx, last = [0], [0], [], []
    for b in requests:
        qo.append(qo[-1] + qo_lens[b])
        kvp.append(kvp[-1] + pages[b])
        idx += list(range(starts[b], starts[b] + pages[b]))
        last.append(0 if kv_lens[b] == 0 else (kv_lens[b] - 1) % PAGE + 1)
    return [torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in (qo, kvp, idx, last)]


def reference(q, k, v, qo_lens, kv_lens, pages, hkv):
    """float64 non-causal attention; out 0 and LSE -inf for a row without keys. LSE in natural log."""
    hq, group = q.shape[1], q.shape[1] // hkv
    out, lse, row, page = [], [], 0, 0
    for qo, kv, n in zip(qo_lens, kv_lens, pages):
        qs = q[row:row + qo].double()
        keys = k[page:page + n].reshape(-1, hkv, DIM)[:kv].double().repeat_interleave(group, 1)
        vals = v[page:page + n].reshape(-1, hkv, DIM)[:kv].double().repeat_interleave(group, 1)
        if kv == 0:
            out.append(torch.zeros(qo, hq, DIM, dtype=torch.float64))
            lse.append(torch.full((qo, hq), -math.inf, dtype=torch.float64))
        else:
            s = torch.einsum("qhd,khd->qhk", qs, keys) / math.sqrt(DIM)
            out.append(torch.einsum("qhk,khd->qhd", torch.softmax(s, -1), vals))
            lse.append(torch.logsumexp(s, -1))
        row, page = row + qo, page + n
    return torch.cat(out), torch.cat(lse)


def wrong_rows(out, lse, ref_out, ref_lse, empty):
    """(row, head) pairs that are wrong: a row without keys must have out exactly 0 and an LSE that says "no key"
    (-inf, or below -1e4: 0.6.18's finite stand-in -5e4 (base 2) is another, known matter, so it is accepted
    here); a row with keys must be within bf16 rounding of the reference, out and LSE."""
    out, lse = out.double().cpu(), lse.double().cpu() * math.log(2)  # FlashInfer's LSE is base 2
    bad = set()
    for r in range(out.shape[0]):
        for h in range(out.shape[1]):
            if empty[r]:
                ok = bool((out[r, h] == 0).all()) and bool(lse[r, h] < -1e4)
            else:
                ok = (out[r, h] - ref_out[r, h]).abs().max().item() <= 0.03 and abs(lse[r, h] - ref_lse[r, h]) <= 0.01
            if not ok:  # NaN (the canary) compares false, so it is wrong
                bad.add((r, h))
    return bad


def run_case(qo_lens, kv_lens, hq, hkv):
    import flashinfer
    import flashinfer.pod

    q, k, v, pages = make_case(qo_lens, kv_lens, hq, hkv)
    ref_out, ref_lse = reference(q, k, v, qo_lens, kv_lens, pages, hkv)
    decode = [b for b, n in enumerate(qo_lens) if n == 1]
    prefill = [b for b in range(len(qo_lens)) if b not in decode]
    starts = [sum(qo_lens[:b]) for b in range(len(qo_lens))]
    rows = {side: [starts[b] + i for b in reqs for i in range(qo_lens[b])] for side, reqs in (("p", prefill), ("d", decode))}
    empty = [kv == 0 for kv, qo in zip(kv_lens, qo_lens) for _ in range(qo)]
    qc, kv = q.to(DEVICE), (k.to(DEVICE), v.to(DEVICE))
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=DEVICE)

    wrapper = flashinfer.BatchPODWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(*layout(prefill, qo_lens, kv_lens, pages), *layout(decode, qo_lens, kv_lens, pages), hq, hkv, DIM, PAGE,
                 q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    canary = CanaryTorch(torch)
    flashinfer.pod.torch = canary
    try:
        # ((out_p, out_d), (lse_p, lse_d)): what pod.py returns with return_lse (0.6.18.post1 pod.py:1354,
        # 0.7.2.post1 pod.py:1350); its docstring says ((out_p, lse_p), (out_d, lse_d))
        (out_p, out_d), (lse_p, lse_d) = wrapper.run(qc[rows["p"]], kv, qc[rows["d"]], kv, causal_p=False, return_lse=True)
    finally:
        flashinfer.pod.torch = torch
    sync()
    canaried = any(t is out_d for t in canary.made)
    out = torch.empty(q.shape, dtype=out_p.dtype, device=DEVICE)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=DEVICE)
    for side, o, s in (("p", out_p, lse_p), ("d", out_d, lse_d)):
        out[rows[side]], lse[rows[side]] = o, s
    pod_bad = wrong_rows(out, lse, ref_out, ref_lse, empty)
    decode_lse = lse[rows["d"]].cpu()

    # the standalone paged prefill (fa2) on the same requests, each side planned alone as POD plans it
    alone_bad = set()
    for side, reqs in (("p", prefill), ("d", decode)):
        alone = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        alone.plan(*layout(reqs, qo_lens, kv_lens, pages), hq, hkv, DIM, PAGE, causal=False,
                   q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        o = torch.full((len(rows[side]), hq, DIM), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        s = torch.full((len(rows[side]), hq), float("nan"), dtype=torch.float32, device=DEVICE)
        alone.run(qc[rows[side]], kv, out=o, lse=s, return_lse=True)
        sync()
        side_bad = wrong_rows(o, s, ref_out[rows[side]], ref_lse[rows[side]], [empty[r] for r in rows[side]])
        alone_bad |= {(rows[side][r], h) for r, h in side_bad}
    predicted = {(r, h) for r in rows["d"] for h in unwritten_heads(hq, hkv)}
    return pod_bad, alone_bad, predicted, canaried, decode_lse


def heads_of(pairs):
    """{row: "16..31, 48..63"}: the qo heads of each row, as runs."""
    by_row = {}
    for r, h in sorted(pairs):
        runs = by_row.setdefault(r, [])
        if runs and runs[-1][1] == h - 1:
            runs[-1][1] = h
        else:
            runs.append([h, h])
    return {r: ", ".join(f"{a}..{b}" if b > a else f"{a}" for a, b in runs) for r, runs in by_row.items()}


def main():
    try:
        import flashinfer
        import flashinfer.pod

        print(f"flashinfer {flashinfer.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
        flashinfer.BatchPODWithPagedKVCacheWrapper  # noqa: B018 - fail here (exit 2) if the wrapper is gone
    except Exception:  # noqa: BLE001 - no flashinfer, no CUDA
        traceback.print_exc()
        return 2
    seen = set()
    for name, qo_lens, kv_lens, hq, hkv in CASES:
        print(f"{name}: qo_lens {qo_lens}, kv_lens {kv_lens}, {hq}/{hkv} heads, page {PAGE}, dim {DIM}, bf16, not causal")
        try:
            pod_bad, alone_bad, predicted, canaried, decode_lse = run_case(qo_lens, kv_lens, hq, hkv)
        except Exception:  # noqa: BLE001 - the other cases still run
            traceback.print_exc()
            seen.add("could not run")
            continue
        # without the canary an unwritten row may happen to hold the right value (0 for a row without keys)
        as_predicted = pod_bad == predicted or (not canaried and pod_bad and pod_bad <= predicted)
        if as_predicted and predicted and not alone_bad:
            verdict = "REPRODUCED"
        elif not pod_bad and not alone_bad:
            verdict = "ok" if not predicted else "ok (not reproduced: fixed?)"
            if predicted and not canaried:
                verdict += "; the NaN canary did not reach POD's output, unwritten rows may have read as right"
        else:
            verdict = "WRONG, not as predicted"
        seen.add(verdict.split(" (")[0].split(";")[0])
        print(f"  predicted unwritten (row: qo heads): {heads_of(predicted) or 'none'}")
        print(f"  POD wrong (row: qo heads): {heads_of(pod_bad) or 'none'}; canary in POD's output: {canaried}")
        print(f"  standalone fa2 paged prefill wrong: {heads_of(alone_bad) or 'none'}")
        if any(kv == 0 for kv in kv_lens):
            print(f"  POD decode-row LSE (base 2) per head: {decode_lse[0].tolist()}")
        print(f"  -> {verdict}")
    for verdict, code in (("WRONG, not as predicted", 3), ("REPRODUCED", 1), ("could not run", 2)):
        if verdict in seen:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
