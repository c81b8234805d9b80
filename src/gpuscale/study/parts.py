"""The parts of lost efficiency, and the noise below which a part reads as about zero."""

from __future__ import annotations

from typing import Any

__all__ = ["PARTS", "PART_LABELS", "NOISE_FLOOR", "noise_of"]

PARTS = ("data", "exposed_comm", "imbalance", "jitter", "compute", "rest")
"""The parts of lost efficiency, in the order the table, the report and the waterfall show them. "imbalance" is its
persistent part (one rank slower on average), "jitter" the waiting that changes rank from step to step."""
PART_LABELS = {"data": "data", "exposed_comm": "exposed communication", "imbalance": "imbalance",
               "jitter": "jitter", "compute": "per-device compute", "rest": "rest (unexplained)"}
NOISE_FLOOR = 0.03
"""The least noise a part of lost efficiency is taken to have, as a share of ideal throughput: a part within the
noise reads "~0%". With --repeat, the spread of the runs' throughput raises it for the parts that compare two runs,
and how far a part itself ranged over the runs raises that part's (`gpuscale.study.analysis.part_noises`)."""


def noise_of(row: dict[str, Any], part: str) -> float | None:
    """How far `part` of `row`'s lost efficiency may be from zero by chance; None for a row compared with nothing. A
    results.json written before the parts had a noise each has one "noise" for all of them."""
    return (row.get("part_noise") or {}).get(part) or row.get("noise")
