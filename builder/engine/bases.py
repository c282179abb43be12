"""Base images.

A build's base is bootstrapped from the cell's locked packages (debian.lock's `base`), from the
wheelhouse server's local repository: bootstrap_locked, tagged by the package set. `lock`
itself, which finds those packages, starts from `ensure`: a local image if present, else a pull
by digest, else a bootstrap from the mirror.

The bootstrap runs mmdebstrap (or debootstrap) against the distro's package mirror with
SOURCE_DATE_EPOCH set, then loads the root filesystem as a one-layer image whose config
carries fixed times. `docker import` would stamp the current time; writing the image
archive ourselves keeps the image ID a function of the root filesystem alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from builder import confined, digests, paths, terminal
from builder.config.schema import KeyringSpec
from builder.engine import archive, canonical, debfile, emulation, ids, privilege
from builder.errors import UserError
from builder.plan.cell import BaseImage
from builder.steps import Report


def ensure(engine: docker.DockerClient, base: BaseImage, epoch: int, report: Report = print) -> str:
    """A reference to the base image in the engine, obtaining it the cheapest way available.

    `image` pins a multi-arch index by digest: it is pulled for the base's own platform, and a
    local image under that name is used only if it is of the base's architecture."""
    if _present(engine, base.local_tag, base.arch) and _reads_its_sources(engine, base):
        return base.local_tag
    if base.image is not None and _present(engine, base.image, base.arch):
        return base.image
    if base.image is not None and os.environ.get("TORCH_IMAGES_NO_PULL") != "1":
        try:
            platform = base.platform.name
            report(f"pulling {base.image} for {platform}")
            engine.images.pull(base.image, platform=platform)
            if _present(engine, base.image, base.arch):
                return base.image
        except docker.errors.APIError as error:
            report(f"pull failed ({str(error.explanation or error)[:80]}); bootstrapping from {base.mirror}")
    bootstrap(engine, base, epoch, report)
    return base.local_tag


@dataclass(frozen=True)
class LockedPackages:
    """The base's locked package set, as a repository the wheelhouse server offers."""

    names: tuple[str, ...]  # every package the base holds
    sources_line: str  # "deb [trusted=yes] http://127.0.0.1:8741/ apt/<key>/"
    key: str  # names the set (and the paths left out): the base image's engine tag ends with it
    # dpkg path-exclude/path-include lines the bootstrap applies (data/layout.yaml's, validated):
    # the base leaves out documentation and translations as debian:bookworm-slim does.
    dpkg: tuple[str, ...] = ()


def locked_tag(base: BaseImage, key: str) -> str:
    """The engine tag of a base bootstrapped from a locked package set: one per set."""
    return f"{base.local_tag}-{key}"


def forget_locked(engine: docker.DockerClient, tag: str) -> None:
    """Remove a locked base from the engine (its tag) and the cache (its rootfs), so that the next
    `bootstrap_locked` makes it again from the packages."""
    with contextlib.suppress(docker.errors.ImageNotFound):
        engine.images.remove(tag, force=True, noprune=False)
    forget_cached_rootfs(tag)


def present_locked(engine: docker.DockerClient, base: BaseImage, key: str) -> str | None:
    tag = locked_tag(base, key)
    return tag if _present(engine, tag, base.arch) else None


def bootstrap_locked(
    engine: docker.DockerClient, base: BaseImage, packages: LockedPackages, epoch: int, report: Report = print
) -> str:
    """Bootstrap the base from exactly its locked packages, from the local repository (never the
    mirror), and load it as locked_tag; returns that tag. Two machines with the same lock get
    the same image."""
    tag = locked_tag(base, packages.key)
    cached = checked_cached_rootfs(tag, report)
    if cached is not None:
        report(f"loading {tag} from the cache ({cached})")
        _load_rootfs(engine, base, epoch, cached, tag)
        return tag
    with tempfile.TemporaryDirectory(prefix="torch-images-base-") as scratch:
        rootfs = Path(scratch, "rootfs.tar")
        emulation.ensure(base.arch, report)
        report(f"bootstrapping {base.distro} {base.suite} ({base.arch}) from its {len(packages.names)} locked packages")
        _run_locked_bootstrap(base, packages, epoch, rootfs)
        _load_rootfs(engine, base, epoch, rootfs, tag)
        _keep_in_cache(rootfs, tag)
    report(f"loaded {tag}")
    return tag


def cached_rootfs(tag: str) -> Path:
    """Where a locked base's root filesystem is kept between runs (CI restores the cache, keyed by
    the locks), so that an engine without the base loads it instead of bootstrapping it again."""
    return paths.cache_dir("bases") / (re.sub(r"[^A-Za-z0-9._-]", "_", tag) + ".tar")


def _rootfs_digest_file(cached: Path) -> Path:
    return cached.with_name(cached.name + ".sha256")


def _keep_in_cache(rootfs: Path, tag: str) -> None:
    """Keep the (canonical) rootfs in the cache with the sha256 it had when it was made: the tar
    first, then its sha256, each renamed into place, so an interrupted write leaves a tar without
    a digest, which is never loaded."""
    cached = cached_rootfs(tag)
    with debfile.written_beside(cached) as partial:
        shutil.copyfile(rootfs, partial)
        digest = digests.sha256_file(partial)
    with debfile.written_beside(_rootfs_digest_file(cached)) as partial:
        partial.write_text(digest + "\n")


def checked_cached_rootfs(tag: str, report: Report = print) -> Path | None:
    """The cached rootfs of `tag`, if it is a plain file with the sha256 written beside it when it
    was made. One truncated, changed or replaced by a link is removed, and the line says so: the
    base is then bootstrapped again. (This catches a damaged cache; a rootfs changed together with
    its digest gives another base image, which the cell's recorded image-id catches before any
    step runs: builder/assemble/build.py's cell_base.)"""
    cached = cached_rootfs(tag)
    digest_file = _rootfs_digest_file(cached)
    if not os.path.lexists(cached):
        return None
    expected = _recorded_digest(digest_file)
    plain = cached.is_file() and not cached.is_symlink()
    actual = digests.sha256_file(cached) if plain and expected else ""
    if plain and expected and actual == expected:
        return cached
    why = (
        "is not a plain file" if not plain
        else "has no sha256 recorded beside it" if not expected
        else f"has sha256 {actual[:12]}, not the {expected[:12]} it had when it was made"
    )  # fmt: skip
    report(f"the cached rootfs {cached.name} {why}: removed, and the base is bootstrapped again")
    forget_cached_rootfs(tag)
    return None


def _recorded_digest(digest_file: Path) -> str:
    """The sha256 kept beside a cached rootfs, or "" where there is none of that form."""
    try:
        text = confined.read_bytes(digest_file, 128).decode(errors="replace").strip()
    except UserError:
        return ""
    return text if re.fullmatch(r"[0-9a-f]{64}", text) else ""


def forget_cached_rootfs(tag: str) -> None:
    cached = cached_rootfs(tag)
    for path in (cached, _rootfs_digest_file(cached)):
        path.unlink(missing_ok=True)


MMDEBSTRAP_HOOKS = Path("/usr/share/mmdebstrap/hooks")


def hook_options(base: BaseImage) -> list[str]:
    """mmdebstrap's --hook-dir for each hook folder the base names (the schema allows only
    folders mmdebstrap ships)."""
    options = []
    for name in base.hooks:
        folder = MMDEBSTRAP_HOOKS / name
        if not folder.is_dir():
            raise UserError(f"base {base.name}: mmdebstrap's hook folder {folder} is missing; install mmdebstrap 1.0+")
        options.append(f"--hook-dir={folder}")
    return options


def _run_locked_bootstrap(base: BaseImage, packages: LockedPackages, epoch: int, rootfs: Path) -> None:
    if base.bootstrap_tool != "mmdebstrap" or shutil.which("mmdebstrap") is None:
        raise UserError(
            f"base {base.name}: bootstrapping from locked packages needs mmdebstrap (apt-get install mmdebstrap)"
        )
    # The image keeps the distro's own sources (apt in the image and in images built FROM it
    # reaches the mirror), not the local repository's; and no keyring copied from the host
    # (mmdebstrap copies the host's), only those the locked packages install.
    hooks = hook_options(base)  # refuses a missing hook folder before anything runs
    mirror_lines = " ".join(f"'{line}'" for line in base.sources_lines())
    own_sources = f'printf "%s\\n" {mirror_lines} > "$1/etc/apt/sources.list"'
    own_keys = (
        'for key in "$1"/etc/apt/trusted.gpg.d/*; do [ -e "$key" ] || continue; '
        'dpkg-query --admindir="$1/var/lib/dpkg" --search "${key#"$1"}" >/dev/null 2>&1 || rm -f "$key"; done'
    )
    extra = foreign_options(base)
    # mmdebstrap keeps --dpkgopt lines in 99mmdebstrap; the images' first apt step writes the
    # same exclusions as /etc/dpkg/dpkg.cfg.d/torch-images, their one place.
    dpkg = [f"--dpkgopt={line}" for line in packages.dpkg]
    forget_dpkgopt = 'rm -f "$1/etc/dpkg/dpkg.cfg.d/99mmdebstrap"'
    command = [
        "mmdebstrap", f"--variant={base.variant}", f"--mode={mode_for_bootstrap()}",
        "--format=tar", f"--include={','.join(packages.names)}", *extra, *hooks, *dpkg,
        f"--customize-hook={own_sources}", f"--customize-hook={own_keys}", f"--customize-hook={forget_dpkgopt}",
        "--quiet",
        base.suite, str(rootfs), packages.sources_line,
    ]  # fmt: skip
    result = run_bootstrap_tool(command, epoch)
    if result.returncode != 0:
        raise UserError(f"bootstrap of {base.suite} from its locked packages failed: {failure_reason(result)}")


def foreign_options(base: BaseImage) -> list[str]:
    """mmdebstrap's options for a base of another architecture than the host's: the architecture,
    and no check of its own. mmdebstrap checks a foreign architecture with arch-test and then wants
    the host's /usr/bin/qemu-aarch64-static, unless a binfmt entry named qemu-aarch64 has the F
    flag: on a machine that never had Debian's qemu-user-static it refuses, though the builder's
    own entry (emulation.ensure, checked before every bootstrap) runs the pinned qemu for it."""
    if base.arch == emulation.host_architecture():
        return []
    return [f"--architectures={base.arch}", "--skip=check/qemu"]


# mmdebstrap's closing line, which says only that it failed, and never why.
_GENERIC_FAILURE = re.compile(r"^E: (mmdebstrap|debootstrap) failed( to run)?\.?$")


def failure_reason(result: subprocess.CompletedProcess[str]) -> str:
    """The line of a failed bootstrap that says why: the first of its `E:` lines (mmdebstrap's
    `E: setup failed: E: cannot find …`) other than the closing "failed to run", else its last
    line. Made safe for a terminal: the output is the mirror's and the packages' words."""
    lines = [line.strip() for line in f"{result.stderr or ''}\n{result.stdout or ''}".splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E:") and not _GENERIC_FAILURE.match(line)]
    chosen = errors[0] if errors else (lines[-1] if lines else "no output")
    return terminal.printable(chosen)[:400]


def mode_for_bootstrap() -> str:
    """mmdebstrap's root mode as root or through passwordless sudo (see privilege.py: user
    namespaces are refused on GitHub's ubuntu-24.04 runners); unshare mode otherwise."""
    return "root" if privilege.root_prefix() is not None else "unshare"


def run_bootstrap_tool(command: list[str], epoch: int) -> subprocess.CompletedProcess[str]:
    """The bootstrap tool with SOURCE_DATE_EPOCH set, as root where root mode was chosen."""
    environment = {"SOURCE_DATE_EPOCH": str(epoch)}
    privileged = privilege.as_root(command, environment) if "--mode=root" in command else None
    if privileged is not None:
        return run_to_its_end(privileged)
    return run_to_its_end(command, {**os.environ, **environment})


BOOTSTRAP_STOP_S = 60  # how long an interrupted bootstrap may take to clean up after itself


def run_to_its_end(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `command` in a process group of its own, its output kept. Interrupted (SIGTERM,
    Ctrl-C), the whole group is asked to stop with SIGTERM and given a minute to clean up, then
    killed: subprocess.run kills only the first process, and measured, mmdebstrap's own child
    then ran on, orphaned, and left its half-made root filesystem (61 MB) in /tmp."""
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as process:
        try:
            stdout, stderr = process.communicate()
        except BaseException:
            _stop_group(process)
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _stop_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.communicate(timeout=BOOTSTRAP_STOP_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def _load_rootfs(
    engine: docker.DockerClient,
    base: BaseImage,
    epoch: int,
    rootfs: Path,
    tag: str,
    extra: dict[str, str] | None = None,
) -> str:
    """Load a root filesystem as a one-layer image with fixed times, its tar first rewritten in the
    canonical encoding (in place: the cache keeps that form); returns the image's config digest."""
    diff_id = canonical.rewrite_file(rootfs, epoch).diff_id
    labels = {"base": base.name, "suite": base.suite, **(extra or {})}
    history = [f"bootstrap {base.suite}" + ("" if base.arch == "amd64" else f" {base.arch}")]
    config = archive.image_config([diff_id], epoch, labels, history, base.arch)
    images = archive.load(engine, config, [(diff_id, rootfs)], tag, epoch)
    return ids.remember(images[0].id, config)


SOURCES_LABEL = "io.torch-images.sources"


def sources_key(base: BaseImage) -> str:
    """A name for the suites a base bootstrapped from the mirror reads (its sources.list)."""
    listing = "\n".join(base.sources_lines())
    return hashlib.sha256(listing.encode()).hexdigest()[:16]


def _reads_its_sources(engine: docker.DockerClient, base: BaseImage) -> bool:
    """A base bootstrapped from the mirror resolves `lock`'s packages with the apt sources it was
    made with: one made before the matrix named another suite (the security archive) is made again."""
    labels = engine.images.get(base.local_tag).labels or {}
    return labels.get(SOURCES_LABEL) == sources_key(base)


def _present(engine: docker.DockerClient, reference: str, arch: str) -> bool:
    try:
        found: str = engine.images.get(reference).attrs.get("Architecture", "")
        return found == arch
    except docker.errors.ImageNotFound:
        return False


def bootstrap(engine: docker.DockerClient, base: BaseImage, epoch: int, report: Report = print) -> str:
    """Bootstrap the base from the mirror and load it into the engine; returns the image ID."""
    with tempfile.TemporaryDirectory(prefix="torch-images-base-") as scratch:
        rootfs = Path(scratch, "rootfs.tar")
        emulation.ensure(base.arch, report)
        report(f"bootstrapping {base.distro} {base.suite} ({base.arch}) with {base.bootstrap_tool}")
        _run_bootstrap(base, epoch, rootfs, Path(scratch))
        image_id = _load_rootfs(engine, base, epoch, rootfs, base.local_tag, {SOURCES_LABEL: sources_key(base)})
    report(f"loaded {base.local_tag} ({image_id[:19]})")
    return image_id


def _run_bootstrap(base: BaseImage, epoch: int, rootfs: Path, scratch: Path) -> None:
    tool = shutil.which(base.bootstrap_tool)
    if tool is None:
        raise UserError(f"{base.bootstrap_tool} is not installed; install it (apt-get install {base.bootstrap_tool})")
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    components = ",".join(base.components)
    extra = [f"--include={','.join(base.include)}"] if base.include else []
    if base.bootstrap_tool == "mmdebstrap":
        extra.extend(foreign_options(base))
    elif base.arch != emulation.host_architecture():
        extra.append(f"--arch={base.arch}")
    if base.keyring is not None:
        # apt checks signatures as its unprivileged _apt user, which must be able to read the
        # keyring: the scratch folder is created private (0700).
        scratch.chmod(0o755)
        extra.append(f"--keyring={keyring_file(base.keyring, scratch)}")
    if base.bootstrap_tool == "mmdebstrap":
        mode = mode_for_bootstrap()
        # One sources line per suite when there are several (the security archive's included);
        # the image's apt keeps them.
        sources = base.sources_lines()
        command = [
            tool, f"--variant={base.variant}", f"--mode={mode}", "--format=tar", f"--components={components}",
            *extra, *hook_options(base), "--quiet", base.suite, str(rootfs),
            *(sources if len(sources) > 1 else [base.mirror]),
        ]  # fmt: skip
        result = run_bootstrap_tool(command, epoch)
    else:
        if base.extra_suites or base.hooks or base.security:
            raise UserError(
                f"base {base.name}: extra_suites, hooks and security need mmdebstrap (debootstrap has none)"
            )
        target = scratch / "root"
        command = [
            tool,
            f"--variant={base.variant}",
            f"--components={components}",
            *extra,
            base.suite,
            str(target),
            base.mirror,
        ]
        result = run_to_its_end(command, env)
        if result.returncode == 0:
            subprocess.run(
                ["tar", "--sort=name", f"--mtime=@{epoch}", "--clamp-mtime", "--numeric-owner", "-C", str(target),
                 "-cf", str(rootfs), "."],
                check=True,
            )  # fmt: skip
    if result.returncode != 0:
        raise UserError(f"bootstrap of {base.suite} from {base.mirror} failed: {failure_reason(result)}")


def keyring_file(keyring: KeyringSpec, scratch: Path) -> Path:
    """The keyring file from its .deb, fetched once into the cache and checked against its
    pinned sha256 (the mirror is then checked with it)."""
    cached = paths.cache_dir("keyrings") / keyring.sha256 / Path(keyring.deb).name
    debfile.fetch(str(keyring.deb), keyring.sha256, cached, "the matrix pins")
    found = debfile.unpacked(cached, scratch / "keyring", keyring.sha256) / keyring.file
    if not found.is_file():
        raise UserError(f"{keyring.deb} has no {keyring.file}; name the keyring file inside it")
    return found
