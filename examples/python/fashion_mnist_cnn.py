"""Fashion-MNIST with your own CNN, trained by chorus across unlike devices (docs/python.md).

    chorus run --devices cpu@1.0,cpu@0.5 -- python examples/python/fashion_mnist_cnn.py
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import chorus
import chorus.datasets


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def accuracy(model, dataset):
    model.eval()
    with torch.no_grad():
        images, labels = dataset.tensors
        correct = sum((model(x).argmax(1) == y).sum().item()
                      for x, y in zip(images.split(1000), labels.split(1000)))
    model.train()
    return correct / len(labels)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--balance", default="adaptive")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: no limit)")
    args = parser.parse_args()

    ctx = chorus.init()  # rank, world and device from `chorus run`
    torch.manual_seed(0)
    train, test = chorus.datasets.fashion_mnist("train"), chorus.datasets.fashion_mnist("test")
    model = chorus.DataParallel(Net(), global_batch=args.global_batch, balance=args.balance)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = chorus.ShardSampler(train, global_batch=args.global_batch, seed=0)
    loader = torch.utils.data.DataLoader(train, batch_sampler=sampler)
    start = time.monotonic()
    for epoch in range(args.epochs):
        for images, labels in loader:
            if args.max_steps and model.step_count >= args.max_steps:
                break
            loss = F.cross_entropy(model(images), labels, reduction="sum")  # sum, not mean
            loss.backward()
            info = chorus.step(optimizer, loss=loss)
            if ctx.rank == 0 and info.step % 100 == 0:
                rate = (info.step + 1) * args.global_batch / (time.monotonic() - start)
                print(f"step {info.step} loss {info.loss:.4f} shares {info.shares} "
                      f"{rate:.0f} samples/s", flush=True)
        if ctx.rank == 0:
            print(f"epoch {epoch}: test accuracy {accuracy(model, test):.4f}", flush=True)
        if args.max_steps and model.step_count >= args.max_steps:
            break
    if ctx.rank == 0:
        print(f"done: {model.step_count} steps in {time.monotonic() - start:.1f} s, "
              f"test accuracy {accuracy(model, test):.4f}", flush=True)


if __name__ == "__main__":
    main()
