"""A PyTorch twin of chorus's zoo GPT (src/model/gpt.cc), shared by the benches that compare
chorus with PyTorch (bench/pipeline_torch.py, bench/zero_torch.py).

Layer for layer: token + position embedding; pre-LayerNorm blocks with a fused QKV projection,
causal attention written out with matmuls, a 4x GELU MLP; final LayerNorm and a bias-free head.
`init_like_chorus` gives it chorus's GPT-2 initialization (normal 0.02, residual projections
0.02 / sqrt(2 * layers), zero biases, LayerNorms 1 and 0); without it PyTorch's defaults stay.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# model.kind = "gpt" with chorus's defaults (include/chorus/model/model_config.h; the synthetic
# data set keeps the default vocabulary of 96): 826k parameters.
GPT_DEFAULTS = dict(vocab=96, layers=4, width=128, heads=4, context=64)


class Embed(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.tokens = nn.Embedding(m["vocab"], m["width"])
        self.positions = nn.Embedding(m["context"], m["width"])

    def forward(self, x):
        return self.tokens(x) + self.positions(torch.arange(x.size(1)))


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        w = m["width"]
        self.heads = m["heads"]
        self.attention_norm = nn.LayerNorm(w)
        self.qkv = nn.Linear(w, 3 * w)
        self.attention_out = nn.Linear(w, w)
        self.mlp_norm = nn.LayerNorm(w)
        self.mlp_in = nn.Linear(w, 4 * w)
        self.mlp_out = nn.Linear(4 * w, w)

    def attention(self, x):
        b, t, w = x.shape
        d = w // self.heads
        q, k, v = (y.reshape(b, t, self.heads, d).transpose(1, 2)
                   for y in self.qkv(x).split(w, dim=2))
        scores = q @ k.transpose(2, 3) / math.sqrt(d)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        return (weights @ v).transpose(1, 2).reshape(b, t, w)

    def forward(self, x):
        x = x + self.attention_out(self.attention(self.attention_norm(x)))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x))))


class Head(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.norm = nn.LayerNorm(m["width"])
        self.linear = nn.Linear(m["width"], m["vocab"], bias=False)

    def forward(self, x):
        return self.linear(self.norm(x))


def make_layers(m):
    return [Embed(m)] + [Block(m) for _ in range(m["layers"])] + [Head(m)]


class Gpt(nn.Module):
    """The whole model: `layers` is chorus's layer list (embedding, blocks, head)."""

    def __init__(self, m):
        super().__init__()
        self.layers = nn.ModuleList(make_layers(m))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def init_like_chorus(model, m, generator=None):
    residual_std = 0.02 / math.sqrt(2.0 * m["layers"])
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, 0.02, generator=generator)
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.fill_(0.0)
            elif isinstance(module, Block):
                for linear, std in ((module.qkv, 0.02), (module.attention_out, residual_std),
                                    (module.mlp_in, 0.02), (module.mlp_out, residual_std)):
                    linear.weight.normal_(0.0, std, generator=generator)
                    linear.bias.fill_(0.0)
            elif isinstance(module, Head):
                module.linear.weight.normal_(0.0, 0.02, generator=generator)


def synthetic_tokens(batch, m, generator, successor, follow=0.75):
    """Token sequences shaped as chorus's SyntheticTokens (src/data/synthetic.cc): each next token
    is the current one's fixed successor with probability `follow`, else uniform; the targets are
    the inputs shifted by one. The values are not chorus's (another generator), the sizes are."""
    t, vocab = m["context"], m["vocab"]
    tokens = torch.empty(batch, t + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab, (batch,), generator=generator)
    follows = torch.rand(batch, t, generator=generator) < follow
    uniform = torch.randint(0, vocab, (batch, t), generator=generator)
    for k in range(t):
        tokens[:, k + 1] = torch.where(follows[:, k], successor[tokens[:, k]], uniform[:, k])
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
