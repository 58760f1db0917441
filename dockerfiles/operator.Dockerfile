# syntax=docker/dockerfile:1
# The operator image: kopf + the pure policy layer, no torch. Slim, non-root, read-only friendly.
#   docker build -f dockerfiles/operator.Dockerfile -t ghcr.io/pipelinerl/plrl-operator:0.1.0 .
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY workers/ workers/
# Only the operator's own dependencies (no [workers]/[gpu] extras): kopf, kubernetes, pydantic.
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="pipelinerl-operator" \
      org.opencontainers.image.description="Kubernetes operator for PipelineRL jobs" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /install /usr/local
RUN groupadd --system --gid 10001 plrl \
    && useradd --system --uid 10001 --gid plrl --no-create-home --shell /usr/sbin/nologin plrl
USER 10001:10001
EXPOSE 8080 9090 9443
ENTRYPOINT ["python", "-m", "plrl_operator"]
CMD ["--all-namespaces"]
