# syntax=docker/dockerfile:1
# The worker image: one image for every role (`plrl-worker --role generator|trainer`), with
# CUDA, vLLM and DeepSpeed. The operator's pods run `plrl-worker --role <role> --config ...`.
#   docker build -f dockerfiles/worker.Dockerfile -t ghcr.io/pipelinerl/plrl-worker:0.1.0 .
FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04 AS build
ARG DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev git ninja-build \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/plrl
ENV PATH=/opt/plrl/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY workers/ workers/
# DeepSpeed compiles its fused Adam for these GPU generations at build time, not on first step.
ENV TORCH_CUDA_ARCH_LIST="8.0;8.6;8.9;9.0" \
    DS_BUILD_FUSED_ADAM=1
# Versions are bounded by pyproject.toml's extras (vLLM pins its own torch and CUDA wheels).
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[workers,gpu]"

FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04
ARG DEBIAN_FRONTEND=noninteractive
LABEL org.opencontainers.image.title="pipelinerl-worker" \
      org.opencontainers.image.description="PipelineRL generator and trainer (vLLM, DeepSpeed, CUDA)" \
      org.opencontainers.image.licenses="Apache-2.0"
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 libpython3.11 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/plrl /opt/plrl
ENV PATH=/opt/plrl/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/tmp/hf \
    NCCL_DEBUG=WARN
RUN groupadd --gid 1000 plrl \
    && useradd --uid 1000 --gid plrl --create-home --shell /bin/bash plrl
USER 1000:1000
WORKDIR /home/plrl
EXPOSE 50051 29500 29600 9400
ENTRYPOINT ["plrl-worker"]
CMD ["--help"]
