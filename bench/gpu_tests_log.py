"""A pytest plugin for the GPU check: each test's outcome, one JSON line per test in $GPU_TESTS_LOG as the test ends,
so that a run cut off by its budget still says which tests passed (``-p bench.gpu_tests_log``)."""

from __future__ import annotations

import json
import os
from typing import Any


def pytest_runtest_logreport(report: Any) -> None:
    path = os.environ.get("GPU_TESTS_LOG")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # under pytest-xdist the controller gets every worker's reports: it writes them, once
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return  # one line per test: its call, or the set-up or tear-down that failed or skipped it
    message = ""
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])
    elif report.outcome == "failed":
        message = str(getattr(report.longrepr, "reprcrash", None) and report.longrepr.reprcrash.message or report.longrepr)
    with open(path, "a") as f:
        f.write(json.dumps({"name": report.nodeid, "outcome": report.outcome, "when": report.when,
                            "seconds": round(report.duration, 1), "message": message.splitlines()[0][:300] if message else ""}) + "\n")
