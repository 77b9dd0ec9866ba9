"""p21: wait for ready, then prompts of ~2K and ~6K tokens, four of each size with distinct first words (no
prefix-cache hits), alternating sizes; print each request's time (non-streamed, 16 tokens)."""
import json, sys, time, urllib.request
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
words = ["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel"]
for i in range(4):
    for n in (250, 750):
        p = f"{words[i + (4 if n == 750 else 0)]} {i}: " + " ".join(f"item {k} is a GPU fact." for k in range(n))
        body = {"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
        r = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        t = time.time()
        with urllib.request.urlopen(r, timeout=120) as f: j = json.loads(f.read())
        print(f"prompt {i} of {j['usage']['prompt_tokens']} tokens ({j['usage'].get('prompt_tokens_details', {}).get('cached_tokens')} cached): {(time.time() - t)*1000:.1f} ms")
