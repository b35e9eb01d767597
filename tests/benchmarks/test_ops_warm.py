"""``benchmarks.ops warm``: the delta family's warm-up split into one process per shape item."""

from benchmarks.ops.delta import MAIN
from benchmarks.ops.warm import shape_jobs


def test_delta_run_warms_one_process_per_main_shape():
    jobs = shape_jobs(["delta", "--graph", "--chunk-tiles", "precision=bf16"])
    assert len(jobs) == len(MAIN) > 1
    for job, item in zip(jobs, MAIN):
        assert job == ["delta", "--graph", "--chunk-tiles", "precision=bf16", "--shapes", ":".join(item)]


def test_delta_run_splits_given_shapes_and_warms_the_sweep_apart():
    jobs = shape_jobs(["delta", "--shapes", "8x64x2x16:fp32:gated;;2x32x1x64:bf16:delta,product", "--sweep"])
    assert jobs == [
        ["delta", "--shapes", "8x64x2x16:fp32:gated"],
        ["delta", "--shapes", "2x32x1x64:bf16:delta,product"],
        ["delta", "--no-main", "--sweep"],
    ]
    assert shape_jobs(["delta", "--no-main", "--sweep"]) == [["delta", "--no-main", "--sweep"]]


def test_other_families_warm_as_one_run():
    assert shape_jobs(["mlstm", "--sections", "main"]) == [["mlstm", "--sections", "main"]]
    assert shape_jobs(["scan"]) == [["scan"]]
