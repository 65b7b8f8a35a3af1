#!/bin/bash
# The official image's start-up, as far as docker-compose.yml needs it: a fresh data
# folder is initialised with POSTGRES_USER and POSTGRES_PASSWORD (password login over
# TCP), POSTGRES_DB created and /docker-entrypoint-initdb.d/*.sql run once; then the
# server runs as the postgres user with the arguments given (`postgres -c ...`).
set -euo pipefail
PGBIN=/usr/lib/postgresql/15/bin
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /run/postgresql
    chown -R postgres:postgres "$PGDATA" /run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
    user=${POSTGRES_USER:-postgres}
    pwfile=$(mktemp)
    printf '%s' "$POSTGRES_PASSWORD" > "$pwfile"
    "$PGBIN/initdb" -D "$PGDATA" -U "$user" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 > /dev/null
    rm -f "$pwfile"
    "$PGBIN/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start > /dev/null
    psql=(psql -v ON_ERROR_STOP=1 -U "$user" -h /run/postgresql)
    if [ -n "${POSTGRES_DB:-}" ] && [ "$POSTGRES_DB" != postgres ]; then
        "${psql[@]}" -d postgres -c "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    for script in /docker-entrypoint-initdb.d/*.sql; do
        [ -e "$script" ] && "${psql[@]}" -d "${POSTGRES_DB:-postgres}" -f "$script"
    done
    "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w stop > /dev/null
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
fi
[ "${1:-}" = postgres ] && shift
exec "$PGBIN/postgres" -D "$PGDATA" -k /run/postgresql "$@"
