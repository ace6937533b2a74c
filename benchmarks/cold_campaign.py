"""The main fuzz job with fresh compile caches, and where its time goes (a benchmark).

    python benchmarks/cold_campaign.py --time-budget 240 -b flashinfer-decode -b sdpa-math ...
    python benchmarks/cold_campaign.py --time-budget 120 -b flex            # CPU

Points ``TRITON_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR`` and ``FLASHINFER_WORKSPACE_BASE`` (FlashInfer's
JIT cache) at empty temp folders, runs ``pa-oracle fuzz`` as a user would, and prints per backend the
cases judged and the split of its wall time: compiling (the campaign's own account: the first case of
each new variant, ahead-of-time builds), judging (the rest of its chunks) and starting (what is left:
process start, imports, worker starts, planning). Prebuilt FlashInfer kernels (its AOT folder) stay
visible: they are what a CI image ships. ``--warm`` keeps the caches of the previous run instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANT_LINE = re.compile(r"^\s+(\S+) variants: .* compiled \d+ in ([\d.]+)s \(([\d.]+)s ahead", re.M)


def run(args: argparse.Namespace, caches: Path, out: Path) -> tuple[float, str, list[dict]]:
    env = dict(os.environ)
    for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"):
        env[name] = str(caches / name.lower())
    command = [sys.executable, "-m", "pa_oracle", "fuzz", "--time-budget", str(args.time_budget), "-n", str(args.examples),
               "--seed", str(args.seed), "--out", str(out), "--overwrite"]
    command += [a for b in args.backend for a in ("-b", b)]
    if args.compile_budget is not None:
        command += ["--compile-budget", str(args.compile_budget)]
    start = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode not in (0, 1):
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"pa-oracle fuzz exited {done.returncode}")
    return wall, done.stdout, json.loads((out / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-b", "--backend", action="append", required=True)
    parser.add_argument("--time-budget", type=float, default=240.0)
    parser.add_argument("--compile-budget", type=float, default=None)
    parser.add_argument("-n", "--examples", type=int, default=100000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--caches", type=Path, default=None, help="cache folder to use (default: a fresh temp folder)")
    args = parser.parse_args()
    caches = args.caches or Path(tempfile.mkdtemp(prefix="pa-cold-caches-"))
    with tempfile.TemporaryDirectory(prefix="pa-cold-out-") as out_dir:
        cpu0 = os.times()
        wall, text, summary = run(args, caches, Path(out_dir))
        cpu1 = os.times()
    compiles = {name: (float(total), float(ahead)) for name, total, ahead in VARIANT_LINE.findall(text)}
    cpu = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    total = sum(r["examples"] - r["unsupported"] for r in summary)
    print(f"cold campaign: {total} cases judged in {wall:.0f}s wall ({total / wall:.1f}/s), {cpu:.0f} CPU-s "
          f"({total / max(cpu, 1e-9):.2f} cases per CPU-second); caches in {caches}")
    fuzzing = 0.0
    for r in summary:
        compile_s, ahead = compiles.get(r["backend"], (0.0, 0.0))
        judge = max(r["seconds"] - (compile_s - ahead), 0.0)
        fuzzing += r["seconds"] + ahead
        print(f"  {r['backend']:<28} {r['examples'] - r['unsupported']:>6} judged ({r['status']}): "
              f"compile {compile_s:6.1f}s  judge {judge:6.1f}s  ({r['examples'] / max(r['seconds'], 1e-9):.1f}/s in its chunks)")
    judged_s = sum(max(r["seconds"] - (compiles.get(r["backend"], (0, 0))[0] - compiles.get(r["backend"], (0, 0))[1]), 0) for r in summary)
    print(f"  split of the wall time: start/other {max(wall - fuzzing, 0):.0f}s, "
          f"compile {sum(c for c, _ in compiles.values()):.0f}s, judge {judged_s:.0f}s ({judged_s / wall:.0%} judging)")
    for line in text.splitlines():
        if " variants: " in line:
            print(line)


if __name__ == "__main__":
    main()
