# Shoal, CPU image: every service runs from it (`shoal gateway|scheduler|worker|repository`).
# The compiled build (docs/performance.md, "The compiled build"): the wheel is built with a C compiler
# in a stage of its own, so the image that runs carries the compiled modules and no compiler.
FROM python:3.11-slim AS build
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    $(python3 -c 'import os, sysconfig; print("" if os.path.exists(sysconfig.get_paths()["include"] + "/Python.h") else "python3-dev")') \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY shared ./shared
COPY services ./services
COPY inference ./inference
COPY shoal ./shoal
RUN pip wheel --no-deps . -w /wheels

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1
COPY --from=build /wheels /wheels
# extras on top, e.g. --build-arg EXTRAS=cloud for a model repository in a bucket (docs/serving.md)
ARG EXTRAS=""
RUN wheel=$(ls /wheels/shoal-*.whl) && if [ -n "$EXTRAS" ]; then pip install "$wheel[$EXTRAS]"; else pip install "$wheel"; fi \
    && python3 -c "from shoal.compiled_modules import describe; line = describe(); print(line); assert line.startswith('build: compiled')"
# the example repository, generated at build time (no downloads at run time)
RUN shoal example /models
ENTRYPOINT ["shoal"]
