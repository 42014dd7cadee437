#!/usr/bin/env bash
# Installs PostgreSQL and MariaDB from Debian's packages, starts one server
# of each on loopback with its data in DIR, and prints the DSNs the database
# tests read, as export lines for eval:
#
#	eval "$(bash scripts/ci-databases.sh start "$dir")"
#	bash scripts/ci-databases.sh stop "$dir"
#
# Runs as root (apt-get); each server runs as its own system user, as
# PostgreSQL refuses root. Everything else goes to stderr.
set -euo pipefail

cmd=${1:?usage: ci-databases.sh start|stop DIR}
dir=${2:?usage: ci-databases.sh start|stop DIR}
# Below Linux's ephemeral range (32768-60999 by default), so that no
# outgoing connection of another process can hold the port when a server
# starts.
pg_port=${TXMQ_PG_PORT:-25432}
my_port=${TXMQ_MY_PORT:-23306}

log() { echo "ci-databases: $*" >&2; }

install() {
	local missing=()
	command -v mariadb-install-db >/dev/null || missing+=(mariadb-server mariadb-client)
	ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || missing+=(postgresql)
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing ${missing[*]}"
		apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
	fi
	# The Debian packages start their default clusters; the tests use their
	# own servers, so those may stay or go.
}

pg_bin() { ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1; }

start_postgres() {
	local bin; bin=$(pg_bin)
	mkdir -p "$dir/pg"
	chown postgres:postgres "$dir/pg"
	runuser -u postgres -- "$bin/initdb" -D "$dir/pg/data" --auth=trust -U postgres >"$dir/pg/initdb.log" 2>&1
	if ! runuser -u postgres -- "$bin/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/server.log" -w -t 60 start \
		-o "-c listen_addresses=127.0.0.1 -p $pg_port -k $dir/pg -c fsync=off -c max_connections=200" >&2; then
		# The log goes with the run's temporary directory: show it here.
		log "PostgreSQL did not start:"
		tail -20 "$dir/pg/server.log" >&2
		exit 1
	fi
	"$bin/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -v ON_ERROR_STOP=1 -q \
		-c "CREATE USER txmq PASSWORD 'txmq' CREATEDB" -c "CREATE DATABASE txmq_test OWNER txmq" >&2
	log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$pg_port"
}

start_mariadb() {
	mkdir -p "$dir/my"
	chown mysql:mysql "$dir/my"
	mariadb-install-db --user=mysql --datadir="$dir/my/data" --auth-root-authentication-method=normal \
		--skip-test-db >"$dir/my/install.log" 2>&1
	# setsid: the server outlives this script; stop kills it by its PID file.
	setsid mariadbd --no-defaults --user=mysql --datadir="$dir/my/data" --socket="$dir/my/mysqld.sock" \
		--pid-file="$dir/my/mysqld.pid" --port="$my_port" --bind-address=127.0.0.1 \
		--innodb-flush-log-at-trx-commit=0 --max-connections=300 \
		--log-error="$dir/my/server.log" </dev/null >/dev/null 2>&1 &
	local pid=$! i
	for i in $(seq 1 120); do
		if mariadb --no-defaults -uroot --socket="$dir/my/mysqld.sock" -e 'SELECT 1' >/dev/null 2>&1; then
			break
		fi
		if [ "$i" = 120 ] || ! kill -0 "$pid" 2>/dev/null; then
			log "MariaDB did not start:"
			tail -20 "$dir/my/server.log" >&2
			exit 1
		fi
		sleep 0.5
	done
	mariadb --no-defaults -uroot --socket="$dir/my/mysqld.sock" -e "
		CREATE DATABASE txmq_test;
		CREATE USER 'txmq'@'127.0.0.1' IDENTIFIED BY 'txmq';
		GRANT ALL ON *.* TO 'txmq'@'127.0.0.1';" >&2
	log "MariaDB $(mariadbd --version | awk '{print $3}') on 127.0.0.1:$my_port"
}

case $cmd in
start)
	if [ -e "$dir/pg" ] || [ -e "$dir/my" ]; then
		log "$dir holds a server's data already: stop it first (ci-databases.sh stop $dir)"
		exit 1
	fi
	install
	mkdir -p "$dir"
	chmod 755 "$dir"
	start_postgres
	start_mariadb
	echo "export TXMQ_TEST_POSTGRES_DSN='postgres://txmq:txmq@127.0.0.1:$pg_port/txmq_test?sslmode=disable'"
	echo "export TXMQ_TEST_MYSQL_DSN='txmq:txmq@tcp(127.0.0.1:$my_port)/txmq_test'"
	;;
stop)
	if [ -f "$dir/pg/data/postmaster.pid" ]; then
		runuser -u postgres -- "$(pg_bin)/pg_ctl" -D "$dir/pg/data" -m fast -w stop >&2 || true
	fi
	if [ -f "$dir/my/mysqld.pid" ]; then
		pid=$(cat "$dir/my/mysqld.pid")
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
	fi
	rm -rf "$dir"
	;;
*)
	echo "usage: ci-databases.sh start|stop DIR" >&2
	exit 2
	;;
esac
