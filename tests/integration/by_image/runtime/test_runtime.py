"""The runtime image, built on the real engine: what users get when they run or extend it.

The tests are methods of TestRuntimeImage and take the image as the `image` fixture, so an
image built FROM the same stack (devel, in ../devel/) inherits them all by subclassing and
giving its own image (as jupyter/docker-stacks' tests by image do). Which cell is built is
`--cell` (see tests/conftest.py).
"""

from __future__ import annotations

import base64
import csv
import fnmatch
import functools
import hashlib
import http.server
import io
import json
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.assemble import build, smoke
from builder.config import layout
from builder.lock import requirements as lock
from tests import image_checks
from tests.integration.conftest import BuiltCell, smoke_of

pytestmark = pytest.mark.integration


HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_PUBLIC_CAS = Path("/usr/share/ca-certificates")  # the distro's public CAs, as ca-certificates ships them


def _wheel(name: str, version: str, requires: list[str]) -> tuple[str, bytes]:
    """A minimal valid wheel: enough for pip to resolve and install it."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = '{version}'\n".encode(),
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        ).encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = io.StringIO()
    writer = csv.writer(rows)
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([path, f"sha256={digest}", len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{dist_info}/RECORD", rows.getvalue())
    return f"{name}-{version}-py3-none-any.whl", buffer.getvalue()


def _tempting_index(tmp_path: Path) -> Iterator[str]:
    """A loopback index offering a newer 'torch' and a package that wants the newest torch."""
    for name, version, requires in [("torch", "99.0.0", []), ("needs_torch", "1.0", ["torch>=2"])]:
        filename, data = _wheel(name, version, requires)
        (tmp_path / filename).write_bytes(data)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None  # type: ignore[method-assign, assignment]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _downstream_torch_version(image: BuiltCell, index: str, tmp_path: Path, extra_env: str) -> str:
    (tmp_path / "Dockerfile").write_text(
        f"FROM {image.image_id}\n"
        f"RUN {extra_env} pip install --no-index --find-links {index} --upgrade --upgrade-strategy eager needs_torch\n"
        'CMD ["python", "-c", "import torch, needs_torch; print(torch.__version__)"]\n'
    )
    image, _ = image.client.images.build(path=str(tmp_path), network_mode="host", rm=True, forcerm=True)
    try:
        output: bytes = image.client.containers.run(image.id, remove=True, network_mode="none")
        return output.decode().strip()
    finally:
        image.client.images.remove(image.id, force=True)


def _cpu_status(image: BuiltCell) -> str:
    """The x86-64 torch wheels of the matrix carry oneMKL 2024.2, whose VML first-call race
    (pytorch#188792) the cpu check reports as a warning; the aarch64 wheels carry no MKL."""
    return "warn" if image.cell.arch == "amd64" else "pass"


def _is_locked_torch(reported: str, locked: str) -> bool:
    """PyPI's CUDA wheels report a local tag (2.15.0+cu132) their metadata version (2.15.0), which
    the lock pins, lacks; a lock that pins a local version (2.13.0+cpu) must match it exactly."""
    return reported == locked if "+" in locked else reported.split("+")[0] == locked


class TestRuntimeImage:
    @pytest.fixture
    def image(self, built: BuiltCell) -> BuiltCell:
        return built

    @pytest.fixture
    def smoke_result(self, image: BuiltCell) -> smoke.SmokeResult:
        return smoke_of(image)

    # Fixtures a test of this class takes are methods of it, so that subclasses in other
    # modules (devel) find them too.
    @pytest.fixture
    def tempting_index(self, tmp_path: Path) -> Iterator[str]:
        yield from _tempting_index(tmp_path)

    def test_torch_imports_and_a_compiled_function_runs_inside_the_image(self, image: BuiltCell) -> None:
        program = (
            "import torch\n"
            "f = torch.compile(lambda x: torch.sin(x) * 2 + x.cos())\n"
            "x = torch.randn(64)\n"
            "assert torch.allclose(f(x), torch.sin(x) * 2 + x.cos(), atol=1e-5)\n"
            "print(torch.__version__)\n"
        )
        assert _is_locked_torch(image.run("python", "-c", program).strip(), image.cell.torch.version)

    def test_the_self_test_passes_and_its_report_is_kept_under_the_image_id(
        self, smoke_result: smoke.SmokeResult, image: BuiltCell
    ) -> None:
        assert smoke_result.status == "pass", smoke_result.summary
        checks = {c["check"]: c["status"] for c in smoke_result.report["checks"]}
        cuda_only = "pass" if image.cell.is_cuda else "skip"
        assert checks == {
            "host": "pass",  # the builder gives the container 1 GiB of /dev/shm
            "environment": "pass",
            "libraries": cuda_only,
            "cpu": _cpu_status(image),
            "conv2d": "pass",
            "linalg": "pass",
            "triton": cuda_only,
            "torch.compile": "pass",
            "amp": "pass",
            "sdpa": "pass",
            "throughput": "pass",
            "distributed": "pass",
            "cuda-runtime": cuda_only,
            "tensorrt-llm": "skip",  # not a trtllm image
        }
        cpu = next(c for c in smoke_result.report["checks"] if c["check"] == "cpu")
        if cpu["status"] == "warn":
            assert "pytorch#188792" in cpu["message"] and cpu["metrics"]["mkl"] == "2024.2"
        assert cpu["metrics"]["inductor_isa"]  # a warning keeps the check's metrics
        if image.cell.is_cuda:  # PyTorch's release invariant: the nvidia wheels are what torch loads, cuBLAS too
            libraries = next(c for c in smoke_result.report["checks"] if c["check"] == "libraries")["metrics"]
            assert libraries["cublas"] and str(libraries.get("cublas_wheel", "")).startswith(libraries["cublas"])
        assert smoke.passing_report(image.image_id) is not None
        assert smoke_result.path == smoke.report_path(image.image_id)

    def test_the_self_test_warns_about_dockers_default_dev_shm_and_still_passes(self, image: BuiltCell) -> None:
        output = image.run("torch-selftest", "--only", "host")  # a plain `docker run`: 64 MiB of /dev/shm
        assert "warning: /dev/shm is 64 MiB" in output and "--shm-size" in output and "result: pass" in output
        assert "warning" not in image.run("torch-selftest", "--only", "host", shm_size="2g")

    def test_a_check_past_its_time_limit_fails_by_name_and_the_report_still_comes_out(self, image: BuiltCell) -> None:
        """The two-process check takes seconds to spawn its workers: a 1-second limit stops it, its
        workers with it, and the run goes on to write the report."""
        output = image.run("sh", "-c", "torch-selftest --only distributed --check-timeout 1 --json -; echo exit=$?")
        report = json.loads(output[output.index("{") : output.rindex("}") + 1])
        [check] = report["checks"]
        assert check["status"] == "fail"
        assert check["message"].startswith("distributed ran past its time limit of 1 s")
        assert report["check_timeout_s"] == 1 and report["emulated"] is False
        assert output.strip().endswith("exit=1")

    def test_each_self_test_gate_fails_when_what_it_checks_is_broken(self, image: BuiltCell) -> None:
        script = (Path(__file__).parent / "selftest_sabotage.py").read_text()
        outcomes = json.loads(image.run("python", "-c", script).strip().splitlines()[-1])
        cuda_only = "fail" if image.cell.is_cuda else "skip"
        assert {case: status for case, (status, _) in outcomes.items()} == {
            "host: /dev/shm of 64 MiB": "warn",
            "host: a CUDA 12.8 driver under a CUDA 13.2 image": "fail",
            "host: a CUDA 13.0 driver under a CUDA 13.2 image (minor version compatibility)": "pass",
            "cpu: Inductor finds no vector ISA": "fail",
            "cpu: torch's oneMKL has the VML first-call race": "warn",
            "cpu: torch's oneMKL is a release without the race": "pass",
            "conv2d: fp32 off by 1e-2": "fail",
            "linalg: singular values off by 1%": "fail",
            "linalg: from_numpy copies": "fail",
            "torch.compile: compiled differs from eager": "fail",
            "torch.compile: eager is off, compiled is right": "fail",
            "libraries: the nvidia wheels are not what torch loads": cuda_only,
            "libraries: cuDNN loaded is of another major than torch was built with": cuda_only,
            "libraries: cuDNN loaded is older than torch was built with": cuda_only,
            "triton: it does not import": cuda_only,
            "cuda-runtime: torch built without NVSHMEM": cuda_only,
        }
        assert "cuda-compat-13-2" in outcomes["host: a CUDA 12.8 driver under a CUDA 13.2 image"][1]
        # A failing comparison says what to act on: dtype, where it ran, the share off, the worst element.
        compile_line = outcomes["torch.compile: compiled differs from eager"][1]
        assert "compiled in float16 differs from eager (CPU, Inductor ISA" in compile_line
        assert "4096 of 4096 elements (100.0%)" in compile_line and "worst at input" in compile_line
        assert "the compiled result is off against float64" in compile_line
        eager_line = outcomes["torch.compile: eager is off, compiled is right"][1]
        assert "compiled in float32 differs from eager" in eager_line
        assert "the eager result is off against float64, the compiled one is right" in eager_line
        assert "pytorch#188792" in outcomes["cpu: torch's oneMKL has the VML first-call race"][1]

    def test_report_json_is_what_the_image_printed(self, smoke_result: smoke.SmokeResult) -> None:
        stored = json.loads(smoke_result.path.read_text())
        assert stored["image_id"] == smoke_result.image_id and stored["status"] == smoke_result.report["status"]

    def test_a_merged_usr_base_has_usr_is_merged_and_not_usrmerge(self, image: BuiltCell) -> None:
        # usrmerge would pull perl (about 45 MB) into every image of the base.
        if "merged-usr" not in image.cell.base.hooks:
            pytest.skip(f"base {image.cell.base.name} is bootstrapped without mmdebstrap's merged-usr hook")
        installed = image.run("dpkg-query", "--show", "--showformat", "${Package}\n").split()
        assert "usr-is-merged" in installed and "usrmerge" not in installed

    def test_what_the_layout_leaves_out_is_absent_and_what_the_flavor_keeps_is_there(self, image: BuiltCell) -> None:
        # The base is bootstrapped with the same rules, so this holds for its files too.
        rules = layout.load()
        assert image.run("cat", "/etc/dpkg/dpkg.cfg.d/torch-images").splitlines() == list(
            rules.dpkg_for(image.cell.flavor)
        )
        assert image.run("ls", "/etc/dpkg/dpkg.cfg.d/").split() == ["torch-images"]
        # The regular files dpkg unpacked (its lists still name the excluded ones; it keeps the
        # symlinks an excluded path names, doc/<pkg> -> <other>, and triggers write files such
        # as info/dir that no package owns).
        listing = image.run(
            "sh",
            "-c",
            "cat /var/lib/dpkg/info/*.list | sort -u"
            ' | while read -r f; do [ -f "$f" ] && [ ! -L "$f" ] && echo "$f"; done; true',
        )
        files = listing.splitlines()
        assert len(files) > 1000, listing[-500:]
        left_out = [f for f in files if layout.leaves_out(rules.rules_for(image.cell.flavor), f)]
        assert left_out == [], f"files the layout leaves out: {left_out[:10]}"
        for rule in (r for r in rules.rules if image.cell.flavor in r.kept_by):
            # A rule's globs cover several distros' layouts: one of them must find files here.
            found = [f for f in files if any(fnmatch.fnmatchcase(f, glob) for glob in rule.exclude)]
            assert found, f"{rule.exclude}: nothing there, though the flavor keeps it"

    def test_labels_carry_the_versions_the_lock_resolved(self, image: BuiltCell) -> None:
        labels = image.client.images.get(image.image_id).labels
        facts = lock.lock_facts(lock.Lockfile.read(image.cell.directory / lock.STACK_LOCK))
        assert labels["io.torch-images.torch"] == facts["torch"] == image.cell.torch.version
        assert labels["io.torch-images.cuda"] == facts["cuda"]
        assert labels["io.torch-images.python"] == image.cell.python
        assert labels["io.torch-images.glibc"] == image.cell.base.glibc
        assert labels["org.opencontainers.image.version"] == image.cell.tag

    def test_the_image_installs_exactly_the_locked_versions(self, image: BuiltCell) -> None:
        frozen = lock.parse_requirements(image.run("pip", "freeze", "--all", "--exclude", "pip"))
        locked = lock.Lockfile.read(image.cell.directory / lock.STACK_LOCK).packages
        assert {name: frozen[name].version for name in locked if name in frozen} == {
            name: package.version for name, package in locked.items()
        }

    def test_no_wheel_file_or_pip_cache_is_left_in_the_image(self, image: BuiltCell) -> None:
        # Debian's python3-venv ships pip's own wheels for ensurepip; anything else is ours and leaked.
        found = image.run(
            "sh",
            "-c",
            "find / -xdev \\( -name '*.whl' -o -path '*/.cache/pip' -o -path '/root/.cache' \\) -print 2>/dev/null"
            ' | while read -r path; do dpkg -S "$path" >/dev/null 2>&1 || echo "$path"; done',
        )
        assert found.strip() == "", f"files no Debian package owns: {found}"

    def test_no_certificate_the_host_trusts_beyond_the_images_bundle_is_in_any_layer(self, image: BuiltCell) -> None:
        if not HOST_BUNDLE.exists():
            pytest.skip(f"this host has no {HOST_BUNDLE}")
        image_bundle = image.run("cat", str(HOST_BUNDLE)).encode()
        host_public = b"".join(p.read_bytes() for p in sorted(HOST_PUBLIC_CAS.rglob("*.crt")))
        extra = image_checks.host_only_certificates(HOST_BUNDLE.read_bytes(), image_bundle, host_public)
        if not extra:
            pytest.skip("this host trusts no certificate beyond the image's own bundle: nothing to look for")
        assert image_checks.find_in_layers(image.client, image.image_id, image_checks.needles(extra)) == []

    def test_each_cuda_and_cudnn_library_is_stored_once(self, image: BuiltCell) -> None:
        # Byte-identical shared libraries must be one file (hard links); no CUDA library may come twice
        # from two sources (a CUDA base image plus the wheels, say). The check itself is shown to
        # catch both in tests/unit/test_image_checks.py.
        listing = image.run("sh", "-c", image_checks.library_listing())
        assert image_checks.duplicated_libraries(listing) == []
        names = image_checks.library_names(listing)
        if image.cell.is_cuda:
            for library in ("libcudnn.so", "libcublas", "libnccl.so", "libtorch_cuda.so"):
                assert any(n.startswith(library) for n in names), f"{library} is missing from a CUDA image"
        else:
            assert "libtorch_cpu.so" in names

    def test_the_standard_library_is_complete_as_python_image_users_expect(self, image: BuiltCell) -> None:
        # What docker-library's python-imports test checks in the official Python images.
        program = (
            "import bz2, curses, dbm.gnu, lzma, readline, sqlite3, ssl, zlib, ctypes, uuid\n"
            "data = b'IT WORKS IT WORKS IT WORKS'\n"
            "assert bz2.decompress(bz2.compress(data)) == data\n"
            "assert lzma.decompress(lzma.compress(data)) == data\n"
            "assert zlib.decompress(zlib.compress(data)) == data\n"
            "print('ok')\n"
        )
        assert image.run("python", "-c", program).strip() == "ok"

    def test_library_check_resolves_torch_and_catches_a_missing_dependency(self, image: BuiltCell) -> None:
        # Positive: every library torch ships resolves in the image (the driver's libcuda aside).
        # Negative control: a library linked against one that is then deleted is reported.
        program = (
            "import json, subprocess, sys, tempfile, os\n"
            "sys.path.insert(0, '/opt/torch-images')\n"
            "import selftest, torch\n"
            "lib = os.path.join(os.path.dirname(torch.__file__), 'lib')\n"
            "work = tempfile.mkdtemp()\n"
            "src = os.path.join(work, 'x.c'); open(src, 'w').write('int ghost(void); int f(void){return ghost();}')\n"
            "open(os.path.join(work, 'g.c'), 'w').write('int ghost(void){return 1;}')\n"
            "subprocess.run(['gcc', '-shared', '-fPIC', '-o', os.path.join(work, 'libghost.so'),"
            " os.path.join(work, 'g.c')], check=True)\n"
            "subprocess.run(['gcc', '-shared', '-fPIC', '-o', os.path.join(work, 'libneeds.so'), src,"
            " '-L' + work, '-lghost'], check=True)\n"
            "os.remove(os.path.join(work, 'libghost.so'))\n"
            "print(json.dumps([selftest.unresolved_libraries([lib]), selftest.unresolved_libraries([work])]))\n"
        )
        torch_problems, ghost_problems = json.loads(image.run("python", "-c", program).strip().splitlines()[-1])
        assert torch_problems == {}
        assert list(ghost_problems.values()) == [["libghost.so"]]

    def test_downstream_pip_install_cannot_replace_the_locked_torch(
        self, image: BuiltCell, tempting_index: str, tmp_path: Path
    ) -> None:
        (tmp_path / "guarded").mkdir()
        guarded = _downstream_torch_version(image, tempting_index, tmp_path / "guarded", "")
        assert _is_locked_torch(guarded, image.cell.torch.version)
        # Control: with the image's constraints switched off the same install does replace torch,
        # so the check above is the constraints at work and not pip being lazy.
        (tmp_path / "unguarded").mkdir()
        assert _downstream_torch_version(image, tempting_index, tmp_path / "unguarded", "PIP_CONSTRAINT=") == "99.0.0"

    def test_a_from_build_of_the_image_runs_torch(self, image: BuiltCell, tmp_path: Path) -> None:
        (tmp_path / "Dockerfile").write_text(
            f'FROM {image.image_id}\nRUN python -c "import torch; print(torch.ones(2).sum().item())" > /answer\n'
        )
        image, _ = image.client.images.build(path=str(tmp_path), rm=True, forcerm=True, network_mode="none")
        try:
            assert image.client.containers.run(image.id, ["cat", "/answer"], remove=True).decode().strip() == "2.0"
        finally:
            image.client.images.remove(image.id, force=True)


# ---------------------------------------------------------------- controls for the checks above (one image is enough)


def test_the_layer_search_finds_a_certificate_a_later_layer_deleted(built: BuiltCell, tmp_path: Path) -> None:
    # The control for the certificate test above: a file added in one layer and deleted in the
    # next is invisible in a container but still in the image, and the search finds it.
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "k.pem"),
         "-out", str(tmp_path / "planted.pem"), "-days", "1", "-subj", "/CN=planted"],
        check=True, capture_output=True,
    )  # fmt: skip
    base_reference = build.cell_base(built.client, built.grid, build.preflight(built.cell, built.grid), print)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base_reference}\nCOPY planted.pem /etc/ssl/planted.pem\nRUN rm /etc/ssl/planted.pem\n"
    )
    image, _ = built.client.images.build(path=str(tmp_path), rm=True, forcerm=True, network_mode="none")
    try:
        gone = built.client.containers.run(
            image.id, ["sh", "-c", "test -e /etc/ssl/planted.pem || echo gone"], remove=True
        )
        assert gone.decode().strip() == "gone"
        planted = image_checks.certificates((tmp_path / "planted.pem").read_bytes())
        found = image_checks.find_in_layers(built.client, image.id, image_checks.needles(planted))
        assert len(found) == 1 and found[0].endswith(": etc/ssl/planted.pem"), found
    finally:
        built.client.images.remove(image.id, force=True)
