# CPU image: the serving runtime only (no torch), the shipped model repository baked in.
#   docker build -t nmt-serve .
#   docker run -p 50051:50051 -p 9090:9090 nmt-serve
FROM python:3.11-slim

WORKDIR /app
ENV PYTHONUNBUFFERED=1 \
    NMT_HOST=0.0.0.0 \
    NMT_PORT=50051 \
    NMT_METRICS_PORT=9090 \
    NMT_MODEL_REPOSITORY=/app/model_repository

COPY pyproject.toml README.md ./
COPY protos/ protos/
COPY server/ server/
COPY client/ client/
COPY models/__init__.py models/
COPY models/core/ models/core/
RUN pip install --no-cache-dir ".[serve]"
COPY model_repository/ model_repository/

EXPOSE 50051 9090
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
    CMD python -m client --target localhost:50051 health || exit 1
# SIGTERM (docker stop) drains in-flight requests within NMT_GRACE_PERIOD_S.
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "server"]
