# The naive image the size benchmark compares the flagship with: what a user writes by hand
# (Debian's Python, a venv, `pip install torch`), one layer, nothing pruned. `nox -s bench`
# builds it from the same base and the same wheels (the flagship's lock page on the
# wheelhouse server, since containers here cannot reach PyPI over HTTPS).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG FIND_LINKS
ARG TORCH
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-pip python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links "$FIND_LINKS" "torch==$TORCH"
ENV PATH=/opt/venv/bin:$PATH
