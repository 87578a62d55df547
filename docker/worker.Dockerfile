# The worker image of the fan-outs (`stackfarm emit buildkite | k8s --image ...`): stackfarm with its requirements
# in a venv, and the project (matrix.toml, suites/, patches/, runners/) at /project, the working directory the
# emitted steps and pods run in, as the unprivileged uid 10001.
#
#   docker build -f docker/worker.Dockerfile -t REGISTRY/stackfarm-worker:TAG . && docker push REGISTRY/stackfarm-worker:TAG
#
# BASE: any image with python3 (3.10 or later) and its venv module. docker/make-base.sh makes
# stackfarm-base:bookworm locally (Debian's python3 3.11, no registry needed); python:3.11-slim-bookworm works
# where a registry answers. pip fetches stackfarm's requirements from the index (PIP_INDEX_URL to use another).
# No `# syntax=` line on purpose: that makes BuildKit pull a frontend image, and offline builders reach no registry.
ARG BASE=stackfarm-base:bookworm
FROM ${BASE}

ENV VENV=/opt/stackfarm \
    PATH=/opt/stackfarm/bin:${PATH} \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PYTHONUNBUFFERED=1 \
    STACKFARM_CACHE=/cache

# The package first (its requirements change less often than the project), then the project around it.
COPY pyproject.toml README.md /project/
COPY src /project/src
RUN python3 -m venv "${VENV}" \
    && "${VENV}/bin/python" -m pip install --no-cache-dir /project \
    && rm -rf /project/build \
    && "${VENV}/bin/python" -m stackfarm --help >/dev/null \
    && useradd --create-home --shell /bin/sh --uid 10001 stackfarm \
    && mkdir -p /cache \
    && chown 10001:10001 /cache

COPY matrix.toml /project/
COPY suites /project/suites
COPY patches /project/patches
COPY runners /project/runners

WORKDIR /project
USER 10001
CMD ["python", "-m", "stackfarm", "--help"]
