"""Base images: a local image if present, else a pull by digest, else a bootstrap.

The bootstrap runs mmdebstrap (or debootstrap) against the distro's package mirror with
SOURCE_DATE_EPOCH set, then loads the root filesystem as a one-layer image whose config
carries fixed times. `docker import` would stamp the current time; writing the image
archive ourselves keeps the image ID a function of the root filesystem alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import docker
import docker.errors

from builder import digests
from builder.engine import archive
from builder.errors import UserError
from builder.plan.cell import BaseImage

Report = Callable[[str], None]


def ensure(engine: docker.DockerClient, base: BaseImage, epoch: int, report: Report = print) -> str:
    """A reference to the base image in the engine, obtaining it the cheapest way available."""
    for reference in (base.local_tag, base.image):
        try:
            engine.images.get(reference)
            return reference
        except docker.errors.ImageNotFound:
            pass
    if os.environ.get("TORCH_IMAGES_NO_PULL") != "1":
        try:
            report(f"pulling {base.image}")
            engine.images.pull(base.image)
            return base.image
        except docker.errors.APIError as error:
            report(f"pull failed ({str(error.explanation or error)[:80]}); bootstrapping from {base.mirror}")
    bootstrap(engine, base, epoch, report)
    return base.local_tag


def layer_count(engine: docker.DockerClient, reference: str) -> int:
    """How many layers an image has: the builder keeps a base's layers as they are."""
    return len(engine.images.get(reference).attrs["RootFS"]["Layers"])


def bootstrap(engine: docker.DockerClient, base: BaseImage, epoch: int, report: Report = print) -> str:
    """Bootstrap the base from the mirror and load it into the engine; returns the image ID."""
    with tempfile.TemporaryDirectory(prefix="torch-images-base-") as scratch:
        rootfs = Path(scratch, "rootfs.tar")
        report(f"bootstrapping {base.distro} {base.suite} with {base.bootstrap_tool}")
        _run_bootstrap(base, epoch, rootfs, Path(scratch))
        diff_id = "sha256:" + digests.sha256_file(rootfs)
        labels = {"base": base.name, "suite": base.suite}
        config = archive.image_config([diff_id], epoch, labels, [f"bootstrap {base.suite}"])
        images = archive.load(engine, config, [(diff_id, rootfs)], base.local_tag, epoch)
    image_id: str = images[0].id
    report(f"loaded {base.local_tag} ({image_id[:19]})")
    return image_id


def _run_bootstrap(base: BaseImage, epoch: int, rootfs: Path, scratch: Path) -> None:
    tool = shutil.which(base.bootstrap_tool)
    if tool is None:
        raise UserError(f"{base.bootstrap_tool} is not installed; install it (apt-get install {base.bootstrap_tool})")
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    components = ",".join(base.components)
    if base.bootstrap_tool == "mmdebstrap":
        mode = "root" if os.geteuid() == 0 else "unshare"
        command = [
            tool, f"--variant={base.variant}", f"--mode={mode}", "--format=tar", f"--components={components}",
            "--quiet", base.suite, str(rootfs), base.mirror,
        ]  # fmt: skip
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    else:
        target = scratch / "root"
        command = [
            tool,
            f"--variant={base.variant}",
            f"--components={components}",
            base.suite,
            str(target),
            base.mirror,
        ]
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode == 0:
            subprocess.run(
                ["tar", "--sort=name", f"--mtime=@{epoch}", "--clamp-mtime", "--numeric-owner", "-C", str(target),
                 "-cf", str(rootfs), "."],
                check=True,
            )  # fmt: skip
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"bootstrap of {base.suite} from {base.mirror} failed: {tail[0]}")
