"""p20: wait for ready, then a long prompt (~1500 tokens, 6 pages) and a short one, twice each; print times and texts."""
import hashlib, json, sys, time, urllib.request
port, t0 = sys.argv[1], float(sys.argv[2])
base = f"http://127.0.0.1:{port}"
while True:
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            if r.status == 200: break
    except Exception: pass
    if time.time() - t0 > 170: print("not ready"); sys.exit(1)
    time.sleep(0.2)
print(f"start to ready: {time.time() - t0:.1f} s")
def req(prompt, n):
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    r = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t = time.time()
    with urllib.request.urlopen(r, timeout=120) as f: j = json.loads(f.read())
    return time.time() - t, j["choices"][0]["text"], j["usage"]["prompt_tokens"]
long = "Summarise the history of computing. " + " ".join(f"item {i} is a GPU fact." for i in range(250))
for rep in range(2):
    for name, p in (("long", long), ("short", "The quick brown fox")):
        dt, text, pt = req(p, 32)
        print(f"{name} #{rep}: {pt} prompt tokens, {dt*1000:.1f} ms, text sha {hashlib.sha1(text.encode()).hexdigest()[:12]} {text[:40]!r}")
