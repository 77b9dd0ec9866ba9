#!/usr/bin/env python3
"""Tokenizer throughput: ours (build/dsv4) vs Hugging Face `tokenizers`, same text.

Workloads (all generated or found locally, nothing downloaded):
  code     Python standard-library sources, one document per file
  hostile  the seeded random corpus of tools/gen_tokenizer_goldens.py
           (many scripts, emoji, whitespace runs, special-token text)
  cjk      Chinese/Japanese prose-like text from the goldens' language samples,
           shuffled into long documents

Ours: `dsv4 tokenize --batch-hex --stats`, timing only the encode calls
(one thread). tokenizers: Tokenizer.encode per document (one thread; the
Python call overhead is included but negligible for these document sizes),
and encode_batch (Rayon, all cores) for reference. Ids are compared, so the
numbers are for identical output.

Usage: python3 bench/tokenizer_bench.py [--mb 4] [--out bench/results/tokenizer.md]
"""
import argparse
import glob
import os
import platform
import random
import re
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_tokenizer_goldens as G  # noqa: E402

DSV4 = os.path.join(ROOT, "build", "dsv4")


def workload_code(limit):
    docs, total = [], 0
    for p in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))):
        with open(p, encoding="utf-8", errors="replace") as f:
            t = f.read()
        docs.append(t)
        total += len(t.encode())
        if total >= limit:
            break
    return docs


def workload_hostile(limit):
    added = G.added_token_contents()
    rng = random.Random(1)
    docs, total = [], 0
    while total < limit:
        t = "".join(G.random_text(rng, added, 60) for _ in range(20))
        docs.append(t)
        total += len(t.encode())
    return docs


def workload_cjk(limit):
    src = [G.LANG[k] for k in ("chinese_simplified", "chinese_traditional", "japanese", "korean")]
    rng = random.Random(2)
    docs, total = [], 0
    while total < limit:
        t = "".join(rng.choice(src)[rng.randint(0, 5):] for _ in range(400))
        docs.append(t)
        total += len(t.encode())
    return docs


def run_ours(docs):
    stdin = "".join(d.encode().hex() + "\n" for d in docs).encode()
    p = subprocess.run([DSV4, "tokenize", "--tokenizer", G.tokenizer_json_path(), "--batch-hex", "--stats"],
                       input=stdin, capture_output=True, check=True)
    m = re.search(r"in ([0-9.]+) s", p.stderr.decode())
    ids = [[int(x) for x in line.split("\t")[0].split(",")] if line.split("\t")[0] else []
           for line in p.stdout.decode().split("\n")[:-1]]
    return float(m.group(1)), ids


def run_hf(tok, docs):
    t0 = time.perf_counter()
    ids = [tok.encode(d).ids for d in docs]
    return time.perf_counter() - t0, ids


def run_hf_batch(tok, docs):
    t0 = time.perf_counter()
    tok.encode_batch(docs)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=4.0, help="MB of text per workload")
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs")
    ap.add_argument("--out", default=None, help="also write a markdown report here")
    args = ap.parse_args()
    import tokenizers
    full, _ = G.load_reference()
    limit = int(args.mb * 1e6)
    rows = []
    for name, fn in (("code", workload_code), ("hostile", workload_hostile), ("cjk", workload_cjk)):
        docs = fn(limit)
        nbytes = sum(len(d.encode()) for d in docs)
        ours_t, hf_t, hfb_t = 1e9, 1e9, 1e9
        for _ in range(args.repeat):
            t, ours_ids = run_ours(docs)
            ours_t = min(ours_t, t)
            t, hf_ids = run_hf(full, docs)
            hf_t = min(hf_t, t)
            hfb_t = min(hfb_t, run_hf_batch(full, docs))
        ntok = sum(len(x) for x in hf_ids)
        same = ours_ids == hf_ids
        rows.append((name, len(docs), nbytes, ntok, same, ntok / ours_t, ntok / hf_t, ntok / hfb_t))
        print("%-8s %5d docs %6.2f MB %8d tokens  ids identical: %s  ours %.2fM tok/s  tokenizers %.2fM tok/s "
              "(batch, all cores: %.2fM)" % (name, len(docs), nbytes / 1e6, ntok, same, ntok / ours_t / 1e6,
                                           ntok / hf_t / 1e6, ntok / hfb_t / 1e6), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# Tokenizer throughput: dsv4 vs Hugging Face tokenizers\n\n")
            f.write("Command: `python3 bench/tokenizer_bench.py --mb %g --repeat %d --out %s`\n\n"
                    % (args.mb, args.repeat, os.path.relpath(args.out, ROOT)))
            f.write("Machine: %s, %d CPUs visible, load average %.1f at the end (shared with other jobs: "
                    "absolute numbers are noisy, the ratio less so); tokenizers %s; best of %d runs.\n"
                    "Ours: encode calls only, one thread (`dsv4 tokenize --batch-hex --stats`). "
                    "tokenizers: `Tokenizer.encode` per document (one thread), and `encode_batch` "
                    "(Rayon, all cores) for reference.\n\n"
                    % (platform.processor() or platform.machine(), os.cpu_count(), os.getloadavg()[0],
                       tokenizers.__version__,
                       args.repeat))
            f.write("| workload | docs | MB | tokens | ids identical | ours (Mtok/s, 1 thread) | "
                    "tokenizers encode (Mtok/s, 1 thread) | ratio | tokenizers encode_batch (Mtok/s, all cores) |\n")
            f.write("|---|---|---|---|---|---|---|---|---|\n")
            for name, nd, nb, nt, same, o, h, hb in rows:
                f.write("| %s | %d | %.2f | %d | %s | %.2f | %.2f | %.1fx | %.2f |\n"
                        % (name, nd, nb / 1e6, nt, "yes" if same else "NO", o / 1e6, h / 1e6, o / h, hb / 1e6))


if __name__ == "__main__":
    main()
