#!/usr/bin/env bash
# stop.sh - stop the local SLURM cluster that start.sh brought up. Idempotent; run as root.
#
#   scripts/local-slurm/stop.sh [--purge]
#
# Cancels every job, shuts down slurmctld and the slurmd(s), kills what survives (a slurmd can
# wedge; orphaned slurmstepd and job processes), removes the node namespaces and the bridge, and
# stops munged if start.sh started it. State under $GPUSCALE_SLURM_PREFIX (default
# /tmp/gpuscale-slurm) is kept, so the next start.sh keeps job ids and finished jobs; --purge
# deletes the whole prefix instead.
# shellcheck disable=SC2086,SC2046  # lists of pids and job ids are split into words on purpose
set -uo pipefail

T0=$(date +%s.%N)
PREFIX=${GPUSCALE_SLURM_PREFIX:-/tmp/gpuscale-slurm}
CONF=$PREFIX/etc/slurm.conf
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH

log() { awk -v a="$T0" -v b="$(date +%s.%N)" -v m="$*" 'BEGIN { printf "[local-slurm stop  %5.1fs] %s\n", b - a, m }' >&2; }
# a zombie is not alive (PID 1 on some CI VMs reaps slowly)
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
# TERM the given pids, wait up to $1 seconds, then KILL the survivors
term_then_kill() {
  local secs=$1; shift; local left="$*"
  [ -n "${left// /}" ] || return 0
  kill -TERM $left 2>/dev/null
  for ((t = 0; t < secs * 10; t++)); do
    left=$(for p in $left; do alive "$p" && echo "$p"; done)
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  log "still alive after ${secs}s, sending KILL:" $left
  kill -KILL $left 2>/dev/null
}

[ "$(id -u)" = 0 ] || { log "run as root"; exit 1; }

# 1. Through SLURM first: cancelling jobs ends their slurmstepd cleanly (otherwise they outlive
#    slurmd, and the saved state still calls the jobs RUNNING at the next start).
if [ -f "$CONF" ] && SLURM_CONF=$CONF timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; then
  export SLURM_CONF=$CONF
  jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    log "cancelling jobs $jobs"
    scancel $jobs 2>/dev/null
    # KillWait is 10 s: a job that ignores SIGTERM is gone after that, unless its node's slurmd
    # is dead (then it stays COMPLETING forever and step 3 below kills its processes)
    for _ in $(seq 75); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  log "scontrol shutdown"
  scontrol shutdown >/dev/null 2>&1
fi

# 2. Daemons by pid file (also covers a dead slurmctld, where 'scontrol shutdown' cannot reach them)
pids=$(cat "$PREFIX"/run/slurmctld.pid "$PREFIX"/run/slurmd-*.pid 2>/dev/null | tr '\n' ' ')
term_then_kill 10 $(for p in $pids; do alive "$p" && echo "$p"; done)
rm -f "$PREFIX"/run/slurmctld.pid "$PREFIX"/run/slurmd-*.pid

# 3. Leftovers, ours only: every process inside a node namespace, and slurm daemons or steps
#    that mention our prefix (config path on the command line, or an open log file), plus all
#    their descendants (the job processes of an orphaned slurmstepd).
ours=$(
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^gpuscale-/ { print $1 }'); do ip netns pids "$ns"; done
  for p in /proc/[0-9]*; do
    case $(cat "$p/comm" 2>/dev/null) in slurmctld|slurmd|slurmstepd) ;; *) continue ;; esac
    if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "$PREFIX/"; then echo "${p#/proc/}"; continue; fi
    for fd in "$p"/fd/*; do
      if [[ $(readlink "$fd" 2>/dev/null) == "$PREFIX"/* ]]; then echo "${p#/proc/}"; break; fi
    done
  done
)
if [ -n "$ours" ]; then
  tree=$(ps -eo pid=,ppid= | awk -v roots="$ours" '
    { kids[$2] = kids[$2] " " $1 }
    END { n = split(roots, q); for (i = 1; i <= n; i++) { if (seen[q[i]]++) continue; print q[i];
                                  m = split(kids[q[i]], k, " "); for (j = 1; j <= m; j++) q[++n] = k[j] } }')
  tree=$(for p in $tree; do alive "$p" && echo "$p"; done | tr '\n' ' ')
  if [ -n "${tree// /}" ]; then log "killing leftover processes: $tree"; term_then_kill 3 $tree; fi
fi

# 4. Network: namespaces, then the bridge. Deleting a namespace removes its veth asynchronously,
#    so wait, or an immediate start.sh could find the old veth name still taken.
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^gpuscale-/ { print $1 }'); do
  log "deleting netns $ns"; ip netns del "$ns"
done
if ip link show gpuscale-br >/dev/null 2>&1; then log "deleting bridge gpuscale-br"; ip link del gpuscale-br; fi
for _ in $(seq 50); do ip -o link show 2>/dev/null | grep -q ' gs-n[0-9]*@' || break; sleep 0.1; done

# 5. munged, only if start.sh started it (someone else's munged is not ours to stop)
if [ "${GPUSCALE_SLURM_KEEP_MUNGE:-0}" != 1 ] && [ -e "$PREFIX/run/munged.ours" ]; then
  pid=$(cat /run/munge/munged.pid 2>/dev/null)
  if [ -n "$pid" ] && alive "$pid"; then log "stopping munged"; term_then_kill 10 "$pid"; fi
  rm -f "$PREFIX/run/munged.ours"
fi

if [ "${1:-}" = --purge ]; then log "deleting $PREFIX"; rm -rf "$PREFIX"; fi
log "stopped"
