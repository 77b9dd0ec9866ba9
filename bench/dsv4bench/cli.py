"""Command line: `dsv4 bench MODE [options]` == `python3 -m dsv4bench MODE [options]`."""
import argparse
import sys
import time

from dsv4bench import common, report
from dsv4bench.client import BenchError

MODES = ["decode", "concurrency", "prefill", "spec", "soak"]

EPILOG = """\
modes:
  decode       single-stream tok/s per content type (count, table, JSON, code,
               SQL, prose), T=0, stream:false, best of --repeats, tokens from usage
  concurrency  c streams at once (--levels), static and staggered arrivals:
               aggregate and per-stream tok/s, TTFT and inter-token percentiles
  prefill      TTFT and prefill tok/s at --sizes prompt tokens (capped at the
               server's max_model_len), 1 output token
  spec         /metrics deltas per content type: acceptance, tok/step,
               per-position acceptance, steps/s (needs vllm:spec_decode_* counters)
  soak         mixed agent traffic by --workers for --duration-s; throughput per
               window; every response classified (errors, empty, loops, CJK
               drift, markup leakage, bad JSON/tool args): clean = zero of each

Each mode writes <mode>.csv and <mode>.png (plus detail CSVs and meta.json)
under --out (default bench/out/<mode>-<time>) and prints a table. The tool talks
only to --base-url. Exit status: 0 all requests healthy, 1 some failed or were
unhealthy, 2 usage error or server unreachable.

examples:
  dsv4 bench decode --repeats 3
  dsv4 bench concurrency --levels 1 2 4 8 --max-tokens 256
  dsv4 bench prefill --sizes 8192 32768 100000
  dsv4 bench spec
  dsv4 bench soak --workers 4 --duration-s 600
  dsv4 bench decode --base-url http://127.0.0.1:8000 --api-key sk-x   # a vLLM server
"""


def parser():
    p = argparse.ArgumentParser(prog="dsv4 bench", description="Measure an OpenAI-compatible server "
                                "(dsv4, vLLM, SGLang, llama.cpp) with the same committed prompts.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", metavar="MODE")

    def common_opts(s):
        s.add_argument("--base-url", default="http://127.0.0.1:8888",
                       help="server base URL (default %(default)s; a trailing /v1 is accepted)")
        s.add_argument("--api-key", default=None, help="sent as a Bearer token")
        s.add_argument("--model", default=None, help="model name (default: first id of /v1/models)")
        s.add_argument("--out", default=None, help="output folder (default bench/out/<mode>-<time>)")
        s.add_argument("--prompts-dir", default=None, help="prompt set folder (default bench/prompts)")
        s.add_argument("--warmup", type=int, default=3,
                       help="warm-up requests before measuring, timed to detect a cold server (default 3; 0 = none)")
        s.add_argument("--warmup-max-tokens", type=int, default=None,
                       help="tokens per warm-up request (default: warmup.json's, 64)")
        s.add_argument("--thinking", choices=["off", "on", "default"], default="off",
                       help="send chat_template_kwargs.thinking false/true, or nothing (default off)")
        s.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: true (vLLM extension)")
        s.add_argument("--timeout", type=float, default=600.0, help="per-request socket timeout, s")
        s.add_argument("--max-model-len", type=int, default=None,
                       help="context length to assume (default: /v1/models max_model_len or context_length)")
        s.add_argument("--verbose", action="store_true")

    s = sub.add_parser("decode", help="single-stream decode tok/s per content type")
    common_opts(s)
    s.add_argument("--repeats", type=int, default=3, help="runs per prompt; best and median reported")
    s.add_argument("--max-tokens", type=int, default=None,
                   help="cap every prompt's budget (default: each prompt's own max_tokens)")
    s.add_argument("--only", nargs="*", help="prompt ids to run (default all)")

    s = sub.add_parser("concurrency", help="aggregate/per-stream tok/s, TTFT, ITL at several concurrencies")
    common_opts(s)
    s.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 6, 8, 16])
    s.add_argument("--pattern", choices=["static", "staggered", "both"], default="both")
    s.add_argument("--stagger-s", type=float, default=0.5, help="gap between staggered arrivals")
    s.add_argument("--rounds", type=int, default=1, help="rounds per level")
    s.add_argument("--max-tokens", type=int, default=512)
    s.add_argument("--temperature", type=float, default=0.0)

    s = sub.add_parser("prefill", help="TTFT and prefill tok/s at several prompt sizes")
    common_opts(s)
    s.add_argument("--sizes", type=int, nargs="+", default=[8192, 32768, 100000],
                   help="target prompt tokens (capped at max_model_len)")
    s.add_argument("--repeats", type=int, default=1)

    s = sub.add_parser("spec", help="speculative-decoding acceptance by content type from /metrics")
    common_opts(s)
    s.add_argument("--repeats", type=int, default=2)
    s.add_argument("--max-tokens", type=int, default=None,
                   help="cap every prompt's budget (default: each prompt's own max_tokens)")
    s.add_argument("--only", nargs="*", help="prompt ids to run (default all)")

    s = sub.add_parser("soak", help="mixed agent traffic, throughput windows, output-health classes")
    common_opts(s)
    s.add_argument("--workers", type=int, default=4)
    s.add_argument("--duration-s", type=float, default=300.0, help="no new request after this")
    s.add_argument("--max-requests", type=int, default=1000)
    s.add_argument("--window-s", type=float, default=30.0)
    s.add_argument("--grace-s", type=float, default=120.0,
                   help="after --duration-s, wait at most this long for requests in flight")
    s.add_argument("--stream-fraction", type=float, default=0.5)
    s.add_argument("--long-context-tokens", type=int, default=8000,
                   help="approximate size of the long-context summarisation document")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-tokens", type=int, default=None,
                   help="cap every entry's budget (default: the entries' own budgets)")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if not args.mode:
        p.print_help()
        return 2
    mod = __import__(f"dsv4bench.mode_{args.mode}", fromlist=["run"])
    t0 = time.time()
    try:
        ctx = common.Ctx(args)
    except (BenchError, ValueError) as e:
        print(f"dsv4 bench: cannot use {args.base_url}: {e}", file=sys.stderr)
        return 2
    print(f"dsv4 bench {args.mode}: {ctx.client.base_url}, model {ctx.model}, "
          f"max_model_len {ctx.max_model_len or 'unknown'}, output {ctx.out}")
    try:
        rc = mod.run(ctx)
    except BenchError as e:
        print(f"dsv4 bench {args.mode}: {e}", file=sys.stderr)
        ctx.meta["error"] = str(e)
        rc = 2
    ctx.meta["elapsed_s"] = time.time() - t0
    ctx.meta["exit_status"] = rc
    report.write_json(ctx.path("meta.json"), ctx.meta)
    print(f"\nwrote {ctx.out}")
    return rc
