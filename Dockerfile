# meshrun images. Build one target:  docker build --target trainer -t meshrun/trainer:0.1.0 .
# No build step downloads from anywhere but the Python package index (pip).

# Each target installs its dependencies (read from pyproject.toml by hack/pydeps.py) in a layer
# below the source, so a code change rebuilds in seconds instead of reinstalling torch. The lists
# are written in a stage of their own and copied in by content: an edit of pyproject.toml that
# leaves a target's requirements alone (a test-only library, say) keeps its installed layer.

# ---- base: Python and a non-root user (uid 1000) -------------------------------------------------
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --gid 1000 meshrun && useradd --uid 1000 --gid 1000 --create-home meshrun
WORKDIR /opt/meshrun

# ---- requirements: each target's list, from pyproject.toml ------------------------------------
FROM base AS requirements
COPY pyproject.toml hack/pydeps.py ./
RUN python pydeps.py operator > operator.txt && python pydeps.py trainer > trainer.txt

# ---- operator: kopf and its aiohttp, no torch; non-root, read-only-rootfs friendly ------
FROM base AS operator
# The operator extra only (kopf, aiohttp, prometheus-client, the kubernetes config loader); the
# import check fails the build if torch ever creeps in through a dependency, which would add
# gigabytes to a small controller.
COPY --from=requirements /opt/meshrun/operator.txt requirements.txt
RUN pip install -r requirements.txt
COPY README.md pyproject.toml ./
COPY meshrun ./meshrun
COPY operator ./operator
COPY trainer ./trainer
RUN pip install --no-deps . \
    && python -c "import meshrun_operator.main, kopf" \
    && ! python -c "import torch" 2>/dev/null \
    && rm -rf build ./*.egg-info
# Nothing is written at run time but /tmp (an emptyDir in the chart) and no .pyc files
# (PYTHONDONTWRITEBYTECODE in base), so readOnlyRootFilesystem: true works.
USER 1000:1000
WORKDIR /home/meshrun
# /metrics and /healthz (the chart's operator.metricsPort and operator.healthPort).
EXPOSE 8080 8081
# The same main() as `meshrun operator`; arguments are its flags (--namespace, --metrics-port).
ENTRYPOINT ["python", "-m", "meshrun_operator"]

# ---- trainer: torch + the trainer package; runs under torchrun (PET_* env from the operator) ------
FROM base AS trainer
# From PyPI only by default (torch's PyPI wheels carry CUDA, so one image serves CPU and GPU
# pods). TORCH_INDEX may name another package index, e.g. PyTorch's CPU-only wheels.
ARG TORCH_INDEX=""
COPY --from=requirements /opt/meshrun/trainer.txt requirements.txt
RUN pip install ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} -r requirements.txt
COPY README.md pyproject.toml ./
COPY meshrun ./meshrun
COPY operator ./operator
COPY trainer ./trainer
RUN pip install --no-deps . \
    && python -c "import meshrun_trainer, torch; print('torch', torch.__version__)" \
    && rm -rf build ./*.egg-info
USER 1000:1000
WORKDIR /home/meshrun
# Rank 0's /metrics and /progress (docs/env-contract.md).
EXPOSE 9400
ENV OMP_NUM_THREADS=1
ENTRYPOINT ["python", "-m", "torch.distributed.run", "-m", "meshrun_trainer"]
