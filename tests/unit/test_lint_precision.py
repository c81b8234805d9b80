"""`gpuscale lint` on realistic training scripts: how many of its findings are right, how many mistakes it finds.

tests/unit/lint_corpus/realistic/ holds DDP training scripts written in the styles of public examples
and courses (see its README.md), each next to `NAME.truth.toml`: its true mistakes, decided by reading
the code, each with the first line of the statement that makes it, the rule of its class and why
(`[[mistake]]`), and the real mistakes no rule covers (`[[not_covered]]`, counted apart).

A finding is right when a truth of the same rule starts the statement it points into (a call spread over
several lines is one statement; a statement flagged twice by one rule is one finding). Precision is
right findings / findings; recall is truths found / truths, over every truth. The rules were refined on
that corpus, so it must reach 90% of both.

tests/unit/lint_corpus/heldout/ holds scripts written afterwards in other styles, their truths written
before the linter first ran on them: a report, not a threshold. docs/lint.md states both measurements.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpuscale.lint import RULE_IDS, Finding, lint_paths

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
REALISTIC = Path(__file__).resolve().parent / "lint_corpus" / "realistic"
HELDOUT = Path(__file__).resolve().parent / "lint_corpus" / "heldout"
SCRIPTS = sorted(REALISTIC.glob("*.py"))
HELDOUT_SCRIPTS = sorted(HELDOUT.glob("*.py"))
FLOOR = 0.90


@dataclass
class Score:
    """One script's (or the corpus's) findings measured against its truths."""

    name: str
    truths: int = 0
    found: int = 0
    right: int = 0
    findings: int = 0
    false: list[Finding] = field(default_factory=list)
    missed: list[dict] = field(default_factory=list)

    def add(self, other: Score) -> None:
        """Add another script's counts and lists to these."""
        for name in ("truths", "found", "right", "findings"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.false += other.false
        self.missed += other.missed


def truths(script: Path) -> dict:
    """A script's truth file, parsed."""
    return tomllib.loads(script.with_suffix(".truth.toml").read_text())


def statement_spans(text: str) -> dict[int, tuple[int, int]]:
    """First line of each statement -> its lines (a compound statement: its header only)."""
    spans: dict[int, tuple[int, int]] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.stmt):
            body = getattr(node, "body", None)
            last = body[0].lineno - 1 if isinstance(body, list) and body else node.end_lineno or node.lineno
            spans.setdefault(node.lineno, (node.lineno, max(node.lineno, last)))
    return spans


def score(script: Path) -> Score:
    """Match the linter's findings for one script against its truth file."""
    spans = statement_spans(script.read_text())
    mistakes = truths(script).get("mistake", [])
    findings = lint_paths([script])
    result = Score(script.name, truths=len(mistakes))
    matched: set[int] = set()
    right: set[tuple[int, str]] = set()
    seen: set[tuple[int, str]] = set()
    for finding in findings:
        hits = [i for i, m in enumerate(mistakes) if m["rule"] == finding.rule
                and spans[m["line"]][0] <= finding.line <= spans[m["line"]][1]]
        if hits:
            matched.update(hits)
            right.add((hits[0], finding.rule))
        elif (finding.line, finding.rule) not in seen:
            seen.add((finding.line, finding.rule))
            result.false.append(finding)
    result.found = len(matched)
    result.right = len(right)
    result.findings = len(right) + len(result.false)
    result.missed = [dict(m, script=script.name) for i, m in enumerate(mistakes) if i not in matched]
    return result


def measure(scripts: list[Path] = SCRIPTS) -> tuple[Score, list[Score]]:
    """The total over some scripts (the corpus by default), and one row per script."""
    rows = [score(script) for script in scripts]
    total = Score("total")
    for row in rows:
        total.add(row)
    return total, rows


def table(rows: list[Score]) -> str:
    """Per script: truths found, findings right, then each false finding and each miss with its reason."""
    lines = [f"{'script':42} {'found':>9} {'right':>9}"]
    for row in rows:
        lines.append(f"{row.name:42} {row.found:>4}/{row.truths:<4} {row.right:>4}/{row.findings:<4}")
        lines += [f"    false {f.rule} line {f.line}: {f.title}" for f in row.false]
        lines += [f"    missed {m['rule']} line {m['line']}: {m['reason']}" + (f" [{m['note']}]" if m.get("note") else "")
                  for m in row.missed]
    return "\n".join(lines)


def percent(numerator: int, denominator: int) -> int:
    """A share in whole percent, as docs/lint.md writes it."""
    return round(100 * numerator / denominator) if denominator else 0


def manual_lint_page() -> str:
    """The manual's lint page (docs/lint.md)."""
    return (ROOT / "docs" / "lint.md").read_text()


def check_truth_files(scripts: list[Path]) -> None:
    """Every script has a truth file whose entries start statements, give reasons and name real rules."""
    for script in scripts:
        assert script.with_suffix(".truth.toml").is_file(), f"{script.name} has no truth file"
        spans = statement_spans(script.read_text())
        found = truths(script)
        assert set(found) <= {"mistake", "not_covered"}, f"{script.name}: unknown tables {sorted(found)}"
        assert found, f"{script.name}: its truth file lists nothing"
        for entry in [*found.get("mistake", []), *found.get("not_covered", [])]:
            assert entry["line"] in spans, f"{script.name}:{entry['line']} does not start a statement"
            assert entry["reason"].strip(), f"{script.name}:{entry['line']} gives no reason"
        for mistake in found.get("mistake", []):
            assert mistake["rule"] in RULE_IDS, f"{script.name}:{mistake['line']}: unknown rule {mistake['rule']}"


def test_the_corpus_has_at_least_ten_scripts_each_with_its_truths():
    assert len(SCRIPTS) >= 10
    check_truth_files(SCRIPTS)


def test_the_held_out_folder_has_at_least_four_scripts_each_with_its_truths():
    assert len(HELDOUT_SCRIPTS) >= 4
    check_truth_files(HELDOUT_SCRIPTS)
    assert not any(m.get("note") for s in HELDOUT_SCRIPTS for m in truths(s).get("mistake", [])), \
        "held-out truths are counted as they are: no known-gap notes"


def test_precision_and_recall_reach_90_percent_over_every_truth():
    total, rows = measure()
    assert total.findings and total.truths
    assert total.right / total.findings >= FLOOR and total.found / total.truths >= FLOOR, table(rows)


FIGURES = re.compile(r"(held-out )?precision\s+(\d+)/(\d+)\s+=\s+(\d+)%,\s+recall\s+(\d+)/(\d+)\s+=\s+(\d+)%")


def figures(held_out: bool) -> list[list[int]]:
    """The `precision a/b = p%, recall c/d = r%` figures docs/lint.md states, of the corpus or of the
    held-out scripts (`held-out precision ...`), each as [a, b, p, c, d, r]."""
    return [[int(g) for g in match.groups()[1:]] for match in FIGURES.finditer(manual_lint_page())
            if bool(match.group(1)) == held_out]


def measured(total: Score) -> list[int]:
    """A total's figures as docs/lint.md writes them."""
    return [total.right, total.findings, percent(total.right, total.findings),
            total.found, total.truths, percent(total.found, total.truths)]


def test_readme_states_the_measured_figures():
    total, rows = measure()
    scripts = re.search(r"(\d+)\s+training\s+scripts", manual_lint_page())
    assert scripts, "docs/lint.md must say how many training scripts the corpus has"
    assert figures(held_out=False) == [measured(total)], table(rows)
    assert int(scripts.group(1)) == len(SCRIPTS)


def test_readme_states_the_held_out_figures_as_measured():
    total, rows = measure(HELDOUT_SCRIPTS)
    counted = re.search(r"(\d+)\s+held-out\s+scripts.*?their\s+(\d+)\s+truths", manual_lint_page(), re.DOTALL)
    assert counted, "docs/lint.md must state the held-out scripts and truths"
    assert [int(g) for g in counted.groups()] == [len(HELDOUT_SCRIPTS), total.truths]
    assert figures(held_out=True) == [measured(total)], table(rows)
