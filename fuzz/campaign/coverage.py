"""Which feature values a campaign exercised, against the values the backend declares.

Coverage of a dimension = distinct declared values among the cases the kernel actually ran
(passed or failed; not unsupported, not skipped as known) / values its ``Capabilities`` (narrowed
by ``--only``, within the ``Limits``) let the strategies draw. The overall figure adds up the
dimensions. A count says how many cases exercised a value, so a value drawn once shows as such.
A case's storage label joins its features (``combined+HND``); each declared feature it names is covered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pa_oracle.backends.base import Capabilities
from pa_oracle.fuzz.draw.features import Feature, case_features
from pa_oracle.fuzz.draw.strategies import GROUP_SIZES, Limits
from pa_oracle.fuzz.draw.strategies import _page_sizes as page_sizes  # what the strategy draws, one place
from pa_oracle.oracle.case import FP8_DTYPES, Case, storage_features

# dimension -> short column title of the text table
DIMENSIONS: dict[str, str] = {
    "batch_size": "batch",
    "empty_requests": "empty",
    "qo_above_kv": "qo>kv",
    "page_size": "page",
    "group_size": "group",
    "head_dim": "dim",
    "q_dtype": "q",
    "kv_dtype": "kv",
    "causal": "causal",
    "window": "window",
    "logits_soft_cap": "softcap",
    "alibi": "alibi",
    "sinks": "sinks",
    "custom_scale": "scale",
    "fp8_scales": "fp8scale",
    "storage": "storage",
}
BATCH_BUCKETS: tuple[tuple[int, int | None], ...] = ((1, 1), (2, 3), (4, 7), (8, 15), (16, None))


def _bucket_name(low: int, high: int | None) -> str:
    return str(low) if low == high else f"{low}+" if high is None else f"{low}-{high}"


def batch_bucket(batch_size: int) -> str:
    """>>> batch_bucket(1), batch_bucket(5), batch_bucket(40)
    ('1', '4-7', '16+')"""
    low, high = next((lo, hi) for lo, hi in BATCH_BUCKETS if hi is None or batch_size <= hi)
    return _bucket_name(low, high)


def _label(value: Feature) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def exercised(case: Case) -> dict[str, str]:
    """The value label of every dimension for ``case``."""
    features = case_features(case)
    labels = {name: _label(features[name]) for name in DIMENSIONS if name != "storage"}
    labels["batch_size"] = batch_bucket(case.layout.batch_size)
    labels["storage"] = "+".join(storage_features(case.storage))
    return labels


def declared(caps: Capabilities, limits: Limits = Limits()) -> dict[str, list[str]]:
    """The value labels of every dimension that the strategies can draw for ``caps``."""
    max_qo = min(limits.max_qo_len, caps.max_qo_len or limits.max_qo_len)
    kv_dtypes = list(dict.fromkeys(kv for q in caps.q_dtypes for kv in caps.accepted_kv_dtypes(q)))
    head_dims = [d for d in limits.head_dims if caps.head_dims is None or d in caps.head_dims] or list(caps.head_dims or ())

    smallest_batch = 2 if caps.mixed_batch else 1

    def switch(reachable: bool) -> list[str]:
        return ["false", "true"] if reachable else ["false"]

    return {
        "batch_size": [_bucket_name(lo, hi) for lo, hi in BATCH_BUCKETS
                       if lo <= max(limits.max_batch, smallest_batch) and (hi is None or hi >= smallest_batch)],
        "empty_requests": switch(caps.empty_requests),
        "qo_above_kv": switch(caps.qo_len_above_kv_len and (caps.empty_requests or max_qo > 1)),
        "page_size": [str(p) for p in page_sizes(caps)],
        "group_size": [
            str(g) for g in GROUP_SIZES if g <= limits.max_qo_heads and g <= (caps.max_group_size or g)
        ],
        "head_dim": [str(d) for d in head_dims],
        "q_dtype": list(caps.q_dtypes),
        "kv_dtype": kv_dtypes,
        "causal": [_label(c) for c in sorted(caps.causal)],
        "window": switch(caps.window_left),
        "logits_soft_cap": switch(caps.logits_soft_cap),
        "alibi": switch(caps.alibi),
        "sinks": switch(caps.sinks),
        "custom_scale": switch(caps.custom_sm_scale),
        "fp8_scales": switch(caps.fp8_scales and any(d in FP8_DTYPES for d in kv_dtypes)),
        "storage": list(caps.storages),
    }


@dataclass
class Coverage:
    """Cases run per dimension and value label."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    variants: list[str] = field(default_factory=list)  # this run's compile keys (``variants.VariantPlan.lines``); not saved

    def add(self, case: Case) -> None:
        for name, value in exercised(case).items():
            per_value = self.counts.setdefault(name, {})
            per_value[value] = per_value.get(value, 0) + 1

    def merge(self, other: Coverage) -> None:
        for name, per_value in other.counts.items():
            mine = self.counts.setdefault(name, {})
            for value, n in per_value.items():
                mine[value] = mine.get(value, 0) + n

    def covered(self, name: str, values: list[str]) -> list[str]:
        counts = self.counts.get(name, {})
        if name == "storage":  # a label names each feature of the case's storage
            return [v for v in values if any(n and v in label.split("+") for label, n in counts.items())]
        return [v for v in values if counts.get(v)]

    def fraction(self, wanted: dict[str, list[str]]) -> float:
        total = sum(len(values) for values in wanted.values())
        return sum(len(self.covered(name, values)) for name, values in wanted.items()) / total if total else 0.0

    def missing(self, wanted: dict[str, list[str]]) -> dict[str, list[str]]:
        """Declared values never exercised, per dimension (dimensions with none left out)."""
        gaps = {name: [v for v in values if v not in self.covered(name, values)] for name, values in wanted.items()}
        return {name: values for name, values in gaps.items() if values}

    def to_json(self, wanted: dict[str, list[str]]) -> dict[str, object]:
        return {"fraction": round(self.fraction(wanted), 4), "counts": self.counts, "missing": self.missing(wanted)}


def coverage_table(rows: list[tuple[str, Coverage, dict[str, list[str]]]]) -> list[str]:
    """A text table: one row per backend, ``covered/declared`` per dimension, then what is missing."""
    name_width = max([len(name) for name, _, _ in rows] + [7])
    header = f"{'backend':<{name_width}}  total " + " ".join(f"{title:>8}" for title in DIMENSIONS.values())
    lines = ["coverage: declared feature values exercised (covered/declared)", header]
    for name, cov, wanted in rows:
        wanted = {d: wanted.get(d, []) for d in DIMENSIONS}  # a dimension a state does not declare: nothing declared
        cells = " ".join(f"{len(cov.covered(d, wanted[d]))}/{len(wanted[d])}".rjust(8) for d in DIMENSIONS)
        lines.append(f"{name:<{name_width}}  {cov.fraction(wanted):>5.0%} {cells}")
    for name, cov, wanted in rows:
        gaps = cov.missing(wanted)
        if gaps:
            lines.append(f"  {name} never ran: " + "; ".join(f"{d} {', '.join(v)}" for d, v in gaps.items()))
    for _, cov, _ in rows:
        lines += cov.variants
    return lines
