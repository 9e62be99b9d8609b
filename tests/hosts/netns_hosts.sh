# Several "hosts" on one machine, for tests: network namespaces joined by a bridge that
# lives in a namespace of its own, so no packet reaches this machine's own interfaces.
# Source it, then:
#   hosts_up N          make hosts $HOSTS_PREFIX-0 .. -(N-1) at 10.231.<id>.1..N/24; sets HOSTS
#                       (space-separated names); removes them on EXIT (also when a test fails)
#   hosts_mpiexec ARGS  mpiexec run on host 0 (its own host name), launching through
#                       launcher.sh into each host's namespace; killed after $HOSTS_TIMEOUT_S
#                       seconds (default 300). Between hosts, UCX is held to TCP
#                       (UCX_TLS=tcp,self unless set): the namespaces share one kernel and boot
#                       id, so UCX would otherwise reach the other "host" through shared memory
#                       and a link taken down would stop nothing. Ranks of one host still use
#                       MPICH's own shared memory, as on a real node.
#   hosts_exec0 CMD...  runs CMD on host 0 (its own host name), with the same limit and UCX
#                       setting (ferry launch --max-restarts --launcher-exec $HOSTS_DIR/launcher.sh)
#   host_link NAME up|down   takes a host's only link up or down
#   hosts_down          removes the namespaces and their /etc/netns files (idempotent)
#   hosts_can_run       exits 77 with the reason where namespaces cannot be made (not root,
#                       no `ip`, no `unshare`)
# Names are unique per shell (its pid), so two tests can run at once.
HOSTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HOSTS_PREFIX=${HOSTS_PREFIX:-fh$$}
HOSTS=""

hosts_can_run() {
  local why=""
  if [ "$(id -u)" != 0 ]; then why="not root";
  elif ! command -v ip >/dev/null; then why="no 'ip' (iproute2)";
  elif ! command -v unshare >/dev/null; then why="no 'unshare' (util-linux)";
  elif ! ip netns add "${HOSTS_PREFIX}-probe" 2>/dev/null; then why="'ip netns add' is not permitted here";
  else ip netns del "${HOSTS_PREFIX}-probe"; return 0; fi
  echo "SKIP: network namespaces cannot be made: $why"
  exit 77
}

hosts_down() {
  local ns
  for ns in $HOSTS "${HOSTS_PREFIX}-br"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  HOSTS=""
}

hosts_up() {
  local n=$1 i ns net=$(( ($$ % 250) + 1 ))
  trap hosts_down EXIT
  local br="${HOSTS_PREFIX}-br"
  ip netns add "$br"
  ip -n "$br" link add br0 type bridge
  ip -n "$br" link set br0 up
  local table="127.0.0.1 localhost"$'\n'
  for ((i = 0; i < n; i++)); do table+="10.231.$net.$((i + 1)) ${HOSTS_PREFIX}-$i"$'\n'; done
  for ((i = 0; i < n; i++)); do
    ns="${HOSTS_PREFIX}-$i"
    ip netns add "$ns"
    HOSTS+="${HOSTS:+ }$ns"
    ip link add eth0 netns "$ns" type veth peer name "v$i" netns "$br"
    ip -n "$br" link set "v$i" master br0 up
    ip -n "$ns" addr add "10.231.$net.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    mkdir -p "/etc/netns/$ns"
    printf '%s' "$table" > "/etc/netns/$ns/hosts"  # ip netns exec binds it over /etc/hosts
  done
}

host_link() { ip -n "${HOSTS_PREFIX}-br" link set "v${1##*-}" "$2"; }

hosts_exec0() {
  local first=${HOSTS%% *}
  UCX_TLS=${UCX_TLS:-tcp,self} timeout -k 5 "${HOSTS_TIMEOUT_S:-300}" ip netns exec "$first" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$first" "$@"
}

hosts_mpiexec() { hosts_exec0 mpiexec -launcher ssh -launcher-exec "$HOSTS_DIR/launcher.sh" "$@"; }
