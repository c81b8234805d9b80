"""`gpuscale report DIR`: the scaling table, report.md, report.html and plots of a study, from its saved JSON.

The rows are derived again from each run's summary.json (and the prediction from results.json),
so a study copied off a cluster, or one whose runs were added to, reports the same way anywhere:
`write_report(analyse(DIR), DIR)` from Python writes the same report (`gpuscale.study.analysis.analyse`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpuscale.base.files import atomic_write_json
from gpuscale.cli.verbs import verb_parser
from gpuscale.study import analysis
from gpuscale.study.answer import check_target
from gpuscale.study.report import format_table, write_report

EPILOG = """examples:
  gpuscale report runs/study
  gpuscale report runs/study --no-files     # print the table only
"""


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "report", __doc__, EPILOG)
    parser.add_argument("study_dir", metavar="DIR", help="the --out directory of `gpuscale study`")
    parser.add_argument("--no-files", action="store_true", help="print the table; write nothing")
    parser.add_argument("--target-efficiency", type=float, default=None, metavar="F",
                        help="recommend the largest run whose efficiency stays at or above F, for this report only "
                             "(default: the study's, else 0.75)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    study_dir = Path(args.study_dir)
    target = None if args.target_efficiency is None else check_target(args.target_efficiency)
    results = analysis.analyse(study_dir, target_efficiency=target)  # the study's saved prediction and own target
    if not results["rows"]:
        raise ValueError(f"{study_dir} has no finished runs yet; run `gpuscale study --out {study_dir} -- SCRIPT` first")
    print(format_table(results))
    if not args.no_files:
        atomic_write_json(study_dir / analysis.RESULTS_FILE, results)
        paths = write_report(results, study_dir)
        print(f"\nreport: {paths['report.html']}  (and report.md, {study_dir / 'plots'})")
    return 0
