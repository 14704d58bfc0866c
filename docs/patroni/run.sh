#!/usr/bin/env bash
# The failover run of docs/patroni.md: from nothing, in a temporary directory,
# a single-node etcd, two Patroni nodes (PostgreSQL 15, synchronous mode), the
# demo on a multi-host DATABASE_URL, refund traffic from load.go, a kill -9 of
# the primary's postmaster, Patroni's failover, and the checks. Everything it
# started is stopped on exit. As root, etcd, Patroni and PostgreSQL run as
# `nobody` (initdb refuses root), like internal/pgcluster's clusters.
#
#   docs/patroni/run.sh        # kill -9 the primary's postmaster; its Patroni fails over
#   docs/patroni/run.sh node   # kill -9 its Patroni too: the leader key expires after ttl
#
# KEEP=1 keeps the directory and its logs.
set -euo pipefail
mode=${1:-postgres}
case $mode in postgres | node) ;; *) echo "usage: run.sh [postgres|node]" >&2; exit 2 ;; esac

root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/docs/patroni
bindir=${PG_BINDIR:-/usr/lib/postgresql/15/bin}
for tool in etcd patroni jq curl python3 go; do
	command -v "$tool" >/dev/null || { echo "run.sh: $tool is missing (apt-get install patroni etcd-server jq curl)" >&2; exit 1; }
done

dir=$(mktemp -d /tmp/idemflow-patroni-XXXXXX)
chmod 755 "$dir"
as_server=()
if [ "$(id -u)" = 0 ]; then
	chown nobody:nogroup "$dir"
	as_server=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
fi
pids=()

cleanup() {
	set +e
	[ -n "${demo_pid:-}" ] && kill "$demo_pid" 2>/dev/null
	# Patroni stops its PostgreSQL when it is told to stop; etcd goes last.
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
	for _ in $(seq 100); do
		alive=0
		for pid in "${pids[@]}" ${demo_pid:-}; do kill -0 "$pid" 2>/dev/null && alive=1; done
		[ $alive = 0 ] && break
		sleep 0.2
	done
	for pid in "${pids[@]}" ${demo_pid:-}; do kill -9 "$pid" 2>/dev/null; done
	for node in node1 node2; do
		[ -f "$dir/$node/data/postmaster.pid" ] && "${as_server[@]}" "$bindir/pg_ctl" stop -m immediate -D "$dir/$node/data" >/dev/null 2>&1
	done
	if [ -n "${KEEP:-}" ]; then echo "kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

echo "building the demo and the load in $dir"
(cd "$root/cmd" && go build -o "$dir/demo" ./demo)
(cd "$root" && go build -o "$dir/load" docs/patroni/load.go)

etcd_client=$(free_port) etcd_peer=$(free_port)
"${as_server[@]}" etcd --name etcd1 --data-dir "$dir/etcd" \
	--listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
	--listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
	--initial-cluster "etcd1=http://127.0.0.1:$etcd_peer" >"$dir/etcd.log" 2>&1 &
pids=("$!")
until curl -sf "http://127.0.0.1:$etcd_client/health" >/dev/null; do sleep 0.2; done
echo "etcd $(etcd --version | head -1 | cut -d' ' -f3) on 127.0.0.1:$etcd_client"

declare -A pg_port rest_port patroni_pid
for node in node1 node2; do
	pg_port[$node]=$(free_port) rest_port[$node]=$(free_port)
	mkdir -m 700 "$dir/$node"
	sed -e "s|@NAME@|$node|; s|@DIR@|$dir/$node|g; s|@BINDIR@|$bindir|; s|@ETCD@|127.0.0.1:$etcd_client|" \
		-e "s|@PGPORT@|${pg_port[$node]}|g; s|@RESTPORT@|${rest_port[$node]}|g" "$here/patroni.yml.in" >"$dir/$node/patroni.yml"
	[ ${#as_server[@]} = 0 ] || chown -R nobody:nogroup "$dir/$node"
	HOME=$dir/$node "${as_server[@]}" patroni "$dir/$node/patroni.yml" >"$dir/$node/patroni.log" 2>&1 &
	patroni_pid[$node]=$!
	pids+=("$!")
	disown "$!" # no job notice when the run kills it
done

# Ready once one node leads and the other streams as its synchronous standby.
cluster() { curl -sf "http://127.0.0.1:${rest_port[${1:-node1}]}/cluster"; }
for i in $(seq 600); do
	leader=$(cluster | jq -r '.members[] | select(.role == "leader" and .state == "running") | .name' || true)
	standby=$(cluster | jq -r '.members[] | select(.role == "sync_standby" and (.state == "running" or .state == "streaming")) | .name' || true)
	[ -n "$leader" ] && [ -n "$standby" ] && break
	[ "$i" = 600 ] && { echo "run.sh: the Patroni cluster did not form" >&2; cluster >&2; exit 1; }
	sleep 0.5
done
echo "patroni $(patroni --version | cut -d' ' -f2): leader $leader (port ${pg_port[$leader]}), sync standby $standby (port ${pg_port[$standby]})"

DATABASE_URL="postgres://postgres@127.0.0.1:${pg_port[node1]},127.0.0.1:${pg_port[node2]}/postgres?sslmode=disable&target_session_attrs=read-write" \
	"$dir/demo" -addr 127.0.0.1:0 -reconcile-interval 0 >"$dir/demo.log" 2>&1 &
demo_pid=$!
for _ in $(seq 300); do
	demo_url=$(sed -n 's/.* listening on \(http[^ ]*\).*/\1/p' "$dir/demo.log" | head -1)
	[ -n "$demo_url" ] && break
	kill -0 "$demo_pid" 2>/dev/null || { echo "run.sh: the demo exited" >&2; cat "$dir/demo.log" >&2; exit 1; }
	sleep 0.2
done
[ -n "$demo_url" ] || { echo "run.sh: the demo did not listen" >&2; exit 1; }
echo "demo (pid $demo_pid) on $demo_url"

kill=$(head -1 "$dir/$leader/data/postmaster.pid")
echo "refunds for 5 s, then kill -9 of $leader's postmaster (pid $kill)"
if [ "$mode" = node ]; then
	kill=${patroni_pid[$leader]},$kill
	echo "and of $leader's Patroni (pid ${patroni_pid[$leader]})"
fi
status=0
"$dir/load" -url "$demo_url" -kill "$kill" \
	-promoted "http://127.0.0.1:${rest_port[$standby]}/primary" | tee "$dir/load.out" || status=$?
killed_at=$(sed -n 's/^killed .* at //p' "$dir/load.out")

if kill -0 "$demo_pid" 2>/dev/null; then
	echo "the demo served throughout: same process (pid $demo_pid), never restarted"
else
	echo "run.sh: the demo exited" >&2
	status=1
fi
# The old primary's Patroni, when it lives, rewinds it and starts it as a
# standby of the new one.
for _ in $(seq 120); do
	[ "$mode" = node ] && break
	[ "$(cluster "$standby" | jq '[.members[] | select(.state == "running" or .state == "streaming")] | length')" = 2 ] && break
	sleep 0.5
done
echo "Patroni after the failover:"
cluster "$standby" | jq -r '.members[] | "  \(.name) \(.role) \(.state) timeline \(.timeline // "-")"'
echo "what Patroni and PostgreSQL logged from the kill on (UTC):"
for node in node1 node2; do
	grep -E "^[0-9-]+ [0-9:]+[,.][0-9]+ " "$dir/$node/patroni.log" | sed -E "s/^([0-9-]+ [0-9:]+),/\1./; s/^([0-9-]+ [0-9:.]+) (UTC )?/\1 $node /"
done | sort | awk -v k="$killed_at" 'substr($0, 1, 23) >= k' |
	grep -E "Error communicating with PostgreSQL|Postgresql is not running|Primary crashed|Leader key released|promoted self|ready to accept connections|stopped PostgreSQL" | sed 's/^/  /' || true
exit $status
