"""A hosted CI runner, as far as this machine can be one: a non-root user in the docker group with
passwordless sudo, who cannot create user namespaces, running a workflow's `run:` steps word for
word, the way GitHub's runner does (bash -eo pipefail, GITHUB_ENV carried between steps).

GitHub's ubuntu-24.04 runners refuse unprivileged user namespaces through AppArmor (as
`kernel.apparmor_restrict_unprivileged_userns=1`; Debian kernels say it with
`kernel.unprivileged_userns_clone=0`). This machine's kernel has neither switch and its root
may not lower `user.max_user_namespaces`, so the steps run under a seccomp filter that refuses
CLONE_NEWUSER to unshare() and clone(), and makes clone3() answer ENOSYS so that libc falls
back to clone(), as Docker's default seccomp profile does. The effect for the steps is the same:
`unshare --user` and mmdebstrap's unshare mode fail; sudo, as on the runner, still works.

The steps see the host's packages through a mount namespace of their own, with an overlay over
each place a package manager writes (PACKAGE_STATE): a package the test removes there, and what a
step then installs with `sudo apt-get`, are the runner's alone. The host's packages stay as they
were, so tests on the host may run meanwhile.
"""

from __future__ import annotations

import ctypes
import os
import platform
import pwd
import re
import shlex
import shutil
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# linux/filter.h and linux/seccomp.h
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x45, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38
AUDIT_ARCH_X86_64 = 0xC000003E
NR_CLONE, NR_UNSHARE, NR_CLONE3 = 56, 272, 435  # x86-64
CLONE_NEWUSER = 0x10000000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
# Where dpkg and apt write: the runner's steps see these through overlays of their own.
PACKAGE_STATE = ("/usr", "/etc", "/var/lib/dpkg", "/var/lib/apt", "/var/cache/apt", "/var/log")
# The runner's own view of the host: its mount namespace (a bind of the nsfs file) and the
# overlays' upper and work folders. On disk, not on tmpfs (a package may be large), and under none
# of PACKAGE_STATE.
VIEW = Path("/var/tmp/torch-images-runner")


def _instruction(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def no_user_namespaces_filter() -> bytes:
    """The BPF program: refuse CLONE_NEWUSER (EPERM), clone3 (ENOSYS); allow all else."""
    program = [
        _instruction(BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _instruction(BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        _instruction(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),  # another ABI (x32, i386): refused
        _instruction(BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        _instruction(BPF_JEQ_K, 0, 1, NR_CLONE3),
        _instruction(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
        _instruction(BPF_JEQ_K, 1, 0, NR_UNSHARE),
        _instruction(BPF_JEQ_K, 0, 3, NR_CLONE),
        _instruction(BPF_LD_W_ABS, 0, 0, 16),  # the low word of args[0]: the flags of both calls
        _instruction(BPF_JSET_K, 0, 1, CLONE_NEWUSER),
        _instruction(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        _instruction(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
    return b"".join(program)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def refuse_user_namespaces() -> None:
    """Install the filter on the calling process (a child before exec; kept across exec and
    setuid). As root no no_new_privs is needed, so sudo keeps working under it."""
    program = no_user_namespaces_filter()
    buffer = ctypes.create_string_buffer(program)
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def supported() -> str | None:
    """Why this machine cannot play the runner, or None."""
    if os.geteuid() != 0:
        return "making the runner's user and sudoers entry needs root"
    if platform.machine() != "x86_64":
        return "the seccomp filter is written for x86-64 system call numbers"
    return None


@dataclass
class Runner:
    """The runner's user, with passwordless sudo and the docker group, and its workspace."""

    user: str = "ci-runner"
    env: dict[str, str] = field(default_factory=dict)  # what GITHUB_ENV has set so far

    @property
    def home(self) -> Path:
        return Path(pwd.getpwnam(self.user).pw_dir)

    @property
    def workspace(self) -> Path:
        return self.home / "work"

    @property
    def namespace(self) -> Path:
        return VIEW / "mnt"

    def create(self) -> None:
        try:
            pwd.getpwnam(self.user)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", self.user], check=True)
        subprocess.run(["usermod", "--append", "--groups", "docker", self.user], check=True)
        sudoers = Path(f"/etc/sudoers.d/{self.user}")
        sudoers.write_text(f"{self.user} ALL=(ALL) NOPASSWD:ALL\n")
        sudoers.chmod(0o440)
        self._make_view()  # after the user and sudoers entry: the view's /etc starts from them

    def _make_view(self) -> None:
        """A mount namespace whose PACKAGE_STATE are overlays on the host's, kept by a bind of its
        nsfs file so that each step can enter it."""
        self._drop_view()
        VIEW.mkdir(parents=True)
        self.namespace.touch()
        # unshare binds the namespace onto a file only on a mount that does not propagate.
        subprocess.run(["mount", "--bind", str(self.namespace), str(self.namespace)], check=True)
        subprocess.run(["mount", "--make-private", str(self.namespace)], check=True)
        subprocess.run(["unshare", f"--mount={self.namespace}", "--propagation", "private", "true"], check=True)
        for lower in PACKAGE_STATE:
            upper, work = (VIEW / part / lower.strip("/").replace("/", "-") for part in ("upper", "work"))
            upper.mkdir(parents=True)
            work.mkdir(parents=True)
            options = f"lowerdir={lower},upperdir={upper},workdir={work}"
            self.as_root(["mount", "-t", "overlay", "overlay", "-o", options, lower])

    def _drop_view(self) -> None:
        for _ in range(2):  # the nsfs bind, then the file's bind onto itself
            subprocess.run(["umount", str(self.namespace)], check=False, capture_output=True)
        shutil.rmtree(VIEW, ignore_errors=True)

    def _entered(self, folder: Path = Path("/")) -> list[str]:
        """The prefix that runs a command in the runner's view of the host, in `folder` (nsenter
        into a mount namespace starts at / unless told where)."""
        return ["nsenter", f"--mount={self.namespace}", f"--wd={folder}"]

    def as_root(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        """A command as root in the runner's view of the host (the packages it sees)."""
        return subprocess.run([*self._entered(), *command], check=True, capture_output=True, text=True)

    def remove(self) -> None:
        self._drop_view()
        Path(f"/etc/sudoers.d/{self.user}").unlink(missing_ok=True)
        subprocess.run(["userdel", "--remove", self.user], check=False, capture_output=True)

    def checkout(self, repository: Path) -> None:
        """actions/checkout: the tree under test (tracked and untracked files git does not ignore),
        owned by the runner's user."""
        subprocess.run(["rm", "-rf", str(self.workspace)], check=True)
        self.workspace.mkdir(parents=True)
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=repository, check=True, capture_output=True,
        ).stdout  # fmt: skip
        files = [name for name in listed.decode().split("\0") if name and (repository / name).exists()]
        archive = subprocess.run(
            ["tar", "-C", str(repository), "--null", "-T", "-", "-cf", "-"],
            input="\0".join(files).encode(), check=True, capture_output=True,
        ).stdout  # fmt: skip
        subprocess.run(["tar", "-C", str(self.workspace), "-xf", "-"], input=archive, check=True)
        subprocess.run(["chown", "-R", f"{self.user}:{self.user}", str(self.home)], check=True)

    def run(
        self, script: str, step_env: dict[str, str], log: Callable[[str], None], timeout_s: int = 1800
    ) -> subprocess.CompletedProcess[str]:
        """One `run:` step: GitHub's `bash --noprofile --norc -eo pipefail {0}`, as the runner's
        user, in the workspace, with the workflow's env, the step's env and what GITHUB_ENV holds."""
        github_env = self.home / "github_env"
        github_env.write_text("")
        subprocess.run(["chown", f"{self.user}:{self.user}", str(github_env)], check=True)
        environment = {
            "HOME": str(self.home),
            "USER": self.user,
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_ENV": str(github_env),
            "GITHUB_WORKSPACE": str(self.workspace),
            **self.env,
            **step_env,
        }
        command = [*self._entered(self.workspace), "runuser", "-u", self.user, "--", "env", "-i",
                   *(f"{k}={v}" for k, v in environment.items()),
                   "bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script]  # fmt: skip
        log(f"$ {script}")
        result = subprocess.run(
            command, cwd=self.workspace, text=True, capture_output=True, timeout=timeout_s,
            preexec_fn=refuse_user_namespaces,
        )  # fmt: skip
        for line in github_env.read_text().splitlines():
            name, _, value = line.partition("=")
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                self.env[name] = value
        log(result.stdout + result.stderr)
        return result


EXPRESSION = re.compile(r"\$\{\{\s*([A-Za-z0-9_.]+)\s*\}\}")


def substitute(text: str, context: dict[str, str]) -> str:
    """GitHub's ${{ name }} expressions, from the context given; any other is an error."""

    def value(match: re.Match[str]) -> str:
        if match.group(1) not in context:
            raise KeyError(f"the workflow uses ${{{{ {match.group(1)} }}}}, which this runner does not provide")
        return context[match.group(1)]

    return EXPRESSION.sub(value, text)


def quoted(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)
