# Shoal, CPU image: every service runs from it (`shoal gateway|scheduler|worker|repository`).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/shoal
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY inference ./inference
COPY shoal ./shoal
RUN pip install .
# the example repository, generated at build time (no downloads at run time)
RUN shoal example /models
ENTRYPOINT ["shoal"]
