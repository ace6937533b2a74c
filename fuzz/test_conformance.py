"""The shipped differential test: fuzz each selected backend against the float64 oracle.

Run it with ``pytest --pa-backend NAME`` or ``pytest --pa-kernel MOD:FN`` (the plugin collects
this file by itself; ``--pyargs pa_oracle.fuzz.test_conformance`` names it explicitly).
Each backend runs as ``--pa-shards`` items (shards of its examples, see ``pa_oracle.fuzz.plugin``); cases
that a ledger entry covers are skipped. A failure message carries the shrunk case, the report
path and a repro command.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.campaign.ledger import GOLDEN, load_ledger
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.plugin import selected_backends, shard_count


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pa_backend" in metafunc.fixturenames:
        count = shard_count(metafunc.config)
        params = [(name, Shard(i, count)) for name in selected_backends(metafunc.config) for i in range(count)]
        ids = [name if count == 1 else f"{name}-shard{shard.index}of{count}" for name, shard in params]
        metafunc.parametrize(("pa_backend", "pa_shard"), params, ids=ids)


def test_kernel_agrees_with_oracle(pa_backend: str, pa_shard: Shard, request: pytest.FixtureRequest) -> None:
    backend = UserKernel.from_spec(pa_backend) if ":" in pa_backend else get_backend(pa_backend)
    reason = backend.unavailable_reason()
    if reason:
        pytest.skip(f"{backend.name}: {reason}")
    out = Path(request.config.getoption("--pa-out") or "pa-findings")
    skip_known = not request.config.getoption("--pa-no-skip-known")
    ledger = load_ledger(Path(request.config.getoption("--pa-ledger") or GOLDEN / "ledger.json")) if skip_known else None
    config = CampaignConfig(examples=pa_shard.share(request.config.getoption("--pa-examples") or 100),
                            seed=request.config.getoption("--pa-seed") or 0, out_dir=out, shard=pa_shard, ledger=ledger)
    result = fuzz_backend(backend, config)
    assert (why := result.judged_nothing()) is None, f"{backend.name}: judged nothing: {why} ({result.line()})"
    if result.finding:
        pytest.fail(
            f"{backend.name} (shard {pa_shard}) disagrees with the oracle: {result.finding.message}\n"
            f"minimal case: {result.finding.case.summary()}\n"
            f"report: {Path(result.finding_dir or out) / 'report.md'}\nrepro: {result.repro}",
            pytrace=False,
        )
