"""Where the builder finds what it ships and where it keeps what it caches.

Nothing here depends on the working directory. Shipped files (templates/, data/, image/) sit
beside the package in a checkout or an editable install, and inside it (builder/_templates,
builder/_data, builder/_image, see pyproject.toml) in an installed wheel. A matrix's own files (images/,
published/) live beside the matrix file; caches under TORCH_IMAGES_CACHE.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _shipped(folder: str) -> Path:
    installed = PACKAGE / f"_{folder}"
    return installed if installed.is_dir() else PACKAGE.parent / folder


TEMPLATES = _shipped("templates")
DATA = _shipped("data")
# What ships inside every image: the self-test (torch and the standard library only) and its data.
IMAGE = _shipped("image")
SELFTEST = IMAGE / "selftest.py"
GPU_PEAKS = IMAGE / "gpu_peaks.json"


def cache_root() -> Path:
    """The builder's cache (wheels, self-test reports, layer manifests); TORCH_IMAGES_CACHE moves it."""
    return Path(os.environ.get("TORCH_IMAGES_CACHE") or Path.home() / ".cache" / "torch-images")


def cache_dir(name: str) -> Path:
    path = cache_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path
