#!/usr/bin/env bash
# Hydra's launcher for "hosts" made of network namespaces (netns_hosts.sh): Hydra runs
#   launcher.sh -x HOST PROXY-COMMAND...
# as it would run ssh; this enters HOST's namespace, gives the proxy a UTS namespace with
# HOST as its host name (MPICH groups ranks into nodes by host name), and runs the command
# through a shell as sshd would.
set -eu
[ "${1:-}" = -x ] && shift
host=$1
shift
exec ip netns exec "$host" unshare --uts sh -c "hostname '$host' && exec $*"
