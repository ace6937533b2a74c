#!/usr/bin/env bash
# GPU check of the one pipeline (helper "pipeline"): isolated workers on CUDA return outcomes
# whose tensors (verdict, the kernel's raw output, a check's derived cases) are on the CPU, the
# isolated campaign keeps its tolerance, and `pa-oracle metamorphic` runs isolated through the
# campaign engine (resume, one worker per backend for all its checks). Logs in $OUT/pipeline/.
# Success: the last line is "PIPELINE OK" and the script exits 0.
set -u
LOG="$OUT/pipeline"; mkdir -p "$LOG"
W=$(mktemp -d)
fail() { echo "PIPELINE FAIL: $*" | tee -a "$LOG/summary.txt"; exit 1; }

cat > "$W/worker_check.py" <<'PY'
import torch
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.checks.registry import CHECKS
from pa_oracle.fuzz.run.isolation import IsolatedBackend
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.tolerance import Tolerance


def main() -> None:

    assert torch.cuda.is_available()
    case = Case(Layout.from_lengths([1, 3], [70, 40], 16, extra_pages=2), Heads(8, 2, 128, 128), Options(q_dtype="bfloat16", kv_dtype="bfloat16"))
    spec = "pa_oracle.fuzz.quality.planted:wrong_gqa_map"
    bug = UserKernel.from_spec(spec)
    bug.capabilities = bug.capabilities.replace(devices=("cuda",))
    print("bug device", bug.device)
    for tol, want in ((Tolerance(), "fail"), (Tolerance(max_ratio=1e12, mean_ratio=1e12, floor_factor=1e12), None)):
        w = IsolatedBackend(bug, spec, timeout=120, tolerance=tol)
        try:
            o = w.check(case)
        finally:
            w.close()
        print("tolerance", tol, "->", o.status, o.message.splitlines()[0][:120])
        if want:
            assert o.status == want, o.message
            assert o.output is not None and o.output.out.device.type == "cpu", "raw output kept, on the CPU"
            assert o.verdict.error.device.type == "cpu" and o.verdict.lse_error is None or o.verdict.lse_error.device.type == "cpu"
    name = next((n for n in ("flashinfer-decode", "sdpa-flash", "sdpa-math") if get_backend(n).unavailable_reason() is None))
    backend = get_backend(name)
    w = IsolatedBackend(backend, name, timeout=300)
    try:
        o = w.check(case, judge=CHECKS["relabel"])
        print(name, "relabel ->", o.status, o.message[:120], [(l, t is None or t.q.device.type) for l, _, t in o.cases])
        assert o.check == "relabel" and o.status in ("pass", "unsupported"), o.message
        assert all(t is None or t.q.device.type == "cpu" for _, _, t in o.cases)
        o = w.check(case)  # the same worker judges the oracle comparison next
        print(name, "oracle ->", o.status, w.starts, "worker start(s)")
        assert o.status in ("pass", "unsupported") and w.starts == 1
    finally:
        w.close()
    print("worker outcomes ok")


if __name__ == "__main__":  # the workers are spawned: they import this file
    main()
PY
timeout 150 python "$W/worker_check.py" >"$LOG/worker.txt" 2>&1 || fail "worker outcomes (see worker.txt)"

B=flashinfer-decode
python -c "from pa_oracle.backends import get_backend as g; import sys; sys.exit(g('$B').unavailable_reason() is not None)" || B=sdpa-flash
echo "backend for the campaigns: $B" | tee "$LOG/summary.txt"
timeout 100 pa-oracle metamorphic -b "$B" -c relabel -c reorder -c cuda-graph -n 6 --out "$W/m" --json >"$LOG/metamorphic.json" 2>"$LOG/metamorphic.err"
rc=$?; echo "metamorphic exit $rc" | tee -a "$LOG/summary.txt"
[ "$rc" = 0 ] || fail "metamorphic exit $rc (0 expected: a correct kernel; see metamorphic.err)"
grep -q "checking $B relabel" "$LOG/metamorphic.err" || fail "no progress line"
timeout 80 pa-oracle metamorphic -b "$B" -c relabel -c reorder -c cuda-graph -n 9 --resume --out "$W/m" --json >"$LOG/resumed.json" 2>>"$LOG/metamorphic.err"
rc=$?; echo "metamorphic --resume exit $rc" | tee -a "$LOG/summary.txt"
[ "$rc" = 0 ] || fail "metamorphic --resume exit $rc"
python - "$LOG/resumed.json" <<'PY' | tee -a "$LOG/summary.txt" || fail "resumed summary"
import json, sys
rows = json.load(open(sys.argv[1]))
for r in rows:
    print(r["check"], r["examples"], "examples", r["held"], "held", r["bit_exact"], "bit-exact", r["not_applicable"] or "")
    assert r["not_applicable"] or r["examples"] == 9, r
PY
timeout 60 pa-oracle fuzz -b "$B" -n 25 --out "$W/f" --json >"$LOG/fuzz.json" 2>>"$LOG/metamorphic.err"
rc=$?; echo "fuzz exit $rc" | tee -a "$LOG/summary.txt"
[ "$rc" = 0 ] || [ "$rc" = 1 ] || fail "fuzz exit $rc"
echo "PIPELINE OK" | tee -a "$LOG/summary.txt"
