#!/usr/bin/env bash
# Runs a local three-node txmq cluster on loopback, for trying failover and
# for benchmarks. `make cluster` runs it.
#
# usage: scripts/cluster.sh [--fresh] [--tls]
#
#   --fresh   delete the nodes' data, logs and pid files first (a new cluster)
#   --tls     serve TLS with client certificates required, and mutual TLS
#             between the nodes, with throwaway certificates that
#             `go run ./scripts/gencerts` writes to $TXMQ_CLUSTER_DIR/tls
#             (a CA, n1..n3 and operator; made again with --fresh)
#
# It builds bin/broker and bin/brokerctl, then starts:
#
#   node  gRPC            Raft            metrics (/metrics, /healthz, /readyz)
#   n1    127.0.0.1:7420  127.0.0.1:7421  127.0.0.1:7422
#   n2    127.0.0.1:7430  127.0.0.1:7431  127.0.0.1:7432
#   n3    127.0.0.1:7440  127.0.0.1:7441  127.0.0.1:7442
#
# all with --peers n1=127.0.0.1:7421,n2=127.0.0.1:7431,n3=127.0.0.1:7441.
# Data goes to $TXMQ_CLUSTER_DIR/n1..n3 (default ./txmq-cluster), each
# node's output to $TXMQ_CLUSTER_DIR/nN.log and its PID to nN.pid. Once
# `brokerctl cluster status` shows three nodes with their gRPC addresses and
# a leader (at most 30 s, else it prints the logs' tails and exits 1), it
# prints a line
#
#   ready: TXMQ_ADDR=127.0.0.1:7420,127.0.0.1:7430,127.0.0.1:7440
#
# and waits. Point clients at that list, e.g.
#
#   export TXMQ_ADDR=127.0.0.1:7420,127.0.0.1:7430,127.0.0.1:7440
#   bin/brokerctl cluster status
#
# Ctrl-C (SIGINT), SIGTERM or any exit of the script stops the three brokers
# by their PIDs: SIGTERM, up to 15 s to shut down, then SIGKILL. Run again
# without --fresh to restart the same cluster with its data; it refuses to
# start while the pid files name brokers still running. A node killed while
# the script runs is reported and not restarted.
#
# Environment: TXMQ_CLUSTER_DIR (data directory), GO (go command, default go).
set -euo pipefail

usage() {
	sed -n '/^# usage:/,/^# Environment:/s/^# \{0,1\}//p' "$0"
}

fresh=false
use_tls=false
for arg in "$@"; do
	case $arg in
	--fresh) fresh=true ;;
	--tls) use_tls=true ;;
	-h | --help)
		usage
		exit 0
		;;
	*)
		echo "cluster.sh: unknown argument ${arg}" >&2
		usage >&2
		exit 2
		;;
	esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${TXMQ_CLUSTER_DIR:-./txmq-cluster}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
go_cmd=${GO:-go}
broker=$root/bin/broker
brokerctl=$root/bin/brokerctl

ids=(n1 n2 n3)
grpc_addrs=(127.0.0.1:7420 127.0.0.1:7430 127.0.0.1:7440)
raft_addrs=(127.0.0.1:7421 127.0.0.1:7431 127.0.0.1:7441)
metrics_addrs=(127.0.0.1:7422 127.0.0.1:7432 127.0.0.1:7442)
peers=n1=${raft_addrs[0]},n2=${raft_addrs[1]},n3=${raft_addrs[2]}
addr_list=${grpc_addrs[0]},${grpc_addrs[1]},${grpc_addrs[2]}
ready_timeout=30 # seconds
stop_timeout=15  # seconds

pids=()    # broker PIDs, by node index; "" once it exited
sleeper="" # PID of the sleep the main loop waits on

# alive tells whether PID still runs. A broker that exited is reaped by
# bash at its next external command, after which kill -0 fails.
alive() {
	kill -0 "$1" 2>/dev/null
}

# ours tells whether PID is a child of this script, so that a PID recycled
# by the system after a broker exited is never signalled.
ours() {
	local ppid
	ppid=$(ps -o ppid= -p "$1" 2>/dev/null) || return 1
	[[ ${ppid// /} == "$$" ]]
}

# stop_all sends SIGTERM to every broker still running, waits up to
# stop_timeout seconds for them to exit, then sends SIGKILL to what is left.
stop_all() {
	local i pid left deadline
	for i in "${!pids[@]}"; do
		pid=${pids[$i]}
		if [[ -n $pid ]] && ours "$pid"; then
			echo "stopping ${ids[$i]} (pid ${pid})"
			kill -TERM "$pid" 2>/dev/null || true
		fi
	done
	deadline=$((SECONDS + stop_timeout))
	while ((SECONDS < deadline)); do
		left=0
		for pid in "${pids[@]}"; do
			if [[ -n $pid ]] && alive "$pid"; then
				left=$((left + 1))
			fi
		done
		if ((left == 0)); then
			break
		fi
		sleep 0.1
	done
	for i in "${!pids[@]}"; do
		pid=${pids[$i]}
		[[ -n $pid ]] || continue
		if alive "$pid" && ours "$pid"; then
			echo "${ids[$i]} (pid ${pid}) did not stop within ${stop_timeout}s: SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
		wait "$pid" 2>/dev/null || true
		rm -f "${dir}/${ids[$i]}.pid"
		pids[i]=""
	done
}

cleanup() {
	local status=$?
	trap '' INT TERM
	trap - EXIT
	if [[ -n $sleeper ]]; then
		kill "$sleeper" 2>/dev/null || true
		wait "$sleeper" 2>/dev/null || true
	fi
	if ((${#pids[@]} > 0)); then
		stop_all
		echo "cluster stopped"
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

tails() {
	local id
	for id in "${ids[@]}"; do
		echo "--- last lines of ${dir}/${id}.log" >&2
		tail -n 20 "${dir}/${id}.log" >&2 || true
	done
}

# Refuse to start over a cluster that runs from the same directory: its pid
# files name live brokers.
for id in "${ids[@]}"; do
	pidfile=${dir}/${id}.pid
	if [[ -f $pidfile ]]; then
		old=$(<"$pidfile")
		if [[ $old =~ ^[0-9]+$ ]] && kill -0 "$old" 2>/dev/null &&
			[[ "$(ps -o args= -p "$old" 2>/dev/null)" == "${broker} "* ]]; then
			echo "cluster.sh: ${id} of a cluster in ${dir} is still running (pid ${old}); stop that one first" >&2
			exit 1
		fi
		rm -f "$pidfile"
	fi
done

if $fresh; then
	echo "--fresh: deleting the nodes' data and logs in ${dir}"
	for id in "${ids[@]}"; do
		rm -rf "${dir:?}/${id}" "${dir}/${id}.log" "${dir}/${id}.pid"
	done
	rm -rf "${dir:?}/tls"
fi

# With --tls, brokerctl's flags (also printed at the end) and each node's.
ctl_tls=()
node_tls() { :; }
if $use_tls; then
	tls_dir=${dir}/tls
	if [[ ! -f ${tls_dir}/ca.pem ]]; then
		echo "--tls: writing throwaway certificates to ${tls_dir}"
		(cd "$root" && "$go_cmd" run ./scripts/gencerts -dir "$tls_dir" "${ids[@]}" operator)
	fi
	ctl_tls=(--tls-ca "${tls_dir}/ca.pem" --tls-cert "${tls_dir}/operator.pem" --tls-key "${tls_dir}/operator-key.pem")
	node_tls() {
		echo --tls-cert "${tls_dir}/$1.pem" --tls-key "${tls_dir}/$1-key.pem" \
			--tls-client-ca "${tls_dir}/ca.pem" --tls-client-auth require
	}
fi

echo "building bin/broker and bin/brokerctl"
(cd "$root" && "$go_cmd" build -o bin/broker ./cmd/broker && "$go_cmd" build -o bin/brokerctl ./cmd/brokerctl)

for i in "${!ids[@]}"; do
	id=${ids[$i]}
	# shellcheck disable=SC2046 # node_tls prints flags and paths without spaces
	"$broker" --data "${dir}/${id}" --node-id "$id" \
		--listen "${grpc_addrs[$i]}" --raft-listen "${raft_addrs[$i]}" \
		--metrics-listen "${metrics_addrs[$i]}" --peers "$peers" $(node_tls "$id") >>"${dir}/${id}.log" 2>&1 &
	pids[i]=$!
	echo "${pids[$i]}" >"${dir}/${id}.pid"
done

# Wait for n1 to see three voters with their gRPC addresses, and a leader.
deadline=$((SECONDS + ready_timeout))
leader=""
while :; do
	for i in "${!ids[@]}"; do
		if ! alive "${pids[$i]}"; then
			echo "cluster.sh: ${ids[$i]} (pid ${pids[$i]}) exited during start-up" >&2
			pids[i]=""
			tails
			exit 1
		fi
	done
	status_json=$("$brokerctl" --addr "${grpc_addrs[0]}" "${ctl_tls[@]}" --timeout 2s -o json cluster status 2>/dev/null) || status_json=""
	nodes=$(grep -o '"grpc_address":"[^"][^"]*"' <<<"$status_json" | wc -l | tr -d ' ') || nodes=0
	leader=$(grep -o '"leader_id":"[^"]*"' <<<"$status_json" | cut -d'"' -f4) || leader=""
	if [[ $nodes == 3 && -n $leader ]]; then
		break
	fi
	if ((SECONDS >= deadline)); then
		echo "cluster.sh: no cluster of 3 nodes with a leader within ${ready_timeout}s" >&2
		tails
		exit 1
	fi
	sleep 0.5
done

echo
printf '%-4s  %-15s  %-15s  %-7s  %s\n' node gRPC Raft pid log
for i in "${!ids[@]}"; do
	printf '%-4s  %-15s  %-15s  %-7s  %s\n' "${ids[$i]}" "${grpc_addrs[$i]}" "${raft_addrs[$i]}" "${pids[$i]}" "${dir}/${ids[$i]}.log"
done
echo "leader: ${leader}; data in ${dir}"
echo
echo "ready: TXMQ_ADDR=${addr_list}"
echo "(e.g. TXMQ_ADDR=${addr_list} bin/brokerctl ${ctl_tls[*]} cluster status; Ctrl-C stops the cluster)"

# Report brokers that exit; stop when all have, or on a signal (the sleep
# is waited on so that a signal is handled at once).
while :; do
	running=0
	for i in "${!ids[@]}"; do
		pid=${pids[$i]}
		[[ -n $pid ]] || continue
		if alive "$pid"; then
			running=$((running + 1))
		else
			code=0
			wait "$pid" 2>/dev/null || code=$?
			echo "${ids[$i]} (pid ${pid}) exited with status ${code}" >&2
			rm -f "${dir}/${ids[$i]}.pid"
			pids[i]=""
		fi
	done
	if ((running == 0)); then
		echo "cluster.sh: every broker has exited" >&2
		exit 1
	fi
	sleep 1 &
	sleeper=$!
	wait "$sleeper" 2>/dev/null || true
	sleeper=""
done
