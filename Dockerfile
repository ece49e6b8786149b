# EFPSN: one image for the coordinator and the agents (`efpsn coordinator ...`, `efpsn agent ...`).
#
#   docker build -t efpsn:local .                  # from the package index (needs internet)
#   docker build -t efpsn:local --build-arg WHEELHOUSE=wheelhouse .   # offline, from ./wheelhouse
#
# Build arguments:
#   BASE_IMAGE           any Debian-like image with Python 3.11, `python3 -m venv` and useradd
#                        (default python:3.11-slim).
#   WHEELHOUSE           a folder inside the build context holding wheels of every dependency
#                        (and setuptools/wheel to build the project): pip then installs with
#                        --no-index --find-links from it and downloads nothing. Empty (default):
#                        install from the package index.
#   PIP_EXTRA_INDEX_URL  where the CPU build of torch comes from when installing from the index
#                        (default PyTorch's CPU wheel index; constraints.txt pins torch==2.13.0,
#                        and the CPU build `2.13.0+cpu` wins over PyPI's multi-GB CUDA build).
#                        Set PIP_INDEX_URL too (--build-arg) to use a mirror instead of PyPI.
#
# The image runs as the unprivileged user `efpsn` (uid and gid 10001); /results and /tls (a
# named volume mounted there starts out owned by it) belong to it.

ARG BASE_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------- build stage
FROM ${BASE_IMAGE} AS build
ARG WHEELHOUSE=
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
COPY . /src
RUN set -eu; \
    python3 -m venv /opt/efpsn; \
    # build arguments are in the environment here; pip reads PIP_*, but not empty ones
    if [ -n "${PIP_INDEX_URL}" ]; then export PIP_INDEX_URL; else unset PIP_INDEX_URL; fi; \
    if [ -n "${PIP_EXTRA_INDEX_URL}" ]; then export PIP_EXTRA_INDEX_URL; \
    else unset PIP_EXTRA_INDEX_URL; fi; \
    if [ -n "${WHEELHOUSE}" ]; then \
        if [ ! -d "/src/${WHEELHOUSE}" ]; then \
            echo "WHEELHOUSE=${WHEELHOUSE}: no such folder in the build context" >&2; exit 1; \
        fi; \
        set -- --no-index --find-links "/src/${WHEELHOUSE}"; \
    else \
        set --; \
    fi; \
    /opt/efpsn/bin/pip install "$@" -c /src/constraints.txt "/src[data]"; \
    /opt/efpsn/bin/efpsn --help > /dev/null

# ---------------------------------------------------------------------------- runtime stage
FROM ${BASE_IMAGE}
RUN groupadd --gid 10001 efpsn \
 && useradd --uid 10001 --gid efpsn --create-home --home-dir /home/efpsn \
        --shell /usr/sbin/nologin efpsn \
 && mkdir -p /results /tls \
 && chown efpsn:efpsn /results /tls
COPY --from=build /opt/efpsn /opt/efpsn
ENV PATH=/opt/efpsn/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER efpsn
WORKDIR /home/efpsn
EXPOSE 50050 50051
# Stopping: as PID 1 without an init (`docker run` without --init) a process only receives the
# signals it handles. The coordinator and the agents handle SIGTERM (docker stop's default) and
# SIGINT and stop at once; docker-compose.yml also sets `init: true`.
ENTRYPOINT ["efpsn"]
CMD ["--help"]
