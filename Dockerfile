# The image every metricbus service in docker-compose.yml runs (one process per container).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
# metricbus/ holds links to the component folders, which are copied beside it
COPY metricbus metricbus
COPY schemas schemas
COPY producers producers
COPY sinks sinks
COPY stream_jobs stream_jobs
RUN pip install --no-cache-dir .
ENTRYPOINT ["metricbus"]
