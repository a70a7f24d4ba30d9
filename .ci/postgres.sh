#!/usr/bin/env bash
# A throwaway PostgreSQL server for the concurrency tests, on 127.0.0.1 only.
#
#   export TCF_TEST_PG_URL="$(.ci/postgres.sh)"
#
# Installs the Debian packages when no server binaries are found, initialises a cluster in
# $TCF_PG_DIR (default /tmp/tcf-pg), starts it on $TCF_PG_PORT (default 54329) listening on
# loopback only, with trust authentication for loopback connections (nothing else can reach
# it), creates the database $TCF_PG_DB (default tcf_test) and prints its URL on stdout — the
# only line on stdout; progress goes to stderr. Idempotent: a second call finds the server
# running and the database present, and prints the same URL.
set -euo pipefail

DATA_DIR="${TCF_PG_DIR:-/tmp/tcf-pg}"
PORT="${TCF_PG_PORT:-54329}"
DB="${TCF_PG_DB:-tcf_test}"
say() { echo "postgres.sh: $*" >&2; }

find_bindir() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [[ -x "$d/initdb" && -x "$d/pg_ctl" ]] && { echo "$d"; return 0; }
    done
    if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
        dirname "$(command -v initdb)"
        return 0
    fi
    return 1
}

BIN="$(find_bindir || true)"
if [[ -z "$BIN" ]]; then
    say "no PostgreSQL server found; installing the Debian packages"
    SUDO=""
    [[ "$(id -u)" -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >&2
    BIN="$(find_bindir)" || { say "installed, but initdb/pg_ctl not found"; exit 1; }
fi

# The server refuses to run as root: as root, run it as the postgres user the package creates.
RUN=()
OWNER="$(id -un)"
if [[ "$(id -u)" -eq 0 ]]; then
    OWNER=postgres
    id -u "$OWNER" >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql "$OWNER"
    RUN=(runuser -u "$OWNER" --)
fi

mkdir -p "$DATA_DIR"
chown "$OWNER" "$DATA_DIR"
chmod 700 "$DATA_DIR"
if [[ ! -f "$DATA_DIR/PG_VERSION" ]]; then
    say "initialising a cluster in $DATA_DIR"
    "${RUN[@]}" "$BIN/initdb" -D "$DATA_DIR" -U postgres --auth=trust -E UTF8 >&2
fi

if ! "${RUN[@]}" "$BIN/pg_ctl" -D "$DATA_DIR" status >/dev/null 2>&1; then
    say "starting the server on 127.0.0.1:$PORT"
    # The socket goes into the data folder: /var/run/postgresql may not exist or be writable.
    "${RUN[@]}" "$BIN/pg_ctl" -D "$DATA_DIR" -l "$DATA_DIR/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DATA_DIR -c max_connections=200" \
        start >&2
fi

PSQL=("${RUN[@]}" "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -v ON_ERROR_STOP=1 -qtA)
if [[ "$("${PSQL[@]}" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]]
then
    say "creating database $DB"
    "${PSQL[@]}" -d postgres -c "CREATE DATABASE \"$DB\"" >&2
fi

echo "postgresql://postgres@127.0.0.1:$PORT/$DB"
