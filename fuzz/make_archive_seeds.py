#!/usr/bin/env python3
"""Writes seed archives for fuzz/checkpoint_archive_fuzzer.cc into fuzz/seeds/checkpoint_archive/.

chorus's archives are libtorch's serialize::OutputArchive: a TorchScript module zip whose
attributes are the saved tensors. A scripted module with the same attribute names is the same
format. Needs torch (the one scripts/setup installs); the output is committed.
"""
import os

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


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    torch.jit.save(torch.jit.script(RankState()), os.path.join(OUT, "rank_state"))
    torch.jit.save(torch.jit.script(SmallModel()), os.path.join(OUT, "small_model"))
