#!/bin/sh
# First start: initdb with POSTGRES_USER/POSTGRES_PASSWORD, create POSTGRES_DB; then serve.
set -eu
BIN=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
DATA=/var/lib/postgresql/data
: "${POSTGRES_USER:=postgres}" "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$DATA/PG_VERSION" ]; then
    printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pw
    # UTF8 as the official image (a SQL_ASCII database hands psycopg bytes, not text)
    "$BIN/initdb" -D "$DATA" -U "$POSTGRES_USER" --pwfile=/tmp/pw -A scram-sha-256 -E UTF8 \
        --locale=C.UTF-8 >/dev/null
    rm -f /tmp/pw
    echo "host all all 0.0.0.0/0 scram-sha-256" >> "$DATA/pg_hba.conf"
    "$BIN/pg_ctl" -D "$DATA" -w -o "-c listen_addresses=127.0.0.1" start >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
        PGPASSWORD=$POSTGRES_PASSWORD "$BIN/psql" -h 127.0.0.1 -U "$POSTGRES_USER" -d postgres \
            -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
    fi
    "$BIN/pg_ctl" -D "$DATA" -w stop >/dev/null
fi
exec "$BIN/postgres" -D "$DATA" -c listen_addresses='*'
