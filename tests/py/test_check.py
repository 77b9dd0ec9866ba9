"""`dsv4 check` on the tiny real-layout checkpoints and on corrupted copies of them.

The checkpoints come from tools/gen_checkpoints.py (models/ when scripts/setup.sh has run,
else generated into a temp dir). Each corrupted variant is built in a temp dir: unchanged
files are hard links, an edited file is rewritten as a new file (never edited in place), so
the originals are never touched and nothing big is committed.

Every rejection must exit 1 with one message naming the file and/or tensor at fault
(issue 2 "Done when"; spec/DSPARK.md §3.3 for the twelve draft shared-expert tensors).
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DSV4 = os.environ.get("DSV4_BIN", os.path.join(ROOT, "build", "dsv4"))
MODELS = ["tiny-flash", "tiny-dspark", "tiny-flash-bf16", "tiny-dspark-bf16"]
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """name -> directory of a pristine generated checkpoint."""
    if not os.path.exists(DSV4):
        pytest.skip(f"{DSV4} not built")
    have = {m: os.path.join(ROOT, "models", m) for m in MODELS}
    if all(os.path.exists(os.path.join(d, "manifest.json")) for d in have.values()):
        return have
    out = tmp_path_factory.mktemp("models")
    cmd = [sys.executable, os.path.join(ROOT, "tools", "gen_checkpoints.py"), "--out", str(out)]
    for m in MODELS:
        cmd += ["--only", m]
    subprocess.run(cmd, check=True, capture_output=True)
    return {m: str(out / m) for m in MODELS}


def check(path):
    p = subprocess.run([DSV4, "check", str(path)], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def clone(src, dst):
    """Copy a checkpoint dir as hard links (edits must replace files, see rewrite helpers)."""
    shutil.copytree(src, dst, copy_function=os.link)
    return dst


# ---- safetensors editing -------------------------------------------------------------------
def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", None)
    data = raw[8 + n:]
    items = sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0])
    tensors = [[k, v["dtype"], list(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]]]
               for k, v in items]
    return meta, tensors


def write_st(path, meta, tensors):
    hdr = {"__metadata__": meta} if meta is not None else {}
    off = 0
    for name, dt, shape, b in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    hj = json.dumps(hdr).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    os.unlink(path) if os.path.exists(path) else None  # break the hard link
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(t[3] for t in tensors))


def index_of(d):
    with open(os.path.join(d, INDEX)) as f:
        return json.load(f)


def write_index(d, idx):
    p = os.path.join(d, INDEX)
    os.unlink(p)
    with open(p, "w") as f:
        json.dump(idx, f)


def shard_of(d, name):
    return index_of(d)["weight_map"][name]


def edit_tensor(d, name, fn):
    """fn(entry) mutates [name, dtype, shape, bytes] in place of tensor `name`."""
    shard = os.path.join(d, shard_of(d, name))
    meta, ts = read_st(shard)
    for t in ts:
        if t[0] == name:
            fn(t)
    write_st(shard, meta, ts)


def remove_tensor(d, name):
    fname = shard_of(d, name)
    meta, ts = read_st(os.path.join(d, fname))
    write_st(os.path.join(d, fname), meta, [t for t in ts if t[0] != name])
    idx = index_of(d)
    del idx["weight_map"][name]
    write_index(d, idx)
    return fname


def add_tensor(d, fname, name, dtype, shape, data):
    meta, ts = read_st(os.path.join(d, fname))
    ts.append([name, dtype, shape, data])
    write_st(os.path.join(d, fname), meta, ts)
    idx = index_of(d)
    idx["weight_map"][name] = fname
    write_index(d, idx)


def rejected(d, *needles):
    rc, out, err = check(d)
    assert rc == 1, f"expected rejection, got rc={rc}\n{out}\n{err}"
    assert "OK" not in out
    for n in needles:
        assert n in err, f"{n!r} not in error message: {err}"
    return err


# ---- acceptance ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_accepts_tiny_checkpoints(models, name):
    rc, out, err = check(models[name])
    assert rc == 0, err
    assert out.strip().endswith("OK")
    # MODEL.md §5.2: layers 0/1/2/3 have ratios 0/4/128/4; layers 0,1 hash-routed.
    assert "sliding (ratio 0) 1 [0], CSA (ratio 4) 2 [1,3], HCA (ratio 128) 1 [2]" in out
    assert "hash layers:    2 [0,1]" in out
    n_tensors = len(index_of(models[name])["weight_map"])
    assert f"tensors:        {n_tensors} in " in out
    if "dspark" in name:
        assert "DSpark" in out and "draft stages:   3 DSpark (mtp.0..2)" in out
    else:
        assert "original Flash (MTP)" in out and "1 MTP block" in out
    if name.endswith("bf16"):
        assert "BF16 (dequantised)" in out
    else:
        assert "FP4 (I8-packed E2M1" in out


def test_param_count_matches_logical_weights(models):
    """Parameters = logical elements of every non-scale tensor (FP4 I8 bytes count twice);
    the FP8/FP4 checkpoint and its BF16 dequantised copy must agree."""
    outs = {}
    for name in ("tiny-dspark", "tiny-dspark-bf16"):
        rc, out, _ = check(models[name])
        assert rc == 0
        outs[name] = [l for l in out.splitlines() if l.startswith("parameters:")][0]
    assert outs["tiny-dspark"] == outs["tiny-dspark-bf16"]
    total = 0
    d = models["tiny-dspark-bf16"]
    for fname in sorted(set(index_of(d)["weight_map"].values())):
        _, ts = read_st(os.path.join(d, fname))
        for _, _, shape, _ in ts:
            n = 1
            for s in shape:
                n *= s
            total += n
    assert outs["tiny-dspark"].split()[1] == str(total)


def test_default_model_profile(models):
    d = os.path.join(ROOT, "models", "default")
    if not os.path.exists(os.path.join(d, "manifest.json")):
        pytest.skip("models/default not generated (scripts/setup.sh)")
    rc, out, err = check(d)
    assert rc == 0, err
    assert "DSpark 0731" in out and "profile 0731" in out


# ---- rejections (issue 2 list) -------------------------------------------------------------
def test_missing_shard(models, tmp_path):
    d = clone(models["tiny-dspark"], tmp_path / "m")
    victim = "model-00003-of-00009.safetensors"
    os.unlink(d / victim)
    mapped = [k for k, v in index_of(d)["weight_map"].items() if v == victim]
    err = rejected(d, victim, "missing")
    assert any(f"'{k}'" in err for k in mapped), err  # names a tensor the index maps to it


def test_truncated_shard(models, tmp_path):
    d = clone(models["tiny-flash"], tmp_path / "m")
    victim = "model-00007-of-00007.safetensors"
    with open(d / victim, "rb") as f:
        raw = f.read()
    os.unlink(d / victim)
    with open(d / victim, "wb") as f:
        f.write(raw[:-100])
    rejected(d, victim, "truncated")


def test_unknown_tensor(models, tmp_path):
    d = clone(models["tiny-dspark"], tmp_path / "m")
    fname = shard_of(d, "mtp.2.norm.weight")
    # a name that contains known segments but is no slot: markov_w1 is not an FFN w1
    add_tensor(d, fname, "mtp.2.markov_head.w1.weight", "BF16", [4], b"\0" * 8)
    rejected(d, "unknown tensor 'mtp.2.markov_head.w1.weight'", fname)


def test_unknown_expert(models, tmp_path):
    d = clone(models["tiny-flash"], tmp_path / "m")
    fname = shard_of(d, "layers.1.ffn.experts.0.w1.weight")
    add_tensor(d, fname, "layers.1.ffn.experts.8.w1.weight", "I8", [128, 128], b"\0" * (128 * 128))
    rejected(d, "unknown tensor 'layers.1.ffn.experts.8.w1.weight'", fname)


def test_missing_tensor(models, tmp_path):
    d = clone(models["tiny-flash"], tmp_path / "m")
    remove_tensor(d, "layers.2.attn.compressor.wgate.weight")
    rejected(d, "missing tensor 'layers.2.attn.compressor.wgate.weight'")


def test_wrong_dtype(models, tmp_path):
    d = clone(models["tiny-flash"], tmp_path / "m")
    name = "layers.0.attn_norm.weight"

    def f(t):
        t[1] = "F16"  # same byte size as BF16

    edit_tensor(d, name, f)
    rejected(d, name, "dtype F16", shard_of(d, name))


def test_wrong_dtype_fp8_relabelled(models, tmp_path):
    d = clone(models["tiny-dspark"], tmp_path / "m")
    name = "mtp.1.attn.wq_a.weight"

    def f(t):
        t[1] = "I8"  # FP4 packing is only valid for routed experts

    edit_tensor(d, name, f)
    rejected(d, name, "dtype I8")


def test_wrong_shape(models, tmp_path):
    d = clone(models["tiny-dspark"], tmp_path / "m")
    name = "mtp.0.main_norm.weight"

    def f(t):
        t[2] = [128, 2]

    edit_tensor(d, name, f)
    rejected(d, name, "shape [128, 2], expected [256]")


def test_wrong_scale_shape(models, tmp_path):
    d = clone(models["tiny-flash"], tmp_path / "m")
    name = "layers.3.ffn.experts.5.w2.scale"

    def f(t):
        t[2] = [t[2][1], t[2][0]]

    edit_tensor(d, name, f)
    rejected(d, name, "expected [256, 4]")


def test_bad_index_entry_wrong_shard(models, tmp_path):
    d = clone(models["tiny-flash"], tmp_path / "m")
    idx = index_of(d)
    name = "layers.0.ffn_norm.weight"
    right = idx["weight_map"][name]
    wrong = "model-00001-of-00007.safetensors" if right != "model-00001-of-00007.safetensors" \
        else "model-00002-of-00007.safetensors"
    idx["weight_map"][name] = wrong
    write_index(d, idx)
    rejected(d, name, wrong)


def test_bad_index_entry_not_a_string(models, tmp_path):
    d = clone(models["tiny-flash"], tmp_path / "m")
    idx = index_of(d)
    idx["weight_map"]["head.weight"] = 7
    write_index(d, idx)
    rejected(d, "head.weight", INDEX)


def test_index_lists_absent_tensor(models, tmp_path):
    d = clone(models["tiny-flash"], tmp_path / "m")
    idx = index_of(d)
    idx["weight_map"]["layers.0.attn.ghost"] = "model-00002-of-00007.safetensors"
    write_index(d, idx)
    rejected(d, "layers.0.attn.ghost", "model-00002-of-00007.safetensors")


def test_shard_tensor_not_in_index(models, tmp_path):
    d = clone(models["tiny-flash"], tmp_path / "m")
    idx = index_of(d)
    fname = idx["weight_map"].pop("norm.weight")
    write_index(d, idx)
    rejected(d, "norm.weight", fname, "not listed")


def test_stray_shard(models, tmp_path):
    d = clone(models["tiny-flash"], tmp_path / "m")
    shutil.copy(d / "model-00002-of-00007.safetensors", d / "model-00002-of-00007 (1).safetensors")
    rejected(d, "model-00002-of-00007 (1).safetensors", "maps no tensor")


def test_corrupt_header(models, tmp_path):
    d = clone(models["tiny-dspark"], tmp_path / "m")
    victim = "model-00005-of-00009.safetensors"
    with open(d / victim, "rb") as f:
        raw = bytearray(f.read())
    raw[8:16] = b"#garbage"
    os.unlink(d / victim)
    with open(d / victim, "wb") as f:
        f.write(raw)
    rejected(d, victim, "corrupt header")


def test_incomplete_download(models, tmp_path):
    d = clone(models["tiny-dspark"], tmp_path / "m")
    (d / "model-00004-of-00009.safetensors.incomplete").write_bytes(b"partial")
    rejected(d, "model-00004-of-00009.safetensors.incomplete", "partial download")


def test_config_missing_key(models, tmp_path):
    d = clone(models["tiny-dspark"], tmp_path / "m")
    cfg = json.load(open(d / "config.json"))
    del cfg["dspark_noise_token_id"]
    os.unlink(d / "config.json")
    json.dump(cfg, open(d / "config.json", "w"))
    rejected(d, "config.json", "dspark_noise_token_id")


def test_config_wrong_type(models, tmp_path):
    d = clone(models["tiny-flash"], tmp_path / "m")
    cfg = json.load(open(d / "config.json"))
    cfg["num_hash_layers"] = "2"
    os.unlink(d / "config.json")
    json.dump(cfg, open(d / "config.json", "w"))
    rejected(d, "config.json", "num_hash_layers")


def test_stage_gap(models, tmp_path):
    d = clone(models["tiny-dspark"], tmp_path / "m")
    shards = set()
    for name in [k for k in index_of(d)["weight_map"] if k.startswith("mtp.1.")]:
        shards.add(remove_tensor(d, name))
    for s in shards - set(index_of(d)["weight_map"].values()):
        os.unlink(d / s)  # now empty and unreferenced
    rejected(d, "mtp.1", "contiguous")


def test_bf16_stray_scale(models, tmp_path):
    d = clone(models["tiny-flash-bf16"], tmp_path / "m")
    fname = shard_of(d, "layers.0.attn.wq_a.weight")
    add_tensor(d, fname, "layers.0.attn.wq_a.scale", "F8_E8M0", [1, 2], b"\x7f\x7f")
    rejected(d, "layers.0.attn.wq_a.scale", "unquantised")


def test_fp8_experts_flash_base(models, tmp_path):
    """Flash-Base style: routed experts stored as FP8 (weight [o,i] F8_E4M3 + 128x128 E8M0
    scale) instead of packed FP4 — the binder dispatches on the stored dtype (MODEL.md §2.2)."""
    import importlib.util
    import numpy as np
    spec = importlib.util.spec_from_file_location("gen", os.path.join(ROOT, "tools", "gen_checkpoints.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    d = clone(models["tiny-flash"], tmp_path / "m")
    for fname in sorted(set(index_of(d)["weight_map"].values())):
        meta, ts = read_st(os.path.join(d, fname))
        by = {t[0]: t for t in ts}
        out, changed = [], False
        for t in ts:
            name = t[0]
            if ".experts." in name and name.endswith(".weight") and t[1] == "I8":
                sc = by[name[:-len("weight")] + "scale"]
                packed = np.frombuffer(t[3], np.uint8).reshape(t[2])
                se = np.frombuffer(sc[3], np.uint8).reshape(sc[2])
                q, s8 = gen.quant_fp8(gen.dequant_fp4(packed, se))
                out.append([name, "F8_E4M3", list(q.shape), q.tobytes()])
                out.append([sc[0], "F8_E8M0", list(s8.shape), s8.tobytes()])
                changed = True
            elif not (".experts." in name and name.endswith(".scale")):
                out.append(t)
        if changed:
            write_st(os.path.join(d, fname), meta, out)
    rc, out, err = check(d)
    assert rc == 0, err
    assert "routed stored as FP8 (E4M3" in out and "note:" in out  # config still says fp4
    cfg = json.load(open(d / "config.json"))
    del cfg["expert_dtype"]
    os.unlink(d / "config.json")
    json.dump(cfg, open(d / "config.json", "w"))
    rc, out, err = check(d)
    assert rc == 0 and "routed stored as FP8" in out and "note:" not in out, err


def test_scan_values(models, tmp_path):
    """--scan reads every value: a NaN E8M0 scale (0xFF) is found and named; the pristine
    checkpoints scan clean. The default check finds it too: a scale this small is read in full."""
    for name in ("tiny-dspark", "tiny-flash-bf16"):
        p = subprocess.run([DSV4, "check", "--scan", models[name]], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0 and "no NaN/Inf codes" in p.stdout, p.stderr
    d = clone(models["tiny-dspark"], tmp_path / "m")
    name = "mtp.1.ffn.experts.3.w2.scale"

    def f(t):
        b = bytearray(t[3])
        b[5] = 0xFF
        t[3] = bytes(b)

    edit_tensor(d, name, f)
    rejected(d, f"'{name}'", "element 5")
    p = subprocess.run([DSV4, "check", "--scan", str(d)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert f"'{name}'" in p.stderr and "element 5" in p.stderr and shard_of(d, name) in p.stderr


def _set_bf16(t, elems, value=0x7FC0):
    b = bytearray(t[3])
    for i in elems:
        b[2 * i:2 * i + 2] = struct.pack("<H", value)
    t[3] = bytes(b)


@pytest.mark.parametrize("name,value", [("layers.0.attn_norm.weight", 0x7FC0),  # NaN in a norm
                                        ("layers.1.attn.q_norm.weight", 0xFF80)])  # -Inf
def test_default_check_finds_nan_in_small_tensors(models, tmp_path, name, value):
    """Without --scan, small tensors (norms, biases, scales) are still read in full."""
    d = clone(models["tiny-dspark"], tmp_path / "m")
    edit_tensor(d, name, lambda t: _set_bf16(t, [7], value))
    rejected(d, f"'{name}'", "element 7", shard_of(d, name))


def test_default_check_samples_large_tensors(models, tmp_path):
    """A large tensor that is NaN throughout is caught by the default (sampled) check; one
    NaN in its middle, away from the sampled windows, needs --scan (which finds it)."""
    name = "embed.weight"  # 262144 bytes of BF16: above the 64 KiB read in full
    d = clone(models["tiny-dspark"], tmp_path / "all")
    edit_tensor(d, name, lambda t: _set_bf16(t, range(len(t[3]) // 2)))
    err = rejected(d, f"'{name}'", "element 0", "sampling")
    d = clone(models["tiny-dspark"], tmp_path / "one")
    edit_tensor(d, name, lambda t: _set_bf16(t, [50000]))  # byte 100000: in no 1 KiB window
    assert check(d)[0] == 0
    p = subprocess.run([DSV4, "check", "--scan", str(d)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and f"'{name}'" in p.stderr and "element 50000" in p.stderr, p.stderr


# spec/DSPARK.md §3.3: the 12 tensors the seed stack's draft loader dropped silently.
SHARED_12 = [f"mtp.{s}.ffn.shared_experts.{w}.{k}"
             for s in range(3) for w in ("w1", "w3") for k in ("weight", "scale")]


@pytest.mark.parametrize("name", SHARED_12)
def test_draft_shared_expert_tensor_required(models, tmp_path, name):
    d = clone(models["tiny-dspark"], tmp_path / "m")
    remove_tensor(d, name)
    rejected(d, f"missing tensor '{name}'")
