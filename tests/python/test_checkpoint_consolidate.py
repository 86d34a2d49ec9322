"""`chorus checkpoint consolidate FILE` on the files chorus.save writes (CTest
python_checkpoint_consolidate, labels python and multiproc; about 30 s).

A checkpoint saved under ZeRO-3 on 2 ranks and one saved by a job of one without ZeRO, each with
an ``extra`` libtorch cannot read, consolidate to a model.pt whose every tensor equals the
model's state dict at the save, and chorus.load gives ``extra`` back. A flipped byte, a file of
the earlier layout (which libtorch cannot read) and a file without a model are CheckpointErrors
(exit 6); chorus.load still reads the earlier layout.
"""

import hashlib
import io
import os
import random
import subprocess
import sys

import pytest
import torch

import chorus

from conftest import WORKERS, _chorus_cli

CHECKPOINT_ERROR_EXIT = 6  # docs/errors.md


def consolidate(path, out):
    return subprocess.run([_chorus_cli(), "checkpoint", "consolidate", str(path), "--out",
                           str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120)


def consolidated(path):
    """The tensors of the model.pt consolidated from `path`, by name."""
    done = consolidate(path, str(path) + ".model.pt")
    assert done.returncode == 0, done.stdout
    module = torch.jit.load(str(path) + ".model.pt")
    return dict(module.named_parameters())


def write_with_checksum(path, data):
    with open(path, "wb") as f:
        f.write(data)
    with open(str(path) + ".sha256", "w") as f:
        f.write(hashlib.sha256(data).hexdigest())


@pytest.fixture(scope="module", params=[("cpu,cpu", 3), ("cpu", 0)], ids=["zero3-2ranks", "one"])
def saved(request, tmp_path_factory):
    """A job's folder: checkpoint.pt (+ .sha256), expected.pt, loaded.pt (workers/)."""
    devices, zero = request.param
    out = tmp_path_factory.mktemp(f"save-zero{zero}")
    command = [_chorus_cli(), "run", "--devices", devices, "--", sys.executable,
               os.path.join(WORKERS, "save_checkpoint.py"), str(out), "--zero", str(zero)]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout
    return out


@pytest.mark.multiproc
def test_consolidated_model_equals_the_state_dict_at_the_save(saved):
    expected = torch.load(saved / "expected.pt")
    tensors = consolidated(saved / "checkpoint.pt")
    assert sorted(tensors) == sorted(expected)
    for name, value in expected.items():
        assert tensors[name].dtype == value.dtype, name
        assert tensors[name].equal(value), name


@pytest.mark.multiproc
def test_load_gives_back_extra_libtorch_cannot_read(saved):
    loaded = torch.load(saved / "loaded.pt")
    assert loaded == {"extra_equal": True, "model_equal": True, "step": 3}


@pytest.mark.multiproc
def test_a_flipped_byte_is_a_checkpoint_error(saved, tmp_path):
    data = bytearray((saved / "checkpoint.pt").read_bytes())
    data[len(data) // 2] ^= 0x10
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(bytes(data))
    (tmp_path / "damaged.pt.sha256").write_bytes((saved / "checkpoint.pt.sha256").read_bytes())
    done = consolidate(damaged, tmp_path / "model.pt")
    assert done.returncode == CHECKPOINT_ERROR_EXIT, done.stdout
    assert (f"CheckpointError: checkpoint '{damaged}' is damaged: its SHA-256 does not match "
            f"{damaged}.sha256") in done.stdout
    assert not (tmp_path / "model.pt").exists()


# ---- a job of one, in this process ----

@pytest.fixture
def ctx():
    return chorus.init(environment={})


def small_model(ctx):
    torch.manual_seed(11)
    return chorus.DataParallel(torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(),
                                                   torch.nn.Linear(4, 3)),
                               global_batch=8, context=ctx)


def test_the_earlier_layout_is_refused_and_chorus_load_still_reads_it(ctx, tmp_path):
    model = small_model(ctx)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    # What chorus.save wrote before its outer dict held only what libtorch reads.
    old = {"chorus": chorus.checkpoint.state_dict(None, ctx), "extra": {"seen": {4, 5}},
           "model": state}
    buffer = io.BytesIO()
    torch.save(old, buffer)
    path = tmp_path / "old.pt"
    write_with_checksum(path, buffer.getvalue())
    done = consolidate(path, tmp_path / "model.pt")
    assert done.returncode == CHECKPOINT_ERROR_EXIT, done.stdout
    assert f"checkpoint '{path}' cannot be read by libtorch" in done.stdout
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    random.random()
    assert chorus.load(str(path), model=model, context=ctx) == {"seen": {4, 5}}
    assert all(model.state_dict()[key].equal(value) for key, value in state.items())


def test_a_file_without_a_model_is_refused(ctx, tmp_path):
    path = tmp_path / "no_model.pt"
    chorus.save(str(path), extra={"note": "no model"}, context=ctx)
    done = consolidate(path, tmp_path / "model.pt")
    assert done.returncode == CHECKPOINT_ERROR_EXIT, done.stdout
    assert f"checkpoint '{path}' holds no model: chorus.save was called without model=" \
        in done.stdout
    assert chorus.load(str(path), context=ctx) == {"note": "no model"}


def test_state_dict_entries_libtorch_cannot_read_are_left_out_with_a_warning(ctx, tmp_path):
    class Tagged(torch.nn.Linear):
        def get_extra_state(self):
            return {"tags": {"a", "b"}}

        def set_extra_state(self, state):
            self.loaded_tags = state["tags"]

    torch.manual_seed(3)
    model = chorus.DataParallel(Tagged(4, 2), global_batch=8, context=ctx)
    path = tmp_path / "tagged.pt"
    chorus.save(str(path), model=model, context=ctx)
    done = consolidate(path, tmp_path / "model.pt")
    assert done.returncode == 0, done.stdout
    assert "(state dict entries only Python reads): module._extra_state" in done.stdout
    tensors = dict(torch.jit.load(str(tmp_path / "model.pt")).named_parameters())
    assert sorted(tensors) == ["module.bias", "module.weight"]
    chorus.load(str(path), model=model, context=ctx)
    assert model.module.loaded_tags == {"a", "b"}
