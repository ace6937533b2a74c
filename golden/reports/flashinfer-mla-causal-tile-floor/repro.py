#!/usr/bin/env python3
"""FlashInfer MLA (fa2 and fa3), causal: a row loses its diagonal key when num_heads does not divide
the tile's packed row count.

Standalone reproducer: needs only torch and flashinfer (CUDA). Exit 1: the problem reproduces; 0: it
does not (fixed?); 2: the kernel could not be run for another reason.
Written for paged-attention-oracle's golden case flashinfer-mla-causal-tile-last-key.

For each case it prints the kernel's max error against a float64 reference, and against the same
reference with the one key the kernel's floor bound leaves out (predicted from mla.cuh) dropped for
the predicted rows: the second is at bf16 rounding level when the cause is that bound.
"""
import math
import sys
import traceback

import torch

CASES = [  # (qo_len, kv_len, num_heads): one request, causal, page 64, 512 + 64 dims, bf16
    (43, 65, 3),    # tile 0 = packed rows 0..127; token 42 = rows 126..128; floor(128/3) = 42 -> keys < 22 + 42 = 64
    (64, 118, 12),  # the case the fuzzer found: token 10 = rows 120..131; floor(128/12) = 10 -> keys < 54 + 10 = 64
]
D_CKV, D_KPE, PAGE = 512, 64, 64


def lost_rows(qo, kv, h):
    """(token, head) rows the kernel's bound kv_len - qo_len + (start + tile) / h (floor) leaves without their
    last key: the plan uses ceil_div, the kernel floor, and loads whole 64-key tiles."""
    tile = 128 if qo * h > 64 else 64  # MLAPlan: cluster_size 2 when the mean packed qo length > 64
    rows = []
    for start in range(0, qo * h - tile, tile):
        end = start + tile
        bound = kv - qo + end // h
        if end % h and 0 <= bound < kv and bound % 64 == 0:
            rows += [(end // h, head) for head in range(h) if (end // h) * h + head < end]
    return rows


def reference(q, latent, qo, kv, h, drop=()):
    """float64 causal attention (bottom-right: query i sits at kv - qo + i); V = the first 512 latent dims."""
    q, k = q.double().cpu(), latent.double().cpu()
    s = torch.einsum("qhd,kd->qhk", q, k) / math.sqrt(D_CKV + D_KPE)
    keep = torch.arange(kv)[None, None, :] <= (torch.arange(qo) + kv - qo)[:, None, None]
    keep = keep.expand(qo, h, kv).clone()
    for token, head in drop:
        keep[token, head, kv - qo + token] = False
    s = s.masked_fill(~keep, -math.inf)
    return torch.einsum("qhk,kd->qhd", torch.softmax(s, -1), k[:, :D_CKV])


def run(backend, qo, kv, h):
    import flashinfer

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(qo, h, D_CKV + D_KPE, generator=gen, dtype=torch.float64).to(torch.bfloat16)
    latent = torch.randn(kv, D_CKV + D_KPE, generator=gen, dtype=torch.float64).to(torch.bfloat16)
    pages = -(-kv // PAGE)
    pool = torch.zeros(pages * PAGE, D_CKV + D_KPE, dtype=torch.bfloat16)
    pool[:kv] = latent
    pool = pool.view(pages, PAGE, D_CKV + D_KPE).cuda()
    index = lambda xs: torch.tensor(xs, dtype=torch.int32, device="cuda")  # noqa: E731
    wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), backend=backend)
    wrapper.plan(index([0, qo]), index([0, pages]), index(list(range(pages))), index([kv]), h, D_CKV, D_KPE, PAGE,
                 True, 1 / math.sqrt(D_CKV + D_KPE), torch.bfloat16, torch.bfloat16)
    qc = q.cuda()
    out = wrapper.run(qc[..., :D_CKV], qc[..., D_CKV:], pool[..., :D_CKV], pool[..., D_CKV:]).double().cpu()
    full = (out - reference(q, latent, qo, kv, h)).abs()
    dropped = (out - reference(q, latent, qo, kv, h, lost_rows(qo, kv, h))).abs()
    worst = [int(i) for i in (full == full.max()).nonzero()[0]]
    return full.max().item(), dropped.max().item(), worst


def main():
    import flashinfer

    print(f"flashinfer {flashinfer.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    backends = ["fa2"] + (["fa3"] if torch.cuda.get_device_capability()[0] == 9 else [])
    reproduced = False
    for qo, kv, h in CASES:
        print(f"qo_len {qo}, kv_len {kv}, {h} heads: predicted rows without their last key (token, head): {lost_rows(qo, kv, h)}")
        for backend in backends:
            try:
                err, err_dropped, worst = run(backend, qo, kv, h)
            except Exception:
                traceback.print_exc()
                return 2
            bad = err > 0.05 and err_dropped < 0.02  # bf16 output of softmax-weighted N(0,1) values: ~0.01
            reproduced |= bad
            print(f"  {backend}: max |out - ref| {err:.4f} at (token, head, dim) {tuple(worst)}; "
                  f"against the reference without that key: {err_dropped:.4f} -> {'REPRODUCED' if bad else 'ok'}")
    return 1 if reproduced else 0


if __name__ == "__main__":
    sys.exit(main())
