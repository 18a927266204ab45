# The translation server's image: the server and its dependencies (no torch, no compilers, no caches) in
# a venv, plus every model folder under models/. Needs BuildKit (the default builder of Docker >= 23 and
# of `docker compose build`), which builds only the stages the chosen target uses.
#
# Targets:
#   runtime (the last stage, so the default): CPU, onnxruntime, on python:3.11-slim
#   cuda:    onnxruntime-gpu on NVIDIA's CUDA + cuDNN runtime; run it with MT_PROVIDERS=cuda,cpu
#            (docker compose -f docker-compose.yml -f docker-compose.gpu.yml up --build)
ARG PYTHON_IMAGE=python:3.11-slim
# onnxruntime-gpu 1.31 on PyPI is built for CUDA 13 and cuDNN 9: the base must match those majors
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu22.04

# ---- model folders: every subfolder of models/ with a manifest.json (models/ may be missing or empty) --
FROM ${PYTHON_IMAGE} AS models
# `model[s]` is a pattern, so COPY accepts a checkout without models/; the folders land in /context/
COPY model[s] /context/
RUN mkdir /models \
 && for manifest in /context/*/manifest.json; do \
      if [ -f "$manifest" ]; then cp -R "$(dirname "$manifest")" /models/; fi; \
    done \
 && chmod -R a+rX,go-w /models

# ---- CPU: the server installed into /opt/venv ------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# the venv holds the dependencies alone, from pyproject.toml alone (the readme it names is a placeholder):
# a layer that stays cached, and the same bytes in the image, while they do. The server's code is a layer
# of its own (runtime stage), so that a change to it ships a few hundred KB, not the venv and the models
COPY pyproject.toml ./
RUN touch README.md && pip install . && pip uninstall -y transformer-mt-server pip setuptools
# the base install is the server's and must stay torch-free; its code compiled once, here (the image's
# root is read-only, and PYTHONDONTWRITEBYTECODE is set: uncompiled, every start would compile it again).
# Nothing here writes to the venv, so a change to the code leaves its layer as it was
COPY service ./service
RUN PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/src python -c "import service.api.app, onnxruntime, sentencepiece" \
 && if python -c "import torch" 2>/dev/null; then echo "torch must not be in the server image" >&2; exit 1; fi \
 && python -m compileall -q --invalidation-mode unchecked-hash service

# ---- CUDA variant (target "cuda"): not built by the tests (no registry to pull the base from) ----------
FROM ${CUDA_IMAGE} AS cuda-base
# Ubuntu 22.04's own python3.11 (the project needs 3.11); its apt versions are not pinned (DL3008): the
# CUDA base tag fixes the Ubuntu release, and a pinned point version disappears from the mirrors
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.11 \
 && rm -rf /var/lib/apt/lists/*

FROM cuda-base AS cuda-builder
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.11-venv \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python3.11 -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
# the server's dependencies, with onnxruntime-gpu of the same pinned version in place of onnxruntime
# (both provide the `onnxruntime` module)
RUN pip install . \
 && ort_version="$(python -c 'import importlib.metadata as m; print(m.version("onnxruntime"))')" \
 && pip uninstall -y onnxruntime \
 && pip install "onnxruntime-gpu==${ort_version}" \
 && python -c "import service.api.app, onnxruntime" \
 && if python -c "import torch" 2>/dev/null; then echo "torch must not be in the server image" >&2; exit 1; fi \
 && pip uninstall -y pip setuptools

FROM cuda-base AS cuda
RUN groupadd --system --gid 10001 mt \
 && useradd --no-log-init --system --uid 10001 --gid mt --no-create-home --shell /usr/sbin/nologin mt
COPY --from=cuda-builder /opt/venv /opt/venv
COPY --from=models /models /models
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MT_MODELS_DIR=/models \
    MT_PROVIDERS=cuda,cpu
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=2)"]
CMD ["python", "-m", "service", "--host", "0.0.0.0", "--port", "8000"]

# ---- CPU runtime (default target) ------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 mt \
 && useradd --no-log-init --system --uid 10001 --gid mt --no-create-home --shell /usr/sbin/nologin mt
# the layers from the least often changed: the dependencies, the models, the server's code
COPY --from=builder /opt/venv /opt/venv
COPY --from=models /models /models
COPY --from=builder /src/service /opt/app/service
# MT_* settings are the server's (docs/configuration.md). The user has no home: HOME is /tmp (a tmpfs
# under docker-compose.yml), where onnxruntime keeps its telemetry device id; nothing else is written,
# so the root filesystem may be read-only.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/app \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MT_MODELS_DIR=/models
USER 10001:10001
EXPOSE 8000
# readiness, not liveness: healthy once every model is loaded and warmed up (/ready answers 200)
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=2)"]
CMD ["python", "-m", "service", "--host", "0.0.0.0", "--port", "8000"]
