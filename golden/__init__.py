"""The golden corpus, shipped as package data: known findings (``ledger.json``), their cases
(``cases/``), ready-to-file upstream reports (``reports/``) and the expected GSM8k results
(``gsm8k/``). ``PA_ORACLE_GOLDEN=DIR`` reads another corpus of the same layout instead."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "PA_ORACLE_GOLDEN"


def root() -> Path:
    """The corpus folder: ``$PA_ORACLE_GOLDEN`` when set, else the one installed with this package."""
    chosen = os.environ.get(ENV, "").strip()
    return Path(chosen).expanduser() if chosen else Path(__file__).resolve().parent


def ledger_path() -> Path:
    return root() / "ledger.json"


def cases_dir() -> Path:
    return root() / "cases"


def gsm8k_dir() -> Path:
    return root() / "gsm8k"
