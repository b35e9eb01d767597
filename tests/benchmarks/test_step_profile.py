"""``benchmarks.training.step_profile`` / ``python -m benchmarks.training.throughput kernels``: kernel families, the
CPU refusal, and (GPU) a replay launches exactly the kernels of one eager step."""

import pandas as pd
import pytest
import torch

from benchmarks.training.step_profile import kernel_family
from benchmarks.training.throughput import benchmark_specs, main


@pytest.mark.parametrize(
    "name,family",
    [
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >", "elementwise"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_contig<float, unsigned int, 4>", "elementwise"),
        ("triton_poi_fused_add_mul_0", "elementwise"),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t> >",
            "reduction",
        ),
        ("triton_per_fused__fused_rms_norm_backward_view_2", "reduction"),
        ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x32x8_stage3", "gemm"),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float>", "gemm"),
        ("_gru_fwd_kernel", "other"),
        ("chunk_attn_kernel", "other"),
    ],
)
def test_kernel_family(name, family):
    assert kernel_family(name) == family


def test_heaviest_kernels_rank_by_time_per_step():
    """Per-name sums over the profiled replays, divided by their count, heaviest first, with shares of
    the whole; ``heaviest_table`` gives one line per (step, kernel)."""
    from types import SimpleNamespace

    from benchmarks.training.step_profile import heaviest_kernels
    from benchmarks.training.throughput import heaviest_table

    ev = lambda name, us: SimpleNamespace(name=name, device_time=us)  # noqa: E731
    events = [
        ev("chunk_attn_kernel", 10.0),
        ev("triton_poi_fused_add_0", 1.0),
        ev("chunk_attn_kernel", 14.0),
        ev("sm80_xmma_gemm_f32f32", 6.0),
        ev("triton_poi_fused_add_0", 1.0),
    ] * 2  # two replays
    top = heaviest_kernels(events, steps=2, n=2)
    assert [k["kernel"] for k in top] == ["chunk_attn_kernel", "sm80_xmma_gemm_f32f32"]
    assert top[0] == {
        "kernel": "chunk_attn_kernel",
        "family": "other",
        "launches": 2.0,
        "us": 24.0,
        "share": round(24 / 32, 3),
    }
    assert top[1]["family"] == "gemm" and top[1]["launches"] == 1.0 and top[1]["us"] == 6.0
    assert len(heaviest_kernels(events, 2, 10)) == 3 and heaviest_kernels([], 1, 3) == []
    rows = pd.DataFrame(
        [
            {"task": "khop2", "mixer": "mamba2", "compiled": True, "heaviest": top},
            {"task": "mqar", "mixer": "transformer", "compiled": False, "error": "x"},
        ]
    )
    lines = heaviest_table(rows)
    assert len(lines) == 2 and list(lines["kernel"]) == ["chunk_attn_kernel", "sm80_xmma_gemm_f32f32"]
    assert set(lines["mixer"]) == {"mamba2"} and "heaviest" not in lines


def test_top_must_not_be_negative(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["kernels", "--top", "-1"])
    assert exit_.value.code == 2 and "--top" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_kernels_without_a_gpu_is_a_one_line_error(capsys):
    assert main(["kernels", "--tasks", "mqar", "--mixers", "transformer"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err


@pytest.mark.parametrize("argv", [["kernels", "--batch-sizes", "16,0"], ["workers", "--counts", "4,0"]])
def test_a_bad_size_list_is_a_one_line_error(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "positive integer" in err, err


def _spec(mixer):
    ((_, spec),) = benchmark_specs("pararnn-table6", ["mqar"], [mixer], 100, "cuda")
    return spec


NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@NEEDS_CUDA
@pytest.mark.parametrize("mixer", ["transformer", "mamba2", "flashgru"])
def test_profile_rows_add_up(mixer):
    """Families add up to the total; a replay takes at least its kernels' summed time."""
    from benchmarks.training.step_profile import profile_step

    row = profile_step(_spec(mixer), replays=50, top=5)
    assert "error" not in row, row
    assert row["kernels_per_step"] == pytest.approx(sum(row[f] for f in ("elementwise", "reduction", "gemm", "other")))
    assert row["replay_us_per_step"] > 0.9 * row["gpu_us_per_step"] > 0
    heaviest = row["heaviest"]
    assert len(heaviest) == 5 and sum(k["us"] for k in heaviest) <= row["gpu_us_per_step"] + 0.5
    assert [k["us"] for k in heaviest] == sorted((k["us"] for k in heaviest), reverse=True)


@pytest.mark.gpu
@NEEDS_CUDA
def test_profile_at_other_batch_sizes():
    """``--batch-sizes``: one row per batch size, each step built at that batch (4x the sequences:
    more GPU time per step; eagerly also other kernels, 61 at batch 16 and 79 at 64 on an H100)."""
    from benchmarks.training.throughput import profile_kernels

    table = profile_kernels("pararnn-table6", ["mqar"], ["transformer"], False, [16, 64])
    assert list(table["batch"]) == [16, 64] and "error" not in table
    small, large = table.iloc[0], table.iloc[1]
    assert large["gpu_us_per_step"] > 1.2 * small["gpu_us_per_step"]


@pytest.mark.gpu
@NEEDS_CUDA
def test_kernels_profiles_one_row_per_precision():
    """``--precisions 32-true,bf16-mixed``: one profiled row each, in that order."""
    from benchmarks.training.throughput import profile_kernels

    table = profile_kernels("pararnn-table6", ["mqar"], ["transformer"], False, precisions=["32-true", "bf16-mixed"])
    assert list(table["precision"]) == ["32-true", "bf16-mixed"] and "error" not in table


@pytest.mark.gpu
@NEEDS_CUDA
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_the_profiled_step_runs_its_linear_layers_in_the_trials_precision(precision):
    """The step that ``kernels`` captures runs as training does: every ``nn.Linear`` output is float32 under
    ``32-true``; under ``bf16-mixed`` (bfloat16 autocast) they are bfloat16. A global forward hook sees each
    call during the warm-up steps and the capture. (GEMM kernel names do not say their dtype on every GPU.)"""
    from benchmarks.training.step_profile import captured_step

    ((_, spec),) = benchmark_specs("pararnn-table6", ["mqar"], ["transformer"], 10, "cuda", precision=precision)
    seen: set[torch.dtype] = set()

    def record(module, args, output):
        if isinstance(module, torch.nn.Linear):
            seen.add(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        captured_step(spec)
    finally:
        handle.remove()
    assert seen == ({torch.float32} if precision == "32-true" else {torch.bfloat16})


@pytest.mark.gpu
@NEEDS_CUDA
def test_a_replay_launches_the_kernels_of_one_eager_step():
    """The profile's kernel count against a profile of the same step run eagerly (same kernels, same
    number; the Transformer: the Newton mixers run another policy outside a capture)."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.training.step_profile import _kernel_events, captured_step, profile_step

    spec = _spec("transformer")
    row = profile_step(spec, replays=50)
    _, step = captured_step(spec)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    assert len(_kernel_events(prof)) == row["kernels_per_step"]


@pytest.mark.gpu
@NEEDS_CUDA
def test_a_compiled_newton_step_captures_with_fewer_kernels():
    """With ``graph_policy`` the compiled FlashGRU step captures (nothing compiles inside the capture)
    and launches fewer kernels than the uncompiled one."""
    from benchmarks.training.step_profile import profile_step

    spec = _spec("flashgru")
    plain, compiled = profile_step(spec, replays=20), profile_step(spec, compile=True, replays=20)
    assert "error" not in compiled, compiled
    assert compiled["kernels_per_step"] < plain["kernels_per_step"]


@pytest.mark.gpu
@NEEDS_CUDA
def test_graph_policy_runs_the_in_graph_solve_only_while_training():
    from mixers import build_mixer

    mixer = build_mixer("flashgru", 16, num_heads=2).cuda()
    mixer.graph_policy = True
    x = torch.randn(2, 12, 16, device="cuda")
    mixer.train()
    mixer(x)
    assert mixer.step_ok is not None and mixer.graph_counts[0].item() == 1
    mixer.eval()
    mixer(x)
    assert mixer.step_ok is None and mixer.graph_counts[0].item() == 1
