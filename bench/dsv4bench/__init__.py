"""dsv4bench: measure any OpenAI-compatible server with the same committed prompts.

Modes: decode, concurrency, prefill, spec, soak (`python3 -m dsv4bench --help`,
or `dsv4 bench --help`). Each writes a CSV and a PNG plot and prints a table.
Specs: spec/DSPARK.md §5.7 (metrics, measuring pitfalls), spec/SERVING.md
§3.4-3.5 (responses), §3.9 (/metrics names), §4.4 (runaways).
"""
__version__ = "0.1"
