# The naive image the size benchmark compares the flagship with: what a user writes by hand
# (Debian's Python with pip's recommended packages, which bring a compiler as the flagship
# has, a venv, `pip install torch`), one layer, nothing pruned, but no pip cache and no apt
# lists left behind. `nox -s bench` builds it from the same wheels (the flagship's lock page on
# the wheelhouse server: containers here cannot reach PyPI over HTTPS) and from the flagship's
# locked base packages bootstrapped in full, documentation and translations included, as
# debian:bookworm has them (and once more from the flagship's own slim base, reported beside).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG FIND_LINKS
ARG TORCH
RUN apt-get update \
 && apt-get install -y python3-pip python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links "$FIND_LINKS" "torch==$TORCH"
ENV PATH=/opt/venv/bin:$PATH
