#!/usr/bin/env python3
"""Writes seed files for fuzz/python_checkpoint_fuzzer.cc into fuzz/seeds/python_checkpoint/.

Each seed is a file that chorus.save wrote (python/chorus/checkpoint.py) in a job of one: a small
MLP with its optimizer, a module with BatchNorm (an int64 buffer) and an `extra` that libtorch
cannot read (kept in the inner Python bytes), and a file without a model (refused). Needs the
chorus package on PYTHONPATH (PYTHONPATH=build/python); the output is committed. The files are
about 12-16 KB (every rank's RNG state is in them), so scripts/fuzz gives this target a larger
-max_len than the others.
"""
import os
import sys
import tempfile

import torch

import chorus

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "python_checkpoint")


def save(name, **entries):
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "checkpoint.pt")
        chorus.save(path, **entries)
        with open(path, "rb") as saved, open(os.path.join(OUT, name), "wb") as seed:
            seed.write(saved.read())


def main():
    os.makedirs(OUT, exist_ok=True)
    chorus.init()
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.SGD(mlp.parameters(), lr=0.1, momentum=0.9)
    mlp(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    save("mlp_and_optimizer", model=mlp, optimizer=optimizer)
    batchnorm = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    batchnorm(torch.randn(5, 4))
    save("batchnorm_and_extra", model=batchnorm, extra={"tags": {"a", "b"}, "big": 2**70})
    save("no_model", optimizer=optimizer)
    print(f"wrote {sorted(os.listdir(OUT))} into {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
