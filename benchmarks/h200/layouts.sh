#!/usr/bin/env bash
# Issue 15, attention memory layouts on the H200 (helper "layouts"). Under 4 minutes.
# LAYOUTS_BACKENDS (matrix) and LAYOUTS_FUZZ (campaign) name other backends; a storage a backend does not
# declare is left out of its matrix rows.
#  1. matrix: every non-default Storage (15) x flashinfer-decode, flashinfer-decode-tc, flashinfer-prefill-fa2,
#     flash-attn-kvcache-paged, sdpa-efficient on one fixed case each (fp16, head_dim 128, GQA 2), judged
#     by check_case (oracle + tolerance + input fingerprints over the whole pool / QKV buffer).
#  2. campaign: pa-oracle fuzz on the four backends, every case in a non-default storage
#     (--only storages=combined,HND,fused_qkv,pool_offset), 150 examples, 150 s budget.
# Success: matrix.txt ends "MATRIX OK" (every row "pass"); summary.txt shows each backend with examples > 0,
# storages combined/HND/fused_qkv/pool_offset all covered, a worst ratio, and "findings: none" (a finding is
# a real result to triage: its case is in findings.tar.gz).
set -u
LOG="$OUT/layouts"; mkdir -p "$LOG"
CAMPAIGN=/tmp/layouts-campaign; rm -rf "$CAMPAIGN"
python - > "$LOG/matrix.txt" 2>&1 <<'PY'
import itertools, time
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case, Heads, Layout, Options, Storage
storages = [Storage(*s) for s in itertools.product(("separate", "combined"), ("NHD", "HND"), ("contiguous", "fused_qkv"), (0, 448))][1:]
bad = 0
import os
names = os.environ.get("LAYOUTS_BACKENDS", "flashinfer-decode flashinfer-decode-tc flashinfer-prefill-fa2 flash-attn-kvcache-paged sdpa-efficient").split()
for name in names:
    backend = get_backend(name)
    why = backend.unavailable_reason()
    if why:
        print(f"{name}: unavailable ({why})"); bad += 1; continue
    page = 256 if name.startswith("flash-attn") else 16
    kv = [300, 41, 1]
    pages = sum(-(-n // page) for n in kv) + 2
    qo = [1, 1, 1] if "decode" in name or name.startswith("flash-attn-kvcache") else [3, 41, 1]
    layout = Layout.from_lengths(qo, kv, page, page_order=list(reversed(range(pages))), extra_pages=2)
    for storage in storages:
        if not set(storage.features) <= set(backend.capabilities.storages):
            continue
        case = Case(layout, Heads(8, 4, 128, 128), Options(q_dtype="bfloat16", kv_dtype="bfloat16", causal=qo[1] > 1), seed=3, storage=storage)
        t = time.time()
        outcome = check_case(backend, case)
        bad += outcome.status != "pass"
        print(f"{name:26s} {storage.label():40s} {outcome.status:11s} {time.time() - t:6.2f}s {outcome.message.splitlines()[0][:160]}", flush=True)
print("MATRIX OK" if bad == 0 else f"MATRIX: {bad} not passing")
PY
echo "matrix done: $(tail -1 "$LOG/matrix.txt")"
timeout $(( ${LAYOUTS_SECONDS:-120} + 50 )) python -m pa_oracle fuzz $(for b in ${LAYOUTS_FUZZ:-flashinfer-decode flashinfer-prefill-fa2 flash-attn-kvcache-paged sdpa-efficient}; do echo -b $b; done) \
  --only storages=${LAYOUTS_STORAGES:-combined,HND,fused_qkv,pool_offset} --only head_dims=64,128 -n 150 --time-budget ${LAYOUTS_SECONDS:-120} --compile-budget 20 \
  --out "$CAMPAIGN" --json > /tmp/layouts-fuzz.json 2> "$LOG/fuzz.log"
echo "fuzz exit code $?" >> "$LOG/fuzz.log"
cp "$CAMPAIGN/summary.json" "$LOG/summary.json" 2>/dev/null
python - > "$LOG/summary.txt" 2>&1 <<'PY'
import json, pathlib
path = pathlib.Path("/tmp/layouts-campaign/summary.json")
if not path.exists():
    print("no summary.json: the campaign did not finish (see fuzz.log)"); raise SystemExit
for r in json.loads(path.read_text()):
    counts = r["coverage"]["counts"].get("storage", {})
    features = {f: sum(n for label, n in counts.items() if f in label.split("+")) for f in ("combined", "HND", "fused_qkv", "pool_offset", "contiguous")}
    print(f"{r['backend']}: status {r['status']}, examples {r['examples']}, passed {r['passed']}, unsupported {r['unsupported']}, "
          f"worst ratio {r['worst_ratio']:.3f}, {r['seconds']} s")
    print(f"  storages covered (cases): {features}; missing: {r['coverage']['missing'].get('storage', [])}")
    print("  findings: " + ("; ".join(f"{f['message'][:200]} [{f.get('case', '')}]" for f in r["findings"]) or "none"))
    for note in r["notes"]:
        print(f"  note: {note[:200]}")
PY
cat "$LOG/summary.txt"
find "$CAMPAIGN" -name case.json -o -name tensors.npz -o -name report.md | head -30 | tar czf "$LOG/findings.tar.gz" -T - 2>/dev/null
tail -5 "$LOG/fuzz.log"
