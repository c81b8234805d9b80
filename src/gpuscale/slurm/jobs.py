"""Job control: the only module that runs sbatch, squeue, scontrol and scancel.

    job_id = submit(script_text)            # sbatch --parsable, the script on standard input
    info = wait(job_id, on_change=print)    # poll until the job ends
    info.state, info.exit_code, info.stdout_path
    cancel(job_id)
    for line in follow(info.stdout_path, lambda: is_finished(job_id)): print(line, end="")

`job_info` reads ``scontrol show job -o``, which keeps finished jobs for the cluster's MinJobAge
(accounting through sacct is not needed), and falls back to squeue. Commands that are missing or
fail raise `SlurmError` with what was run and what SLURM said.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SlurmError", "JobInfo", "submit", "job_info", "wait", "cancel", "list_jobs", "follow", "TERMINAL_STATES"]

TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
})


class SlurmError(RuntimeError):
    """A SLURM command was missing or failed."""


@dataclass(frozen=True)
class JobInfo:
    """What SLURM says about one job."""

    job_id: str
    name: str
    state: str
    """PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ..."""
    exit_code: int | None
    """The batch script's exit code once the job ended (128 + the signal for a signal)."""
    reason: str | None
    nodes: str | None
    stdout_path: str | None
    restarts: int = 0

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code in (0, None)


def _run(cmd: list[str], input_text: str | None = None, timeout: float = 60) -> str:
    if shutil.which(cmd[0]) is None:
        raise SlurmError(
            f"{cmd[0]} not found: run this on a SLURM login node, or start the local test cluster "
            "(scripts/local-slurm/start.sh, then `. /tmp/gpuscale-slurm/env.sh`)"
        )
    try:
        result = subprocess.run(cmd, input=input_text, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{shlex.join(cmd)}` did not answer within {timeout:.0f} s; is slurmctld up (`sinfo`)?") from None
    if result.returncode != 0:
        message = " | ".join(line.strip() for line in (result.stderr or result.stdout).strip().splitlines() if line.strip())
        raise SlurmError(f"`{shlex.join(cmd)}` failed: {message or f'exit code {result.returncode}'}")
    return result.stdout


def submit(script_text: str, *, chdir: str | Path | None = None, extra_args: tuple[str, ...] = ()) -> str:
    """Submit a batch script (given as text) and return the job id."""
    cmd = ["sbatch", "--parsable", *extra_args]
    if chdir is not None:
        cmd.append(f"--chdir={chdir}")
    out = _run(cmd, input_text=script_text).strip()
    job_id = out.split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered {out!r} instead of a job id")
    return job_id


_FIELD = re.compile(r"([A-Za-z][A-Za-z0-9_:/]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9_:/]*=|\s*$)")


def _parse_scontrol(line: str) -> dict[str, str]:
    """``Key=Value Key=Value ...`` from `scontrol show job -o`; values may contain spaces (not quoted)."""
    return {match.group(1): match.group(2) for match in _FIELD.finditer(line.strip())}


def _exit_code(text: str | None) -> int | None:
    if not text:
        return None
    code, _, signal = text.partition(":")
    try:
        if int(code):
            return int(code)
        return 128 + int(signal) if signal and int(signal) else 0  # killed by a signal: the shell's convention
    except ValueError:
        return None


def job_info(job_id: str) -> JobInfo:
    """The job's state now; SlurmError if SLURM no longer knows it."""
    try:
        out = _run(["scontrol", "show", "job", "-o", str(job_id)])
    except SlurmError as exc:
        return _job_info_squeue(str(job_id), exc)
    fields = _parse_scontrol(out.strip().splitlines()[0]) if out.strip() else {}
    if not fields:
        return _job_info_squeue(str(job_id), SlurmError(f"scontrol knows no job {job_id}"))
    state = fields.get("JobState", "UNKNOWN").split()[0].rstrip("+")
    running = state not in TERMINAL_STATES
    return JobInfo(
        job_id=str(job_id), name=fields.get("JobName", ""), state=state,
        exit_code=None if running else _exit_code(fields.get("ExitCode")),
        reason=None if fields.get("Reason") in (None, "None") else fields.get("Reason"),
        nodes=None if fields.get("NodeList") in (None, "(null)") else fields.get("NodeList"),
        stdout_path=fields.get("StdOut"), restarts=int(fields.get("Restarts", "0") or 0),
    )


def _job_info_squeue(job_id: str, cause: SlurmError) -> JobInfo:
    unknown = (f"SLURM knows no job {job_id}: a mistyped id, or a job that ended longer ago than SLURM keeps it "
               f"(MinJobAge; `sacct -j {job_id}` reads the accounting)")
    try:
        out = _run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i|%j|%T|%r|%N"])
    except SlurmError as exc:
        if "Invalid job id" in str(exc):
            raise SlurmError(unknown) from None
        raise
    line = out.strip().splitlines()
    if not line:
        raise SlurmError(f"{unknown} ({cause})")
    return _squeue_row(line[0])


def wait(job_id: str, *, poll_s: float = 1.0, timeout_s: float | None = None,
         on_change: Callable[[JobInfo], None] | None = None) -> JobInfo:
    """Poll until the job ends; call `on_change` whenever its state changes. Returns the final info."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = None
    while True:
        info = job_info(job_id)
        if on_change is not None and info.state != last:
            on_change(info)
        last = info.state
        if info.finished:
            return info
        if deadline is not None and time.monotonic() > deadline:
            raise SlurmError(f"job {job_id} still {info.state} after {timeout_s:.0f} s")
        time.sleep(poll_s)


def cancel(job_id: str, *, signal: str | None = None) -> JobInfo:
    """Cancel a job (or send it a signal: ``signal='USR1'`` goes to the batch shell and its steps); the job as it was.

    SlurmError for a job SLURM does not know or one that has ended: scancel itself returns 0 for both, having done
    nothing. An array job has ended only when none of its tasks is pending or running (the first one listed may
    have finished while the others wait)."""
    info = job_info(job_id)
    if info.finished and not _run(["squeue", "-h", "-j", str(job_id), "-o", "%T"]).strip():
        raise SlurmError(f"job {job_id} has already ended ({info.state}): nothing to cancel")
    cmd = ["scancel"] + ([f"--signal={signal}", "--full"] if signal else []) + [str(job_id)]
    _run(cmd)
    return info


def list_jobs(user: str | None = None) -> list[JobInfo]:
    """The user's pending and running jobs (squeue)."""
    cmd = ["squeue", "-h", "-o", "%i|%j|%T|%r|%N"] + (["-u", user] if user else ["--me"])
    infos = []
    for line in _run(cmd).strip().splitlines():
        infos.append(_squeue_row(line))
    return infos


def _squeue_row(line: str) -> JobInfo:
    """One row of squeue's "%i|%j|%T|%r|%N": squeue writes the reason "None" where there is none."""
    jid, name, state, reason, nodes = (line.split("|") + [""] * 5)[:5]
    return JobInfo(job_id=jid, name=name, state=state, exit_code=None, reason=None if reason in ("", "None") else reason,
                   nodes=nodes or None, stdout_path=None)


def follow(path: str | Path, finished: Callable[[], bool], poll_s: float = 0.5) -> Iterator[str]:
    """Yield the lines of a growing file (``tail -f``) until `finished()` and the file is drained."""
    path = Path(path)
    position = 0
    while True:
        done = finished()  # read the state before draining: lines written before the end are not lost
        if path.exists():
            with path.open("r", errors="replace") as f:
                f.seek(position)
                while line := f.readline():
                    if not line.endswith("\n") and not done:
                        break  # a partial line: wait for the rest
                    position = f.tell()
                    yield line
        if done:
            return
        time.sleep(poll_s)
