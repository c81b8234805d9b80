"""gpuscale's probe, loaded by Python itself before a rank's script (this folder is put first on PYTHONPATH).

`gpuscale run` and every study cell put this folder on the workers' PYTHONPATH, so each rank's
interpreter imports this module at start-up, before the script. It must cost nothing and change
nothing: it imports no torch and no gpuscale. It only waits for the script's own ``import torch``
and then, once torch is fully imported, lets `gpuscale.probe.recorder` hook it. Then it runs the
next ``sitecustomize`` on the path (a site's own, e.g. Debian's), as if this one were not there.

The probe arms only in a rank: a process with RANK set and GPUSCALE_PROBE_DIR naming where to
write; not in torchrun's agent (no RANK), not in a child of a rank (DataLoader workers started
with "spawn", subprocesses), which inherit GPUSCALE_PROBE_OWNER naming their rank. GPUSCALE_PROBE=0
turns it off.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _armed():
    environ = os.environ
    if environ.get("GPUSCALE_PROBE", "1").strip() == "0" or not environ.get("GPUSCALE_PROBE_DIR") or "RANK" not in environ:
        return False
    owner = environ.get("GPUSCALE_PROBE_OWNER", "")
    rank, _, pid = owner.partition(":")
    if owner and rank == environ["RANK"] and pid != str(os.getpid()):
        return False  # a child process of a rank that is already recorded
    environ["GPUSCALE_PROBE_OWNER"] = f"{environ['RANK']}:{os.getpid()}"
    return True


class _AfterTorch:
    """A meta-path finder that finds nothing itself: it wraps the loader of `torch` so that the
    probe installs its hooks right after torch's own import has finished."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_torch = spec.loader.exec_module

        def exec_module(module):
            exec_torch(module)
            try:
                from gpuscale.probe import recorder

                recorder.install()
            except Exception as exc:  # the probe never stops a training
                print(f"gpuscale probe: not recording this rank ({type(exc).__name__}: {exc})", file=sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


def _run_next_sitecustomize():
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if _armed():
    if "torch" in sys.modules:  # imported by something before us (another site hook): hook it now
        from gpuscale.probe import recorder

        recorder.install()
    else:
        sys.meta_path.insert(0, _AfterTorch())
_run_next_sitecustomize()
