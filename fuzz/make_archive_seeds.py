#!/usr/bin/env python3
"""Writes seed archives for fuzz/checkpoint_archive_fuzzer.cc into fuzz/seeds/checkpoint_archive/.

chorus's archives are libtorch's serialize::OutputArchive: a TorchScript module zip whose
attributes are the saved tensors. A scripted module with the same attribute names is the same
format. Needs torch (the one scripts/setup installs); the output is committed.
"""
import io
import os
import zipfile
from enum import Enum

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "checkpoint_archive")


class RankState(torch.nn.Module):
    """What restoreRankState reads: the CPU generator's state and the loss scale."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rng_cpu", torch.get_rng_state())
        self.register_buffer("loss_scale", torch.tensor([65536.0, 3.0], dtype=torch.float64))

    def forward(self):
        return self.loss_scale


class SmallModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3, 4))

    def forward(self):
        return self.weight


class Colour(Enum):
    RED = 1


class WithEnum(torch.nn.Module):
    """A buffer and an enum attribute: what storage_behind_an_absent_enum forges from."""

    def __init__(self):
        super().__init__()
        self.colour = Colour.RED
        self.register_buffer("x", torch.zeros(4))

    def forward(self):
        if self.colour == Colour.RED:
            return self.x
        return -self.x


def storage_behind_an_absent_enum(path):
    """A forged archive no pickler writes: x's storage declares 34,464 floats over its 16-byte
    record, and between its storage tuple and BINPERSID the enum's global is called on 7, a value
    Colour lacks. libtorch's enum global then pushes nothing, so BINPERSID takes the tuple below:
    torch.jit.load (torch 2.15) loads a 137,856-byte storage over the record. archiveOf refuses
    it (the storage check cannot follow the tuple back; docs/security.md)."""
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(WithEnum()), buf)
    original = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    name = next(n for n in original.namelist() if n.endswith("/data.pkl"))
    pickle = original.read(name)
    storage = b"X\x01\x00\x00\x000q\x05X\x03\x00\x00\x00cpuq\x06K\x04tQ"  # key '0', 4 floats
    assert pickle.count(storage) == 1 and pickle.count(b"(K\x04t") == 1
    end = pickle.index(b"Colour\n") + len(b"Colour\n")
    colour = pickle[pickle.rindex(b"c__torch__", 0, end) : end]  # GLOBAL of the enum
    forged = storage[:-4] + b"M\xa0\x86t" + colour + b"K\x07R" + b"Q"
    pickle = pickle.replace(storage, forged).replace(b"(K\x04t", b"(M\xa0\x86t")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for n in original.namelist():
            archive.writestr(n, pickle if n == name else original.read(n))
    with open(path, "wb") as f:
        f.write(out.getvalue())


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    torch.jit.save(torch.jit.script(RankState()), os.path.join(OUT, "rank_state"))
    torch.jit.save(torch.jit.script(SmallModel()), os.path.join(OUT, "small_model"))
    storage_behind_an_absent_enum(os.path.join(OUT, "storage_behind_an_absent_enum"))
