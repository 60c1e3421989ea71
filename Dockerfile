# syntax=docker/dockerfile:1
# One image for the six services and `writ migrate`: `writ service <name>` is its command.
# Build from the repository root: `docker build -t <registry>/writ:<version> .` (docs/operations.md).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# The same uv as the Makefile's, so the image resolves nothing: it installs the committed lock.
ARG UV_VERSION=0.13.9
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/writ \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --no-cache-dir "uv==${UV_VERSION}"
WORKDIR /src
# Dependencies first, in a layer of their own: a code change does not reinstall them.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project --python /usr/local/bin/python3.11
COPY actions/ actions/
COPY schemas/ schemas/
COPY libs/ libs/
COPY services/ services/
COPY writ/ writ/
COPY fakes/ fakes/
# --no-editable: the project is copied into the environment, so the runtime stage needs no /src.
RUN uv sync --frozen --no-dev --no-editable --python /usr/local/bin/python3.11

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="writ" \
      org.opencontainers.image.description="A governed, durable runtime for AI agents"
# Bytecode was compiled at build time; nothing is written under the (read-only) root at run
# time. Anything a process must write goes to /tmp, an emptyDir in the chart.
ENV PATH=/opt/writ/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    WRIT_METRICS_HOST=0.0.0.0 \
    WRIT_METRICS_PORT=9090 \
    HOME=/tmp
COPY --from=build /opt/writ /opt/writ
# A numeric user and group, so a pod's `runAsNonRoot` can be verified without an /etc/passwd.
USER 10001:10001
WORKDIR /tmp
EXPOSE 9090
ENTRYPOINT ["writ"]
CMD ["--help"]
