"""The parts of lost efficiency, and the noise below which a part reads as about zero. Constants only."""

from __future__ import annotations

__all__ = ["PARTS", "PART_LABELS", "NOISE_FLOOR"]

PARTS = ("data", "exposed_comm", "imbalance", "jitter", "compute", "rest")
"""The parts of lost efficiency, in the order the table, the report and the waterfall show them. "imbalance" is its
persistent part (one rank slower on average), "jitter" the waiting that changes rank from step to step."""
PART_LABELS = {"data": "data", "exposed_comm": "exposed communication", "imbalance": "imbalance",
               "jitter": "jitter", "compute": "per-device compute", "rest": "rest (unexplained)"}
NOISE_FLOOR = 0.03
"""The least noise a comparison of two runs is taken to have, as a share of ideal throughput: a part of lost
efficiency within the noise reads "~0%". With --repeat, the spread of the runs' throughput raises it."""
