#!/usr/bin/env bash
# make bench-peers' alternated rounds (docs/benchmarks.md › How to run):
# ROUNDS times, txmq-bench's tx, send and e2e at 16 producers and NATS's
# sync publishes at 16 with both fsync settings, one system right after
# the other, txmq first in odd rounds and NATS first in even ones. Round
# N's JSON lines go to DIR/round-N.json in the order they ran, for
# `peers --round`.
#
#	bash scripts/bench-rounds.sh ROUNDS DIR
#
# Runs from the repository's root with bin/txmq-bench, bin/broker and
# DIR/peers built (make bench-peers builds them). TXMQ_ROUND_DURATION sets
# each run's measured time (6s).
set -euo pipefail

rounds=${1:?usage: bench-rounds.sh ROUNDS DIR}
dir=${2:?usage: bench-rounds.sh ROUNDS DIR}
duration=${TXMQ_ROUND_DURATION:-6s}

txmq() { bin/txmq-bench --broker-bin bin/broker -o json --workloads tx,send,e2e --producers 16 --duration "$duration"; }
nats() { "$dir/peers" -o json --shapes sync-16 --duration "$duration"; }

for i in $(seq "$rounds"); do
	echo "# alternated round $i of $rounds" >&2
	if ((i % 2)); then
		{ txmq && nats; } >"$dir/round-$i.json"
	else
		{ nats && txmq; } >"$dir/round-$i.json"
	fi
done
