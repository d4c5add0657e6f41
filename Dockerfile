# CPU image: the serving runtime only (no torch), run as an unprivileged user (uid 10001). The
# shipped model repository is baked in at /app/model_repository, a volume: mount another one there
# (or anywhere, with NMT_MODEL_REPOSITORY) to serve other models. See docs/deployment.md.
#   docker build -t nmt-serve .
#   docker run -p 50051:50051 -p 8080:8080 -p 9090:9090 nmt-serve
#   docker run -p 50051:50051 -v /srv/models:/app/model_repository:ro nmt-serve
# A build host that cannot reach Docker Hub can build on a local Debian base instead:
#   sh deploy/offline-base.sh && docker build --build-arg BASE_IMAGE=nmt-offline-base:3.11 -t nmt-serve .
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

WORKDIR /app
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NMT_HOST=0.0.0.0 \
    NMT_PORT=50051 \
    NMT_METRICS_PORT=9090 \
    NMT_HTTP_PORT=8080 \
    NMT_MODEL_REPOSITORY=/app/model_repository \
    NMT_LAME_DUCK_S=5 \
    NMT_GRACE_PERIOD_S=20
RUN groupadd --system --gid 10001 nmt \
    && useradd --system --uid 10001 --gid nmt --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nmt

COPY pyproject.toml ./
# The dependencies (~230 MB) in a layer of their own, keyed on pyproject.toml only: a change to the
# code rebuilds the small layer below, not this one.
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['serve']))" > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY README.md ./
COPY protos/ protos/
COPY server/ server/
COPY client/ client/
COPY models/__init__.py models/
COPY models/core/ models/core/
RUN pip install --no-cache-dir --no-deps ".[serve]"
COPY model_repository/ model_repository/
VOLUME ["/app/model_repository"]

USER 10001:10001
EXPOSE 50051 8080 9090
# Follows the configured port (the NMT_PORT variable, as docker run -e sets it).
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
    CMD python -m client --target "localhost:${NMT_PORT}" health || exit 1
# SIGTERM (docker stop): NMT_LAME_DUCK_S of NOT_SERVING while still serving, then in-flight work
# drains within NMT_GRACE_PERIOD_S; give docker stop more than both (docker stop -t 30).
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "server"]
