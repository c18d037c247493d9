#!/usr/bin/env python3
"""Lattice's Hugging Face exports next to transformers itself: the same loss, the same greedy text.

    python3 bench/compare_transformers.py --families gpt2,llama,mixtral --steps 200

For each family (gpt2: configs/gpt2-tiny.toml, llama: configs/llama-tiny.toml, mixtral:
configs/mixtral-tiny.toml) it trains `--steps` steps with `lattice train`, exports the final
checkpoint with `lattice export` and loads the directory with transformers'
`AutoModelForCausalLM` in fp32 (every tensor must load: no missing, unexpected or mismatched
keys). Then, on the same tokens:

  loss    Lattice's validation loss after the last step (`val_loss` of the last `--metrics` line:
          the final checkpoint's weights on the first `--eval-batches` x batch.micro_batch windows
          of val.bin, llm.c's layout) against transformers' mean cross-entropy on those windows.
          No Lattice command reports logits for given tokens, so the loss is the number compared.
  greedy  `lattice sample --temperature 0` against `generate(do_sample=False)` from the same prompt
          (byte tokenizer: token id = byte value), the same number of new tokens, within the
          context (prompt + new tokens <= model.seq_len, where Lattice does not slide its window).

A family passes when the losses agree to `--rtol` and the generated tokens are identical. Needs
PyTorch and transformers (`pip install torch transformers`); no test runs it. Run from anywhere:
paths are taken from the repository root; the data must be prepared (README.md: lattice data
prepare). Everything written goes to a temporary directory, removed at the end.
"""

import argparse
import array
import json
import os
import subprocess
import sys
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "gpt2": "configs/gpt2-tiny.toml",
    "llama": "configs/llama-tiny.toml",
    "mixtral": "configs/mixtral-tiny.toml",
}
TOKEN_FILE_MAGIC, TOKEN_FILE_VERSION, TOKEN_FILE_HEADER_INTS = 20240520, 1, 256


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lattice", default="build/lattice", help="the lattice executable")
    p.add_argument("--families", default="gpt2,llama,mixtral", help=f"of {','.join(CONFIGS)}")
    p.add_argument("--steps", type=int, default=200, help="training steps before the export")
    p.add_argument("--eval-batches", type=int, default=4,
                   help="validation batches (of batch.micro_batch windows) in the loss")
    p.add_argument("--prompt", default="ROMEO:", help="prompt of the greedy generation")
    p.add_argument("--tokens", type=int, default=0,
                   help="new tokens to generate (default: fill the context)")
    p.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance of the loss")
    args = p.parse_args()
    args.families = args.families.split(",")
    unknown = [f for f in args.families if f not in CONFIGS]
    if unknown:
        p.error(f"unknown families {unknown}: choose from {', '.join(CONFIGS)}")
    return args


def run(cmd):
    """stdout (bytes) of a command run in the repository root; its output shown if it fails."""
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n"
                 f"{done.stdout.decode(errors='replace')}{done.stderr.decode(errors='replace')}")
    return done.stdout


def read_token_file(path):
    """The uint16 tokens of an llm.c token file (src/data/token_file.h)."""
    with open(path, "rb") as f:
        header = array.array("i")
        header.fromfile(f, TOKEN_FILE_HEADER_INTS)
        tokens = array.array("H")
        tokens.frombytes(f.read())
    if sys.byteorder != "little":
        header.byteswap()
        tokens.byteswap()
    if header[0] != TOKEN_FILE_MAGIC or header[1] != TOKEN_FILE_VERSION or header[2] != len(tokens):
        sys.exit(f"{path} is not a version-{TOKEN_FILE_VERSION} token file of {header[2]} tokens")
    return tokens


def validation_windows(config, eval_batches):
    """The windows Lattice's evaluation reads: sequential, window s = tokens [s·T, s·T + T + 1)."""
    data_dir = os.path.join(ROOT, config["data"]["dir"])
    path = os.path.join(data_dir, "val.bin")
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: prepare the data first, e.g. build/lattice data prepare "
                 f"--input ../shared/data/tinyshakespeare.txt --out {config['data']['dir']}")
    tokens = read_token_file(path)
    T, B = config["batch"]["seq_len"], config["batch"]["micro_batch"]
    rows = eval_batches * B
    if rows > (len(tokens) - 1) // T:
        sys.exit(f"{path} holds fewer than {rows} windows of {T + 1} tokens")
    return [list(tokens[s * T:s * T + T + 1]) for s in range(rows)]


def lattice_train_and_export(args, family, work):
    """(final validation loss, checkpoint directory, Hugging Face directory)."""
    out, metrics = os.path.join(work, family), os.path.join(work, f"{family}.jsonl")
    run([args.lattice, "train", CONFIGS[family], "--set", f"train.steps={args.steps}",
         "--set", f"output.dir={out}", "--set", f"eval.batches={args.eval_batches}",
         "--set", "eval.interval=0", "--metrics", metrics])  # interval 0: only after the last step
    with open(metrics) as f:
        last = json.loads(f.read().splitlines()[-1])
    if last.get("step") != args.steps or "val_loss" not in last:
        sys.exit(f"{metrics}: no validation loss at step {args.steps}")
    ckpt, hf = os.path.join(out, "final"), os.path.join(work, f"{family}-hf")
    run([args.lattice, "export", "--ckpt", ckpt, "--out", hf])
    return last["val_loss"], ckpt, hf


def lattice_greedy(args, ckpt, prompt, tokens):
    """The token ids `lattice sample` generates after the prompt (it prints prompt + text + \\n)."""
    out = run([args.lattice, "sample", "--ckpt", ckpt, "--prompt", prompt, "--tokens", str(tokens),
               "--temperature", "0"])
    encoded = prompt.encode()
    if not out.startswith(encoded) or len(out) != len(encoded) + tokens + 1:
        sys.exit(f"unexpected output of lattice sample: {out!r}")
    return list(out[len(encoded):-1])


def load_hf(torch, transformers, hf):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        hf, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"{hf} did not load cleanly into {type(model).__name__}: {bad}")
    if any(p.dtype != torch.float32 for p in model.parameters()):
        sys.exit(f"{hf} did not load in fp32")
    return model.eval()


def hf_loss(torch, model, windows):
    batch = torch.tensor(windows, dtype=torch.long)
    with torch.no_grad():
        logits = model(batch[:, :-1]).logits
    return torch.nn.functional.cross_entropy(
        logits.double().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)).item()


def hf_greedy(torch, model, prompt_ids, tokens):
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=False, num_beams=1,
                             pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def compare(args, torch, transformers, family, work):
    with open(os.path.join(ROOT, CONFIGS[family]), "rb") as f:
        config = tomllib.load(f)
    if config["data"].get("tokenizer", "byte") != "byte":
        sys.exit(f"{CONFIGS[family]}: the greedy check assumes the byte tokenizer")
    seq_len = config["batch"]["seq_len"]
    prompt_ids = list(args.prompt.encode())
    tokens = args.tokens or seq_len - len(prompt_ids)
    if not prompt_ids or tokens < 1 or len(prompt_ids) + tokens > seq_len:
        sys.exit(f"prompt ({len(prompt_ids)} bytes) + {tokens} new tokens must fit in the "
                 f"context of {seq_len}: beyond it Lattice slides its window, transformers not")
    windows = validation_windows(config, args.eval_batches)

    lattice_loss, ckpt, hf = lattice_train_and_export(args, family, work)
    lattice_ids = lattice_greedy(args, ckpt, args.prompt, tokens)
    model = load_hf(torch, transformers, hf)
    loss = hf_loss(torch, model, windows)
    hf_ids = hf_greedy(torch, model, prompt_ids, tokens)
    first_diff = next((i for i, (a, b) in enumerate(zip(lattice_ids, hf_ids)) if a != b), None)
    return {
        "family": family,
        "class": type(model).__name__,
        "lattice": lattice_loss,
        "transformers": loss,
        "diff": abs(loss - lattice_loss),
        "rel": abs(loss - lattice_loss) / abs(lattice_loss),
        "tokens": tokens,
        "first_diff": first_diff,
        "text": bytes(lattice_ids).decode(errors="replace"),
        "hf_text": bytes(hf_ids).decode(errors="replace"),
    }


def main():
    args = parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"{e.name} is not installed (pip install torch transformers): nothing to compare "
                 "against")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if not os.path.isabs(args.lattice):
        args.lattice = os.path.join(ROOT, args.lattice)
    print(f"# compare_transformers: {args.steps} training steps, loss on {args.eval_batches} "
          f"validation batch(es), greedy from {args.prompt!r}; PyTorch {torch.__version__}, "
          f"transformers {transformers.__version__}, fp32")
    with tempfile.TemporaryDirectory(prefix="lattice_compare_transformers_") as work:
        results = [compare(args, torch, transformers, f, work) for f in args.families]
    print(f"# {'family':<8} {'transformers class':<20} {'lattice loss':>14} {'hf loss':>14} "
          f"{'|diff|':>9} {'rel':>9}  greedy tokens identical")
    failed = False
    for r in results:
        same = r["first_diff"] is None
        ok = same and r["rel"] <= args.rtol
        failed |= not ok
        greedy = f"yes ({r['tokens']})" if same else f"NO (first at {r['first_diff']})"
        print(f"  {r['family']:<8} {r['class']:<20} {r['lattice']:>14.9f} "
              f"{r['transformers']:>14.9f} {r['diff']:>9.2e} {r['rel']:>9.2e}  {greedy}")
    for r in results:
        print(f"# {r['family']} greedy: {r['text']!r}")
        if r["first_diff"] is not None:
            print(f"# {r['family']} transformers: {r['hf_text']!r}")
    print("# all families match" if not failed else
          f"# MISMATCH: a loss beyond rtol {args.rtol:g} or a different greedy token")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
