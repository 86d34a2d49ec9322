"""ZeRO from Python: chorus.DataParallel(zero=1|2|3, shards=...) against stage 0 (CTest
python_zero, labels python and multiproc).

Every stage on 3 CPU ranks with batch shares {5, 17, 42} and slices even, listed or sized by
memory budgets must end within 1e-6 (relative) of the stage-0 job on the same data: the same
trajectory, only the reduction's order of summation differs. A checkpoint written under ZeRO is
resumed by jobs of another stage, shards and world size. Refusals run in a job of one.
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import chorus

from conftest import WORKERS, _chorus_cli

STEPS = 20
SHARES = "5,17,42"
BUDGETS = "cpu/1GiB,cpu/2GiB,cpu/4GiB"
_baselines = {}


def run(out, devices, *args):
    command = [_chorus_cli(), "run", "--devices", devices, "--", sys.executable,
               os.path.join(WORKERS, "train.py"), str(out), *map(str, args)]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=240)
    assert done.returncode == 0, done.output
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(len(devices.split(",")))]


def common(optimizer):
    return ["--steps", STEPS, "--global-batch", 64, "--balance", "fixed", "--lr",
            0.1 if optimizer == "sgd" else 0.01, "--momentum", 0.9, "--optimizer", optimizer]


def baseline(optimizer, tmp_path_factory):
    """The stage-0 job's parameters (run once per optimizer)."""
    if optimizer not in _baselines:
        out = tmp_path_factory.mktemp(f"stage0-{optimizer}")
        ranks = run(out, "cpu,cpu,cpu", *common(optimizer), "--shares", SHARES)
        _baselines[optimizer] = ranks[0]
    return _baselines[optimizer]


def max_relative_error(got, expected):
    return max(float((g - e).abs().max() / e.abs().max()) for g, e in zip(got, expected))


@pytest.mark.multiproc
@pytest.mark.parametrize("stage,shards,optimizer", [
    (1, "even", "sgd"), (1, "0.2,0.3,0.5", "sgd"), (1, "memory", "sgd"),
    (2, "even", "sgd"), (2, "0.5,0.1,0.4", "sgd"), (2, "memory", "sgd"), (2, "0,0.5,0.5", "sgd"),
    (3, "even", "sgd"), (3, "0.1,0.6,0.3", "sgd"), (3, "memory", "sgd"),
    (1, "memory", "adamw"), (2, "0.6,0.1,0.3", "adamw"), (3, "memory", "adamw"),
])
def test_zero_stages_match_stage_zero_on_uneven_shares(stage, shards, optimizer, tmp_path,
                                                       tmp_path_factory):
    expected = baseline(optimizer, tmp_path_factory)
    devices = BUDGETS if shards == "memory" else "cpu,cpu,cpu"
    ranks = run(tmp_path, devices, *common(optimizer), "--shares", SHARES, "--zero", stage,
                "--shards", shards)
    bounds = ranks[0]["shard_bounds"]
    total = sum(p.numel() for p in expected["parameters"])
    assert bounds[0] == 0 and bounds[-1] == total and len(bounds) == 4
    sizes = [bounds[r + 1] - bounds[r] for r in range(3)]
    if shards == "even":
        assert max(sizes) - min(sizes) <= 1
    elif shards == "memory":  # budgets 1:2:4, and a tiny model: nearly all of each is headroom
        assert ranks[0]["shard_fractions"] == pytest.approx([1 / 7, 2 / 7, 4 / 7], rel=1e-3)
    else:
        fractions = [float(f) for f in shards.split(",")]
        assert all(abs(size - f * total) <= 1 for size, f in zip(sizes, fractions))
    for r, rank in enumerate(ranks):
        assert rank["shares"] == [[5, 17, 42]] * STEPS
        assert rank["shard_bounds"] == bounds
        assert max_relative_error(rank["parameters"], expected["parameters"]) < 1e-6
        for got, want in zip(rank["losses"], expected["losses"]):
            assert got == pytest.approx(want, rel=1e-6)
        # The optimizer keeps state for its slice only (momentum / AdamW's two moments).
        per_element = 1 if optimizer == "sgd" else 2
        assert rank["optimizer_elements"] == per_element * sizes[r]
        if stage == 3:  # no parameter values between steps
            assert rank["parameter_bytes"] == 0
    assert all(r["parameters"][0].equal(ranks[0]["parameters"][0]) for r in ranks)


@pytest.mark.multiproc
def test_a_zero_checkpoint_resumes_under_other_stages_shards_and_world_sizes(tmp_path,
                                                                          tmp_path_factory):
    expected = baseline("adamw", tmp_path_factory)
    args = ["--steps", STEPS, "--global-batch", 64, "--balance", "fixed", "--lr", 0.01,
            "--optimizer", "adamw"]
    writer = tmp_path / "writer"
    writer.mkdir()
    run(writer, "cpu,cpu,cpu", *args, "--shares", SHARES, "--zero", 2, "--shards", "0.2,0.3,0.5",
        "--save-at", 10)
    for name, devices, more in (
            ("zero3-two-ranks", "cpu,cpu", ["--shares", "20,44", "--zero", 3]),
            ("stage0-three-ranks", "cpu,cpu,cpu", ["--shares", SHARES]),
            ("zero1-even", "cpu,cpu,cpu", ["--shares", SHARES, "--zero", 1, "--shards", "even"])):
        out = tmp_path / name
        out.mkdir()
        for suffix in ("", ".sha256"):
            (out / f"checkpoint.pt{suffix}").write_bytes(
                (writer / f"checkpoint.pt{suffix}").read_bytes())
        ranks = run(out, devices, *args, *more, "--resume")
        for rank in ranks:
            assert rank["start_step"] == 10
            assert max_relative_error(rank["parameters"], expected["parameters"]) < 1e-6, name


@pytest.mark.multiproc
def test_an_overflow_on_one_rank_skips_the_step_of_every_slice(tmp_path):
    # A GradScaler's overflow on rank 1, whose ZeRO-2 slice is small: every rank skips and
    # lowers its scale, exactly as a stage-0 job does.
    args = [*common("sgd"), "--steps", 8, "--shares", SHARES, "--overflow-at", 3,
            "--overflow-rank", 1]
    (tmp_path / "zero").mkdir()
    (tmp_path / "stage0").mkdir()
    zero = run(tmp_path / "zero", "cpu,cpu,cpu", *args, "--zero", 2, "--shards", "0.45,0.1,0.45")
    stage0 = run(tmp_path / "stage0", "cpu,cpu,cpu", *args)
    for rank in zero:
        assert rank["skipped"] == [False] * 3 + [True] + [False] * 4
        assert rank["scales"] == stage0[0]["scales"]
        assert max_relative_error(rank["parameters"], stage0[0]["parameters"]) < 1e-6


# ---- a job of one ----

@pytest.fixture
def ctx():
    return chorus.init(environment={})


def small_model():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


@pytest.mark.parametrize("kwargs,message", [
    (dict(zero=4), "zero must be 0, 1, 2 or 3"),
    (dict(zero=-1), "zero must be 0, 1, 2 or 3"),
    (dict(zero="2"), "zero must be 0, 1, 2 or 3"),
    (dict(zero=True), "zero must be 0, 1, 2 or 3"),
    (dict(zero=1, shards="fast"), "unknown"),
    (dict(zero=1, shards=[0.5, 0.5]), "2 fractions for 1 ranks"),
    (dict(zero=1, shards=[0.9]), "sum to 0.9"),
    (dict(zero=1, shards=[1.5]), r"in \[0, 1\]"),
    (dict(zero=1, shards=["a"]), "must be numbers"),
    (dict(zero=1, shards=7), "must be"),
    (dict(zero=0, shards="even"), "needs zero >= 1"),
])
def test_bad_zero_options_are_refused(ctx, kwargs, message):
    with pytest.raises(chorus.ConfigError, match=message):
        chorus.DataParallel(small_model(), global_batch=8, context=ctx, **kwargs)
    assert ctx.data_parallel is None


def test_zero_needs_fp32_parameters(ctx):
    with pytest.raises(chorus.ConfigError, match="fp32"):
        chorus.DataParallel(small_model().double(), global_batch=8, zero=1, context=ctx)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_job_of_one_under_zero_matches_plain_pytorch(ctx, stage):
    generator = torch.Generator().manual_seed(5)
    inputs = torch.randn(16, 6, generator=generator)
    targets = torch.randint(0, 3, (16,), generator=generator)
    reference = small_model()
    wrapped = chorus.DataParallel(small_model(), global_batch=16, zero=stage, context=ctx)
    adam = torch.optim.Adam(wrapped.parameters(), lr=0.01)
    adam_ref = torch.optim.Adam(reference.parameters(), lr=0.01)
    for _ in range(3):
        loss = F.cross_entropy(wrapped(inputs), targets, reduction="sum")
        loss.backward()
        chorus.step(adam, loss=loss, context=ctx)
        adam_ref.zero_grad()
        F.cross_entropy(reference(inputs), targets).backward()
        adam_ref.step()
    assert wrapped.zero_stage == stage and wrapped.shard_bounds == [0, 16 * 6 + 16 + 16 * 3 + 3]
    with torch.no_grad():  # a ZeRO-3 module outside a step gathers for the forward alone
        assert torch.allclose(wrapped(inputs), reference(inputs), rtol=1e-6, atol=1e-6)
    with wrapped.gathered():
        for a, b in zip(wrapped.module.parameters(), reference.parameters()):
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    if stage == 3:
        assert all(p.untyped_storage().nbytes() == 0 for p in wrapped.parameters())
