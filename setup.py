"""Packaging beyond pyproject.toml: the wheel carries the examples, so that `gpuscale demo` and the
examples run from `pip install gpuscale` without a checkout.

The examples live at the repository's top (examples/*.py, where a reader looks for them); a wheel
puts a copy under gpuscale/examples/ (`gpuscale demo --examples` prints where). An editable install
(`pip install -e .`) copies nothing: the demo finds the checkout's examples/ itself.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

EXAMPLES = Path(__file__).resolve().parent / "examples"


class BuildWithExamples(build_py):
    """build_py, then examples/*.py into the built package's examples/ folder."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "gpuscale" / "examples"
        target.mkdir(parents=True, exist_ok=True)
        for example in sorted(EXAMPLES.glob("*.py")):
            shutil.copy2(example, target / example.name)


setup(cmdclass={"build_py": BuildWithExamples})
