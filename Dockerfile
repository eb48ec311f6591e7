# Shoal, CPU image: every service runs from it (`shoal gateway|scheduler|worker|repository`).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/shoal
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY inference ./inference
COPY shoal ./shoal
# extras on top, e.g. --build-arg EXTRAS=cloud for a model repository in a bucket (docs/serving.md)
ARG EXTRAS=""
RUN if [ -n "$EXTRAS" ]; then pip install ".[$EXTRAS]"; else pip install .; fi
# the example repository, generated at build time (no downloads at run time)
RUN shoal example /models
ENTRYPOINT ["shoal"]
