"""gpuscale's start-up hook, loaded by Python itself before a rank's script (this folder is put first on PYTHONPATH).

`gpuscale run`, every study cell and every gpuscale batch script put this folder on the workers'
PYTHONPATH, so each rank's interpreter imports this module at start-up, before the script. It
does three things for any script, gpuscale's or not, and must cost nothing measurable:

1. before the script's first line, it places the rank (`gpuscale.runtime.pinning`: its cores, its thread
   pools), has a rank that only lost its peer say so in one line (`gpuscale.runtime.failures`), in a batch
   script notes a SIGUSR1 handler the script installs (`gpuscale.base.exits`) and, under torchrun, has it
   end with its launcher (`gpuscale.base.lifeline`); none of them imports torch; once the script imports
   argparse, its usage error and --help are printed by one rank of the job, not by each;
2. once the script's own ``import torch`` has finished, it has a process group the script starts use the timeout
   ``gpuscale run --timeout`` asked for (`gpuscale.runtime.collective_timeout`), registers the exit handler that ends a
   process group the script left open without gloo's abort at exit (`gpuscale.runtime.teardown`), and,
   where a records folder is named, lets `gpuscale.measure.probe.recorder` hook torch to measure the run;
3. then it runs the next ``sitecustomize`` on the path (a site's own, e.g. Debian's), as if this
   one were not there.

All of it happens only in a rank: a process with RANK set; not in torchrun's agent (no RANK), not
in a child of a rank (DataLoader workers started with "spawn", subprocesses), which inherit
GPUSCALE_PROBE_OWNER naming their rank (and GPUSCALE_PLACED: they keep the cores they inherit).
Recording needs GPUSCALE_PROBE_DIR naming where to write; GPUSCALE_PROBE=0 turns recording off,
GPUSCALE_BIND=none the placement. Nothing here may stop a training: a failure is one line on stderr.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _a_rank():
    """True in a rank itself, which from now on owns this role: not in its launcher, not in its children."""
    environ = os.environ
    if "RANK" not in environ:
        return False
    owner = environ.get("GPUSCALE_PROBE_OWNER", "")
    rank, _, pid = owner.partition(":")
    if owner and rank == environ["RANK"] and pid != str(os.getpid()):
        return False  # a child process of a rank
    environ["GPUSCALE_PROBE_OWNER"] = f"{environ['RANK']}:{os.getpid()}"
    return True


def _recording():
    return os.environ.get("GPUSCALE_PROBE", "1").strip() != "0" and bool(os.environ.get("GPUSCALE_PROBE_DIR"))


def _say(what, exc):
    print(f"gpuscale: {what} ({type(exc).__name__}: {exc})", file=sys.stderr)


def _before_the_script():
    """Place this rank on its cores and, under torchrun, tie it to its launcher (no torch imported)."""
    try:
        from gpuscale.runtime.pinning import place_this_rank

        place_this_rank()
    except Exception as exc:  # e.g. a contradiction in the launcher's variables: gpuscale.init() would say it
        _say("this rank was not placed on its cores", exc)
    try:
        from gpuscale.runtime.failures import one_line_for_a_lost_peer

        one_line_for_a_lost_peer()  # a rank that only lost its peer: one line, not a second traceback
    except Exception as exc:
        _say("a rank that loses its peer will print its whole traceback", exc)
    if os.environ.get("GPUSCALE_STOP_MARKER"):
        try:
            from gpuscale.base.exits import watch_usr1_handlers

            watch_usr1_handlers()  # a script's own SIGUSR1 handler (Lightning's requeue): the batch script passes USR1 on
        except Exception as exc:
            _say("SLURM's warning will not reach a SIGUSR1 handler of the script's own", exc)
    if "TORCHELASTIC_RUN_ID" in os.environ and not os.environ.get("GPUSCALE_SRUN_TASK"):
        try:
            import signal

            from gpuscale.base.lifeline import end_with_parent

            end_with_parent(signal.SIGTERM)  # a SIGKILLed torchrun leaves no worker training on
        except Exception as exc:
            _say("this rank will not end with its launcher", exc)


def _after_torch():
    """Once torch is imported: the exit handler that ends a left-open process group; the recorder."""
    if _recording():
        try:
            from gpuscale.measure.probe import recorder

            recorder.install()
        except Exception as exc:  # the probe never stops a training
            _say("probe: not recording this rank", exc)
    try:
        from gpuscale.runtime.collective_timeout import use_requested_timeout

        use_requested_timeout()  # gpuscale run --timeout: also for a process group the script starts itself
    except Exception as exc:
        _say("the script's process group keeps its own collective timeout", exc)
    try:
        from gpuscale.runtime.teardown import install_exit_teardown

        install_exit_teardown()
    except Exception as exc:
        _say("no clean end of the process group at exit", exc)


def _gpuscale_half_imported():
    """True while a gpuscale module is being imported (the one that imported torch, say): the hooks import
    gpuscale modules themselves and must not meet one half made."""
    return any(name.partition(".")[0] == "gpuscale" and getattr(getattr(module, "__spec__", None), "_initializing", False)
               for name, module in list(sys.modules.items()))


class _WhenGpuscaleIsImported:
    """A meta-path finder that finds nothing itself: at the first import after gpuscale's modules are whole,
    it runs the after-torch hooks (a gpuscale module imported torch first, so they had to wait)."""

    def __init__(self):
        import threading

        self.lock = threading.Lock()
        self.done = False

    def find_spec(self, name, path=None, target=None):
        # It stays on sys.meta_path (removing itself here would make importlib skip the next finder for
        # this very import); once done it only returns None.
        if self.done or _gpuscale_half_imported():
            return None
        with self.lock:
            if not self.done:
                self.done = True
                _after_torch()
        return None


def _after_torch_once_gpuscale_is_imported():
    if _gpuscale_half_imported():
        sys.meta_path.insert(0, _WhenGpuscaleIsImported())
    else:
        _after_torch()


class _AfterImport:
    """A meta-path finder that finds nothing itself: it wraps the loader of the module `name` so that `then` runs
    right after that module's own import has finished (the module imported only if the script imports it)."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_original = spec.loader.exec_module
        then = self.then

        def exec_module(module):
            exec_original(module)
            then()

        spec.loader.exec_module = exec_module
        return spec


def _after_argparse():
    """Once the script imports argparse: its usage error and its --help printed by one rank, not by each."""
    try:
        from gpuscale.runtime.failures import one_usage_message_per_job

        one_usage_message_per_job()
    except Exception as exc:
        _say("every rank will print a usage error of the script's", exc)


def _when_imported(name, then):
    """Run `then` once `name` is imported: now if it already is, else right after the script's import of it."""
    if name in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def _run_next_sitecustomize():
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _in_a_child_of_a_rank():
    """A process a rank started (a DataLoader worker started with "spawn", a subprocess): SLURM hands the
    warning before the time limit (USR1) to every process of the step, and USR1's default would kill it,
    turning the rank's planned stop at a checkpoint into a crashed loader. It ignores USR1; its rank stops."""
    import signal

    if signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


if _a_rank():
    _before_the_script()
    _when_imported("torch", _after_torch_once_gpuscale_is_imported)  # now if another site hook imported it before us
    _when_imported("argparse", _after_argparse)
elif "RANK" in os.environ and os.environ.get("GPUSCALE_PROBE_OWNER"):
    _in_a_child_of_a_rank()
_run_next_sitecustomize()
