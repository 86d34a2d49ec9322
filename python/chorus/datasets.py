"""Datasets the examples use, read by chorus's C++ readers."""

import torch.utils.data

from . import _C

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


def fashion_mnist(split="train", directory=FASHION_MNIST_DIR):
    """Fashion-MNIST (the Debian package dataset-fashion-mnist; scripts/setup installs it) as a
    TensorDataset of (image [1, 28, 28] float normalized by the dataset's mean and std, label)."""
    images, labels = _C.fashion_mnist(split, directory)
    return torch.utils.data.TensorDataset(images, labels)
