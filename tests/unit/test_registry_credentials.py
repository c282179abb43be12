"""Registry credentials are found the way docker finds them, and never shown."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from builder import downloads
from builder.errors import UserError
from builder.oci import auth, registry


def _docker_config(tmp_path: Path, document: dict[str, object]) -> dict[str, str]:
    folder = tmp_path / "docker"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(document))
    return {"DOCKER_CONFIG": str(folder)}


def _helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, username: str, secret: str) -> Path:
    """A docker credential helper on PATH that records the host it was asked about."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    asked = tmp_path / f"{name}-asked"
    script = folder / f"docker-credential-{name}"
    script.write_text(
        f'#!/bin/sh\ncat > {asked}\nprintf \'{{"ServerURL": "x", "Username": "{username}", "Secret": "{secret}"}}\'\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return asked


def test_a_credential_helper_named_for_the_host_is_asked_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _helper(tmp_path, monkeypatch, "torchtest", "helper-user", "helper-s3cret")
    environ = _docker_config(tmp_path, {"credHelpers": {"ghcr.io": "torchtest"}})
    environ.update({registry.USER_VARIABLE: "env-user", registry.PASSWORD_VARIABLE: "env-pass"})
    found = registry.find_credentials("ghcr.io", environ)
    assert found is not None and (found.username, found.password) == ("helper-user", "helper-s3cret")
    assert asked.read_text() == "ghcr.io"
    assert "credHelpers.ghcr.io (torchtest)" in found.source and "helper-s3cret" not in repr(found)


def test_a_creds_store_is_asked_as_docker_asks_it_before_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker's order (docker/cli's configfile): the host's credHelpers entry, else credsStore
    where it is set, whose answer overwrites an inline `auths` entry (an empty one when the store
    has none), else the inline entry; the builder's environment variables come after all of it."""
    _helper(tmp_path, monkeypatch, "store", "store-user", "store-pass")
    inline = base64.b64encode(b"inline-user:inline-pass").decode()
    environ = _docker_config(tmp_path, {"auths": {"harbor.example": {"auth": inline}}, "credsStore": "store"})
    environ[registry.USER_VARIABLE] = "env-user"
    for host in ("harbor.example", "quay.io"):
        found = registry.find_credentials(host, environ)
        assert found is not None and found.username == "store-user" and "credsStore (store)" in found.source
    without_store = _docker_config(tmp_path / "no-store", {"auths": {"harbor.example": {"auth": inline}}})
    by_auths = registry.find_credentials("harbor.example", without_store)
    assert by_auths is not None and (by_auths.username, by_auths.password) == ("inline-user", "inline-pass")


def test_the_environment_is_the_fallback(tmp_path: Path) -> None:
    environ = _docker_config(tmp_path, {"auths": {}})
    assert registry.find_credentials("ghcr.io", environ) is None
    environ.update({registry.USER_VARIABLE: "ci", registry.PASSWORD_VARIABLE: "s3cret"})
    found = registry.find_credentials("ghcr.io", environ, configured="ghcr.io")
    assert found is not None and found.source == registry.USER_VARIABLE and "s3cret" not in repr(found)


def test_the_environments_credentials_go_to_the_configured_registry_only(tmp_path: Path) -> None:
    """Issue 35: `verify` of another registry's image handed it the team's push credentials."""
    environ = _docker_config(tmp_path, {"auths": {}})
    environ.update({registry.USER_VARIABLE: "ci", registry.PASSWORD_VARIABLE: "s3cret"})
    assert registry.find_credentials("elsewhere.example", environ, configured="ghcr.io") is None
    assert registry.find_credentials("ghcr.io", environ, configured=None) is None  # nothing says whose they are
    environ[auth.HOST_VARIABLE] = "harbor.example"
    assert registry.find_credentials("ghcr.io", environ, configured="ghcr.io") is None
    assert registry.find_credentials("harbor.example", environ, configured="ghcr.io") is not None


def test_a_broken_docker_config_is_one_line_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text("{not json")
    with pytest.raises(UserError) as caught:
        registry.find_credentials("ghcr.io", {"DOCKER_CONFIG": str(tmp_path / "docker")})
    assert f"{tmp_path / 'docker' / 'config.json'}: not a docker config file" in caught.value.line()


def test_https_unless_loopback_or_insecure_and_a_ca_file_means_https(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    assert registry.Registry("ghcr.io").base.startswith("https://")
    assert registry.Registry("127.0.0.1:5000").base.startswith("http://")
    assert registry.Registry("127.0.0.1:5000", ca_file=ca).base.startswith("https://")
    assert registry.Registry("registry.internal:5000", insecure=True).base.startswith("http://")
    assert registry.Registry("ghcr.io").session.verify == downloads.system_ca_bundle()


def test_a_credential_helper_that_is_not_installed_is_one_line(tmp_path: Path) -> None:
    environ = _docker_config(tmp_path, {"credHelpers": {"ghcr.io": "absent-helper"}})
    with pytest.raises(UserError) as caught:
        registry.find_credentials("ghcr.io", environ)
    assert "names the credential helper 'absent-helper' for ghcr.io" in caught.value.line()
    assert "docker-credential-absent-helper is not on PATH" in caught.value.line()


def test_docker_hub_names_reach_its_api_host_with_the_login_docker_wrote(tmp_path: Path) -> None:
    """Issue 39: `docker.io/...` references did not map to Docker Hub's registry host."""
    inline = base64.b64encode(b"hub-user:hub-pass").decode()
    environ = _docker_config(tmp_path, {"auths": {"https://index.docker.io/v1/": {"auth": inline}}})
    for name in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        assert registry.Registry(name).base == "https://registry-1.docker.io/v2/"
        found = registry.find_credentials(name, environ)
        assert found is not None and found.username == "hub-user", name
    assert registry.Registry("ghcr.io").base == "https://ghcr.io/v2/"


def test_the_registry_client_takes_the_environments_proxy_unless_no_proxy_or_loopback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 39: the client ignored HTTPS_PROXY (it reads no netrc, but a proxy it must)."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert registry.Registry("ghcr.io").session.proxies == {}
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.corp.example:3128")
    assert registry.Registry("ghcr.io").session.proxies.get("https") == "http://proxy.corp.example:3128"
    assert registry.Registry("127.0.0.1:5000").session.proxies == {}  # loopback: always direct
    monkeypatch.setenv("NO_PROXY", "ghcr.io,.internal")
    assert registry.Registry("ghcr.io").session.proxies == {}
    assert registry.Registry("harbor.internal").session.proxies == {}
    assert registry.Registry("quay.io").session.proxies.get("https") == "http://proxy.corp.example:3128"
