"""gpuscale's own processes end without the last garbage collection, and the rest of their exit is unchanged.

The truth is what a real child process prints on its way out: an object kept in a reference cycle until exit is
collected (its __del__ prints) only by the final collection that `skip_final_collection` skips, while a thread
still running, an exit handler registered later and buffered output all finish as before.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
KEEP_A_CYCLE = textwrap.dedent("""
    import sys

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            sys.stdout.write("cycle collected\\n")
            sys.stdout.flush()

    kept = Cycle()  # lives until the modules are cleared at exit; then only a collection can free it
""")


def _exit_of(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "child.py"
    script.write_text(KEEP_A_CYCLE + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("mode", ["plain", "skip"])
def test_the_exit_skips_only_the_last_collection(tmp_path, mode):
    result = _exit_of(tmp_path, """
        import atexit, threading, time
        from gpuscale.base.quickexit import skip_final_collection

        if sys.argv[1] == "skip":
            skip_final_collection()
            skip_final_collection()  # a second call registers nothing more
        atexit.register(lambda: print("handler ran"))
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished"))).start()
        sys.stdout.write("buffered, not flushed ")
    """, mode)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["buffered, not flushed thread finished", "handler ran"], lines
    assert lines[2:] == (["cycle collected"] if mode == "plain" else []), lines


@pytest.mark.parametrize("entry, argv, skips", [
    ("gpuscale.cli:console", ["gpuscale", "profiles"], True),  # the `gpuscale` command
    ("gpuscale.cli:main", ["gpuscale", "profiles"], False),  # main() alone, as tests and scripts call it in-process
    ("-m gpuscale", ["gpuscale", "profiles"], True),
    ("-m gpuscale.agent", ["agent", "--help"], True),  # what batch scripts start on each node
])
def test_gpuscales_entry_points_skip_it_and_main_alone_does_not(tmp_path, entry, argv, skips):
    if entry.startswith("-m "):
        call = f"import runpy; sys.argv = {argv!r}; runpy.run_module({entry[3:]!r}, run_name='__main__', alter_sys=True)"
    else:
        module, name = entry.split(":")
        call = f"import {module} as m; sys.argv = {argv!r}; sys.exit(m.{name}(sys.argv[1:]) if {name!r} == 'main' else m.{name}())"
    result = _exit_of(tmp_path, call)
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("cycle collected" in result.stdout) is not skips, result.stdout[-500:]


def test_the_console_script_is_the_entry_point_that_skips_it():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["gpuscale"] == "gpuscale.cli:console"
