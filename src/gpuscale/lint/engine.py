"""Running the rules: over one source text (`lint_source`) or over files and folders (`lint_paths`).

Suppression: a comment `# gpuscale: ignore[GS103]` (one or more ids, comma separated) or a bare
`# gpuscale: ignore` on any line of the flagged statement (the line a finding points at, or
another line of the same multi-line call or statement) silences it there.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from gpuscale.base.files import has_python_shebang
from gpuscale.lint.findings import Finding, Rule
from gpuscale.lint.rules import RULE_IDS, RULES
from gpuscale.lint.script import Script

IGNORE = re.compile(r"#\s*gpuscale:\s*ignore\b(?:\[([^\]]*)\])?", re.IGNORECASE)
ALL = "*"
COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
            ast.AsyncFunctionDef, ast.ClassDef, ast.Match) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
SKIPPED_DIRS = ("__pycache__", "node_modules", "site-packages")


def suppressions(text: str) -> dict[int, set[str]]:
    """Line -> rule ids silenced on it by `# gpuscale: ignore[...]` comments ({'*'} for a bare ignore)."""
    found: dict[int, set[str]] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT and (match := IGNORE.search(token.string)):
                ids = {part.strip().upper() for part in (match.group(1) or ALL).split(",") if part.strip()}
                found.setdefault(token.start[0], set()).update(ids or {ALL})
    except (tokenize.TokenError, SyntaxError):  # the parser already accepted the text; be lenient here
        pass
    return found


def select_rules(select: Iterable[str] | None = None, ignore: Iterable[str] | None = None) -> tuple[Rule, ...]:
    """The rules to run: all, or those in `select`, minus those in `ignore`. Unknown ids raise ValueError."""
    chosen = {r.strip().upper() for r in select or () if r.strip()} or set(RULE_IDS)
    dropped = {r.strip().upper() for r in ignore or () if r.strip()}
    unknown = sorted((chosen | dropped) - set(RULE_IDS))
    if unknown:
        raise ValueError(f"unknown rule id {', '.join(unknown)}; valid ids: {', '.join(RULE_IDS)}")
    return tuple(rule for rule in RULES if rule.id in chosen - dropped)


def lint_source(text: str, path: str = "<string>", rules: Sequence[Rule] = RULES, skipped: list[str] | None = None) -> list[Finding]:
    """The findings of one script's source text, sorted by line. A syntax error raises ValueError. A script with no sign
    of running as several processes is not checked (no findings); its path is appended to `skipped` if given."""
    try:
        script = Script(text, path)
    except SyntaxError as exc:
        raise ValueError(f"{path}:{exc.lineno or 0}: not valid Python ({exc.msg}); fix the syntax error, "
                         f"or lint only Python training scripts") from None
    except ValueError as exc:  # e.g. source with null bytes
        raise ValueError(f"{path}: not valid Python ({exc}); lint only Python training scripts") from None
    if not script.is_distributed:
        if skipped is not None:
            skipped.append(path)
        return []
    silenced = suppressions(text)
    findings = set()
    main_test = _main_process_test(script)
    for rule in rules:
        for hit in rule.check(script):
            finding = rule.finding(path, hit)
            if main_test:
                inside_a_class = any(isinstance(a, ast.ClassDef) for a in script.ancestors(hit.node))
                test = f"self.{main_test}" if inside_a_class and main_test.startswith("trainer.") else main_test
                finding = replace(finding, fix=finding.fix.replace("rt.is_main", test))
            ids = set().union(*(silenced.get(line, set()) for line in _lines(script, hit.node, finding.line)))
            if ALL not in ids and finding.rule not in ids:
                findings.add(finding)
    return sorted(findings, key=lambda f: (f.line, f.col, f.rule, f.title))


def _main_process_test(script: Script) -> str | None:
    """How the script's own library tells the main process, for the fixes (gpuscale's `rt.is_main` otherwise):
    Lightning's `trainer.is_global_zero` (`self.trainer...` in a LightningModule), Accelerate's
    `accelerator.is_main_process`."""
    if script.uses_gpuscale_init:
        return None
    if script.imports("lightning") or script.imports("pytorch_lightning"):
        return "trainer.is_global_zero"
    if script.imports("accelerate"):
        return "accelerator.is_main_process"
    return None


def _lines(script: Script, node: ast.AST, line: int) -> range:
    """The lines a suppression comment for a finding at `node` may sit on: the node's own lines, or those of
    the simple statement that holds it (a call whose closing bracket is some lines below its start)."""
    first, last = line, getattr(node, "end_lineno", None) or line
    if isinstance(node, ast.stmt) or node in script.parents:
        stmt = script.statement(node)
        if not isinstance(stmt, COMPOUND):
            first, last = min(first, stmt.lineno), max(last, stmt.end_lineno or last)
    return range(first, last + 1)


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Files to lint: each file as given, each folder's *.py files recursively (hidden folders skipped).

    A missing path or a file that is not Python raises ValueError naming it.
    """
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*.py") if p.is_file() and not any(
                part.startswith(".") or part in SKIPPED_DIRS for part in p.relative_to(path).parts[:-1])))
        elif path.is_file():
            if path.suffix != ".py" and not has_python_shebang(path):
                raise ValueError(f"{path} is not a Python file (no .py suffix, no python #! line); "
                                 "name a training script or a folder of them")
            files.append(path)
        else:
            raise ValueError(f"{path} does not exist; name a training script or a folder of them")
    return files



def lint_paths(paths: Iterable[str | Path], rules: Sequence[Rule] = RULES,
               errors: list[str] | None = None, skipped: list[str] | None = None) -> list[Finding]:
    """The findings of every script named (folders recursively), sorted by path and line.

    A missing path or a named file that is not Python raises ValueError naming it. A file that
    cannot be read or parsed raises ValueError too, unless `errors` is given: then its one-line
    message (file, what is wrong, the fix) is appended there and the other files are still linted. `skipped`: where
    the scripts not checked (no sign of several processes) are listed.
    """
    findings: list[Finding] = []
    for path in expand(paths):
        try:
            try:
                with tokenize.open(path) as f:  # honours a coding: line, like Python does
                    text = f.read()
            except (SyntaxError, UnicodeDecodeError) as exc:
                raise ValueError(f"{path}: cannot be read as Python source ({exc}); "
                                 "fix its encoding, or lint only Python training scripts") from None
            except OSError as exc:
                raise ValueError(f"{path}: cannot be read ({exc.strerror or exc}); check its permissions") from None
            findings.extend(lint_source(text, str(path), rules, skipped))
        except ValueError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
    return findings
