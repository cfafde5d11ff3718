"""``hpcdl bench codecs --quick``: runs end to end and writes a JSON report with every field (no timing checks)."""

import json

import pytest
import torch

from hpcdl.bench.activations import natural_images, saved_activations
from hpcdl.bench.codecs import codec_suite, format_report
from hpcdl.cli import main
from hpcdl.compress.sz import host

ROW_FIELDS = {
    "label", "codec", "config", "status", "reason", "tensors", "original_bytes", "packed_bytes", "ratio",
    "ratio_per_model", "compress_gbps", "decompress_gbps", "compress_cpu_gbps", "decompress_cpu_gbps", "max_error_over_bound", "max_error_over_range",
    "bound_violations", "nonfinite_mismatches", "zero_mismatches", "sign_flips",
}


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    # one intra-op thread: on a busy shared CPU, waking worker threads would dominate the tiny --quick tensors
    out = tmp_path_factory.mktemp("bench") / "codecs.json"
    threads = torch.get_num_threads()
    assert main(["bench", "codecs", "--quick", "--bounds", "1e-1,1e-2", "--threads", "1", "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads, "the run restores torch's thread count"
    return json.loads(out.read_text())


def test_report_has_every_field(quick_report):
    report = quick_report
    assert report["quick"] is True and report["bounds"] == [0.1, 0.01] and report["repeats"] == 1
    assert report["machine"]["torch_threads"] == 1
    assert report["memcpy_gbps"] > 0
    assert {"cpu_count", "torch", "torch_threads", "sz_backend", "sz_host_isa", "load_average_1min"} <= set(report["machine"])
    if report["machine"]["sz_backend"] == "host":
        assert report["machine"]["sz_host_isa"] == host.active_isa() in ("avx512", "avx2", "baseline")
    assert [w["model"] for w in report["workloads"]] == ["resnet18", "vit"]
    assert all(w["tensors"] > 0 and w["bytes"] > 0 for w in report["workloads"])
    labels = [row["label"] for row in report["results"]]
    assert labels == [entry.label for entry in codec_suite((0.1, 0.01))]
    for row in report["results"]:
        assert set(row) == ROW_FIELDS, row["label"]
        assert row["status"] == "ok", row
        assert row["ratio"] > 1 and row["compress_gbps"] > 0 and row["decompress_gbps"] > 0
        assert row["compress_cpu_gbps"] > 0 and row["decompress_cpu_gbps"] > 0
        assert row["packed_bytes"] < row["original_bytes"]
        assert set(row["ratio_per_model"]) == {"resnet18", "vit"}
    assert set(report["targets"]) == {"bound", "sz_over_sz3_compress_speed", "sz_over_sz3_ratio",
                                      "sz_decompress_over_compress_speed"}
    speed = report["targets"]["sz_over_sz3_compress_speed"]
    assert set(speed) == {"measured", "measured_per_cpu_second", "target", "met"} and speed["target"] == 4.0
    assert isinstance(speed["met"], bool) and speed["measured_per_cpu_second"] > 0
    ratio = report["targets"]["sz_over_sz3_ratio"]
    rows = {row["label"]: row for row in report["results"]}
    assert ratio["measured"] == pytest.approx(rows["sz rel 0.01"]["ratio"] / rows["sz3 rel 0.01"]["ratio"])


def test_error_columns_judge_each_codec_by_check_bound(quick_report):
    rows = {row["label"]: row for row in quick_report["results"]}
    for bound in (0.1, 0.01):
        sz = rows[f"sz rel {bound:g}"]
        assert 0 < sz["max_error_over_bound"] <= 1 and sz["bound_violations"] == 0
        assert sz["zero_mismatches"] == sz["sign_flips"] == sz["nonfinite_mismatches"] == 0
        assert sz["max_error_over_range"] == pytest.approx(sz["max_error_over_bound"] * bound)
        assert rows[f"sz3 rel {bound:g}"]["bound_violations"] == 0
    for label in ("quant 2-bit", "cast bf16"):
        assert rows[label]["max_error_over_bound"] is None and rows[label]["max_error_over_range"] > 0
    assert rows["quant 2-bit"]["max_error_over_range"] > rows["quant 8-bit"]["max_error_over_range"]
    assert rows["quant 2-bit"]["ratio"] > rows["quant 8-bit"]["ratio"]


def test_table_shows_every_row_and_the_targets(quick_report):
    table = format_report(quick_report)
    for row in quick_report["results"]:
        assert f"| {row['label']} |" in table
    assert "memcpy:" in table and "target sz_over_sz3_ratio at rel 0.01" in table
    assert f"sz backend {quick_report['machine']['sz_backend']}" in table


def test_saved_activations_drop_parameters_and_keep_each_storage_once():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    saved = saved_activations(model, torch.randn(5, 8))
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    pointers = [t.untyped_storage().data_ptr() for t in saved]
    assert saved and not parameters & set(pointers) and len(pointers) == len(set(pointers))
    assert sorted(tuple(t.shape) for t in saved) == [(5, 8), (5, 16)]  # input of fc1; ReLU output, saved twice


def test_natural_images_are_smooth_and_standardised():
    images = natural_images(2, 3, 32, 32, torch.Generator().manual_seed(0))
    assert images.shape == (2, 3, 32, 32)
    assert images.mean().abs() < 1e-5 and (images.std() - 1).abs() < 1e-2
    neighbours = torch.corrcoef(torch.stack([images[..., 1:].flatten(), images[..., :-1].flatten()]))[0, 1]
    assert neighbours > 0.6, "white noise would give about 0"


def test_bad_bounds_are_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "codecs", "--bounds", "1e-2,abc"])
    assert "not a number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "codecs", "--bounds", "0"])
    assert "finite number > 0" in capsys.readouterr().err


def test_bad_device_is_refused(capsys):
    assert main(["bench", "codecs", "--quick", "--device", "tpu"]) == 2
    assert "--device must be cpu or cuda" in capsys.readouterr().err


def test_codecs_option_runs_only_the_named_codecs_beside_a_background_load(tmp_path):
    out = tmp_path / "sz.json"
    assert main(["bench", "codecs", "--quick", "--bounds", "1e-2", "--threads", "1", "--codecs", "sz,cast",
                 "--load", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [row["label"] for row in report["results"]] == ["sz rel 0.01", "sz+zstd rel 0.01", "cast bf16"]
    assert report["machine"]["background_load_processes"] == 1
    assert report["machine"]["openmp_wait_policy"]


def test_an_unknown_codec_id_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="no codec zstd; choose from sz, sz3, zfp, quant, cast"):
        codec_suite((0.01,), ("sz", "zstd"))


def test_background_load_runs_busy_processes_only_inside_its_block():
    from hpcdl.bench.load import background_load

    with background_load(2) as workers:
        assert len(workers) == 2 and all(worker.poll() is None for worker in workers)
    assert all(worker.poll() is not None for worker in workers)
    with pytest.raises(ValueError, match="number of busy processes >= 0"):
        with background_load(-1):
            pass
