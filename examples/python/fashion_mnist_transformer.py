"""Fashion-MNIST with a small transformer (each image row a token), trained by chorus.

    chorus run --devices cpu@1.0,cpu@0.5 -- python examples/python/fashion_mnist_transformer.py
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import chorus
import chorus.datasets


class RowTransformer(nn.Module):
    def __init__(self, width=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Linear(28, width)
        self.position = nn.Parameter(torch.zeros(1, 28, width))
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 10)

    def forward(self, images):  # [N, 1, 28, 28] -> 28 tokens of 28 pixels
        tokens = self.embed(images.squeeze(1)) + self.position
        return self.head(self.encoder(tokens).mean(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: no limit)")
    args = parser.parse_args()

    ctx = chorus.init()
    torch.manual_seed(0)
    train, test = chorus.datasets.fashion_mnist("train"), chorus.datasets.fashion_mnist("test")
    model = chorus.DataParallel(RowTransformer(), global_batch=args.global_batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sampler = chorus.ShardSampler(train, global_batch=args.global_batch, seed=0)
    loader = torch.utils.data.DataLoader(train, batch_sampler=sampler)
    start = time.monotonic()
    for epoch in range(args.epochs):
        for images, labels in loader:
            if args.max_steps and model.step_count >= args.max_steps:
                break
            loss = F.cross_entropy(model(images), labels, reduction="sum")
            loss.backward()
            info = chorus.step(optimizer, loss=loss)
            if ctx.rank == 0 and info.step % 100 == 0:
                print(f"step {info.step} loss {info.loss:.4f} shares {info.shares}", flush=True)
        if ctx.rank == 0:
            model.eval()
            with torch.no_grad():
                images, labels = test.tensors
                correct = (model(images).argmax(1) == labels).sum().item()
            model.train()
            print(f"epoch {epoch}: test accuracy {correct / len(labels):.4f} "
                  f"({time.monotonic() - start:.1f} s)", flush=True)
        if args.max_steps and model.step_count >= args.max_steps:
            break
    if ctx.rank == 0:
        print(f"done: {model.step_count} steps in {time.monotonic() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
