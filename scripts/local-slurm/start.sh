#!/usr/bin/env bash
# start.sh - bring up a real, local SLURM cluster (Debian 12, slurm-wlm 22.05) for gpuscale's
# SLURM tests and for trying the SLURM path on a laptop or CI machine. Run as root.
#
#   scripts/local-slurm/start.sh [two|single]
#   . /tmp/gpuscale-slurm/env.sh && sinfo && srun -N2 hostname
#
# Layouts (first argument, else $GPUSCALE_SLURM_LAYOUT, else "two"):
#   two     nodes n1 and n2. Each slurmd runs in its own network, UTS and mount namespace: own
#           hostname, own address (10.99.0.11, 10.99.0.12) on the bridge gpuscale-br, and a private
#           /etc/hosts so that n1, n2 and the controller resolve inside jobs. slurmctld stays in the
#           root namespace at 10.99.0.1. Falls back to "single" when namespaces cannot be made.
#   single  one node named after this host, at 127.0.0.1.
# Every node gets all detected CPUs (real binding through task/affinity) and $GPUSCALE_SLURM_GPUS
# fake GPUs (default 2): GRES on character devices, so CUDA_VISIBLE_DEVICES & co. are set as on a
# real cluster. Partition "debug" (default, all nodes, MaxTime 60 min, enforced at submit), and
# "load" on the same nodes, where up to 4 jobs share a CPU (OverSubscribe=FORCE:4; load tests).
# Nodes share this host's filesystem and run jobs as root; jobs inherit the submitter's
# environment (PATH included), so the submitter's python3 runs in jobs.
#
# Idempotent: with the same config and every daemon up it only checks and exits (well under a second);
# a dead daemon is restarted keeping state; a changed config stops everything and wipes state.
# Everything lives under $GPUSCALE_SLURM_PREFIX (default /tmp/gpuscale-slurm); /etc/slurm is not
# touched. Clients need SLURM_CONF, which $PREFIX/env.sh exports. stop.sh undoes all of this.
set -euo pipefail

T0=$(date +%s.%N)
PREFIX=${GPUSCALE_SLURM_PREFIX:-/tmp/gpuscale-slurm}
LAYOUT=${1:-${GPUSCALE_SLURM_LAYOUT:-two}}
GPUS=${GPUSCALE_SLURM_GPUS:-2}
NET=10.99.0                 # two layout: bridge at .1, node i at .(10+i)
BRIDGE=gpuscale-br
CONF=$PREFIX/etc/slurm.conf
HERE=$(dirname "$(readlink -f "$0")")
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH

log() { awk -v a="$T0" -v b="$(date +%s.%N)" -v m="$*" 'BEGIN { printf "[local-slurm start %5.1fs] %s\n", b - a, m }' >&2; }
die() { log "ERROR: $*"; exit 1; }
# "alive" must read the state field: PID 1 on some CI VMs reaps slowly, leaving killed daemons as zombies
alive() { local pid; pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] \
  && [ "$(awk '{print $3}' "/proc/$pid/stat")" != Z ]; }

case $LAYOUT in -h|--help) sed -n '2,/^set -e/{/^set -e/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
[ "$(id -u)" = 0 ] || die "run as root (sudo $0)"
case $LAYOUT in two|single) ;; *) die "unknown layout '$LAYOUT' (valid: two, single)" ;; esac
[[ $GPUS =~ ^[0-9]+$ ]] || die "GPUSCALE_SLURM_GPUS must be a number, got '$GPUS'"

# ---- 1. packages: only what is missing; apt-get update only when the lists are missing or stale
missing=()
for x in slurmctld:slurmctld slurmd:slurmd sinfo:slurm-client munged:munge; do
  command -v "${x%%:*}" >/dev/null || missing+=("${x#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_install() { apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
  apt-cache show "${missing[@]}" >/dev/null 2>&1 || apt-get update -qq
  apt_install 2>/dev/null || { apt-get update -qq && apt_install; }
fi

# ---- 2. munge (the postinst creates the key; policy-rc.d / no systemd means nobody starts it)
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 600 /etc/munge/munge.key
  install -d -o munge -g munge -m 755 /run/munge
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged
  mkdir -p "$PREFIX/run" && touch "$PREFIX/run/munged.ours"   # stop.sh stops it only if we started it
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munged does not work"
fi

# ---- 3. layout: can this machine make network namespaces and a bridge? (needs CAP_SYS_ADMIN/NET_ADMIN)
if [ "$LAYOUT" = two ] && ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  if ip netns add gpuscale-probe 2>/dev/null && ip link add gpuscale-probe type bridge 2>/dev/null; then
    ip link del gpuscale-probe; ip netns del gpuscale-probe
  else
    ip netns del gpuscale-probe 2>/dev/null || true
    log "cannot create network namespaces or a bridge here: falling back to the single layout"
    LAYOUT=single
  fi
fi
HOST=$(hostname -s)
if [ "$LAYOUT" = two ]; then NODES="n1 n2"; CTLD_ADDR=$NET.1; else NODES=$HOST; CTLD_ADDR=127.0.0.1; fi
NUM_NODES=$(wc -w <<<"$NODES")

# ---- 4. config, written to etc.new and compared with the running one
HW=$(slurmd -C | head -1)   # "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=..."
hw() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$HW"; }
TOPO="CPUs=$(hw CPUs) Boards=$(hw Boards) SocketsPerBoard=$(hw SocketsPerBoard) CoresPerSocket=$(hw CoresPerSocket) ThreadsPerCore=$(hw ThreadsPerCore)"
MEM=$(( $(hw RealMemory) * 9 / 10 / NUM_NODES ))   # nodes share RAM; leave some to the host
NEW=$PREFIX/etc.new
rm -rf "$NEW" && mkdir -p "$NEW" "$PREFIX"/{etc,state/ctld,log,run}
{
  cat <<EOF
# Generated by gpuscale scripts/local-slurm/start.sh (layout=$LAYOUT). Do not edit: rerun start.sh.
ClusterName=gpuscale
SlurmctldHost=$HOST($CTLD_ADDR)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$PREFIX/state/ctld
SlurmdSpoolDir=$PREFIX/state/slurmd-%n
SlurmctldPidFile=$PREFIX/run/slurmctld.pid
SlurmdPidFile=$PREFIX/run/slurmd-%n.pid
SlurmctldLogFile=$PREFIX/log/slurmctld.log
SlurmdLogFile=$PREFIX/log/slurmd-%n.log
# no cgroup tracking or confinement; task/affinity still binds tasks to CPUs for real
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
# no accounting (sacct needs slurmdbd): finished jobs stay in 'scontrol show job' for a day instead
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=86400
# TERM -> KILL after 10 s (default 30) so cancel/timeout tests are quick
KillWait=10
# reject a job over the partition's limits at submission, as production clusters do
EnforcePartLimits=ALL
MailProg=/bin/true
EOF
  [ "$GPUS" -gt 0 ] && echo "GresTypes=gpu"
  i=0
  for n in $NODES; do
    i=$((i + 1))
    gres=""; [ "$GPUS" -gt 0 ] && gres=" Gres=gpu:$GPUS"
    if [ "$LAYOUT" = two ]; then addr="NodeHostname=$n NodeAddr=$NET.$((10 + i))"; else addr="NodeAddr=127.0.0.1"; fi
    echo "NodeName=$n $addr $TOPO RealMemory=$MEM$gres State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=60 State=UP"
  # for load tests: the same nodes, but up to 4 jobs may share each CPU (GPUs are never shared)
  echo "PartitionName=load Nodes=ALL MaxTime=60 State=UP OverSubscribe=FORCE:4"
} >"$NEW/slurm.conf"
# Fake GPUs: slurmd insists on character devices, so each is a copy of /dev/null (c 1 3).
{
  echo "AutoDetect=off"
  if [ "$GPUS" -gt 0 ]; then
    for n in $NODES; do
      files=$PREFIX/fakegpu/$n/nvidia0; [ "$GPUS" -gt 1 ] && files="$PREFIX/fakegpu/$n/nvidia[0-$((GPUS - 1))]"
      echo "NodeName=$n Name=gpu File=$files"
    done
  fi
} >"$NEW/gres.conf"
# two layout: the /etc/hosts every node sees (bind-mounted in its mount namespace). Each address also in its
# IPv4-mapped IPv6 form: torch's c10d store names a client by that form, and without an entry the lookup goes
# to DNS, which fails here ("[c10d] The hostname of the client socket cannot be retrieved", one line per rank).
if [ "$LAYOUT" = two ]; then
  { printf '127.0.0.1 localhost\n::1 localhost\n::ffff:127.0.0.1 localhost\n%s %s\n::ffff:%s %s\n' "$NET.1" "$HOST" "$NET.1" "$HOST"
    i=0; for n in $NODES; do i=$((i + 1)); echo "$NET.$((10 + i)) $n"; echo "::ffff:$NET.$((10 + i)) $n"; done; } >"$NEW/hosts"
fi
# slurmd initialises its cgroup plugin even without cgroup plugins configured; on a pure cgroup v2
# host outside systemd this should keep it from failing (UNTESTED: our machines are cgroup v1).
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
  printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemdOnFailure=yes\nCgroupAutomount=yes\n' >"$NEW/cgroup.conf"
fi

nodes_alive() { for n in $NODES; do alive "$PREFIX/run/slurmd-$n.pid" || return 1; done; }
ctld_up() { SLURM_CONF=$CONF timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; }
if diff -r "$PREFIX/etc" "$NEW" >/dev/null 2>&1 && alive "$PREFIX/run/slurmctld.pid" && nodes_alive && ctld_up; then
  log "already running with this config"
  rm -rf "$NEW"
else
  if ! diff -r "$PREFIX/etc" "$NEW" >/dev/null 2>&1; then
    if [ -e "$CONF" ]; then log "config changed: stopping the old cluster and wiping its state"; fi
    GPUSCALE_SLURM_PREFIX=$PREFIX GPUSCALE_SLURM_KEEP_MUNGE=1 "$HERE/stop.sh"
    rm -rf "${PREFIX:?}/state" "${PREFIX:?}/etc" "${PREFIX:?}/fakegpu"
    mkdir -p "$PREFIX/state/ctld"
    mv "$NEW" "$PREFIX/etc"
  else
    rm -rf "$NEW"
  fi
  for n in $NODES; do
    mkdir -p "$PREFIX/state/slurmd-$n" "$PREFIX/fakegpu/$n"
    for ((g = 0; g < GPUS; g++)); do
      [ -c "$PREFIX/fakegpu/$n/nvidia$g" ] || mknod "$PREFIX/fakegpu/$n/nvidia$g" c 1 3
    done
  done

  # ---- 5. two layout: bridge + one namespace per node, joined by a veth pair
  if [ "$LAYOUT" = two ]; then
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
      ip link add "$BRIDGE" type bridge
      ip addr add "$NET.1/24" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
    i=0
    for n in $NODES; do
      i=$((i + 1))
      ip netns list | grep -qw "gpuscale-$n" && continue
      ip netns add "gpuscale-$n"
      ip link add "gs-$n" type veth peer name eth0 netns "gpuscale-$n"
      ip link set "gs-$n" master "$BRIDGE" up
      ip -n "gpuscale-$n" addr add "$NET.$((10 + i))/24" dev eth0
      ip -n "gpuscale-$n" link set eth0 up
      ip -n "gpuscale-$n" link set lo up
    done
    # Docker-style hosts (FORWARD policy DROP + br_netfilter) would drop traffic between the nodes
    if command -v iptables >/dev/null && iptables -S FORWARD 2>/dev/null | grep -q -- '-P FORWARD DROP'; then
      iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null \
        || iptables -I FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
    fi
  fi

  # ---- 6. daemons (both daemonise themselves)
  if ! alive "$PREFIX/run/slurmctld.pid"; then
    log "starting slurmctld"
    slurmctld -f "$CONF"
  fi
  for _ in $(seq 100); do ctld_up && break; sleep 0.1; done
  for n in $NODES; do
    alive "$PREFIX/run/slurmd-$n.pid" && continue
    log "starting slurmd $n"
    if [ "$LAYOUT" = two ]; then
      # nsenter, not 'ip netns exec': that remounts /sys, hiding /sys/fs/cgroup, and slurmd dies.
      # A private mount namespace lets this node alone see its /etc/hosts; UTS gives its hostname.
      # shellcheck disable=SC2016  # $1.. expand in the inner sh
      nsenter --net="/run/netns/gpuscale-$n" unshare --uts --mount --propagation private \
        sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && exec slurmd -f "$3" -N "$2"' \
        sh "$PREFIX/etc/hosts" "$n" "$CONF"
    else
      slurmd -f "$CONF" -N "$n"
    fi
  done
fi

# ---- 7. wait until every node takes jobs (resume nodes left down by an earlier run)
export SLURM_CONF=$CONF
for ((t = 0; ; t++)); do
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null || true)
  [ -n "$states" ] && ! awk '$2 !~ /^(idle|mix|alloc|comp)$/ { bad = 1 } END { exit !bad }' <<<"$states" && break
  # shellcheck disable=SC2013  # node names have no spaces
  for n in $(awk '$2 ~ /^(down|drain|drng)/ { print $1 }' <<<"$states"); do
    scontrol update nodename="$n" state=resume 2>/dev/null || true
  done
  if [ "$t" -ge 300 ]; then
    log "nodes not ready after 60 s:"; echo "$states" >&2
    tail -n 5 "$PREFIX"/log/*.log >&2
    exit 1
  fi
  sleep 0.2
done

cat >"$PREFIX/env.sh" <<EOF
# Source this to use the local cluster: . $PREFIX/env.sh
export SLURM_CONF=$CONF
export GPUSCALE_SLURM_PREFIX=$PREFIX
export GPUSCALE_SLURM_LAYOUT=$LAYOUT
EOF
sinfo -N -o '%N %P %t %c %m %G %l' >&2
log "ready: layout=$LAYOUT nodes='$NODES'; now run: . $PREFIX/env.sh"
