"""The main fuzz job with fresh compile caches, and where its time goes (a benchmark).

    python benchmarks/cold_campaign.py --time-budget 240 -b flashinfer-decode -b sdpa-math ...
    python benchmarks/cold_campaign.py --time-budget 120 -b flex            # CPU

Points ``PA_ORACLE_CACHE_DIR`` (FlashInfer's JIT cache, Triton's and inductor's) at an empty temp folder, runs ``pa-oracle fuzz`` as a user would, and prints per backend the
cases judged and the split of its wall time: compiling (the campaign's own account: the first case of
each new variant, ahead-of-time builds), judging (the rest of its chunks) and starting (what is left:
process start, imports, worker starts, planning). Prebuilt FlashInfer kernels (its AOT folder) stay
visible: they are what a CI image ships. ``--caches DIR`` keeps the caches of an earlier run instead;
``--workers N`` runs N shards side by side (their cases add up; a backend's seconds are its slowest shard's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path



def run(args: argparse.Namespace, caches: Path, out: Path) -> tuple[float, str, list[dict], int]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")}
    env["PA_ORACLE_CACHE_DIR"] = str(caches)  # pa-oracle points every compile cache into it
    command = [sys.executable, "-m", "pa_oracle", "fuzz", "--time-budget", str(args.time_budget), "-n", str(args.examples),
               "--seed", str(args.seed), "--out", str(out), "--overwrite"]
    command += [a for b in args.backend for a in ("-b", b)]
    if args.compile_budget is not None:
        command += ["--compile-budget", str(args.compile_budget)]
    if args.workers > 1:
        command += ["--workers", str(args.workers)]
    start = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if args.log:
        args.log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    if done.returncode not in (0, 1, 3) or not (out / "summary.json").is_file():  # 3: a backend incomplete, still measured
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"pa-oracle fuzz exited {done.returncode}")
    return wall, done.stdout, json.loads((out / "summary.json").read_text()), done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-b", "--backend", action="append", default=[], help="(repeatable) default: every available one, the main job")
    parser.add_argument("--time-budget", type=float, default=240.0)
    parser.add_argument("--compile-budget", type=float, default=None)
    parser.add_argument("-n", "--examples", type=int, default=100000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="pa-oracle fuzz --workers: shards side by side (on one GPU too)")
    parser.add_argument("--caches", type=Path, default=None, help="cache folder to use (default: a fresh temp folder)")
    parser.add_argument("--log", type=Path, default=None, help="write the campaign's whole output here")
    args = parser.parse_args()
    caches = args.caches or Path(tempfile.mkdtemp(prefix="pa-cold-caches-"))
    with tempfile.TemporaryDirectory(prefix="pa-cold-out-") as out_dir:
        cpu0 = os.times()
        wall, text, summary, code = run(args, caches, Path(out_dir))
        cpu1 = os.times()
    cpu = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    judged = {r["backend"]: r["examples"] - r["unsupported"] for r in summary}
    total = sum(judged.values())
    print(f"cold campaign (exit {code}): {total} cases judged in {wall:.0f}s wall ({total / wall:.1f}/s), {cpu:.0f} CPU-s "
          f"({total / max(cpu, 1e-9):.2f} cases per CPU-second); fewest for one backend: {min(judged.values(), default=0)}; "
          f"caches in {caches}")
    split = {"start": 0.0, "compile": 0.0, "judge": 0.0}
    for r in summary:
        start, compile_ = r.get("start_seconds", 0.0), r.get("compile_seconds", 0.0)
        judge = max(r["seconds"] - start - compile_, 0.0)
        split["start"] += start
        split["compile"] += compile_
        split["judge"] += judge
        print(f"  {r['backend']:<28} {judged[r['backend']]:>6} judged ({r['status']}): start {start:6.1f}s  "
              f"compile {compile_:6.1f}s  judge {judge:6.1f}s  ({judged[r['backend']] / max(judge, 1e-9):.1f}/s judging)")
    other = max(wall - sum(split.values()), 0.0)
    for r in summary:
        if r.get("not_built"):
            print(f"  {r['backend']:<28} not built: {r['not_built']}")
    print(f"  split of the wall time: start {split['start']:.0f}s, compile {split['compile']:.0f}s, judge {split['judge']:.0f}s, "
          f"other (process start, planning, summary) {other:.0f}s -> {split['judge'] / wall:.0%} judging")
    for line in text.splitlines():
        if " variants: " in line or "compile plan:" in line or "LEFT OUT" in line:
            print(line)


if __name__ == "__main__":
    main()
