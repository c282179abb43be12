"""Every registry answer is validated before use: size, shape, digests; the token service is held
to the registry's TLS rule; the docker config and its helpers are hostile input too; a report is
a pass only when it lists the checks the image's self-test runs; README rows are inert text.

Each case is one line (a UserError), never a traceback, and nothing moves. The registry here is
a scriptable fake on loopback; tests/integration/test_publish.py runs the real one.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import resource
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from builder import verdict
from builder.errors import UserError
from builder.oci import auth, registry
from builder.oci.registry import OCI_INDEX, OCI_MANIFEST, Registry
from builder.publish import publish

IMAGE_ID = "sha256:" + "c" * 64


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def image_manifest(config: str = IMAGE_ID) -> bytes:
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": config, "size": 9}],
        }
    ).encode()


class Scripted(http.server.BaseHTTPRequestHandler):
    """Answers each path as `routes` says: (status, headers, body). Records what it was asked."""

    routes: ClassVar[dict[str, tuple[int, dict[str, str], bytes]]] = {}
    seen: ClassVar[list[tuple[str, str, str | None]]] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.seen.append((self.command, self.path, self.headers.get("Authorization")))
        path = self.path.split("?")[0]
        status, headers, body = self.routes.get(path, (404, {}, b""))
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = _answer


@pytest.fixture
def hostile() -> Iterator[tuple[str, type[Scripted]]]:
    handler = type("Hostile", (Scripted,), {"routes": {}, "seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def one_line(error: pytest.ExceptionInfo[UserError]) -> str:
    line = error.value.line()
    assert "\n" not in line and "Traceback" not in line
    return line


# ---------------------------------------------------------------- manifests and blobs


@pytest.mark.parametrize(
    ("body", "headers", "needle"),
    [
        (b"<html>not json</html>", {"Content-Type": OCI_MANIFEST}, "is not JSON"),
        (b"[1, 2, 3]", {"Content-Type": OCI_MANIFEST}, "is JSON but not an object"),
        (b'{"schemaVersion": 1}', {"Content-Type": OCI_MANIFEST}, "schemaVersion is not 2"),
        (b'{"schemaVersion": 2, "config": 5, "layers": []}', {"Content-Type": OCI_MANIFEST}, "not an object"),
        (
            json.dumps({"schemaVersion": 2, "config": {"digest": "sha256:../../x", "size": 1}, "layers": []}).encode(),
            {"Content-Type": OCI_MANIFEST},
            "digest is not sha256:<64 hex>",
        ),
        (b'{"schemaVersion": 2, "manifests": "no"}', {"Content-Type": OCI_INDEX}, "without a list of manifests"),
        (image_manifest(), {"Content-Type": "text/html"}, "is not a manifest or index"),
        (
            image_manifest(),
            {"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": "sha256:" + "0" * 64},
            "Docker-Content-Digest says",
        ),
    ],
)
def test_a_manifest_answer_that_is_not_a_manifest_is_one_line(
    hostile: tuple[str, type[Scripted]], body: bytes, headers: dict[str, str], needle: str
) -> None:
    host, handler = hostile
    handler.routes = {"/v2/torch/manifests/latest": (200, headers, body)}
    with pytest.raises(UserError) as refused:
        Registry(host, retries=0).manifest("torch", "latest")
    assert needle in one_line(refused)


def test_a_valid_manifest_is_read_with_the_digest_of_its_body(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    body = image_manifest()
    handler.routes = {
        "/v2/torch/manifests/latest": (
            200,
            {"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": _digest(body)},
            body,
        )
    }
    found = Registry(host, retries=0).manifest("torch", "latest")
    assert found is not None and found.digest == _digest(body) and found.media_type == OCI_MANIFEST


def test_a_manifest_fetched_by_digest_must_hash_to_it(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    asked = "sha256:" + "1" * 64
    handler.routes = {f"/v2/torch/manifests/{asked}": (200, {"Content-Type": OCI_MANIFEST}, image_manifest())}
    with pytest.raises(UserError) as refused:
        Registry(host, retries=0).manifest("torch", asked)
    assert "not the digest asked for" in one_line(refused)


def test_a_blob_fetched_by_digest_must_hash_to_it(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    asked = _digest(b"the real config")
    handler.routes = {f"/v2/torch/blobs/{asked}": (200, {}, b"a lying config")}
    with pytest.raises(UserError) as refused:
        Registry(host, retries=0).blob("torch", asked)
    assert f"blob {asked[:19]} hashes to" in one_line(refused)


def test_a_layer_streamed_into_a_file_must_hash_to_its_digest(
    hostile: tuple[str, type[Scripted]], tmp_path: Path
) -> None:
    host, handler = hostile
    honest, lying = b"a layer's bytes" * 1000, _digest(b"another layer")
    handler.routes = {
        f"/v2/torch/blobs/{_digest(honest)}": (200, {}, honest),
        f"/v2/torch/blobs/{lying}": (200, {}, honest),
    }
    api = Registry(host, retries=0)
    api.download_blob("torch", _digest(honest), tmp_path / "kept")
    assert (tmp_path / "kept").read_bytes() == honest
    with pytest.raises(UserError) as refused:
        api.download_blob("torch", lying, tmp_path / "refused")
    assert f"blob {lying[:19]} hashes to" in one_line(refused)
    assert not (tmp_path / "refused").exists()  # nothing of it is left to be used


def test_a_layer_over_its_cap_is_refused_while_streaming(hostile: tuple[str, type[Scripted]], tmp_path: Path) -> None:
    host, handler = hostile
    body = bytes(4096)
    handler.routes = {f"/v2/torch/blobs/{_digest(body)}": (200, {}, body)}
    with pytest.raises(UserError) as refused:
        Registry(host, retries=0).download_blob("torch", _digest(body), tmp_path / "layer", limit=1024)
    assert "more than the 1024" in one_line(refused)
    assert not (tmp_path / "layer").exists()


def test_a_put_whose_answered_digest_is_not_the_bytes_digest_is_refused(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    handler.routes = {"/v2/torch/manifests/t": (201, {"Docker-Content-Digest": "sha256:" + "9" * 64}, b"")}
    manifest = registry.Manifest.of(image_manifest(), OCI_MANIFEST)
    with pytest.raises(UserError) as refused:
        Registry(host, retries=0).put_manifest("torch", "t", manifest)
    assert "but its bytes hash to" in one_line(refused)


def test_a_huge_manifest_is_refused_without_reading_it_whole(hostile: tuple[str, type[Scripted]]) -> None:
    # The review's 300 MB manifest raised peak memory to 1.9 GB. At the cap and one byte past it:
    host, handler = hostile
    at_cap = b" " * (registry.MAX_MANIFEST_BYTES - len(image_manifest())) + image_manifest()
    handler.routes = {
        "/v2/torch/manifests/at-cap": (200, {"Content-Type": OCI_MANIFEST}, at_cap),
        "/v2/torch/manifests/past-cap": (200, {"Content-Type": OCI_MANIFEST}, at_cap + b" "),
    }
    client = Registry(host, retries=0)
    assert client.manifest("torch", "at-cap") is not None
    with pytest.raises(UserError) as refused:
        client.manifest("torch", "past-cap")
    assert f"more than the {registry.MAX_MANIFEST_BYTES} such an answer may hold" in one_line(refused)


def test_a_head_for_a_layer_of_a_gb_is_not_an_answer_over_the_cap(hostile: tuple[str, type[Scripted]]) -> None:
    """HEAD's Content-Length is the blob's size; there is no body to cap (the zstd upload asks
    whether a layer of 477 MB is there, and was refused)."""
    host, handler = hostile
    digest = "sha256:" + "a" * 64
    handler.routes = {f"/v2/torch/blobs/{digest}": (200, {"Content-Length": str(477 << 20)}, b"")}
    assert Registry(host, retries=0).has_blob("torch", digest)
    assert not Registry(host, retries=0).has_blob("torch", "sha256:" + "b" * 64)


def test_an_endless_answer_without_a_length_is_cut_at_the_cap() -> None:
    class Endless(Scripted):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", OCI_MANIFEST)
            self.end_headers()  # no Content-Length: the body runs until the connection closes
            chunk = b" " * (1 << 20)
            try:
                for _ in range(300):  # 300 MB
                    self.wfile.write(chunk)
            except OSError:
                pass  # the client stopped reading: the point

    class Quiet(http.server.ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # the client hanging up mid-body is what this test wants

    server = Quiet(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with pytest.raises(UserError) as refused:
            Registry(f"127.0.0.1:{server.server_address[1]}", retries=0).manifest("torch", "latest")
        assert "more than the" in one_line(refused)
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert grown_mb < 64, grown_mb  # read in pieces up to the 4 MiB cap, never the 300 MB
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- referrers


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"not json", "is not JSON"),
        (b'{"schemaVersion": 2, "manifests": [1, 2, 3]}', "descriptor that is not an object"),
        (b'{"schemaVersion": 2, "manifests": [{"digest": 7}]}', "digest is not sha256"),
        (b'{"schemaVersion": 2, "manifests": {"a": 1}}', "without a list of manifests"),
        (
            json.dumps(
                {"schemaVersion": 2, "manifests": [{"digest": IMAGE_ID, "size": 1, "annotations": {"a": 1}}]}
            ).encode(),
            "annotations that are not strings",
        ),
    ],
)
def test_referrers_that_are_not_an_index_of_descriptors_are_one_line(
    hostile: tuple[str, type[Scripted]], body: bytes, needle: str
) -> None:
    host, handler = hostile
    handler.routes = {f"/v2/torch/referrers/{IMAGE_ID}": (200, {"Content-Type": OCI_INDEX}, body)}
    with pytest.raises(UserError) as refused:
        Registry(host, retries=0).attached("torch", IMAGE_ID)
    assert needle in one_line(refused)


# ---------------------------------------------------------------- token challenges


def _challenge(header: str) -> dict[str, tuple[int, dict[str, str], bytes]]:
    return {"/v2/": (401, {"WWW-Authenticate": header}, b"")}


def test_a_challenge_without_a_realm_is_one_line(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    handler.routes = _challenge('Bearer service="x",scope="repository:torch:pull"')
    with pytest.raises(UserError) as refused:
        Registry(host, Registry.login("ci", "s3cret"), retries=0).check()
    assert "named no token service (realm)" in one_line(refused)


@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        (b"[1, 2]", "not a token"),
        (b'{"token": 5}', "not a token"),
        (b'{"token": "has a space"}', "not a token"),
        (b"<html>", "not a token"),
        (b'{"token": "' + b"x" * auth.MAX_TOKEN_ANSWER_BYTES + b'"}', "more than the"),
    ],
)
def test_a_token_answer_that_is_not_a_token_is_one_line(
    hostile: tuple[str, type[Scripted]], answer: bytes, needle: str
) -> None:
    host, handler = hostile
    handler.routes = {**_challenge(f'Bearer realm="http://{host}/token",service="s"'), "/token": (200, {}, answer)}
    with pytest.raises(UserError) as refused:
        Registry(host, Registry.login("ci", "s3cret"), retries=0).check()
    assert needle in one_line(refused) and "s3cret" not in one_line(refused)


def test_a_token_is_used_once_the_token_service_grants_it(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    handler.routes = {
        **_challenge(f'Bearer realm="http://{host}/token",service="s"'),
        "/token": (200, {}, b'{"token": "t0k"}'),
    }
    with pytest.raises(UserError, match=r"wants credentials|refused"):
        Registry(
            host, Registry.login("ci", "s3cret"), retries=0
        ).check()  # /v2/ keeps refusing: the token was sent and refused
    token_request = next(auth_header for method, path, auth_header in handler.seen if path.startswith("/token"))
    assert token_request == "Basic " + base64.b64encode(b"ci:s3cret").decode()
    assert handler.seen[-1][2] == "Bearer t0k"


def test_basic_credentials_never_go_to_a_plain_http_token_service_on_another_host() -> None:
    # The review's case: an HTTPS registry (or a plain one) naming http://elsewhere as its realm.
    for plain, insecure in ((False, False), (True, False), (True, True)):
        with pytest.raises(UserError) as refused:
            auth.token_service("http://tokens.example.net/token", "registry.example.com", plain, insecure)
        assert "over plain HTTP on another host" in one_line(refused)
    assert auth.token_service("https://tokens.example.net/token", "registry.example.com", False, False)
    assert auth.token_service("http://127.0.0.1:9/token", "registry.example.com", False, False)  # loopback
    assert auth.token_service("http://registry.lan/token", "registry.lan:5000", True, True)  # its own host, --insecure
    with pytest.raises(UserError):
        auth.token_service("file:///etc/passwd", "registry.example.com", False, False)


def test_the_client_sends_nothing_to_a_refused_token_service(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    handler.routes = _challenge('Bearer realm="http://tokens.example.net/token",service="s"')
    with pytest.raises(UserError) as refused:
        Registry(host, Registry.login("ci", "s3cret"), retries=0).check()
    assert "over plain HTTP on another host" in one_line(refused)
    assert [path for _, path, _ in handler.seen] == ["/v2/"]


# ---------------------------------------------------------------- the docker config


def _config(tmp_path: Path, text: str) -> dict[str, str]:
    folder = tmp_path / "docker"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(text)
    return {"DOCKER_CONFIG": str(folder)}


def _helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str, exit_code: int = 0) -> None:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    script = folder / "docker-credential-hostile"
    script.write_text(f"#!/bin/sh\ncat >/dev/null\nprintf '%s' '{output}'\nexit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(
    ("document", "needle"),
    [
        ("[]", "its top level is not an object"),
        ('{"auths": []}', "auths must be an object"),
        ('{"auths": {"ghcr.io": "x"}}', "auths.ghcr.io must be an object"),
        ('{"auths": {"ghcr.io": {"auth": 5}}}', "auths.ghcr.io.auth must be a string"),
        ('{"auths": {"ghcr.io": {"auth": "%%%not-base64"}}}', "auths.ghcr.io.auth is not base64 of user:password"),
        (
            '{"auths": {"ghcr.io": {"auth": "' + base64.b64encode(b"no-colon-s3cret").decode() + '"}}}',
            "holds no user:password",
        ),
        ('{"credHelpers": {"ghcr.io": "../../bin/sh"}}', "must name a credential helper"),
        ('{"credHelpers": {"ghcr.io": 5}}', "must name a credential helper"),
        ('{"credsStore": ["x"]}', "credsStore must be the name of a credential helper"),
    ],
)
def test_a_malformed_docker_config_is_one_line_naming_the_file_and_key(
    tmp_path: Path, document: str, needle: str
) -> None:
    environ = _config(tmp_path, document)
    with pytest.raises(UserError) as refused:
        registry.find_credentials("ghcr.io", environ)
    line = one_line(refused)
    assert str(tmp_path / "docker" / "config.json") in line and needle in line and "s3cret" not in line


@pytest.mark.parametrize(
    ("output", "exit_code", "needle"),
    [
        ("not json s3cret", 0, 'other than a JSON object of "Username" and "Secret"'),
        ('{"Username": "u"}', 0, 'other than a JSON object of "Username" and "Secret"'),
        ('{"Username": 5, "Secret": "s3cret"}', 0, 'other than a JSON object of "Username" and "Secret"'),
        ("[1]", 0, 'other than a JSON object of "Username" and "Secret"'),
        ("boom s3cret", 3, "failed (exit 3)"),
    ],
)
def test_a_credential_helper_answering_garbage_is_one_line_without_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str, exit_code: int, needle: str
) -> None:
    _helper(tmp_path, monkeypatch, output, exit_code)
    environ = _config(tmp_path, '{"credHelpers": {"ghcr.io": "hostile"}}')
    with pytest.raises(UserError) as refused:
        registry.find_credentials("ghcr.io", environ)
    line = one_line(refused)
    assert needle in line and "credHelpers.ghcr.io" in line and "s3cret" not in line


def test_a_helper_that_has_no_credentials_for_the_host_falls_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _helper(tmp_path, monkeypatch, "credentials not found in native keychain", 1)
    environ = _config(tmp_path, '{"credsStore": "hostile"}')
    assert registry.find_credentials("ghcr.io", environ) is None


# ---------------------------------------------------------------- reports


def passing_report() -> dict[str, object]:
    checks = [
        {"check": name, "status": "skip" if name == "cuda-runtime" else "pass"} for name in verdict.expected_checks()
    ]
    return {"status": "pass", "image_id": IMAGE_ID, "device": "cpu", "checks": checks, "failed": []}


def test_a_report_listing_every_check_passes() -> None:
    assert verdict.why_not_a_pass(passing_report(), IMAGE_ID) is None


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda r: r.update(checks=[]), "lacks checks the self-test runs"),
        (lambda r: r.pop("checks"), "not a list of {check, status}"),
        (lambda r: r.update(checks=r["checks"][1:]), "lacks checks the self-test runs: host"),
        (lambda r: r.update(image_id="sha256:" + "d" * 64), "for another image"),
        (lambda r: r.update(status="PASS"), "status is not pass"),
        (lambda r: r["checks"].append({"check": "host", "status": "pass"}), "lists a check twice"),
        (lambda r: r["checks"][0].update(status="fail"), "yet checks failed: host"),
        (lambda r: r["checks"][0].update(status="maybe"), "not a list of {check, status}"),
        (lambda r: r.update(device="<script>alert(1)</script>"), "device is not a plain name"),
        (lambda r: r.update(device="cpu\n<!-- published-tags:end -->"), "device is not a plain name"),
    ],
)
def test_a_report_that_is_not_a_full_pass_for_the_image_is_refused(edit: object, needle: str) -> None:
    report = passing_report()
    edit(report)  # type: ignore[operator]
    why = verdict.why_not_a_pass(report, IMAGE_ID)
    assert why is not None and needle in why


def test_report_text_reaches_the_readme_as_inert_text(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    hostile = {
        "repository": "127.0.0.1:5000/torch",
        "tags": ["2.13.0-cpu", "<b>x</b>"],
        "digest": "sha256:" + "a" * 64,
        "platform": "linux/amd64",
        "selftest": {
            "status": f"pass {publish.TABLE_END} [x](javascript:alert(1)) <script>",
            "passed": 14,
            "checks": "<img src=x>",
            "device": "cpu\n| injected | row |",
        },
        "gpu": {
            "status": "pass",
            "device": "H200 | <i>x</i> https://evil.example/login www.evil.example",
            "capability": "`9.0",
            "driver": "[d](x)",
            "matmul_bf16_fraction_of_peak": 0.8,
        },
    }
    (records / "a.json").write_text(json.dumps(hostile))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{publish.TABLE_START}\n{publish.TABLE_END}\noutro\n")
    publish.update_readme_table(readme, records)
    text = readme.read_text()
    assert text.count(publish.TABLE_END) == 1 and text.endswith(f"{publish.TABLE_END}\noutro\n")
    table = text[text.index(publish.TABLE_START) : text.index(publish.TABLE_END)]
    assert "<" not in table.replace(publish.TABLE_START, "") and "](javascript:" not in table
    assert "://" not in table and "www." not in table  # GitHub links neither by itself (issue 47)
    assert len([line for line in table.splitlines() if line.startswith("|")]) == 3  # header, rule, one row
    row = table.splitlines()[-1]
    assert row.count(" | ") == 5  # six cells: the device's | is escaped, not a new cell
    assert "bf16 matmul 80% of peak" in row and "\\`9.0" in row  # the backtick escaped: no code span
    assert "`127.0.0.1:5000/torch:2.13.0-cpu`" in row


def test_an_error_body_that_echoes_the_credentials_is_quoted_without_them(hostile: tuple[str, type[Scripted]]) -> None:
    """Issue 35: a registry's error body that repeats the Authorization header reached the error line."""
    host, handler = hostile
    pair = base64.b64encode(b"ci:s3cret-pass").decode()
    echo = f'{{"errors": [{{"detail": "bad header Authorization: Basic {pair} for ci:s3cret-pass\\u001b[2J"}}]}}'
    handler.routes = {"/v2/": (200, {}, b"{}"), "/v2/torch/manifests/x": (400, {}, echo.encode())}
    client = Registry(host, Registry.login("ci", "s3cret-pass"), retries=0)
    client.authorization = f"Basic {pair}"
    with pytest.raises(UserError) as caught:
        client.put_manifest("torch", "x", registry.Manifest.of(image_manifest(), OCI_MANIFEST))
    line = one_line(caught)
    assert "refused the manifest for torch:x (400:" in line and "Basic ***" in line
    assert "s3cret-pass" not in line and pair not in line and "\x1b" not in line


def test_a_reference_with_a_password_is_refused_without_repeating_it() -> None:
    from builder.publish import verify

    with pytest.raises(UserError) as caught:
        verify.parse_reference("bob:hunter2@ghcr.io/acme/torch:latest")
    line = one_line(caught)
    assert "hunter2" not in line and "'bob:***@ghcr.io/acme/torch:latest' carries credentials" in line
    assert verify.parse_reference("ghcr.io/acme/torch@sha256:" + "a" * 64).digest == "sha256:" + "a" * 64
