"""The Python front in one process (a job of one): the API's contracts and its refusals.

No launcher: chorus.init(environment={}) makes a job of one, and each test its own context.
"""

import builtins
import itertools

import pytest
import torch
import torch.nn.functional as F

import chorus


@pytest.fixture
def ctx():
    return chorus.init(environment={})


def data(samples=64, features=6):
    generator = torch.Generator().manual_seed(5)
    return torch.utils.data.TensorDataset(torch.randn(samples, features, generator=generator),
                                          torch.randint(0, 3, (samples,), generator=generator))


def model():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def test_job_of_one_matches_plain_pytorch(ctx):
    dataset = data()
    reference = model()
    wrapped = chorus.DataParallel(model(), global_batch=16, context=ctx)
    sgd = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    sgd_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    sampler = chorus.ShardSampler(dataset, global_batch=16, seed=9, context=ctx)
    steps = 0
    for inputs, targets in torch.utils.data.DataLoader(dataset, batch_sampler=sampler):
        loss = F.cross_entropy(wrapped(inputs), targets, reduction="sum")
        loss.backward()
        info = chorus.step(sgd, loss=loss, context=ctx)
        ref_loss = F.cross_entropy(reference(inputs), targets)
        sgd_ref.zero_grad()
        ref_loss.backward()
        sgd_ref.step()
        assert info.loss == pytest.approx(ref_loss.item(), rel=1e-6)
        assert info.shares == [16] and info.step == steps
        steps += 1
    assert steps == 4 == len(sampler)
    for a, b in zip(wrapped.module.parameters(), reference.parameters()):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    assert all(p.grad is None for p in wrapped.parameters())  # chorus.step cleared them


def test_accumulation_needs_no_sync(ctx):
    wrapped = chorus.DataParallel(model(), global_batch=8, context=ctx)
    sgd = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    inputs, targets = data(8)[:]
    with wrapped.no_sync():
        F.cross_entropy(wrapped(inputs[:4]), targets[:4], reduction="sum").backward()
    F.cross_entropy(wrapped(inputs[4:]), targets[4:], reduction="sum").backward()
    chorus.step(sgd, context=ctx)
    F.cross_entropy(wrapped(inputs[:4]), targets[:4], reduction="sum").backward()
    with pytest.raises(chorus.ConfigError, match="no_sync"):
        wrapped(inputs[4:])


def test_samples_must_add_up_to_the_global_batch(ctx):
    wrapped = chorus.DataParallel(model(), global_batch=8, context=ctx)
    sgd = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    inputs, targets = data(8)[:]
    F.cross_entropy(wrapped(inputs[:5]), targets[:5], reduction="sum").backward()
    with pytest.raises(chorus.ConfigError, match="processed 5 samples in all"):
        chorus.step(sgd, context=ctx)


@pytest.mark.parametrize("kwargs, message", [
    (dict(balance="sometimes"), "unknown balance 'sometimes'"),
    (dict(shares=[3, 4]), "shares has 2 entries for 1 ranks"),
    (dict(shares=[7]), "shares sum to 7, not to global_batch 8"),
    (dict(global_batch=0), "must be at least the number of ranks"),
    (dict(bucket_cap_mb=0), "bucket_cap_mb must be positive"),
])
def test_bad_options_are_refused(ctx, kwargs, message):
    options = dict(global_batch=8)
    options.update(kwargs)
    with pytest.raises(chorus.ConfigError, match=message):
        chorus.DataParallel(model(), context=ctx, **options)


def test_one_data_parallel_per_context(ctx):
    chorus.DataParallel(model(), global_batch=8, context=ctx)
    with pytest.raises(chorus.ConfigError, match="already"):
        chorus.DataParallel(model(), global_batch=8, context=ctx)


def test_sampler_state_round_trip_and_refusals(ctx):
    dataset = data(100)
    sampler = chorus.ShardSampler(dataset, global_batch=16, seed=1, context=ctx)
    assert len(sampler) == 6  # 100 // 16; the last 4 ids of each epoch are dropped
    batches = list(sampler) + list(itertools.islice(iter(sampler), 2))
    assert sampler.epoch == 1 and sampler.step == 8
    assert all(len(b) == 16 for b in batches)
    assert len(set(sum(batches[:6], []))) == 96  # an epoch never repeats an id
    state = sampler.state_dict()
    assert (state["epoch"], state["position"], state["step"]) == (1, 32, 8)
    other = chorus.ShardSampler(dataset, global_batch=16, seed=1, context=ctx)
    other.load_state_dict(state)
    assert next(iter(other)) == next(iter(sampler))
    with pytest.raises(chorus.CheckpointError, match="seed"):
        chorus.ShardSampler(dataset, global_batch=16, seed=2, context=ctx).load_state_dict(state)


def test_errors_are_typed_and_builtin_compatible(ctx):
    with pytest.raises(chorus.ConfigError) as raised:
        chorus.ShardSampler(data(10), global_batch=20, context=ctx)
    assert isinstance(raised.value, ValueError)
    assert raised.value.file.endswith(".cc") and raised.value.line > 0
    assert issubclass(chorus.TimeoutError, builtins.TimeoutError)
    assert issubclass(chorus.PeerFailure, chorus.CommError)
    assert issubclass(chorus.CommError, RuntimeError)


def test_communicator_of_a_job_of_one(ctx):
    world = chorus.world(ctx)
    assert (world.rank, world.size) == (0, 1)
    t = torch.arange(4, dtype=torch.float32)
    world.all_reduce(t, op="max", timeout=5.0).wait()
    assert t.tolist() == [0, 1, 2, 3]
    with pytest.raises(chorus.ConfigError, match="timeout must be positive"):
        world.all_reduce(t, timeout=-1)
    with pytest.raises(chorus.ConfigError, match="unknown reduce op"):
        world.all_reduce(t, op="product")


def test_a_loader_that_reads_ahead_checkpoints_the_first_step_not_run(ctx):
    dataset = data(160)
    wrapped = chorus.DataParallel(model(), global_batch=16, context=ctx)
    sgd = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    sampler = chorus.ShardSampler(dataset, global_batch=16, seed=2, context=ctx)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=2,
                                         prefetch_factor=2)
    for inputs, targets in itertools.islice(loader, 3):
        F.cross_entropy(wrapped(inputs), targets, reduction="sum").backward()
        info = chorus.step(sgd, context=ctx)
        assert info.shares == [16]
    assert sampler.step > 3  # the loader's workers asked for more batches than ran
    assert sampler.state_dict()["step"] == 3
