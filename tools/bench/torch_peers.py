#!/usr/bin/env python3
"""PyTorch eager peers of weft's GPU training-step benchmarks (`weft train MODEL --device cuda:0
--bench N`): the same architectures, sizes, optimizers and batch shapes, timed the way weft times
its steps (warm-up steps first, then N timed steps, each ending when its loss is on the host).

    torch_peers.py MODEL STEPS [--device cuda:0] [--precision f32|bf16] [--batch B] [--image-size S]
                               [--profile K]

MODEL:
  resnet50  ResNet-50 v1.5 (torchvision's layout, which is weft's --depth 50: 7x7/2 stem, 3x3/2
            max pool, bottleneck stages [3, 4, 6, 3] with the stride on the 3x3 convolution, 1x1
            projection shortcuts) over 10 classes, on random images (batch 128 of 3 x 224 x 224
            unless told); momentum SGD 0.05, momentum 0.9, weight decay 5e-4 on every parameter.
            bf16 runs the forward pass under torch.autocast, weft's --precision bf16 counterpart
            (f32 weights, bf16 products and convolutions).
  lm        weft's LSTM language model as tools/bench/ZooTorch.cpp describes it: embedding
            50004 x 128 -> LSTM 256 -> sampled softmax over 1024 shared log-uniform candidates
            with logQ correction and accidental-hit removal, batch 64 x 22; the embedding and the
            softmax weight and bias have sparse gradients (SparseAdam: lazy Adam, as weft's sparse
            update), the LSTM dense ones (Adam 2e-3); global-norm clipping at 1 over all of them.
            Throughput credits weft's mean real words per default batch, as the LibTorch peer does.

In f32, TF32 is off for products and cuDNN (weft's default); prints one JSON line like weft's
--bench: {"model", "impl": "pytorch", "steps", "median_ms", "p10_ms", "p90_ms", "<unit>_per_s"},
plus the device and versions; the losses go to stderr. --profile K then profiles STEPS more steps
with torch.profiler and prints the K kernels that took the most GPU time, per step (the peer's side
of weft's `--trace` with tools/bench/trace_ops.py).
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

WARMUP = 5


def resnet50(a, device):
    import torchvision

    net = torchvision.models.resnet50(num_classes=10).to(device)
    net.train()
    images = torch.randn(a.batch, 3, a.image_size, a.image_size, device=device)
    labels = torch.randint(0, 10, (a.batch,), device=device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = F.cross_entropy(net(images), labels)
        loss.backward()
        opt.step()
        return loss.item()

    params = sum(p.numel() for p in net.parameters())
    return step, "images", float(a.batch), f"{params} parameters; images {a.batch} x 3 x {a.image_size} x {a.image_size}"


def log_uniform(shape, vocab, device):
    """Ids in [0, vocab) from weft's log-uniform sampler distribution (frequent words first)."""
    u = torch.rand(shape, dtype=torch.float64, device=device) * math.log1p(vocab)
    return (u.exp().floor() - 1).clamp(0, vocab - 1).long()


def log_q(ids, vocab, draws):
    p = torch.log1p(1.0 / (ids.double() + 1)) / math.log1p(vocab)
    return (p * draws).log().float()


def lm(a, device):
    vocab, embed, hidden, sampled, batch, width = 50004, 128, 256, 1024, 64, 22
    mean_width, mean_words = 21.503, 1302.79
    embedding = (torch.randn(vocab, embed, device=device) / math.sqrt(embed)).requires_grad_()
    lstm = torch.nn.LSTM(embed, hidden).to(device)
    with torch.no_grad():  # weft's one bias with the forget gate's at 1; LibTorch's second bias held at 0
        lstm.bias_ih_l0.zero_()
        lstm.bias_ih_l0[hidden:2 * hidden] = 1
        lstm.bias_hh_l0.zero_()
        limit = 1 / math.sqrt(hidden)
        lstm.weight_ih_l0.uniform_(-limit, limit)
        lstm.weight_hh_l0.uniform_(-limit, limit)
    lstm.bias_hh_l0.requires_grad_(False)
    out_w = (torch.randn(vocab, hidden, device=device) / math.sqrt(hidden)).requires_grad_()
    out_b = log_q(torch.arange(vocab, device=device), vocab, 1).reshape(vocab, 1).clone().requires_grad_()
    tokens = log_uniform((batch, width), vocab, device)
    targets = log_uniform((batch * width,), vocab, device)
    candidates = log_uniform((sampled,), vocab, device)
    candidate_log_q, target_log_q = log_q(candidates, vocab, sampled), log_q(targets, vocab, sampled)
    hits = (targets.unsqueeze(1) == candidates.unsqueeze(0)).float()
    sparse = [embedding, out_w, out_b]
    dense = [lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0]
    adam = torch.optim.Adam(dense, lr=2e-3, betas=(0.9, 0.999), eps=1e-8)
    sparse_adam = torch.optim.SparseAdam(sparse, lr=2e-3, betas=(0.9, 0.999), eps=1e-8)

    def rows(table, ids):
        return F.embedding(ids, table, sparse=True)

    def step():
        for p in sparse + dense:
            p.grad = None
        x = rows(embedding, tokens).transpose(0, 1)  # (T, B, E), time-major as weft's graph
        h = lstm(x)[0].transpose(0, 1).reshape(-1, hidden)
        true_logit = (h * rows(out_w, targets)).sum(1, keepdim=True) + (rows(out_b, targets).reshape(-1) - target_log_q).unsqueeze(1)
        sampled_logits = h @ rows(out_w, candidates).t() + (rows(out_b, candidates).reshape(-1) - candidate_log_q) - hits * 1e9
        loss = -torch.log_softmax(torch.cat([true_logit, sampled_logits], 1), 1)[:, 0].mean()
        loss.backward()
        with torch.no_grad():
            for p in sparse:
                p.grad = p.grad.coalesce()  # duplicates summed first, as weft's norm and update do
            squares = [p.grad.square().sum() for p in dense] + [p.grad._values().square().sum() for p in sparse]
            scale = 1.0 / torch.clamp_min(torch.stack(squares).sum().sqrt(), 1.0)
            for p in dense:
                p.grad.mul_(scale)
            for p in sparse:
                p.grad = torch.sparse_coo_tensor(p.grad._indices(), p.grad._values() * scale, p.grad.shape).coalesce()
        adam.step()
        sparse_adam.step()
        return loss.item()

    params = sum(p.numel() for p in sparse + dense)
    return step, "words", mean_words * width / mean_width, f"{params} parameters; tokens {batch} x {width}, {sampled} candidates"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=["resnet50", "lm"])
    p.add_argument("steps", type=int)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    p.add_argument("--batch", type=int, default=128, help="resnet50's images per step")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--profile", type=int, default=0, metavar="K", help="print the K kernels that took the most time")
    a = p.parse_args()
    if a.steps < 1:
        p.error("STEPS must be positive")
    if a.model == "lm" and a.precision != "f32":
        p.error("the lm peer runs in f32 (weft's LSTM stays f32 under mixed precision)")
    device = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True  # algorithm chosen once per shape, as weft's cuDNN calls do
    torch.manual_seed(1)
    step, unit, items, shapes = (resnet50 if a.model == "resnet50" else lm)(a, device)
    print(f"{a.model}: {shapes}", file=sys.stderr)
    warm = [step() for _ in range(WARMUP)]
    times, last = [], 0.0
    for _ in range(a.steps):
        start = time.perf_counter()
        last = step()
        times.append(time.perf_counter() - start)
    print(f"{a.model}: warm-up losses {' '.join(f'{l:.4f}' for l in warm)}; after {a.steps} more steps {last:.4f}",
          file=sys.stderr)
    ordered = sorted(times)
    at = lambda q: ordered[int(q * (len(ordered) - 1))] * 1e3
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(json.dumps({"model": a.model, "impl": "pytorch", "steps": a.steps, "precision": a.precision,
                      "median_ms": at(0.5), "p10_ms": at(0.1), "p90_ms": at(0.9),
                      f"{unit}_per_s": items * a.steps / sum(times), "device": name, "torch": torch.__version__}))
    if a.profile > 0:
        profile(step, a.steps, a.profile)


def profile(step, steps, top):
    """The `top` kernels by GPU time over `steps` steps, per step, and the step's kernel total."""
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    device_us = lambda e: getattr(e, "self_device_time_total", None) or e.self_cuda_time_total
    kernels.sort(key=device_us, reverse=True)
    total = sum(device_us(e) for e in kernels)
    print(f"kernels: {total / steps / 1e3:.2f} ms a step")
    for e in kernels[:top]:
        print(f"{device_us(e) / steps / 1e3:9.3f} ms {e.count / steps:6.1f}x  {e.key[:110]}")


if __name__ == "__main__":
    main()
