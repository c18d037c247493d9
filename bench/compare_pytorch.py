#!/usr/bin/env python3
"""A training step of Lattice next to PyTorch's, on the same model, shapes and threads, in one run.

    python3 bench/compare_pytorch.py --preset gpt2-124m --batch 4 --seq 256 --threads 1,2

For each thread count and precision it alternates `lattice bench train` (a subprocess) with the
same step in PyTorch (this process: a GPT-2 of the preset's shape, SDPA causal attention, AdamW
fused where PyTorch has it, gradient clipping at 1, random tokens), `--rounds` times, and prints
the median tokens/s of each and their ratio. Lattice's bf16 is compared with PyTorch's faster of
fp32 and bf16 autocast, as docs/performance.md reports it. Needs PyTorch (`pip install torch`);
no test runs it. Runs on the GPT presets (learned positions, LayerNorm, GELU) and the Llama one
(RMSNorm, rotary positions, SwiGLU, grouped-query attention), tied embeddings in all, and checks
each model's parameter count against Lattice's.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

PRESETS = {
    # name: (layers, heads, width, context, padded vocab, vocab)
    "gpt2-124m": (12, 12, 768, 1024, 50304, 50257),
    "shakespeare-char": (4, 4, 128, 64, 256, 256),
    "smollm-135m": (30, 9, 576, 2048, 49152, 49152),
}
# The Llama presets: (kv heads, MLP hidden features, rope theta).
LLAMA = {"smollm-135m": (3, 1536, 10000.0)}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lattice", default="build/lattice", help="the lattice executable")
    p.add_argument("--preset", default="gpt2-124m", choices=sorted(PRESETS))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=5, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2")
    p.add_argument("--precision", default="fp32,bf16")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds; medians are kept")
    p.add_argument("--gemms", action="store_true",
                   help="instead: each GEMM role of Lattice's step against the same problems in "
                        "PyTorch's CPU GEMM (and Lattice's own alone), per precision and threads")
    p.add_argument("--gemm-repeats", type=int, default=5, help="timed calls per problem, best kept")
    return p.parse_args()


def lattice_step(args, threads, precision):
    """tokens/s, N and the CPU distances it printed (ns) from one `lattice bench train` row."""
    cmd = [args.lattice, "bench", "train", "--preset", args.preset, "--batch", str(args.batch),
           "--seq", str(args.seq), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(threads), "--precision", precision, "--gemm-repeats", "1"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    row = re.search(rf"^\s*{precision}\s+{threads}\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)", out,
                    re.M)
    params = re.search(r"N = (\d+) parameters", out)
    if not row or not params:
        sys.exit(f"could not read lattice bench train's output:\n{out}")
    # How far apart the host put the first two CPUs at the row's start and end: near and far
    # placements give different 2-thread figures (docs/performance.md).
    apart = [float(ns) for ns in re.findall(r"CPUs \d+ and \d+ ([0-9.]+) ns apart", out)]
    return float(row.group(1)), int(params.group(1)), apart


def torch_llama(torch, preset):
    nn = torch.nn
    F = torch.nn.functional
    layers, heads, width, context, vocab, _ = PRESETS[preset]
    kv_heads, hidden, theta = LLAMA[preset]
    hs = width // heads
    inv_freq = 1.0 / theta ** (torch.arange(0, hs, 2).float() / hs)
    angles = torch.outer(torch.arange(context).float(), inv_freq)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)

    def rotate(x):  # x: (B, heads, T, hs), the rotate-half convention of Hugging Face's Llama
        t = x.shape[2]
        x1, x2 = x[..., : hs // 2], x[..., hs // 2:]
        return x * cos[:t].to(x.dtype) + torch.cat((-x2, x1), dim=-1) * sin[:t].to(x.dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm = nn.RMSNorm(width, eps=1e-5)
            self.q = nn.Linear(width, heads * hs, bias=False)
            self.k = nn.Linear(width, kv_heads * hs, bias=False)
            self.v = nn.Linear(width, kv_heads * hs, bias=False)
            self.o = nn.Linear(heads * hs, width, bias=False)
            self.mlp_norm = nn.RMSNorm(width, eps=1e-5)
            self.gate = nn.Linear(width, hidden, bias=False)
            self.up = nn.Linear(width, hidden, bias=False)
            self.down = nn.Linear(hidden, width, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            h = self.attn_norm(x)
            q = rotate(self.q(h).view(b, t, heads, hs).transpose(1, 2))
            k = rotate(self.k(h).view(b, t, kv_heads, hs).transpose(1, 2))
            v = self.v(h).view(b, t, kv_heads, hs).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o(y.transpose(1, 2).reshape(b, t, heads * hs))
            h = self.mlp_norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.RMSNorm(width, eps=1e-5)

        def forward(self, idx, targets):
            x = self.embed(idx)
            for block in self.blocks:
                x = block(x)
            logits = self.norm(x) @ self.embed.weight.t()  # tied, as the preset's
            return F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))

    return Llama(), vocab


def torch_model(torch, preset):
    if preset in LLAMA:
        return torch_llama(torch, preset)
    nn = torch.nn
    F = torch.nn.functional
    layers, heads, width, context, vocab, _ = PRESETS[preset]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.ln2 = nn.LayerNorm(width)
            self.fc = nn.Linear(width, 4 * width)
            self.out = nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            shape = (b, t, heads, c // heads)
            q, k, v = (y.view(shape).transpose(1, 2) for y in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied, as Lattice's
            return F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))

    return GPT(), vocab


def torch_step(args, threads, precision):
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, vocab = torch_model(torch, args.preset)
    # Counted as Lattice counts: the padding rows of the embedding are not parameters.
    _, _, width, _, padded, real = PRESETS[args.preset]
    params = sum(p.numel() for p in model.parameters()) - (padded - real) * width
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    idx = torch.randint(0, real, (args.batch, args.seq))
    targets = torch.randint(0, real, (args.batch, args.seq))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return args.batch * args.seq / statistics.median(times), params


def lattice_gemm_profile(args, threads, precision):
    """Each GEMM role's step time (s) and its problems, from `lattice bench train --profile`."""
    cmd = [args.lattice, "bench", "train", "--preset", args.preset, "--batch", str(args.batch),
           "--seq", str(args.seq), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(threads), "--precision", precision, "--profile",
           "--gemm-repeats", str(args.gemm_repeats)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    step_seconds = {}
    for m in re.finditer(r"^#   (gemm \S.*?)\s+([0-9.]+)\s+([0-9.]+)\s+[0-9.]+%", out, re.M):
        step_seconds[m.group(1).strip()] = float(m.group(3)) / 1e3
    problems = []
    for m in re.finditer(r"^# gemm-problem role=\"([^\"]+)\" (.*)$", out, re.M):
        fields = dict(kv.split("=") for kv in m.group(2).split())
        problems.append((m.group(1), fields))
    if not problems or not step_seconds:
        sys.exit(f"could not read lattice bench train --profile's GEMM problems:\n{out}")
    return step_seconds, problems


def torch_gemm_seconds(torch, f, threads, repeats):
    """Best wall seconds of PyTorch's CPU GEMM on one problem posed as Lattice posed it."""
    torch.set_num_threads(threads)
    m, k, n = int(f["m"]), int(f["k"]), int(f["n"])
    dtype = torch.bfloat16 if f["input"] == "bf16" else torch.float32
    a = torch.rand(k, m, dtype=dtype).t() if f["transpose_a"] == "1" else torch.rand(m, k, dtype=dtype)
    b = torch.rand(n, k, dtype=dtype).t() if f["transpose_b"] == "1" else torch.rand(k, n, dtype=dtype)
    # PyTorch's CPU mm returns its input dtype: a bf16 -> f32 problem is timed with a bf16 result
    # (half the bytes written), which if anything favours PyTorch.
    out = torch.rand(m, n, dtype=dtype)
    bias = torch.rand(n, dtype=dtype)

    def call():
        if f["accumulate"] == "1":
            out.addmm_(a, b)
        elif f["bias"] == "1":
            torch.addmm(bias, a, b, out=out)
        else:
            torch.mm(a, b, out=out)

    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def compare_gemms(args, torch):
    threads = [int(t) for t in args.threads.split(",")]
    print(f"# compare_pytorch --gemms: {args.preset} B={args.batch} T={args.seq}, best of "
          f"{args.gemm_repeats} calls per problem, PyTorch {torch.__version__} "
          f"({torch.backends.mkldnn.is_available() and 'oneDNN' or 'no oneDNN'}, "
          f"MKL {torch.backends.mkl.is_available()}), load {os.getloadavg()[0]:.2f}")
    for t in threads:
        for p in args.precision.split(","):
            step, problems = lattice_gemm_profile(args, t, p)
            roles = {}
            for role, f in problems:
                flops = 2.0 * int(f["m"]) * int(f["k"]) * int(f["n"])
                calls = float(f["calls_per_step"])
                r = roles.setdefault(role, {"flops": 0.0, "lattice": 0.0, "torch": 0.0})
                r["flops"] += calls * flops
                r["lattice"] += calls * flops / (float(f["alone_gflops"]) * 1e9)
                r["torch"] += calls * torch_gemm_seconds(torch, f, t, args.gemm_repeats)
            print(f"# {p}, {t} thread(s): GFLOP/s of each role in Lattice's step, alone in "
                  "Lattice's faster library (oneDNN, or oneMKL where setup unpacked it) and alone "
                  "in PyTorch; 'of best' = the step's rate over the fastest library's")
            print(f"#   {'role':<24} {'step':>8} {'lattice':>8} {'pytorch':>8} {'of best':>8}")
            total_step = total_best = 0.0
            for role in sorted(roles, key=lambda x: -step.get(x, 0)):
                r = roles[role]
                if role not in step:
                    continue
                best = min(r["lattice"], r["torch"])
                total_step += step[role]
                total_best += best
                print(f"    {role:<24} {r['flops'] / step[role] / 1e9:>8.1f} "
                      f"{r['flops'] / r['lattice'] / 1e9:>8.1f} {r['flops'] / r['torch'] / 1e9:>8.1f} "
                      f"{100 * best / step[role]:>7.0f}%")
            print(f"#   all GEMM roles: the step's GEMMs at {100 * total_best / total_step:.0f}% of "
                  "the faster library's rate on the same problems")


def main():
    args = parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("PyTorch is not installed (pip install torch): nothing to compare against")
    if args.gemms:
        return compare_gemms(args, torch)
    threads = [int(t) for t in args.threads.split(",")]
    precisions = args.precision.split(",")
    print(f"# compare_pytorch: {args.preset} B={args.batch} T={args.seq}, {args.warmup} warm-up + "
          f"{args.steps} timed steps, {args.rounds} alternating rounds, PyTorch {torch.__version__}, "
          f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    results = {}
    for t in threads:
        for p in precisions:
            lattice, torch_rate, apart = [], {"fp32": [], "bf16": []}, []
            for _ in range(args.rounds):
                rate, n, ns = lattice_step(args, t, p)
                lattice.append(rate)
                apart += ns
                for q in ("fp32", "bf16"):
                    rate_q, n_torch = torch_step(args, t, q)
                    torch_rate[q].append(rate_q)
                if n_torch != n:
                    sys.exit(f"the PyTorch model has {n_torch} parameters, Lattice's {n}: "
                             "not the same model")
            results[(p, t)] = (statistics.median(lattice),
                               {q: statistics.median(v) for q, v in torch_rate.items()}, apart)
    print(f"# {'precision':>9} {'threads':>7} {'lattice tok/s':>14} {'pytorch same':>13} "
          f"{'ratio':>7} {'pytorch best':>13} {'ratio':>7}  CPUs apart (ns)")
    for (p, t), (lat, tor, apart) in results.items():
        best = max(tor.values())
        spread = f"{min(apart):.0f}-{max(apart):.0f}" if apart else "-"
        print(f"  {p:>9} {t:>7} {lat:>14.1f} {tor[p]:>13.1f} {lat / tor[p]:>6.2f}x "
              f"{best:>13.1f} {lat / best:>6.2f}x  {spread}")
    print(f"# load at the end {os.getloadavg()[0]:.2f}; 'pytorch best' is its faster of fp32 and "
          "bf16 autocast at those threads; CPUs apart: the cache-line round trip between the first "
          "two CPUs that Lattice's runs of the row measured at their start and end (about 55 ns "
          "on one die, 300 ns and more when the host placed them apart: docs/performance.md)")


if __name__ == "__main__":
    main()
