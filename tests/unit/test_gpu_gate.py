"""The GPU gate over the reports a digest carries (builder/publish/reports.py, assemble/smoke.py).

The GPU reports here are made up, as unit-test fakes: the shape the self-test writes on a CUDA
device (image/selftest.py's accelerator()), never a claim that any device ran anything. The
integration tests gate real reports from a real registry."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from builder import verdict
from builder.assemble import smoke
from builder.errors import UserError
from builder.plan.matrix import load_matrix
from builder.publish import publish, reports, staging, verify
from builder.publish.publisher import Publisher

IMAGE_ID = "sha256:" + "c" * 64
OTHER_IMAGE = "sha256:" + "d" * 64


def cpu_report(image_id: str = IMAGE_ID) -> dict[str, Any]:
    checks = [
        {"check": name, "status": "skip" if name in ("cuda-runtime", "triton", "tensorrt-llm") else "pass",
         "metrics": {}}
        for name in verdict.expected_checks()
    ]  # fmt: skip
    return {"status": "pass", "image_id": image_id, "device": "cpu", "accelerator": {"kind": "cpu"},
            "checks": checks, "failed": []}  # fmt: skip


def gpu_report(image_id: str = IMAGE_ID, device: str = "NVIDIA H200", gated: bool = True) -> dict[str, Any]:
    """A fake: the fields a CUDA run of the self-test writes, with made-up figures."""
    report = cpu_report(image_id)
    report["device"] = device
    report["accelerator"] = {"kind": "cuda", "name": device, "count": 1, "capability": "9.0",
                             "driver": "570.124.06", "driver_cuda": "12.8", "peaks": "H200" if gated else None,
                             "gated": gated}  # fmt: skip
    metrics = {
        "throughput": {"matmul_bfloat16_tflops": 700.0, **({"matmul_bf16_fraction_of_peak": 0.71} if gated else {})},
        "sdpa": {"flash_attention_speedup_vs_math_4096": 6.2, "cudnn_attention_speedup_vs_math_4096": 7.9},
        "torch.compile": {"compile_s": 11.4},
    }
    for check in report["checks"]:
        check["status"] = "skip" if check["check"] == "tensorrt-llm" else "pass"
        check["metrics"] = metrics.get(check["check"], {})
    return report


def test_the_gpu_checks_are_the_self_tests_own_list_and_each_is_one_it_runs() -> None:
    assert set(verdict.gpu_checks()) <= set(verdict.expected_checks())
    assert {"sdpa", "throughput", "torch.compile", "amp", "cuda-runtime"} <= set(verdict.gpu_checks())


def test_a_gpu_report_naming_device_capability_and_driver_passes_the_gate() -> None:
    assert verdict.why_not_a_gpu_pass(gpu_report(), IMAGE_ID) is None
    gated = reports.gate([cpu_report(), gpu_report()], IMAGE_ID, "required")
    assert isinstance(gated, reports.Gated)
    assert gated.report["device"] == "cpu" and gated.gpu_report is not None  # the build's report, and the GPU's


def test_a_cpu_report_cannot_satisfy_a_required_gpu_gate() -> None:
    assert verdict.why_not_a_pass(cpu_report(), IMAGE_ID) is None  # a full pass, on a CPU
    refused = reports.gate([cpu_report(), cpu_report()], IMAGE_ID, "required")
    assert isinstance(refused, str) and "no passing GPU self-test" in refused and "not on a CUDA device" in refused
    assert isinstance(refused, reports.GpuMissing)  # publish says this reason once for every CUDA cell
    # a CPU report that claims the CUDA kind without naming a GPU is still no GPU report
    claimed = cpu_report()
    claimed["accelerator"] = {"kind": "cuda"}
    assert "names no GPU model" in str(verdict.why_not_a_gpu_pass(claimed, IMAGE_ID))


def test_a_gpu_report_for_another_image_is_refused() -> None:
    why = verdict.why_not_a_gpu_pass(gpu_report(OTHER_IMAGE), IMAGE_ID)
    assert why is not None and "for another image (dddddddddddd)" in why
    refused = reports.gate([cpu_report(), gpu_report(OTHER_IMAGE)], IMAGE_ID, "required")
    assert isinstance(refused, str) and "for another image" in refused


def test_a_gpu_report_without_the_checks_the_image_runs_is_refused() -> None:
    report = gpu_report()
    report["checks"] = [c for c in report["checks"] if c["check"] != "distributed"]
    assert "lacks checks the self-test runs: distributed" in str(verdict.why_not_a_gpu_pass(report, IMAGE_ID))


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda r: next(c for c in r["checks"] if c["check"] == "sdpa").update(status="skip"),
         "GPU checks did not pass on the device: sdpa skip"),
        (lambda r: next(c for c in r["checks"] if c["check"] == "cuda-runtime").update(status="warn"),
         "cuda-runtime warn"),
        (lambda r: r["accelerator"].pop("capability"), "no compute capability"),
        (lambda r: r["accelerator"].update(driver="latest"), "no driver version"),
        (lambda r: r["accelerator"].update(name="NVIDIA A100"), "names no GPU model"),
        (lambda r: r["accelerator"].pop("gated"), "whether its speed gates applied"),
        (lambda r: next(c for c in r["checks"] if c["check"] == "throughput").update(metrics={}),
         "carries no fraction of peak"),
    ],
)  # fmt: skip
def test_a_gpu_report_that_does_not_prove_the_device_is_refused(edit: object, needle: str) -> None:
    report = gpu_report()
    edit(report)  # type: ignore[operator]
    why = verdict.why_not_a_gpu_pass(report, IMAGE_ID)
    assert why is not None and needle in why


def test_a_device_without_a_datasheet_entry_passes_not_gated_and_says_so() -> None:
    report = gpu_report(device="NVIDIA L4", gated=False)
    assert verdict.why_not_a_gpu_pass(report, IMAGE_ID) is None
    entry = reports.record_entry("required", report)
    assert entry is not None and entry["gated"] is False and entry["matmul_bf16_fraction_of_peak"] is None
    cell = publish._gpu_text(entry)
    assert "NVIDIA L4 \\(sm 9.0, driver 570.124.06\\)" in cell and "not gated \\(no datasheet peak\\)" in cell
    assert "SDPA flash 6.2x math" in cell and "compile 11.4 s" in cell


def test_an_optional_gate_lets_an_untested_image_go_and_says_so_but_refuses_a_failed_gpu_run() -> None:
    gated = reports.gate([cpu_report()], IMAGE_ID, "optional")
    assert isinstance(gated, reports.Gated) and gated.gpu_report is None
    assert reports.record_entry("optional", None) == {"status": "not tested", "gate": "optional"}
    assert publish._gpu_text(reports.record_entry("optional", None)) == "GPU: not tested"
    failed = gpu_report()
    next(c for c in failed["checks"] if c["check"] == "throughput").update(status="fail")
    failed.update(status="fail", failed=["throughput"])
    refused = reports.gate([cpu_report(), failed], IMAGE_ID, "optional")
    assert isinstance(refused, str) and "its GPU self-test failed on NVIDIA H200" in refused
    assert not isinstance(refused, reports.GpuMissing)  # a failure is never folded into "no GPU here"


def test_a_cpu_image_has_no_gpu_column_and_gpu_reports_get_a_tag_per_model() -> None:
    assert reports.record_entry("none", gpu_report()) is None and publish._gpu_text(None) == "-"
    assert reports.artifact_tag("1.0-cu13.0.staging-7", cpu_report()) == "1.0-cu13.0.staging-7.selftest"
    assert reports.artifact_tag("t", gpu_report()) == "t.selftest-gpu-nvidia-h200"
    assert reports.artifact_tag("t", gpu_report(device="NVIDIA GH200 480GB")) == "t.selftest-gpu-nvidia-gh200-480gb"
    hostile = copy.deepcopy(gpu_report(device="x/../../y:z"))
    assert reports.artifact_tag("t", hostile) == "t.selftest-gpu-x-y-z"


def test_the_gpu_stage_refuses_a_cpu_cell_and_an_engine_without_the_nvidia_runtime(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    grid = load_matrix(Path("matrix.yaml"))

    class EngineWithoutGpus:
        def info(self) -> dict[str, object]:
            return {"Runtimes": {"runc": {}}}

    engine, say = EngineWithoutGpus(), lambda _: None
    with pytest.raises(UserError, match=r"2\.13\.0-cpu-bookworm-runtime: a CPU image has no GPU stage"):
        publisher = Publisher(None, grid, say, engine)  # type: ignore[arg-type]
        staging.gpu_test(publisher, [grid.cell("2.13.0-cpu-bookworm-runtime")], "r1", tmp_path)
    with pytest.raises(UserError, match="the engine has no NVIDIA runtime, so no container sees a GPU"):
        staging.gpu_test(publisher, [grid.flagship], "r1", tmp_path)
    with pytest.raises(UserError, match=r"keeps its report for the sign job \(--staged-record DIR\) or attaches it"):
        staging.gpu_test(publisher, [grid.flagship], "r1")


@pytest.mark.parametrize(
    "text",
    ["ghcr.io", "ghcr.io/Acme/torch:x", "ghcr.io/acme/torch:-x", "ghcr.io/acme/torch@sha256:abc",
     "ghcr.io/../torch:x", "ghcr.io/acme/torch:x\nfoo", "https://ghcr.io/acme/torch:x"],
)  # fmt: skip
def test_verify_takes_only_a_plain_image_reference(text: str) -> None:
    with pytest.raises(UserError, match=r"is not|not a tag|not a sha256"):
        verify.parse_reference(text)


def test_verify_reads_registry_repository_tag_and_digest() -> None:
    parsed = verify.parse_reference("127.0.0.1:5000/ml/torch:2.15-runtime")
    assert (parsed.registry, parsed.repository, parsed.tag, parsed.digest) == (
        "127.0.0.1:5000",
        "ml/torch",
        "2.15-runtime",
        None,
    )
    pinned = verify.parse_reference("ghcr.io/acme/torch@sha256:" + "a" * 64)
    assert pinned.reference == "sha256:" + "a" * 64 and pinned.tag is None


@pytest.mark.parametrize("gpu_gate", ["required", "optional"])
def test_a_failed_gpu_report_is_never_outvoted_by_a_pass_on_another_device(gpu_gate: str) -> None:
    failed = gpu_report(device="NVIDIA A100-SXM4-80GB")
    next(c for c in failed["checks"] if c["check"] == "sdpa").update(status="fail", message="cudnn differs")
    failed.update(status="fail", failed=["sdpa"])
    why = reports.gate([cpu_report(), gpu_report(), failed], IMAGE_ID, gpu_gate)
    assert isinstance(why, str) and "failed on NVIDIA A100-SXM4-80GB" in why and "does not outvote" in why
    # A failure of another image (a stale report) does not hold this one back.
    stale = copy.deepcopy(failed)
    stale["image_id"] = OTHER_IMAGE
    assert isinstance(reports.gate([cpu_report(), gpu_report(), stale], IMAGE_ID, gpu_gate), reports.Gated)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.5, 0.0, 250.0])
def test_a_figure_that_is_not_a_measurement_is_no_gpu_pass(value: float) -> None:
    """Issue 35: NaN, infinite, negative or absurd figures opened the gate."""
    report = gpu_report()
    next(c for c in report["checks"] if c["check"] == "throughput")["metrics"]["matmul_bf16_fraction_of_peak"] = value
    why = verdict.why_not_a_gpu_pass(report, IMAGE_ID)
    assert why is not None and "is not a measurement" in why


def test_a_device_the_datasheet_knows_cannot_say_its_gates_did_not_apply() -> None:
    report = gpu_report(device="NVIDIA H200", gated=False)
    assert "gpu_peaks.json knows NVIDIA H200 (H200)" in str(verdict.why_not_a_gpu_pass(report, IMAGE_ID))
    slow = gpu_report()
    next(c for c in slow["checks"] if c["check"] == "throughput")["metrics"]["matmul_bf16_fraction_of_peak"] = 0.2
    assert "ran at 0.20 of peak, under the gate's 0.7" in str(verdict.why_not_a_gpu_pass(slow, IMAGE_ID))


def test_the_gpu_stage_skips_a_digest_that_already_carries_the_keys_gpu_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: every run re-tested every CUDA digest and attached one more report, up to the cap."""
    from securesystemslib.signer import CryptoSigner

    from builder.oci.registry import OCI_MANIFEST, Manifest
    from builder.publish import trust

    grid = load_matrix(Path(__file__).resolve().parents[2] / "matrix.yaml")
    cell = grid.cell("2.15.0-cu13.2-bookworm-runtime")
    document = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": [],
                "config": {"mediaType": "x", "digest": IMAGE_ID, "size": 2}}  # fmt: skip
    body = json.dumps(document).encode()

    class Staged:
        host = "127.0.0.1:5000"

        def manifest(self, repository: str, reference: str) -> Manifest:
            return Manifest.of(body, OCI_MANIFEST)

    class NoEngine:  # a pull or a run would fail the test
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the engine was used ({name}) for a digest that needs no new GPU run")

    monkeypatch.setattr(smoke, "has_nvidia_runtime", lambda engine: True)
    evidence = trust.Evidence(reports=[gpu_report()], provenance_problem=None)
    monkeypatch.setattr(trust, "signed_evidence", lambda *args: evidence)
    said: list[str] = []
    key = CryptoSigner.generate_ed25519().public_key
    publisher = Publisher(Staged(), grid, said.append, NoEngine(), key=key)  # type: ignore[arg-type]
    assert staging.gpu_test(publisher, [cell], "7", attach=True) == [None]
    assert "already carries a GPU pass signed by the key (NVIDIA H200); not tested again" in said[-1]


def test_the_gate_reads_the_one_real_gpu_report_there_is() -> None:
    """Issue 36: the gate had only ever read made-up GPU reports. This one is real: the self-test
    on an H200 lent on 2026-12-04, run on that machine's own torch stack (torch 2.11.0+cu130, the
    images' layout applied; benchmarks/gpu-selftest.sh), so it proves the checks, not an image's
    digest. It predates the `accelerator` block the self-test writes now, which is why the gate
    refuses it: a report must name the compute capability and driver it ran with."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "selftest-2026-12-04-NVIDIA-H200-pruned.json"
    report = json.loads(path.read_text())
    report["image_id"] = IMAGE_ID  # a host-stack run names no image; the gate is asked about this one
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    assert all(statuses[name] == "pass" for name in verdict.gpu_checks())  # every GPU check passed there
    assert verdict.why_not_a_pass(report, IMAGE_ID) is None
    assert verdict.why_not_a_gpu_pass(report, IMAGE_ID) == "the report ran on NVIDIA H200, not on a CUDA device"
    figures = verdict.gpu_figures(report)
    assert figures["matmul_bf16_fraction_of_peak"] == 0.736 and verdict._figure_problem(figures) is None
    assert verdict.known_gpu(report["device"]) is not None  # gpu_peaks.json gates this device


def test_publish_on_a_machine_without_a_gpu_says_once_what_the_cuda_cells_need(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: `publish --all` after `build --all` on a CPU host refused every CUDA cell in one
    joined line, each with the same long reason."""
    grid = load_matrix(Path(__file__).resolve().parents[2] / "matrix.yaml")
    cuda = [c for c in grid.cells if c.is_cuda and c.gpu_gate == "required"][:3]
    monkeypatch.setattr(publish.ids, "config_digest", lambda engine, reference: IMAGE_ID)
    monkeypatch.setattr(publish.smoke, "passing_report", lambda image_id: cpu_report())
    with pytest.raises(UserError) as caught:
        publish.gate(None, grid, cuda)  # type: ignore[arg-type]
    line = caught.value.line()
    assert (
        line.count("need a passing GPU self-test") == 1 and f"3 CUDA cells ({', '.join(c.name for c in cuda)})" in line
    )
    assert "publish gpu-test" in line and "ci.gpu_optional" in line


def test_the_gpu_report_kept_for_the_sign_job_is_read_back_only_as_a_gpu_report_of_that_tag(tmp_path: Path) -> None:
    """The GPU job holds no write token: its report travels to the sign job as a file, which is
    hostile there (the GPU runner ran the image): another tag's, a CPU report, a link, an
    oversized or malformed one is one line; none kept is None."""
    tag, digest = "t.staging-1", "sha256:" + "a" * 64
    assert staging.read_gpu_report(tmp_path, tag) is None
    path = staging.write_gpu_report(tmp_path, tag, digest, gpu_report())
    assert staging.read_gpu_report(tmp_path, tag) == gpu_report()
    for hostile in ({"tag": "other", "report": gpu_report()}, {"tag": tag, "report": {"status": "pass"}},
                    {"tag": tag, "report": "x"}, [tag]):  # fmt: skip
        path.write_text(json.dumps(hostile))
        with pytest.raises(UserError, match=r"not a GPU report of t\.staging-1"):
            staging.read_gpu_report(tmp_path, tag)
    path.write_text("{" * 100)
    with pytest.raises(UserError):
        staging.read_gpu_report(tmp_path, tag)
    path.write_bytes(b" " * (staging.GPU_REPORT_RECORD_BYTES + 1))
    with pytest.raises(UserError, match="is larger than"):
        staging.read_gpu_report(tmp_path, tag)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UserError, match="symbolic link"):
        staging.read_gpu_report(tmp_path, tag)
