"""What the linter reports: a `Rule` (what it checks, why it matters, how to fix it) and a `Finding`.

A rule's check is a plain function `check(script) -> Iterable[Hit]`: it reads a parsed `Script`
and points at the lines that break the rule. The engine turns each hit into a `Finding` carrying
the rule's why and fix, so every rule explains itself the same way.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuscale.lint.script import Script


@dataclass(frozen=True)
class Finding:
    """One mistake at one place of one script."""

    path: str
    """The script as it was named (a path, or '<string>')."""
    line: int
    """1-based line of the offending code."""
    col: int
    """1-based column of the offending code."""
    rule: str
    """Rule id, e.g. 'GS103'."""
    title: str
    """What is wrong, in one line."""
    why: str
    """Why it matters on more than one GPU."""
    fix: str
    """How to fix it, naming the gpuscale call that does it right."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        """Compiler style: `path:line:col: GS1xx title`, then indented why and fix lines."""
        return f"{self.path}:{self.line}:{self.col}: {self.rule} {self.title}\n    why: {self.why}\n    fix: {self.fix}"


def format_findings(findings: Iterable[Finding]) -> list[str]:
    """Text lines of findings, grouped: the first of a rule's findings in a script with its why and fix, every
    further one of the same rule and title there as one line of its own (compiler style, for editors to jump to)."""
    lines, told = [], set()
    for finding in findings:
        key = (finding.path, finding.rule, finding.title)
        if key in told:
            lines.append(f"{finding.path}:{finding.line}:{finding.col}: {finding.rule} {finding.title} (why and fix as above)")
        else:
            told.add(key)
            lines.append(finding.format())
    return lines


@dataclass(frozen=True)
class Hit:
    """Where a check found its rule broken; `detail`, naming the offending code, replaces the rule's title, and `fix`,
    where this case has a fix of its own (a library's way), the rule's fix."""

    node: ast.AST
    detail: str = ""
    fix: str = ""


@dataclass(frozen=True)
class Rule:
    """One check: id, one-line title, why it matters, the fix, and the function that finds it."""

    id: str
    title: str
    why: str
    fix: str
    check: Callable[[Script], Iterable[Hit]]

    def finding(self, path: str, hit: Hit) -> Finding:
        title = hit.detail or self.title
        return Finding(path=path, line=getattr(hit.node, "lineno", 1), col=getattr(hit.node, "col_offset", 0) + 1,
                       rule=self.id, title=title, why=self.why, fix=hit.fix or self.fix)
