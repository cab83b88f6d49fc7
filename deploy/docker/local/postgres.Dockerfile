# PostgreSQL from Debian's packages, for machines that cannot pull postgres:15 from Docker Hub
# (make stack-smoke). Takes the official image's POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB
# on first start and keeps its data in /var/lib/postgresql/data, like the official image.
ARG PYTHON_IMAGE=failslow-local/python:3.11
FROM ${PYTHON_IMAGE}
RUN apt-get update -q && apt-get install -y -q --no-install-recommends postgresql \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data && chown -R postgres:postgres /var/lib/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
USER postgres
ENTRYPOINT ["sh", "/usr/local/bin/postgres-entrypoint"]
