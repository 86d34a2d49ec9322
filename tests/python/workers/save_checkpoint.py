"""A worker that writes a chorus.save checkpoint and loads it back, started by `chorus run`.

    python save_checkpoint.py OUT_DIR [--zero 0|1|2|3] [--steps N]

Trains a small model (a Linear and a BatchNorm, so the state dict holds buffers and an int64
tensor) a few steps with AdamW, saves OUT_DIR/checkpoint.pt with an ``extra`` that libtorch's
unpickler cannot read (a set, an instance of a class of this file, an int beyond 64 bits,
bytes), and writes OUT_DIR/expected.pt (rank 0): the model's state dict at the save, gathered.
Then it trains on (one DataParallel per job: the same model moves on), every rank loads the
checkpoint back, and rank 0 records in OUT_DIR/loaded.pt whether ``extra`` and the state dict
came back equal.
"""

import argparse
import os

import torch

import chorus


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)


EXTRA = {"epoch": 3, "seen": {1, 2, 3}, "best": Point(1, 2.5), "big": 2 ** 70, "raw": b"\x00\xff"}


def make_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 3))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--zero", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    ctx = chorus.init()
    model = chorus.DataParallel(make_model(), global_batch=16, zero=args.zero)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(ctx.rank)

    def train(steps):
        for _ in range(steps):
            inputs = torch.randn(16 // ctx.world_size, 6, generator=generator)
            loss = model(inputs).square().sum()
            loss.backward()
            chorus.step(optimizer, loss=loss)

    train(args.steps)
    path = os.path.join(args.out, "checkpoint.pt")
    chorus.save(path, model=model, optimizer=optimizer, extra=EXTRA)
    with model.gathered():
        expected = {key: value.clone() for key, value in model.state_dict().items()}
    if ctx.rank == 0:
        torch.save(expected, os.path.join(args.out, "expected.pt"))

    train(2)
    extra = chorus.load(path, model=model, optimizer=optimizer)
    with model.gathered():
        loaded = model.state_dict()
        same_model = (list(loaded) == list(expected)
                      and all(loaded[key].equal(value) for key, value in expected.items()))
    if ctx.rank == 0:
        torch.save({"extra_equal": extra == EXTRA, "model_equal": same_model,
                    "step": model.step_count}, os.path.join(args.out, "loaded.pt"))

if __name__ == "__main__":
    main()
