"""Publish logic that needs no registry: alias rollback, records and the README table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from builder.errors import UserError
from builder.facts.compat import TorchWheels
from builder.oci.registry import Manifest
from builder.plan.matrix import load_matrix
from builder.publish import publish, signing, staging
from builder.publish.publisher import Publisher

REPO = Path(__file__).resolve().parents[2]


def manifest(name: str) -> Manifest:
    return Manifest(name.encode(), "application/vnd.oci.image.manifest.v1+json", f"sha256:{name}")


class FlakyRegistry:
    """A registry whose manifest PUT fails for one tag: enough to exercise the rollback."""

    def __init__(self, tags: dict[str, Manifest], failing: str) -> None:
        self.tags, self.failing, self.puts = tags, failing, []  # type: ignore[var-annotated]

    def manifest(self, repository: str, reference: str) -> Manifest | None:
        return self.tags.get(reference)

    def put_manifest(self, repository: str, reference: str, value: Manifest) -> str:
        self.puts.append(reference)
        if reference == self.failing:
            raise UserError(f"registry refused the manifest for {reference}")
        self.tags[reference] = value
        return value.digest


def test_a_failed_alias_move_puts_the_moved_aliases_back(matrix_file: Path, wheels: TorchWheels) -> None:
    grid = load_matrix(matrix_file, wheels)
    cell = grid.flagship
    assert cell.aliases == ("2.9-cu12.8-runtime", "latest")
    old, new = manifest("old"), manifest("new")
    registry = FlakyRegistry({cell.tag: new, "2.9-cu12.8-runtime": old, "latest": old}, failing="latest")
    item = publish.Publication(cell, "sha256:image", {"status": "pass"}, digest=new.digest)
    with pytest.raises(UserError, match="refused the manifest for latest"):
        publish._move_aliases(Publisher(registry, grid), [item])  # type: ignore[arg-type]
    assert registry.tags["2.9-cu12.8-runtime"] == old and registry.tags["latest"] == old
    assert registry.puts == ["2.9-cu12.8-runtime", "latest", "2.9-cu12.8-runtime"]  # the failed one is not retried


def test_records_regenerate_the_readme_table_between_its_markers(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    (records / "a.json").write_text(
        json.dumps(
            {
                "repository": "127.0.0.1:5000/torch",
                "tags": ["2.9.1-cu12.8-cudnn9.10-py3.11-bookworm-runtime", "2.9-runtime"],
                "digest": "sha256:" + "a" * 64,
                "selftest": {"status": "pass", "passed": 6, "checks": 7, "device": "cpu"},
            }
        )
    )
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{publish.TABLE_START}\nold\n{publish.TABLE_END}\noutro\n")
    publish.update_readme_table(readme, records)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{publish.TABLE_END}\noutro\n") and "old" not in text
    assert (
        "| `127.0.0.1:5000/torch:2.9.1-cu12.8-cudnn9.10-py3.11-bookworm-runtime` | linux/amd64 | `2.9-runtime` |"
        in text
    )


def test_no_engine_is_one_line_naming_the_socket_and_exit_2(tmp_path: Path) -> None:
    socket = tmp_path / "no-engine.sock"
    result = subprocess.run(
        [sys.executable, "-m", "builder", "smoke", "torch:anything"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "DOCKER_HOST": f"unix://{socket}"},
        check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: no Docker engine answers at unix://{socket}; start one")


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"tag": "another.staging-1", "digest": "sha256:' + b"a" * 64 + b'"}',
     b'{"tag": "t.staging-1", "digest": "sha256:../../x"}', b"[]", b"{" * 100000],
)  # fmt: skip
def test_a_staged_record_that_is_not_one_is_refused_in_one_line(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "t.staging-1.json").write_bytes(content)
    with pytest.raises(UserError, match=r"t.staging-1.json: not a staged record of t.staging-1"):
        staging.read_staged(tmp_path, "t.staging-1")
    with pytest.raises(UserError, match=r"--staged-record .*: no u.staging-1.json"):
        staging.read_staged(tmp_path, "u.staging-1")
    (tmp_path / "t.staging-1.json").write_text('{"tag": "t.staging-1", "digest": "sha256:' + "b" * 64 + '"}')
    assert staging.read_staged(tmp_path, "t.staging-1") == "sha256:" + "b" * 64


def test_the_spdx_form_of_the_sbom_lists_each_component_with_its_purl() -> None:
    from builder.publish import sbom

    cyclonedx = {
        "metadata": {"component": {"name": "torch:2.13.0-cpu"}},
        "components": [
            {"name": "jinja2", "version": "3.1.6", "purl": "pkg:pypi/jinja2@3.1.6"},
            {"name": "libc6", "version": "2.36-9", "purl": "pkg:deb/debian/libc6@2.36-9?arch=amd64"},
        ],
    }
    document = sbom.spdx_of(cyclonedx, "https://torch-images.invalid/spdx/sha256:x")
    assert document["spdxVersion"] == "SPDX-2.3" and document["name"] == "torch:2.13.0-cpu"
    assert [(p["name"], p["versionInfo"], p["externalRefs"][0]["referenceLocator"]) for p in document["packages"]] == [
        ("jinja2", "3.1.6", "pkg:pypi/jinja2@3.1.6"), ("libc6", "2.36-9", "pkg:deb/debian/libc6@2.36-9?arch=amd64"),
    ]  # fmt: skip
    assert len(document["relationships"]) == 2 and sbom.spdx_of(cyclonedx, "n") == sbom.spdx_of(cyclonedx, "n")


class _StagedRegistry:
    """A registry holding one staged image and, attached to it, an SBOM and `reports` self-test
    reports; it counts how often each referrer listing is read."""

    host = "127.0.0.1:5000"

    def __init__(self, tag: str, reports: int) -> None:
        config = json.dumps({"config": {"Labels": {"io.torch-images.build-id": "b" * 32}}}).encode()
        self.blobs = {"sha256:" + "c" * 64: config}
        body = json.dumps({"schemaVersion": 2, "config": {"digest": "sha256:" + "c" * 64}, "layers": []}).encode()
        self.image = Manifest.of(body, "application/vnd.oci.image.manifest.v1+json")
        self.tag, self.listings, self.artifacts = tag, [], {}
        for kind, letter, count in (("sbom", "a", 1), ("selftest", "b", reports)):
            for number in range(count):
                artifact_type, layer = publish.ARTIFACT_TYPES[kind], f"sha256:{letter * 60}{number:04d}"
                self.blobs[layer] = json.dumps({"status": "pass", "image_id": "sha256:" + "f" * 64}).encode()
                manifest = {"artifactType": artifact_type, "subject": {"digest": self.image.digest},
                            "layers": [{"mediaType": artifact_type, "digest": layer}]}  # fmt: skip
                self.artifacts[f"sha256:{letter * 56}{number:08d}"] = manifest

    def manifest(self, repository: str, reference: str) -> Manifest | None:
        return self.image if reference in (self.tag, self.image.digest) else None

    def blob(self, repository: str, digest: str, limit: int = 0) -> bytes:
        return self.blobs[digest]

    def referrers(self, repository: str, subject: str, artifact_type: str | None = None) -> list[dict[str, str]]:
        self.listings.append(artifact_type or "")
        return [{"digest": d, "artifactType": m["artifactType"]} for d, m in self.artifacts.items()
                if artifact_type in (None, m["artifactType"])]  # fmt: skip

    def artifact_manifest(self, repository: str, digest: str) -> dict[str, object]:
        return self.artifacts[digest]

    def artifact_document(self, repository: str, manifest: dict[str, Any], limit: int = 0) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.blobs[manifest["layers"][0]["digest"]])
        return document


def test_promote_without_a_key_refuses_a_staged_image_with_no_report_and_lists_reports_once(tmp_path: Path) -> None:
    """The gate without the team's key: an SBOM alone does not let a tag move, and where a report
    is attached its listing is read once, by the gate that reads the reports."""
    grid = load_matrix(REPO / "matrix.yaml")
    cell = grid.cell("2.13.0-cpu-bookworm-runtime")
    tag = staging.staging_tag(grid, cell, "7")
    bare = _StagedRegistry(tag, reports=0)
    with pytest.raises(UserError, match=r"no self-test report attached to sha256:"):
        staging.gate_in_registry(Publisher(bare, grid, lambda _: None), [cell], "7")  # type: ignore[arg-type]
    reported = _StagedRegistry(tag, reports=1)
    with pytest.raises(UserError, match="refused, nothing promoted"):  # its report is about another image
        staging.gate_in_registry(Publisher(reported, grid, lambda _: None), [cell], "7")  # type: ignore[arg-type]
    assert reported.listings.count(publish.ARTIFACT_TYPES["selftest"]) == 1


def test_the_sign_job_reads_which_documents_a_run_attached_and_refuses_a_record_that_is_not_one(tmp_path: Path) -> None:
    """A staged record names, by sha256, what the stage job attached; one staged from the
    registry names nothing; a missing, foreign or malformed one is one line."""
    tag, digest = "t.staging-1", "sha256:" + "a" * 64
    (tmp_path / f"{tag}.json").write_text(json.dumps({"tag": tag, "digest": digest, "attached": {"sbom": digest}}))
    assert signing.recorded_documents(tmp_path, tag) == {"sbom": digest}
    (tmp_path / f"{tag}.json").write_text(json.dumps({"tag": tag, "digest": digest}))  # staged from the registry
    assert signing.recorded_documents(tmp_path, tag) == {}
    for hostile in ({"tag": "other", "attached": {}}, {"tag": tag, "attached": {"sbom": "sha256:zz"}},
                    {"tag": tag, "attached": {"script": digest}},
                    {"tag": tag, "attached": {"gpu-selftest": digest}}):  # fmt: skip
        (tmp_path / f"{tag}.json").write_text(json.dumps(hostile))
        with pytest.raises(UserError, match=r"not a staged record of t\.staging-1"):
            signing.recorded_documents(tmp_path, tag)
    with pytest.raises(UserError, match=r"no u.staging-1.json; give the folder `publish stage` wrote"):
        signing.recorded_documents(tmp_path, "u.staging-1")


def test_the_engine_that_built_an_image_is_recorded_and_a_changed_record_names_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 55: the stage's provenance and a rebuild's statement name the builder (engine,
    version, store, backend): the build records it in the cache by image ID; a record that is not
    one (another image's, a control character, a link) names nothing."""
    from builder.assemble import build

    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))

    class Engine:
        def info(self) -> dict[str, object]:
            return {"Driver": "overlay2", "DriverStatus": []}

        def version(self) -> dict[str, object]:
            return {"Version": "20.10.24"}

    image_id = "sha256:" + "c" * 64
    assert build.built_by(image_id) is None
    build.record_builder(Engine(), image_id, "buildkit")  # type: ignore[arg-type]
    assert build.built_by(image_id) == "Docker 20.10.24 (overlay2), BuildKit"
    record = tmp_path / "cache" / "builds" / f"{'c' * 64}.json"
    for hostile in ({"image_id": "sha256:" + "d" * 64, "builder": "x"}, {"image_id": image_id, "builder": "x\x1b[2J"}):
        record.write_text(json.dumps(hostile))
        assert build.built_by(image_id) is None
    record.unlink()
    record.symlink_to(tmp_path / "elsewhere")
    assert build.built_by(image_id) is None


def test_the_sign_job_carries_the_first_builders_name_into_the_provenance_or_refuses_a_bad_one(tmp_path: Path) -> None:
    tag = "t.staging-1"
    (tmp_path / f"{tag}.json").write_text(json.dumps({"tag": tag, "built_on": "Docker 29.1.3 (containerd store)"}))
    assert signing.recorded_builder(tmp_path, tag) == "Docker 29.1.3 (containerd store)"
    (tmp_path / f"{tag}.json").write_text(json.dumps({"tag": tag}))
    assert signing.recorded_builder(tmp_path, tag) is None
    for hostile in ("x\n", "", "x" * 201, 7):
        (tmp_path / f"{tag}.json").write_text(json.dumps({"tag": tag, "built_on": hostile}))
        with pytest.raises(UserError, match="its built_on is not an engine's name"):
            signing.recorded_builder(tmp_path, tag)


class _EmptyEngine:
    """An engine that holds no image: what `push --all` meets on a fresh machine."""

    class images:
        @staticmethod
        def get(reference: str) -> None:
            import docker.errors

            raise docker.errors.ImageNotFound(reference)

    class api:
        @staticmethod
        def inspect_image(reference: str) -> None:
            import docker.errors

            raise docker.errors.ImageNotFound(reference)


def test_the_gate_names_a_few_unbuilt_cells_and_counts_the_rest_in_one_clause() -> None:
    """Issue 60: `push --all` before `build --all` said a clause per cell of the matrix."""
    grid = load_matrix(REPO / "matrix.yaml")
    one = grid.flagship
    with pytest.raises(UserError) as caught:
        publish.gate(_EmptyEngine(), grid, [one])  # type: ignore[arg-type]
    assert (
        caught.value.message
        == f"refused, nothing pushed: {one.name}: not built; run `python -m builder build {one.name}`"
    )
    with pytest.raises(UserError) as caught:
        publish.gate(_EmptyEngine(), grid, grid.cells)  # type: ignore[arg-type]
    message = caught.value.message
    assert message.startswith(f"refused, nothing pushed: {len(grid.cells)} cells not built (")
    assert f"and {len(grid.cells) - 3} more); run `python -m builder build CELL...` or `build --all`" in message
    assert len(message) < 400 and grid.cells[5].name not in message
