"""The batch script's stop handling: SLURM's warning, scancel, and the requeue of a job that stopped at a checkpoint.

Shell lines only, pure like `slurm.render`, which places them around the training step (docs/reliability.md,
signals, time limits and requeue):

- SLURM warns the batch shell with USR1 before the time limit. USR1's default action ends a process, so the
  shell passes it on to the step only when the script stops at a checkpoint on it: `gpuscale.StopSignal`
  says so by creating the file GPUSCALE_STOP_MARKER names, in a folder of this job's own on the batch node
  (whose /tmp the ranks there share). So does a script that installs a SIGUSR1 handler of its own (gpuscale's
  start-up hook notes it: `gpuscale.base.exits.watch_usr1_handlers`), such as Lightning's SLURM auto-requeue,
  which then checkpoints and requeues the job itself. A script with neither runs on to its time limit.
- The job requeues itself only after the step stopped at a checkpoint: exit code 75 (srun passes its tasks'
  codes on), or the note the ranks leave beside the marker (torchrun turns its workers' 75 into a 1).
- TERM (scancel, preemption, the time limit) is passed on the same way but never requeues: a job someone
  cancelled stays cancelled.
- The job's exit code is the first failing rank's own. srun returns the highest code of its tasks, which is
  a victim's 143 once --kill-on-bad-exit has ended the others, and torchrun returns 1 for any failure; so
  every task notes its non-zero exit code, when it ended and where (srun mode: `task_exit_note`; torchrun
  mode: `gpuscale.agent`, for its node's first failing rank) in a folder of the job's own on the file system
  its nodes share (GPUSCALE_EXIT_DIR, in the submit directory), and the batch script takes the earliest of
  the ranks that failed on their own, and names it in its last line: gpuscale's ranks note there whether
  their error only says that a peer went away (GPUSCALE_FAILURE_DIR), and a task stopped with TERM (143) is
  a victim too. When every note is such a TERM, SLURM stopped the job (its time limit, scancel, preemption).
"""

from __future__ import annotations

from gpuscale.base.exits import EXIT_STOPPED, STOP_MARKER, own_usr1_marker, stopped_marker
from gpuscale.runtime.failures import EXIT_DIR, FAILURE_DIR

__all__ = ["stop_handling", "requeue_block", "task_exit_note"]

_MARKER = "$" + STOP_MARKER

_NO_STOP_SIGNAL = ("gpuscale: the script does not stop at a checkpoint on SLURM's warning (no gpuscale.StopSignal): "
                   "it runs on to its time limit and is not requeued")


def task_exit_note(program: str) -> str:
    """An srun task's shell around `program`: it stays the program's parent (no exec) and, when the program ends with
    a non-zero code, notes the code, the time and its host in GPUSCALE_EXIT_DIR (the host by `uname -n`, as Python's
    socket.gethostname() names it: bash's $HOSTNAME is inherited from the environment srun passes on, the first node's).
    A program that a signal other than TERM ended (SIGKILL: the out-of-memory killer) could not say so itself: the shell
    says it in one line, in place of bash's own notice (its stderr goes to /dev/null around the program, whose own stderr
    stays). Its traps only keep it alive through the signals the step's processes get (USR1, TERM): the program gets them
    too, and acts on them as it would alone.

    Once the program has failed (a non-zero code), the shell ignores USR1 and TERM (so do the commands it then runs),
    and its own stderr goes to /dev/null while it notes the exit (the line on a kill, and an error writing the note, go
    out on the saved stderr). At the time limit SLURM sends TERM to every process of the step at once; the program ends on it,
    and the shell notes its exit while more signals may follow (srun's own, the USR1 the batch shell passes on). Before,
    a trap that fired while bash 5.2 read a command substitution broke the substitution ("trap: line 2: unexpected EOF
    while looking for matching `)'", or the shell aborted with "bad jump"), and a TERM could kill `date` or `uname`
    before they printed: a timed-out task's note lost its time and shifted its fields, and the job ended with 0
    (docs/traps.md). A signal caught just before the switch makes bash warn when it runs it ("run_pending_traps: bad
    value"): that is what the stderr to /dev/null is for."""
    killed = ('if [ "$code" -gt 128 ] && [ "$code" -ne 143 ]; then echo "[gpuscale] rank $SLURM_PROCID/$SLURM_NTASKS on $this_node '
              'was killed by SIG$(kill -l "$code" 2>/dev/null) (exit code $code)" >&3; fi; ')
    note = ('if [ -d "${' + EXIT_DIR + ':-}" ]; then '
            'echo "$(date +%s.%N) $code $SLURM_PROCID $this_node" 2>&3 > "$' + EXIT_DIR + '/task-$SLURM_PROCID"; fi; ')
    return (f"trap : USR1 TERM; {{ {program} 2>&3 3>&-; }} 3>&2 2>/dev/null; code=$?; "
            f"if [ \"$code\" -ne 0 ]; then {{ trap '' USR1 TERM; this_node=$(uname -n); {killed}{note}}} 3>&2 2>/dev/null; fi; "
            "exit \"$code\"")


def _exit_notes() -> list[str]:
    """The folder where the tasks note their exit codes, its clean-up, and the pick of the first failure."""
    return [
        "# The job ends with the first failing rank's own exit code. srun returns its tasks' highest, a victim's 143",
        "# once --kill-on-bad-exit ended the others (torchrun: 1 for any failure): every task notes its code, when it",
        "# ended and where, here, in a folder of this job's own (and of this run of it) that all its nodes see (the",
        "# submit directory's file system), and the earliest note wins. A rank of gpuscale notes there too whether its",
        "# error only says that a peer went away (rank-N.json): such a victim, and a task stopped with TERM (143), come",
        "# after the ranks that failed on their own.",
        'exit_dir="${SLURM_SUBMIT_DIR:-$PWD}/.gpuscale-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"',
        f'if rm -rf "$exit_dir" && mkdir -p "$exit_dir" 2>/dev/null; then export {EXIT_DIR}="$exit_dir" {FAILURE_DIR}="$exit_dir"; '
        'else exit_dir=""; fi',
        "# shellcheck disable=SC2317,SC2329  # called below",
        "first_failure() {",
        "    local note when code rank host victim",
        '    for note in "$exit_dir"/task-*; do',
        '        [ -e "$note" ] || continue',
        '        read -r when code rank host < "$note" || true',
        "        # A note cut short or garbled (its task killed while writing it) says nothing sure: leave it out.",
        '        [[ "$when" =~ ^[0-9]+([.][0-9]+)?$ && "$code" =~ ^[0-9]+$ && "$rank" =~ ^([0-9]+|-)$ && -n "$host" ]] || continue',
        "        # 0: a failure of its own; 1: the same error another rank printed (that one is named); 2: a victim",
        '        victim=0',
        "        if [ \"$code\" -eq 143 ] || grep -qs '\"symptom\": true' \"$exit_dir/rank-$rank.json\"; then victim=2;",
        "        elif grep -qs '\"repeat_of\": [0-9]' \"$exit_dir/rank-$rank.json\"; then victim=1; fi",
        '        echo "$victim $when $code $rank ${host:-?}"',
        "    done | sort -k1,1n -k2,2n | head -n 1",
        "}",
        "trap 'rm -rf \"$stop_dir\" ${exit_dir:+\"$exit_dir\"}' EXIT",
    ]


def stop_handling(private_tmp: bool = False) -> list[str]:
    """The lines before the step: the marker's folder, the tasks' exit notes' folder, the traps,
    and the wait that a trapped signal cannot cut short. `private_tmp`: the ranks run where /tmp is not the node's
    (enroot gives each container its own): the marker's folder is then in the job's folder, which they see."""
    exits = _exit_notes()
    where = ("# on it: gpuscale.StopSignal says so by creating GPUSCALE_STOP_MARKER, in a folder of this job's own in the",
             "# job's folder (each container's /tmp is its own; this folder is mounted in them). The step runs in the",
             "# background so this shell can react.") if private_tmp else (
             "# on it: gpuscale.StopSignal says so by creating GPUSCALE_STOP_MARKER, in a folder of this job's own on this",
             "# node's /tmp (the ranks here share it). The step runs in the background so this shell can react.")
    folder = '"${SLURM_SUBMIT_DIR:-$PWD}/.gpuscale-stop-$SLURM_JOB_ID.XXXXXX"' if private_tmp else '"/tmp/gpuscale-$SLURM_JOB_ID.XXXXXX"'
    return [
        "# Stopping in time. SLURM sends USR1 before the time limit (and TERM on scancel, preemption or at the limit).",
        "# USR1's default action ends a process, so it goes on to the step only if the script stops at a checkpoint",
        *where,
        f"stop_dir=$(mktemp -d {folder})",
        *exits,
        f'export {STOP_MARKER}="$stop_dir/stops-at-checkpoint"',
        'warned=""',
        'cancelled=""',
        'passed_on=""',
        'step_pid=""',
        "# shellcheck disable=SC2317,SC2329  # called by the traps below (0.9-0.10 say SC2317, 0.11 SC2329)",
        "on_signal() {",
        '    if [ "$1" = TERM ]; then cancelled=1; else warned=1; fi',
        '    if [ -n "$passed_on" ] || [ -z "$step_pid" ]; then return; fi',
        f'    if [ -e "{_MARKER}" ]; then',
        "        # USR1, even for TERM: srun turns a TERM into a KILL of every task; SLURM hands USR1 to every process of",
        "        # the step. Once only: a second signal would cut torchrun's own shutdown short.",
        '        echo "gpuscale: $1 received; passed on to the step, which stops at its next checkpoint" >&2',
        '        kill -USR1 "$step_pid" 2>/dev/null || true',
        "        passed_on=1",
        f'    elif [ "$1" = USR1 ] && [ -e "{own_usr1_marker(_MARKER)}" ]; then',
        "        # The script installed a SIGUSR1 handler of its own (Lightning's SLURM auto-requeue): it acts on the",
        "        # warning itself, and requeues the job itself if it does so.",
        '        echo "gpuscale: USR1 received; passed on to the step, whose script handles it with its own SIGUSR1 handler" >&2',
        '        kill -USR1 "$step_pid" 2>/dev/null || true',
        "        passed_on=1",
        '    elif [ "$1" = USR1 ]; then',
        f'        echo "{_NO_STOP_SIGNAL}" >&2',
        "    fi",
        "}",
        "trap 'on_signal USR1' USR1",
        "trap 'on_signal TERM' TERM",
        "wait_for_step() {",
        "    local code again",
        "    while :; do",
        '        code=0; wait "$step_pid" || code=$?',
        "        # A trapped signal ends `wait` early (128+n) while the step still runs: wait again.",
        '        if [ "$code" -gt 128 ]; then',
        '            if kill -0 "$step_pid" 2>/dev/null; then continue; fi',
        '            again=0; wait "$step_pid" || again=$?',
        '            if [ "$again" -ne 127 ]; then code=$again; fi',
        "        fi",
        '        return "$code"',
        "    done",
        "}",
    ]


def _first_failure_code() -> list[str]:
    """The lines that take the first failing rank's own exit code from the tasks' notes, and say whose it is."""
    return [
        "# The first failing rank's own exit code (its task's note), not the highest of all tasks (srun's).",
        'first=""',
        "# Through a file, not $(...), which a trap can break in bash 5.2 (task_exit_note), and in a subshell that ignores",
        "# USR1 and TERM, as its sort and head then do: SLURM signals every process of the job, and they would end unsaid.",
        f'if [ "$status" -ne 0 ] && [ -n "$exit_dir" ] && [ ! -e "{stopped_marker(_MARKER)}" ]; then '
        '( trap \'\' USR1 TERM; first_failure ) > "$exit_dir/first" || true; read -r first < "$exit_dir/first" || true; fi',
        'if [ -n "$first" ]; then',
        '    read -r first_victim _ first_code first_rank first_host <<< "$first"',
        '    who="rank $first_rank on $first_host"; [ "$first_rank" != - ] || who="torchrun on $first_host"',
        '    if [ "$first_victim" = 2 ] && [ "$first_code" -eq 143 ]; then',
        '        echo "gpuscale: the ranks were stopped with TERM (by SLURM: the time limit, scancel or preemption, as its line above says); '
        'the job ends with $first_code" >&2',
        f'    elif [ "$first_code" -eq {EXIT_STOPPED} ]; then',
        f'        echo "gpuscale: $who ended first, with exit code {EXIT_STOPPED} (srun: $status), which asks for the job to run again; '
        f'the job ends with {EXIT_STOPPED}" >&2',
        "    else",
        '        echo "gpuscale: $who failed first, with exit code $first_code (srun: $status); the job ends with $first_code" >&2',
        "    fi",
        '    status=$first_code',
        "fi",
    ]


def requeue_block(max_requeues: int) -> list[str]:
    """The lines after the step: wait for it, take the first failing rank's exit code, requeue it if it stopped at a
    checkpoint (not after TERM), exit."""
    lines = [
        "step_pid=$!",
        "status=0",
        "wait_for_step || status=$?",
        *_first_failure_code(),
        f"# Stopped at a checkpoint: {EXIT_STOPPED} from the ranks (srun passes it on), or their note beside the marker",
        f"# (torchrun reports its workers' {EXIT_STOPPED} as a failure, 1).",
        'stopped=""',
        f'if [ "$status" -eq {EXIT_STOPPED} ] || [ -e "{stopped_marker(_MARKER)}" ]; then '
        f"stopped=1; status={EXIT_STOPPED}; fi",
    ]
    resume = "submit the job again to resume from its checkpoint"
    if not max_requeues:
        return [*lines, 'if [ -n "$stopped" ]; then echo "gpuscale: the step stopped at a checkpoint; not requeued '
                f'(--max-requeues 0); {resume}" >&2; fi', 'exit "$status"']
    return [
        *lines,
        "# Only a step that stopped at a checkpoint is requeued, and never after TERM: scancel sends it, and a job",
        "# someone cancelled must stay cancelled (a preempting SLURM with PreemptMode=REQUEUE requeues it by itself).",
        'if [ -n "$stopped" ] && [ -n "$cancelled" ]; then',
        f'    echo "gpuscale: TERM received, the step stopped at a checkpoint; not requeued (scancel, preemption or the time limit); {resume}" >&2',
        'elif [ -n "$stopped" ] && [ "${SLURM_RESTART_COUNT:-0}" -lt ' + f"{max_requeues} ]; then",
        '    echo "gpuscale: the step stopped at a checkpoint; requeueing job $SLURM_JOB_ID '
        f'(restart $((${{SLURM_RESTART_COUNT:-0}} + 1)) of at most {max_requeues}) to resume from it" >&2',
        "    # SLURM ends the job's processes with TERM at the requeue, scontrol too if it has not exited yet: it ignores",
        "    # TERM, so its exit code stays its own and bash prints no \"Terminated\" for it.",
        '    ( trap "" TERM; exec scontrol requeue "$SLURM_JOB_ID" ) '
        '|| echo "gpuscale: could not requeue job $SLURM_JOB_ID (cancelled or timed out?); '
        f'{resume.replace("the job", "it")}" >&2',
        'elif [ -n "$stopped" ]; then',
        f'    echo "gpuscale: the step stopped at a checkpoint; job already requeued {max_requeues} times, not again; '
        f'{resume.replace("the job", "it")}" >&2',
        f'elif [ -n "$warned" ] && [ -n "$passed_on" ] && [ -e "{own_usr1_marker(_MARKER)}" ]; then',
        '    echo "gpuscale: the step ended with $status after its script handled SLURM\'s warning itself; '
        'gpuscale did not requeue it (the script may have)" >&2',
        'elif [ -n "$warned" ] && [ -n "$passed_on" ]; then',
        '    echo "gpuscale: the step ended with $status after SLURM\'s warning without stopping at a checkpoint; not requeued" >&2',
        "fi",
        'exit "$status"',
    ]
