# syntax=docker/dockerfile:1
# Two images from one build context (k8s/README.md, "Build the images"):
#   docker build --target gateway       -t ghcr.io/qwen-serving/gateway:0.1.0 .
#   docker build --target model-builder -t ghcr.io/qwen-serving/model-builder:0.1.0 .
# Tag them with pyproject's version; k8s/components/images/images.yaml pins those tags.
# The vLLM engine runs vLLM's own images (vllm/vllm-openai, vllm-cpu), not one of ours.

# Pinned by version; pin a digest too if your registry policy requires it
# (--build-arg PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:...).
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- wheel: the project as a wheel, and the gateway's environment ------------------------
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY serving ./serving
COPY loadtest ./loadtest
RUN pip wheel --no-deps --wheel-dir /wheels .
# Every runtime dependency ships as a binary wheel (pydantic-core, uvloop, httptools, psutil),
# so nothing is compiled and no compiler is installed, here or below.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --only-binary=:all: /wheels/*.whl

# ---- gateway: `serving gateway` --------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS gateway
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SERVING_HOME=/var/lib/serving \
    SERVING_GATEWAY_HOST=0.0.0.0
# uid 10001, as the Deployment's securityContext runs it; the state directory is the one
# place it writes (an emptyDir in Kubernetes).
RUN groupadd --system --gid 10001 serving \
    && useradd --system --uid 10001 --gid serving --home-dir /var/lib/serving \
        --no-create-home --shell /usr/sbin/nologin serving \
    && install -d -o serving -g serving -m 0750 /var/lib/serving
COPY --from=wheel /opt/venv /opt/venv
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["serving"]
CMD ["gateway"]

# ---- model-builder: `serving model tiny` for the cpu-demo overlay's init container ---------
FROM ${PYTHON_IMAGE} AS model-builder-env
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# CPU-only torch from PyTorch's own index: PyPI's default torch wheel carries CUDA
# libraries (gigabytes) this image never uses. The versions are the ones the project's
# .venv builds the model with, so the image writes the same files (the build is
# deterministic for given versions).
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
    && /opt/venv/bin/pip install transformers==5.19.0 tokenizers==0.23.3 safetensors==0.8.0
COPY --from=wheel /wheels /wheels
RUN /opt/venv/bin/pip install --only-binary=:all: /wheels/*.whl

FROM ${PYTHON_IMAGE} AS model-builder
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    SERVING_HOME=/tmp/serving
# uid 10002, as the engine pod (whose init container this is) runs it.
RUN groupadd --system --gid 10002 builder \
    && useradd --system --uid 10002 --gid builder --home-dir /tmp \
        --no-create-home --shell /usr/sbin/nologin builder
COPY --from=model-builder-env /opt/venv /opt/venv
USER 10002:10002
ENTRYPOINT ["serving"]
CMD ["model", "tiny", "--out", "/models/qwen3-tiny"]
