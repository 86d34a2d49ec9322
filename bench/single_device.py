#!/usr/bin/env python3
"""One device: chorus against a plain PyTorch training loop of the same model, side by side.

For each zoo model and compute format, --pairs pairs of runs, alternating which goes first:

  chorus   `chorus train` with `devices = "<device>"` (one worker), synthetic data, the job's
           default optimizer (SGD, lr 0.05, momentum 0.9, no weight decay) on a constant schedule,
           `train.eval_every = 0`, `train.target_accuracy = 0`; its step times come from
           `--log-json` (`step_s`, and the `time` stamps of the lines for the wall clock)
  pytorch  this script in a fresh process (--pytorch-worker): a layer-for-layer copy of chorus's
           model (bench/ddp_baseline.py's CNN, bench/gpt_torch.py's GPT), the same batch, optimizer,
           loss, data shapes and numerics, in the loop anyone would write (zero_grad(set_to_none),
           forward and loss under autocast, backward, step; no per-step host synchronization)

Numerics, the same in both: fp32 (on a GPU matrix products without TF32, chorus's
`precision.tf32 = false` and PyTorch's default; cuDNN convolutions in TF32 when the binary knows
`precision.conv_tf32`, which is then set true as PyTorch's cudnn.allow_tf32 default, else not), or bf16
autocast with fp32 master weights (chorus `precision.default = "bf16"`, PyTorch
`torch.autocast(dtype=torch.bfloat16)`). On a CPU both compute on --threads intra-op threads
(default 1, the steadiest figure on a shared host): chorus's job sets `cpu_threads` (its worker
calls at::set_num_threads, src/runtime/launch/worker.cc), the loop torch.set_num_threads. Both
run with the malloc settings chorus's agent gives its workers (GLIBC_TUNABLES,
AgentOptions::kRetainFreedMemory) unless --system-malloc.

Timing: each run takes --steps steps; the last --measure are timed. On a CPU every op is
synchronous, so the loop's per-step time.perf_counter() is the step's time, and each side's figure is
the median of its timed steps (chorus: `step_s`). On a GPU the loop is not synchronized per step: it
times the block of timed steps (torch.cuda.synchronize() at its two ends only) and its figure is the
block's mean; chorus's is then its wall clock per step over the timed steps but the last (the `time`
stamps; the last step's line waits for the final evaluation), which, as `step_s` does, includes
chorus's own per-step synchronizations. Both figures are kept either way
(`*_median_step_s`, `*_block_step_s`). samples/s = batch / step time; a row's figure is the median
over the pairs, and chorus_over_pytorch the median of the per-pair ratios (min and max kept too).

MFU: the model's forward FLOPs per sample counted from its shapes as chorus's own profile counts
them (src/model/cnn.cc and gpt.cc forwardFlops: 3x3 convolutions and linear layers; attention's two
T x T matmuls over the whole square; norms, activations and the optimizer not counted) x 3 for
forward + backward x samples/s, over the device's matmul peak in that format as `chorus devices
--json` measures it (on a CPU at one thread).

GPT attention: the loop computes it as the chorus binary does (--attention auto): through
F.scaled_dot_product_attention(is_causal=True) on a GPU when the binary calls
at::scaled_dot_product_attention, else written out as chorus's GPT does on a CPU (matmul,
masked_fill, softmax, matmul; gpt.cc Block::attention). Unless --no-attention-reference, each GPT pair also runs the loop with the other
attention, reported beside the row (`pytorch_sdpa_*` or `pytorch_explicit_*`), not in its ratio.

--breakdown (a diagnosis, not a benchmark): per model and format, --pairs chorus runs with --trace
and as many loop runs that time each phase on the host (exact on a CPU only); the median ms of each
phase, and chorus's per-step gradient passes of a world of one redone in PyTorch on the same sizes.
--pytorch-linear cpp-frontend makes the loop's nn.Linear compute as libtorch's C++ torch::nn::Linear
does (matmul, then `output += bias`, for inputs of more than two dimensions).

    python3 bench/single_device.py                          # CPU, every model, fp32 and bf16
    python3 bench/single_device.py --device cuda:0          # adds gpt2-small (12 x 768, T 1024)
    python3 bench/single_device.py --models gpt --dtypes bf16 --pairs 3
"""

import argparse
import datetime
import json
import math
import os
import platform
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

REPO = os.path.dirname(os.path.abspath(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench")
DEFAULT_CHORUS = os.path.join(REPO, "build", "chorus")
# What chorus's agent gives its workers (include/chorus/runtime/launch/agent.h, kRetainFreedMemory).
CHORUS_MALLOC = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"
LR, MOMENTUM = 0.05, 0.9  # include/chorus/runtime/job/job_config.h, OptimizerSection's defaults
DATA_POOL = 8  # distinct batches the loop cycles through

# The zoo models. `batch` is the global batch on a CPU, `gpu_batch` on a GPU.
MODELS = {
    "cnn-small": dict(kind="cnn", channels=64, blocks=2, groups=8, input_shape=[1, 28, 28],
                      classes=10, batch=32, gpu_batch=256),
    "cnn-large": dict(kind="cnn", channels=128, blocks=4, groups=8, input_shape=[1, 28, 28],
                      classes=10, batch=16, gpu_batch=256),
    "gpt": dict(kind="gpt", vocab=96, layers=4, width=128, heads=4, context=64,
                batch=16, gpu_batch=64),
    "gpt2-small": dict(kind="gpt", vocab=50257, layers=12, width=768, heads=12, context=1024,
                       batch=None, gpu_batch=8, gpu_only=True),
}
DEFAULT_MODELS = "cnn-small,cnn-large,gpt,gpt2-small"
KERNEL, HEAD_GRID = 3, 4  # src/model/cnn.cc kKernel, kHeadGrid


# --------------------------------------------------------------------------------------------
# The model's size and FLOPs, counted from its shapes as chorus's C++ code builds it.

def parameter_count(m):
    """Parameters of chorus's model `m` (src/model/cnn.cc, gpt.cc, from the layer shapes)."""
    if m["kind"] == "cnn":
        c, g = m["channels"], m["groups"]
        conv = lambda cin, cout: cin * cout * KERNEL * KERNEL + (cout if g == 0 else 2 * cout)  # noqa: E731
        return (conv(m["input_shape"][0], c) + m["blocks"] * 2 * conv(c, c)
                + c * HEAD_GRID * HEAD_GRID * m["classes"] + m["classes"])
    w, v = m["width"], m["vocab"]
    block = 2 * 2 * w + (3 * w * w + 3 * w) + (w * w + w) + (4 * w * w + 4 * w) + (4 * w * w + w)
    return v * w + m["context"] * w + m["layers"] * block + 2 * w + w * v


def forward_flops(m):
    """Forward FLOPs per sample, as chorus's Layer::forwardFlops count them."""
    if m["kind"] == "cnn":
        h = (m["input_shape"][1] - 1) // 2 + 1
        w = (m["input_shape"][2] - 1) // 2 + 1
        conv = lambda cin, cout: 2.0 * cin * cout * KERNEL * KERNEL * h * w  # noqa: E731
        return (conv(m["input_shape"][0], m["channels"]) + m["blocks"] * 2 * conv(m["channels"], m["channels"])
                + 2.0 * m["channels"] * HEAD_GRID * HEAD_GRID * m["classes"])
    t, w = float(m["context"]), float(m["width"])
    block = 2 * t * w * 3 * w + 2 * t * t * w + 2 * t * t * w + 2 * t * w * w + 2 * t * w * 4 * w * 2
    return m["layers"] * block + 2 * t * w * m["vocab"]


def format_count(n):
    """chorus's ZooModel::formatCount."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return str(n)


# --------------------------------------------------------------------------------------------
# The PyTorch side: a worker process that trains the copy and prints its timings as JSON.

def build_torch_model(m, attention, linear="aten"):
    """The PyTorch copy of chorus's model `m`. linear="cpp-frontend": every nn.Linear computes as
    libtorch's C++ torch::nn::Linear does (torch/nn/functional/linear.h: addmm for 2-D inputs,
    else matmul and then `output += bias`), instead of aten::linear (Python's F.linear)."""
    sys.path.insert(0, BENCH)
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415
    model = build_torch_copy(m, attention, torch, F)
    if linear == "cpp-frontend":
        class CppFrontendLinear(torch.nn.Linear):
            def forward(self, x):
                if x.dim() == 2 and self.bias is not None:
                    return torch.addmm(self.bias, x, self.weight.t())
                out = x.matmul(self.weight.t())
                if self.bias is not None:
                    out += self.bias
                return out
        for module in model.modules():
            if type(module) is torch.nn.Linear:
                module.__class__ = CppFrontendLinear
    return model


def build_torch_copy(m, attention, torch, F):
    if m["kind"] == "cnn":
        import ddp_baseline  # noqa: PLC0415
        return ddp_baseline.ResidualCNN(m["channels"], m["blocks"], m["groups"],
                                        in_channels=m["input_shape"][0], classes=m["classes"])
    import gpt_torch  # noqa: PLC0415
    shape = {k: m[k] for k in ("vocab", "layers", "width", "heads", "context")}

    class Embed(gpt_torch.Embed):
        def forward(self, x):  # positions on the tokens' device (gpt_torch's assume the CPU)
            return self.tokens(x) + self.positions(torch.arange(x.size(1), device=x.device))

    class Block(gpt_torch.Block):
        def attention(self, x):
            b, t, w = x.shape
            d = w // self.heads
            q, k, v = (y.reshape(b, t, self.heads, d).transpose(1, 2)
                       for y in self.qkv(x).split(w, dim=2))
            if attention == "sdpa":
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # chorus's: matmul, causal mask, softmax, matmul (gpt.cc Block::attention)
                scores = q @ k.transpose(2, 3) / math.sqrt(d)
                future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
                out = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
            return out.transpose(1, 2).reshape(b, t, w)

    model = gpt_torch.Gpt(shape)
    layers = [Embed(shape)] + [Block(shape) for _ in range(shape["layers"])] + [gpt_torch.Head(shape)]
    model.layers = torch.nn.ModuleList(layers)
    gpt_torch.init_like_chorus(model, shape)
    return model


def make_torch_data(m, batch, seed):
    """DATA_POOL batches shaped as chorus's synthetic data (src/data/synthetic.cc), on the host:
    images = a class prototype + noise, both uniform in (-1, 1), and a label; or token sequences
    and their successors. The values are not chorus's; the shapes and types are."""
    import torch  # noqa: PLC0415
    generator = torch.Generator().manual_seed(seed)
    pool = []
    if m["kind"] == "cnn":
        prototypes = torch.rand((m["classes"], *m["input_shape"]), generator=generator) * 2 - 1
    for _ in range(DATA_POOL):
        if m["kind"] == "cnn":
            y = torch.randint(0, m["classes"], (batch,), generator=generator)
            noise = torch.rand((batch, *m["input_shape"]), generator=generator) * 2 - 1
            x = prototypes[y] + noise
        else:
            tokens = torch.randint(0, m["vocab"], (batch, m["context"] + 1), generator=generator)
            x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        pool.append((x, y))
    return pool


def reducer_passes(parameters, repeats=20):
    """What chorus's GradientReducer does to the gradients of a world of one each step, the same
    ops on the same sizes and bucket layout, timed here (median ms of `repeats`): the copy of each
    gradient into its bucket as it becomes final (GradientReducer::release), the scale by 1 / B
    and the copy back (writeGradients), the finiteness check (gradientsFinite)."""
    import torch  # noqa: PLC0415
    # parallel::bucketLayoutOf with the job's defaults (comm.bucket_mb 25, first_bucket_mb 1,
    # min_buckets 4, buckets of at least 32 KiB): in reverse registration order.
    total = sum(p.numel() * 4 for p in parameters)
    cap = min(25 << 20, max(32 << 10, total // 4))
    layout, current, size = [], [], 0
    for p in reversed(parameters):
        limit = min(1 << 20, cap) if not layout else cap
        if current and size + p.numel() * 4 > limit:
            layout.append(current)
            current, size = [], 0
        current.append(p)
        size += p.numel() * 4
    layout.append(current)
    flats = [torch.zeros(sum(p.numel() for p in bucket), device=bucket[0].device) for bucket in layout]
    times = {"copy into buckets": [], "scale and copy back": [], "finite check": []}
    for _ in range(repeats):
        start = time.perf_counter()
        for bucket, flat in zip(layout, flats):
            offset = 0
            for p in bucket:
                flat.narrow(0, offset, p.numel()).copy_(p.grad.reshape(-1))
                offset += p.numel()
        copied = time.perf_counter()
        for bucket, flat in zip(layout, flats):
            flat.mul_(1.0 / 16)
            offset = 0
            for p in bucket:
                p.grad.copy_(flat.narrow(0, offset, p.numel()).view(p.shape))
                offset += p.numel()
        written = time.perf_counter()
        finite = all(bool(torch.isfinite(flat).all().item()) for flat in flats)
        checked = time.perf_counter()
        assert finite
        times["copy into buckets"].append(copied - start)
        times["scale and copy back"].append(written - copied)
        times["finite check"].append(checked - written)
    result = {k: round(1e3 * statistics.median(v), 3) for k, v in times.items()}
    result["buckets"] = len(layout)
    result["gradient_mb"] = round(total / 2**20, 2)
    return result


def pytorch_worker(spec):
    """Runs the loop described by `spec` and prints one JSON line of results."""
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415
    m, device = spec["model"], torch.device(spec["device"])
    if device.type == "cpu":
        torch.set_num_threads(spec.get("threads", 1))
    else:  # as chorus: matrix products in fp32; convolutions in TF32 when chorus's are
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = bool(spec.get("conv_tf32"))
    torch.manual_seed(spec["seed"])
    model = build_torch_model(m, spec["attention"], spec.get("linear", "aten")).to(device)
    model.train()
    parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=0.0)
    pool = make_torch_data(m, spec["batch"], spec["seed"])
    bf16 = spec["dtype"] == "bf16"

    def loss_of(out, y):
        if m["kind"] == "cnn":  # chorus: cross_entropy summed, the gradients divided by B
            return F.cross_entropy(out, y)
        # chorus's Gpt::lossSum: per-token loss, mean over each sequence, summed (then / B)
        per_token = F.cross_entropy(out.reshape(-1, out.size(2)), y.reshape(-1), reduction="none")
        return per_token.view(out.size(0), out.size(1)).mean(1).mean()

    steps, timed_from = spec["steps"], spec["steps"] - spec["measure"]
    step_s, losses = [], []
    cuda = device.type == "cuda"
    block_start = None
    # --breakdown: the time of each phase (data and zero_grad, forward with the loss, backward,
    # optimizer), read on the host; exact on a CPU, where every op is synchronous.
    phases = [] if spec.get("phases") else None
    clock = time.perf_counter
    for step in range(steps):
        if step == timed_from:
            if cuda:
                torch.cuda.synchronize(device)
            block_start = clock()
        start = clock()
        x, y = pool[step % DATA_POOL]
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        t_data = clock()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(model(x), y)
        t_forward = clock()
        loss.backward()
        t_backward = clock()
        optimizer.step()
        losses.append(loss.detach())
        end = clock()
        step_s.append(end - start)
        if phases is not None:
            phases.append({"data": t_data - start, "forward": t_forward - t_data,
                           "backward": t_backward - t_forward, "optimizer": end - t_backward})
    if cuda:
        torch.cuda.synchronize(device)
    block_s = time.perf_counter() - block_start
    result = {"parameters": parameters, "step_s": step_s, "block_s": block_s,
              "first_loss": float(losses[0]), "last_loss": float(losses[-1]),
              "threads": torch.get_num_threads(), "torch": torch.__version__}
    if phases is not None:
        result["phases"] = phases[timed_from:]
        result["reducer_passes"] = reducer_passes(list(model.parameters()))
    print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------
# The driver.

def busy_cpu_seconds():
    """CPU seconds the whole machine has spent busy since boot (/proc/stat)."""
    with open("/proc/stat", encoding="utf-8") as handle:
        ticks = [int(x) for x in handle.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(command, env, timeout):
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {proc.returncode}:\n{output[-3000:]}")
    return output


def measured(func):
    """Runs func(); returns its result with the run's wall time, the cores other processes used
    meanwhile (the machine's busy CPU less this run's), and the load average at its end."""
    start, busy, own = time.monotonic(), busy_cpu_seconds(), children_cpu_seconds()
    result = func()
    wall = time.monotonic() - start
    foreign = (busy_cpu_seconds() - busy - (children_cpu_seconds() - own)) / wall
    result.update(run_wall_s=round(wall, 2), foreign_cores=round(max(0.0, foreign), 3),
                  loadavg=[round(x, 2) for x in os.getloadavg()])
    return result


def chorus_settings(args, m, batch, dtype):
    settings = {
        "devices": args.device,
        "train.global_batch": batch,
        "train.eval_every": 0,
        "train.target_accuracy": 0,
        "train.log_every": args.steps,
        "data.dataset": "synthetic",
        "data.size": 2 * batch,  # the final evaluations run on size / 4 samples: keep them short
        "optimizer.warmup_steps": 0,  # the built-in default job warms up over 20 steps
        "optimizer.schedule": "constant",
        "precision.default": dtype,
        "seed": args.seed,
        "model.kind": m["kind"],
    }
    keys = ("channels", "blocks", "groups", "classes") if m["kind"] == "cnn" else \
        ("vocab", "layers", "width", "heads", "context")
    for key in keys:
        settings[f"model.{key}"] = m[key]
    if m["kind"] == "cnn":
        settings["model.input_shape"] = "[" + ",".join(str(d) for d in m["input_shape"]) + "]"
    if args.device == "cpu" and args.sets_cpu_threads:
        settings["cpu_threads"] = args.threads
    if args.device.startswith("cuda"):
        settings["precision.tf32"] = "false"  # fp32 matrix products in fp32, as PyTorch's default
        if args.conv_tf32:  # cuDNN convolutions in TF32, as PyTorch's default (chorus af50370 on)
            settings["precision.conv_tf32"] = "true"
    return settings


def run_chorus(args, m, batch, dtype, workdir, tag, trace=None):
    log = os.path.join(workdir, f"{tag}.jsonl")
    command = [args.chorus, "train", "--steps", str(args.steps), "--log-json", log]
    if trace:
        command += ["--trace", trace, "--trace-steps", f"{args.steps - args.measure}:{args.steps}"]
    for key, value in chorus_settings(args, m, batch, dtype).items():
        command += ["--set", f"{key}={value}"]
    output = run(command, job_env(args), args.timeout)
    with open(log, encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle if line.strip() and '"step"' in line]
    lines = [line for line in lines if "step" in line]
    if len(lines) != args.steps:
        raise RuntimeError(f"chorus logged {len(lines)} steps, expected {args.steps}:\n{output[-2000:]}")
    timed = lines[-args.measure:]
    # The wall clock per step over the timed steps but the last, whose log line waits for the
    # final evaluation (Trainer::run evaluates after step train.steps before reporting it).
    block = (lines[-2]["time"] - lines[-args.measure - 1]["time"]) * args.measure / (args.measure - 1)
    found = re.search(r"\): ([0-9.]+(?: [kMG])?) parameters", output)
    return {"median_step_s": statistics.median(s["step_s"] for s in timed),
            "step_s_by_step": {s["step"]: s["step_s"] for s in timed},
            "time_by_step": {s["step"]: s["time"] for s in lines},
            "block_step_s": block / args.measure,
            "step_s": [round(s["step_s"], 6) for s in timed],
            "first_loss": lines[0]["loss"], "last_loss": lines[-1]["loss"],
            "parameters_logged": found.group(1) if found else None}


def run_pytorch(args, m, batch, dtype, attention, phases=False):
    spec = {"model": m, "device": args.device, "batch": batch, "dtype": dtype, "seed": args.seed,
            "steps": args.steps, "measure": args.measure, "attention": attention, "phases": phases,
            "conv_tf32": args.conv_tf32, "linear": args.pytorch_linear, "threads": args.threads}
    command = [sys.executable, os.path.abspath(__file__), "--pytorch-worker", json.dumps(spec)]
    output = run(command, job_env(args, PYTHONWARNINGS="ignore"), args.timeout)
    line = next(line for line in output.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    timed = result.pop("step_s")[-args.measure:]
    result.update(median_step_s=statistics.median(timed),
                  block_step_s=result.pop("block_s") / args.measure,
                  step_s=[round(s, 6) for s in timed])
    return result


def job_env(args, **extra):
    env = dict(os.environ, **extra)
    env["GLIBC_TUNABLES"] = "" if args.system_malloc else CHORUS_MALLOC
    return env


def chorus_knows(args, key):
    """Whether the chorus binary reads config key `key` (its name appears in the binary)."""
    with open(args.chorus, "rb") as handle:
        return key.encode() in handle.read()


def step_time(args, run_result):
    """The figure a run is compared by: the median step on a CPU, the block's mean on a GPU."""
    return run_result["block_step_s" if args.device.startswith("cuda") else "median_step_s"]


def device_peaks(args):
    """The device's matmul GFLOP/s per format, as `chorus devices --json` measures them."""
    output = run([args.chorus, "devices", "--json"], job_env(args), 600)
    devices = json.loads(output[output.index("["):output.rindex("]") + 1])
    kind, _, index = args.device.partition(":")
    for entry in devices:
        if entry.get("kind") == kind and (kind == "cpu" or str(entry.get("index")) == (index or "0")):
            return {"name": entry.get("name"), "threads": entry.get("threads"),
                    "fp32": entry.get("matmul_gflops_fp32"), "bf16": entry.get("matmul_gflops_bf16"),
                    "blas": entry.get("blas")}
    raise RuntimeError(f"`chorus devices --json` lists no {args.device}: {output[-1000:]}")


def machine_info(args):
    with open("/proc/cpuinfo", encoding="utf-8") as handle:
        cpu = next((line.split(":", 1)[1].strip() for line in handle
                    if line.startswith("model name")), "unknown")
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "src", "include",
                            "tools", "CMakeLists.txt"],
                           capture_output=True, text=True, check=False).stdout.strip()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: PLC0415
    if args.chorus_commit:
        commit, dirty = args.chorus_commit, None
    return {"host": socket.gethostname(), "cpu": cpu, "nproc": os.cpu_count(),
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "chorus_commit": commit or None,
            "chorus_sources_modified": None if dirty is None else bool(dirty),
            "chorus_binary_mtime": datetime.datetime.fromtimestamp(
                os.path.getmtime(args.chorus)).isoformat(timespec="seconds"),
            "uptime_before": subprocess.run(["uptime"], capture_output=True, text=True,
                                            check=False).stdout.strip()}


def summarize(args, name, m, batch, dtype, pairs, peaks):
    ratios = [p["chorus_over_pytorch"] for p in pairs]
    c_sps = [p["chorus_samples_per_s"] for p in pairs]
    p_sps = [p["pytorch_samples_per_s"] for p in pairs]
    train_flops = 3.0 * forward_flops(m)
    peak = peaks.get(dtype)
    mfu = (lambda sps: round(train_flops * sps / (peak * 1e9), 4)) if peak else (lambda sps: None)
    row = {
        "device": args.device, "device_name": peaks.get("name"), "model": name, "dtype": dtype,
        "batch": batch, "steps": args.steps, "measured_steps": args.measure, "pairs": len(pairs),
        "parameters": parameter_count(m),
        "train_flops_per_sample": train_flops,
        "peak_gflops": peak,
        "chorus_samples_per_s": round(statistics.median(c_sps), 2),
        "pytorch_samples_per_s": round(statistics.median(p_sps), 2),
        "chorus_over_pytorch": round(statistics.median(ratios), 4),
        "chorus_over_pytorch_min": round(min(ratios), 4),
        "chorus_over_pytorch_max": round(max(ratios), 4),
        "chorus_samples_per_s_min": round(min(c_sps), 2),
        "pytorch_samples_per_s_min": round(min(p_sps), 2),
        "chorus_mfu": mfu(statistics.median(c_sps)),
        "pytorch_mfu": mfu(statistics.median(p_sps)),
        "mfu": {"chorus": mfu(statistics.median(c_sps)), "pytorch": mfu(statistics.median(p_sps))},
        # The wall-clock view: chorus's `time` stamps, the loop's block (what runs between steps
        # counts here, not in step_s).
        "chorus_over_pytorch_block": round(statistics.median(
            p["pytorch"]["block_step_s"] / p["chorus"]["block_step_s"] for p in pairs), 4),
        "per_pair": pairs,
    }
    if m["kind"] == "gpt":
        row["attention"] = args.attention
    other = f"pytorch_{other_attention(args.attention)}"
    reference = [p[f"{other}_samples_per_s"] for p in pairs if f"{other}_samples_per_s" in p]
    if reference:  # the loop with the other attention: beside the row, not in its ratio
        row[f"{other}_samples_per_s"] = round(statistics.median(reference), 2)
        row[f"{other}_mfu"] = mfu(statistics.median(reference))
        row[f"chorus_over_{other}"] = round(statistics.median(
            p["chorus_samples_per_s"] / p[f"{other}_samples_per_s"] for p in pairs), 4)
    return row


def set_mfu(row, peak):
    """(Re)computes a row's MFU figures against `peak` GFLOP/s."""
    row["peak_gflops"] = peak
    mfu = (lambda sps: round(row["train_flops_per_sample"] * sps / (peak * 1e9), 4)) if peak else \
        (lambda sps: None)
    for key in [k for k in row if k.endswith("_samples_per_s") and not k.endswith("_min")]:
        row[key[:-len("_samples_per_s")] + "_mfu"] = mfu(row[key])
    row["mfu"] = {"chorus": row["chorus_mfu"], "pytorch": row["pytorch_mfu"]}


def measure_row(args, name, dtype, peaks, workdir):
    m = MODELS[name]
    batch = args.batch.get(name) or (m["gpu_batch"] if args.device.startswith("cuda") else m["batch"])
    reference = args.attention_reference and m["kind"] == "gpt"
    pairs = []
    for k in range(args.pairs):
        for attempt in range(1 + args.retries):
            pair = measure_pair(args, name, m, batch, dtype, reference, workdir, k, attempt)
            if pair["other_load_cores"] <= args.max_foreign:
                break
            if attempt < args.retries:
                print(f"    other work used {pair['other_load_cores']:.2f} cores: waiting, then again",
                      flush=True)
                wait_for_quiet(args.max_foreign)
        pairs.append(pair)
    expected = parameter_count(m)
    for pair in pairs:
        got = pair["pytorch"]["parameters"]
        if got != expected:
            raise RuntimeError(f"{name}: the PyTorch copy has {got} parameters, chorus's model {expected}")
        logged = pair["chorus"]["parameters_logged"]
        if logged is not None and logged != format_count(expected):
            raise RuntimeError(f"{name}: chorus logged {logged} parameters, expected {format_count(expected)}")
    return summarize(args, name, m, batch, dtype, pairs, peaks)


def wait_for_quiet(max_foreign, limit_s=300):
    """Waits (at most limit_s) until other work uses at most max_foreign cores over 5 s."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        busy = busy_cpu_seconds()
        time.sleep(5)
        if (busy_cpu_seconds() - busy) / 5 <= max_foreign:
            return


def other_attention(attention):
    return "explicit" if attention == "sdpa" else "sdpa"


def measure_pair(args, name, m, batch, dtype, reference, workdir, k, attempt):
    """One pair: chorus and the loop (first in turn), and for a GPT with `reference` the loop
    with the other attention."""
    tag = f"{name}-{dtype}-{k}-{attempt}"
    jobs = [("chorus", lambda: run_chorus(args, m, batch, dtype, workdir, tag)),
            ("pytorch", lambda: run_pytorch(args, m, batch, dtype, args.attention))]
    if k % 2:
        jobs.reverse()  # alternate which goes first: drift of the host hits both alike
    other = other_attention(args.attention)
    if reference:
        jobs.append((f"pytorch_{other}", lambda: run_pytorch(args, m, batch, dtype, other)))
    pair = {"pair": k, "attempt": attempt, "order": [j[0] for j in jobs]}
    for label, job in jobs:
        pair[label] = measured(job)
        pair[label].pop("step_s_by_step", None)
        pair[label].pop("time_by_step", None)
    for label in [j[0] for j in jobs]:
        pair[f"{label}_samples_per_s"] = round(batch / step_time(args, pair[label]), 3)
    pair["chorus_over_pytorch"] = round(pair["chorus_samples_per_s"] / pair["pytorch_samples_per_s"], 4)
    print(f"  {name:10s} {dtype:4s} pair {k}: chorus {pair['chorus_samples_per_s']:8.1f}/s "
          f"({1e3 * step_time(args, pair['chorus']):7.2f} ms), pytorch {pair['pytorch_samples_per_s']:8.1f}/s "
          f"({1e3 * step_time(args, pair['pytorch']):7.2f} ms), ratio {pair['chorus_over_pytorch']:.3f}"
          + (f", {other} {pair[f'pytorch_{other}_samples_per_s']:8.1f}/s" if reference else "")
          + f"; other load {max(pair[j[0]]['foreign_cores'] for j in jobs):.2f} cores", flush=True)
    pair["other_load_cores"] = max(pair[j[0]]["foreign_cores"] for j in jobs)
    return pair


CHORUS_PHASES = ("before forward", "forward", "backward", "backward to optimizer", "optimizer",
                 "after optimizer", "between steps")
TORCH_PHASES = ("data", "forward", "backward", "optimizer")


def chorus_phases(trace_path, run_result):
    """Per-step phases of a chorus run, in seconds, from its --trace and its log: the trace's
    forward, backward and optimizer spans; `backward to optimizer` is the gap between them (the
    reducer's finish, the gradient check, the step figures); `before forward` and `after
    optimizer` are what the engine's step (`step_s`) holds besides the spans, split at the
    forward's start; `between steps` is the wall clock from one logged step to the next (the log's
    `time` stamps) less `step_s`: what the trainer and the report do between steps."""
    with open(trace_path, encoding="utf-8") as handle:
        document = json.load(handle)
    events = document["traceEvents"] if isinstance(document, dict) else document
    spans = {}
    for event in events:
        if event.get("ph") == "X":
            spans.setdefault(event["args"]["step"], {}).setdefault(event["name"], []).append(event)
    steps_s, times = run_result["step_s_by_step"], run_result["time_by_step"]
    result = []
    for step, named in sorted(spans.items()):
        logged = step + 1  # the log counts steps from 1, the trace from 0
        if not all(k in named for k in ("forward", "backward", "optimizer")) or logged not in steps_s:
            continue
        if len(named["forward"]) != 1:
            continue  # micro-batches: not this table's case
        forward, backward, optimizer = named["forward"][0], named["backward"][0], named["optimizer"][0]
        inside = (optimizer["ts"] + optimizer["dur"] - forward["ts"]) / 1e6
        gap = (optimizer["ts"] - backward["ts"] - backward["dur"]) / 1e6
        step_s = steps_s[logged]
        # before forward: from the step's start to the forward span; the step's start is the
        # previous step's end plus what ran between them (unknown split): take the trace's view,
        # the time from the previous optimizer's end to this forward, less `between steps`.
        wall = times[logged] - times[logged - 1] if logged - 1 in times else None
        entry = {"forward": forward["dur"] / 1e6, "backward": backward["dur"] / 1e6,
                 "backward to optimizer": gap, "optimizer": optimizer["dur"] / 1e6,
                 "step_s": step_s, "outside spans": step_s - inside + gap}
        previous = spans.get(step - 1, {}).get("optimizer")
        if previous and wall is not None:
            since = (forward["ts"] - previous[0]["ts"] - previous[0]["dur"]) / 1e6
            entry["between steps"] = wall - step_s
            # What of the step runs before the forward span: the gap since the previous
            # optimizer, less what ran outside the engine's step between them.
            entry["before forward"] = max(0.0, since - entry["between steps"])
            entry["after optimizer"] = max(0.0, step_s - inside - entry["before forward"])
        result.append(entry)
    return result


def breakdown(args, workdir, peaks):
    """--breakdown: --pairs traced chorus runs and as many PyTorch runs timing each phase, per
    model and format, alternating which goes first; each phase's median over a run's timed steps,
    then the median of those over the runs, in ms."""
    gpu = args.device.startswith("cuda")
    if gpu:
        print("--breakdown reads phases on the host: on a GPU they measure launches, not compute")
    rows = []
    med = lambda entries, key: 1e3 * statistics.median(e[key] for e in entries if key in e)  # noqa: E731
    for name in [n for n in args.models if gpu or not MODELS[n].get("gpu_only")]:
        m = MODELS[name]
        batch = args.batch.get(name) or (m["gpu_batch"] if gpu else m["batch"])
        for dtype in args.dtypes:
            runs = []
            for k in range(args.pairs):  # each phase: its median per run, then over the runs
                trace = os.path.join(workdir, f"{name}-{dtype}-{k}.trace")
                jobs = [lambda: measured(lambda: run_chorus(args, m, batch, dtype, workdir,
                                                            f"bd-{name}-{dtype}-{k}", trace)),
                        lambda: measured(lambda: run_pytorch(args, m, batch, dtype, args.attention,
                                                             phases=True))]
                if k % 2:
                    c, p = jobs[0](), jobs[1]()
                else:
                    p, c = jobs[1](), jobs[0]()
                cp = chorus_phases(trace, c)
                runs.append({"chorus_ms": {k2: med(cp, k2) for k2 in CHORUS_PHASES if any(k2 in e for e in cp)},
                             "pytorch_ms": {k2: med(p["phases"], k2) for k2 in TORCH_PHASES},
                             "chorus_step_ms": 1e3 * c["median_step_s"],
                             "chorus_wall_ms": 1e3 * c["block_step_s"],
                             "pytorch_step_ms": 1e3 * p["median_step_s"],
                             "pytorch_wall_ms": 1e3 * p["block_step_s"],
                             "reducer_passes": p["reducer_passes"],
                             "foreign_cores": max(c["foreign_cores"], p["foreign_cores"])})
            over = lambda key: round(statistics.median(r[key] for r in runs), 3)  # noqa: E731
            row = {"model": name, "dtype": dtype, "batch": batch, "runs": len(runs),
                   "chorus_ms": {k2: round(statistics.median(r["chorus_ms"][k2] for r in runs), 3)
                                 for k2 in runs[0]["chorus_ms"]},
                   "pytorch_ms": {k2: round(statistics.median(r["pytorch_ms"][k2] for r in runs), 3)
                                  for k2 in TORCH_PHASES},
                   "chorus_step_ms": over("chorus_step_ms"), "chorus_wall_ms": over("chorus_wall_ms"),
                   "pytorch_step_ms": over("pytorch_step_ms"), "pytorch_wall_ms": over("pytorch_wall_ms"),
                   "foreign_cores": [r["foreign_cores"] for r in runs]}
            p = {"reducer_passes": {k2: (round(statistics.median(r["reducer_passes"][k2] for r in runs), 3))
                                    for k2 in runs[0]["reducer_passes"]}}
            rows.append(row)
            cm, pm = row["chorus_ms"], row["pytorch_ms"]
            print(f"{name} {dtype} (batch {batch}): chorus step {row['chorus_step_ms']:.2f} ms "
                  f"(wall {row['chorus_wall_ms']:.2f}), pytorch step {row['pytorch_step_ms']:.2f} ms "
                  f"(wall {row['pytorch_wall_ms']:.2f}); median of {len(runs)} runs each; "
                  f"other load up to {max(row['foreign_cores']):.2f} cores")
            print("   chorus : " + ", ".join(f"{k} {v:.3f}" for k, v in cm.items()))
            print("   pytorch: " + ", ".join(f"{k} {v:.3f}" for k, v in pm.items()))
            row["reducer_passes_ms"] = p["reducer_passes"]
            print("   chorus's reducer passes, redone in PyTorch: "
                  + ", ".join(f"{k} {v}" for k, v in p["reducer_passes"].items()))
    return rows


def print_table(rows):
    header = (f"{'model':10s} {'dtype':5s} {'batch':>5s} {'chorus/s':>9s} {'MFU':>6s} "
              f"{'pytorch/s':>9s} {'MFU':>6s} {'chorus/pt':>9s} {'min':>6s} {'max':>6s} {'wall':>6s}"
              f" {'other attention/s':>17s}")
    print(header)
    for r in rows:
        pct = lambda x: f"{100 * x:5.1f}%" if x is not None else "   -  "  # noqa: E731
        print(f"{r['model']:10s} {r['dtype']:5s} {r['batch']:5d} {r['chorus_samples_per_s']:9.1f} "
              f"{pct(r['chorus_mfu'])} {r['pytorch_samples_per_s']:9.1f} {pct(r['pytorch_mfu'])} "
              f"{r['chorus_over_pytorch']:9.3f} {r['chorus_over_pytorch_min']:6.3f} "
              f"{r['chorus_over_pytorch_max']:6.3f} {r['chorus_over_pytorch_block']:6.3f}"
              + "".join(f" {r[f'pytorch_{a}_samples_per_s']:8.1f} ({a})" for a in ("sdpa", "explicit")
                        if f"pytorch_{a}_samples_per_s" in r))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda:N")
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help="comma-separated, of " + ", ".join(MODELS) + " (gpt2-small only on a GPU; "
                             "default: %(default)s)")
    parser.add_argument("--dtypes", default="fp32,bf16", help="fp32 and/or bf16 (default: %(default)s)")
    parser.add_argument("--pairs", type=int, default=5, help="chorus/PyTorch pairs per row (default: 5)")
    parser.add_argument("--steps", type=int, default=30, help="steps per run (default: 30)")
    parser.add_argument("--measure", type=int, default=20, help="last steps timed (default: 20)")
    parser.add_argument("--batch", default="",
                        help="global batches, MODEL=B,... (defaults: cnn-small 32, cnn-large 16, "
                             "gpt 16 on a CPU; 256, 256, 64, gpt2-small 8 on a GPU)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of both on a CPU (default: 1)")
    parser.add_argument("--out", default=None,
                        help="results JSON (default: bench/results/single_device_<device>_<date>.json)")
    parser.add_argument("--chorus", default=DEFAULT_CHORUS, help="chorus binary (build/chorus)")
    parser.add_argument("--chorus-commit", default=None,
                        help="what the binary was built from, for the record (default: this "
                             "checkout's `git rev-parse --short HEAD`, and whether src/, include/, "
                             "tools/ or CMakeLists.txt differ from it)")
    parser.add_argument("--attention", choices=("auto", "explicit", "sdpa"), default="auto",
                        help="the loop's GPT attention: as chorus's binary computes it (auto: "
                             "F.scaled_dot_product_attention when the binary calls it, else "
                             "matmul, mask, softmax, matmul), or as given")
    parser.add_argument("--no-attention-reference", dest="attention_reference", action="store_false",
                        help="skip the extra PyTorch GPT run with the other attention (for a GPT "
                             "each pair also runs the loop with the attention chorus does not use, "
                             "reported beside the row, not in its ratio)")
    parser.add_argument("--system-malloc", action="store_true",
                        help="run both with glibc's default malloc instead of chorus's workers' settings")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--max-foreign", type=float, default=float("inf"),
                        help="redo a pair during which other processes used more than this many "
                             "cores (after waiting for the host to quieten; default: never)")
    parser.add_argument("--retries", type=int, default=2, help="redos of a disturbed pair (default: 2)")
    parser.add_argument("--breakdown", action="store_true",
                        help="instead of the pairs: --pairs chorus runs with --trace and PyTorch runs "
                             "timing each phase, per model and format; the median ms of each phase")
    parser.add_argument("--pytorch-linear", choices=("aten", "cpp-frontend"), default="aten",
                        help="the loop's nn.Linear: aten::linear as Python's F.linear (default), or "
                             "as libtorch's C++ torch::nn::Linear computes it (what chorus's models "
                             "run): for a diagnosis")
    parser.add_argument("--pytorch-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pytorch_worker is None:
        args.models = [name.strip() for name in args.models.split(",") if name.strip()]
        for name in args.models:
            if name not in MODELS:
                parser.error(f"--models: unknown {name!r}; known: {', '.join(MODELS)}")
        args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        if any(d not in ("fp32", "bf16") for d in args.dtypes):
            parser.error("--dtypes: fp32 and/or bf16")
        if not 1 <= args.measure < args.steps:
            parser.error("--measure must be at least 1 and below --steps")
        batches = {}
        for item in filter(None, args.batch.split(",")):
            key, _, value = item.partition("=")
            if key not in MODELS or not value.isdigit():
                parser.error(f"--batch: {item!r} is not MODEL=B")
            batches[key] = int(value)
        args.batch = batches
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.pytorch_worker is not None:
        pytorch_worker(json.loads(args.pytorch_worker))
        return
    gpu = args.device.startswith("cuda")
    models = [n for n in args.models if gpu or not MODELS[n].get("gpu_only")]
    skipped = [n for n in args.models if n not in models]
    if skipped:
        print(f"skipping {', '.join(skipped)}: GPU only", flush=True)
    # On a GPU, fp32 convolutions: chorus before af50370 ran them without TF32 (no key), later
    # with it by default (precision.conv_tf32, PyTorch's cudnn.allow_tf32 default); the loop does
    # as the binary does.
    args.conv_tf32 = gpu and chorus_knows(args, "precision.conv_tf32")
    args.sets_cpu_threads = chorus_knows(args, "cpu_threads")  # once: the binary is large
    if args.attention == "auto":  # chorus's GPT calls at::scaled_dot_product_attention, or not:
        # since 4583bf0 on a GPU only (src/model/gpt.cc, attention), its name in every binary
        fused = chorus_knows(args, "scaled_dot_product_attention")
        args.attention = "sdpa" if fused and args.device.startswith("cuda") else "explicit"
    info = machine_info(args)
    peaks = device_peaks(args)
    info["peaks_gflops"] = peaks
    print(f"{info['cpu']} ({info['nproc']} cores), torch {info['torch']}, chorus {info['chorus_commit']}; "
          f"{args.device}: {peaks['name']} fp32 {peaks['fp32']} / bf16 {peaks['bf16']} GFLOP/s "
          f"({peaks['threads']} thread(s)); GPT attention {args.attention}; {info['uptime_before']}",
          flush=True)
    if args.breakdown:
        with tempfile.TemporaryDirectory(prefix="single_device_") as workdir:
            rows = breakdown(args, workdir, peaks)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as handle:
                json.dump([dict(row, host_cpu=info["cpu"], torch=info["torch"],
                                chorus_commit=info["chorus_commit"],
                                chorus_sources_modified=info["chorus_sources_modified"],
                                command=" ".join(sys.argv), uptime=info["uptime_before"],
                                pytorch_linear=args.pytorch_linear, attention=args.attention)
                           for row in rows], handle, indent=1)
                handle.write("\n")
            print(f"wrote {args.out}")
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="single_device_") as workdir:
        for name in models:
            for dtype in args.dtypes:
                rows.append(measure_row(args, name, dtype, peaks, workdir))
    info["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True,
                                          check=False).stdout.strip()
    info["peaks_gflops_after"] = device_peaks(args)
    # The matmul peak is a measurement too, and a busy moment lowers it: MFU is taken against the
    # better of the two (before and after the pairs).
    for row in rows:
        set_mfu(row, max(filter(None, (peaks.get(row["dtype"]),
                                       info["peaks_gflops_after"].get(row["dtype"]))), default=None))
    print()
    print_table(rows)
    print(f"\nload: before {info['uptime_before']}\n      after  {info['uptime_after']}")
    out = args.out or os.path.join(
        REPO, "bench", "results",
        f"single_device_{args.device.replace(':', '')}_{datetime.date.today().isoformat()}.json")
    common = {"benchmark": "bench/single_device.py", "command": " ".join(sys.argv),
              "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "host": info["host"], "host_cpu": info["cpu"], "nproc": info["nproc"],
              "torch": info["torch"], "chorus_commit": info["chorus_commit"],
              "chorus_sources_modified": info["chorus_sources_modified"],
              "chorus_binary_mtime": info["chorus_binary_mtime"],
              "uptime_before": info["uptime_before"], "uptime_after": info["uptime_after"],
              "peaks_gflops": peaks, "peaks_gflops_after": info["peaks_gflops_after"],
              "malloc": "system" if args.system_malloc else CHORUS_MALLOC,
              "optimizer": f"SGD lr {LR} momentum {MOMENTUM} weight decay 0, constant schedule",
              "intra_op_threads": None if gpu else args.threads, "seed": args.seed,
              "cudnn_conv_tf32": args.conv_tf32 if gpu else None,
              "pytorch_linear": args.pytorch_linear, "attention": args.attention,
              "chorus_binary": os.path.abspath(args.chorus)}
    # A list of rows, each complete in itself (the machine and settings repeated in every row).
    document = [dict(row, **common) for row in rows]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1)
        handle.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
