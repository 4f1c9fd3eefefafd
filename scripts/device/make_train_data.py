#!/usr/bin/env python3
"""Training data and job specs for the device checks (gpu_train_check.sh),
generated on the spot so nothing large travels with the repository.

  make_train_data.py text --out corpus.txt --bytes 400000 [--seed 1]
      a deterministic synthetic English-like corpus (byte tokens, vocab 256)
  make_train_data.py bin --out tokens.bin --tokens 4000000 --vocab 32000 [--seed 1]
      an llm.c token file (header of 256 int32: magic 20240520, version 1,
      count; then uint16 tokens) of phrases repeated under a Zipf law, so a
      model can learn something and the loss falls
  make_train_data.py job --template jobs/X.yaml --out job.yaml --data PATH [--steps N]
      the template with data.train_path set to PATH (and train.steps to N)

Python 3 standard library only (numpy is used for `bin` when present).
"""
import argparse
import random
import re
import struct
import sys

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their has would when if "
         "so no will more out up into do any your what time some could them other than then now "
         "model train token layer loss rank step data batch learning rate gradient weight memory "
         "device stream kernel matrix vector tensor parallel pipeline shard expert attention").split()


def make_text(n_bytes, seed):
    rng = random.Random(seed)
    # A fixed set of sentences, each reused many times: structure to learn.
    sentences = []
    for _ in range(400):
        n = rng.randint(5, 14)
        words = [WORDS[min(int(rng.paretovariate(1.2)) - 1, len(WORDS) - 1)] if rng.random() < 0.5
                 else rng.choice(WORDS) for _ in range(n)]
        sentences.append(" ".join(words).capitalize() + ".")
    out, size = [], 0
    while size < n_bytes:
        s = sentences[min(int(rng.paretovariate(0.8)) - 1, len(sentences) - 1)]
        s += "\n" if rng.random() < 0.1 else " "
        out.append(s)
        size += len(s)
    return "".join(out)[:n_bytes].encode("ascii")


def make_tokens(n_tokens, vocab, seed):
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        rng = np.random.default_rng(seed)
        n_phrases = 4096
        lengths = rng.integers(8, 64, size=n_phrases)
        phrases = [np.minimum(rng.zipf(1.3, size=int(l)) - 1, vocab - 1).astype(np.uint16)
                   for l in lengths]
        picks = np.minimum(rng.zipf(1.1, size=n_tokens // 8) - 1, n_phrases - 1)
        chunks, total = [], 0
        for p in picks:
            chunks.append(phrases[p])
            total += len(phrases[p])
            if total >= n_tokens:
                break
        tokens = np.concatenate(chunks)[:n_tokens]
        if len(tokens) < n_tokens:  # not reached for sane sizes; pad with uniform tokens
            tokens = np.concatenate([tokens, rng.integers(0, vocab, n_tokens - len(tokens),
                                                          dtype=np.uint16)])
        return tokens.astype("<u2").tobytes()
    rng = random.Random(seed)
    phrases = [[min(int(rng.paretovariate(0.3)) - 1, vocab - 1) for _ in range(rng.randint(8, 63))]
               for _ in range(4096)]
    out = []
    while len(out) < n_tokens:
        out.extend(phrases[min(int(rng.paretovariate(0.1)) - 1, 4095)])
    return struct.pack("<%dH" % n_tokens, *out[:n_tokens])


def write_bin(path, n_tokens, vocab, seed):
    if vocab > 65536:
        sys.exit("make_train_data.py: --vocab must be at most 65536 (uint16 tokens)")
    header = struct.pack("<256i", 20240520, 1, n_tokens, *([0] * 253))
    with open(path, "wb") as f:
        f.write(header)
        f.write(make_tokens(n_tokens, vocab, seed))


def write_job(template, out, data, steps):
    text = open(template).read()
    text, n = re.subn(r"train_path:\s*[^,}\s]+", "train_path: " + data, text)
    if n != 1:
        sys.exit(f"make_train_data.py: {template} must have exactly one data.train_path")
    if steps is not None:
        text, n = re.subn(r"\bsteps:\s*\d+", f"steps: {steps}", text)
        if n != 1:
            sys.exit(f"make_train_data.py: {template} must have exactly one train.steps")
    with open(out, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("text")
    t.add_argument("--out", required=True)
    t.add_argument("--bytes", type=int, default=400000)
    t.add_argument("--seed", type=int, default=1)
    b = sub.add_parser("bin")
    b.add_argument("--out", required=True)
    b.add_argument("--tokens", type=int, default=4_000_000)
    b.add_argument("--vocab", type=int, default=32000)
    b.add_argument("--seed", type=int, default=1)
    j = sub.add_parser("job")
    j.add_argument("--template", required=True)
    j.add_argument("--out", required=True)
    j.add_argument("--data", required=True)
    j.add_argument("--steps", type=int)
    a = ap.parse_args()
    if a.cmd == "text":
        with open(a.out, "wb") as f:
            f.write(make_text(a.bytes, a.seed))
    elif a.cmd == "bin":
        write_bin(a.out, a.tokens, a.vocab, a.seed)
    else:
        write_job(a.template, a.out, a.data, a.steps)


if __name__ == "__main__":
    main()
