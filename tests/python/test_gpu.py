"""The Python front on a GPU (CTest labels gpu, python; scripts/gpu-check runs it on a GPU machine).

A module on CUDA reduces as chorus train's does (runtime/train/gradient_path.h): beside a CPU rank
its buckets live in host memory (algorithm "flat") or on the device, bridged ("auto"); two ranks sharing one GPU (emulated devices) cannot share a NCCL
communicator, so they too reduce in host memory; a world of one GPU rank per card would use NCCL
on the device. Each test compares with single-process PyTorch on the CPU on the same global
batches, and AMP's overflow consensus holds on the GPU. Every test skips without a usable CUDA
device, and CTest then reports the whole file skipped (run_pytest.py --all-skipped-exit 77), so a
GPU machine where they skipped fails scripts/gpu-check.
"""

import pytest
import torch

from test_multirank import load_ranks, max_relative_error, reference_parameters

pytestmark = [pytest.mark.multiproc,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no usable CUDA device")]


@pytest.mark.parametrize("algorithm", ["flat", "auto"])
def test_a_cuda_module_beside_a_cpu_rank_trains_as_one_process(run_job, tmp_path, algorithm):
    job = run_job("cuda:0,cpu", "train.py", tmp_path, "--on-device", "--steps", 12,
                  "--global-batch", 64, "--shares", "40,24", "--balance", "fixed", "--lr", 0.1,
                  "--algorithm", algorithm)
    assert job.returncode == 0, job.output
    # flat: host buckets; auto: device buckets, the GPU group bridged to the CPU's through host
    # memory (gradient_path.h).
    assert ("gradient all-reduce: flat, in host memory" if algorithm == "flat"
            else "gradient all-reduce: auto over") in job.output
    expected, losses = reference_parameters(12, 64, lr=0.1)
    ranks = load_ranks(tmp_path, 2)
    for rank in ranks:
        # cuBLAS and the CPU's BLAS round differently (TF32 is off for fp32 matmuls by default).
        assert max_relative_error(rank["parameters"], expected) < 1e-4
        for got, want in zip(rank["losses"], losses):
            assert got == pytest.approx(want, rel=1e-4)
    # The replicas agree exactly: both applied the same averaged gradients.
    for a, b in zip(ranks[0]["parameters"], ranks[1]["parameters"]):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_two_ranks_sharing_one_gpu_train_together(run_job, tmp_path):
    job = run_job("cuda:0@1.0/8GiB,cuda:0@0.5/4GiB", "train.py", tmp_path, "--on-device",
                  "--steps", 10, "--global-batch", 64, "--balance", "adaptive", "--lr", 0.1)
    assert job.returncode == 0, job.output
    assert "gradient all-reduce: flat, in host memory" in job.output
    expected, _ = reference_parameters(10, 64, lr=0.1)
    ranks = load_ranks(tmp_path, 2)
    for rank in ranks:
        assert len(rank["losses"]) == 10
        assert max_relative_error(rank["parameters"], expected) < 1e-4
    for a, b in zip(ranks[0]["parameters"], ranks[1]["parameters"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_autocast_on_the_gpu_beside_a_cpu_rank_and_overflow_consensus(run_job, tmp_path, amp):
    extra = ["--overflow-at", 3, "--overflow-rank", 0] if amp == "fp16" else []
    job = run_job("cuda:0,cpu", "train.py", tmp_path, "--on-device", "--amp", amp, "--steps", 8,
                  "--global-batch", 32, "--balance", "fixed", "--lr", 0.1, *extra)
    assert job.returncode == 0, job.output
    ranks = load_ranks(tmp_path, 2)
    _, losses = reference_parameters(8, 32, lr=0.1)
    for rank in ranks:
        assert all(torch.isfinite(p).all() for p in rank["parameters"])
        if amp == "fp16":  # the GPU rank overflowed at step 3: both skipped it and halved alike
            assert rank["skipped"] == [False, False, False, True] + [False] * 4
            assert rank["scales"][3] == rank["scales"][2] / 2
        else:
            assert not any(rank["skipped"])
        # Low precision on one rank: close to fp32 training, not equal.
        steps = [s for s in range(8) if not rank["skipped"][s]]
        assert rank["losses"][steps[0]] == pytest.approx(losses[steps[0]], rel=0.05)
    for a, b in zip(ranks[0]["parameters"], ranks[1]["parameters"]):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
