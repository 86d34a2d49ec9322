#!/usr/bin/env python3
"""Writes the hand-made seed inputs of the fuzz targets into fuzz/seeds/<target>/.

scripts/fuzz adds the repo's own files (examples/*.toml, examples/clusters/*.toml) to these when it
assembles each target's corpus. Run again after changing an input format; the output is committed.
Needs only the Python standard library (the checkpoint archive seeds come from
fuzz/seeds/checkpoint_archive, written by chorus itself; see docs/security.md).
"""
import gzip
import hashlib
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")
SEPARATOR = b"\n#--8<--\n"


def write(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(ROOT, target, name), "wb") as out:
        out.write(data)


def device_specs():
    for i, text in enumerate(["cpu", "cpu@0.5", "cpu@0.5/512MiB", "cuda:0", "cuda:1/20GiB",
                              "auto", "cpu@1.0,cpu@0.25/1GiB,cuda:0", "cpu/2GB, cpu@0.75"]):
        write("device_spec", "spec%d" % i, text)


def config_sets():
    write("config", "sets", b'seed = 3\n[train]\nsteps = 4\n' + SEPARATOR +
          b'train.steps=7\ndevices=cpu@1.0,cpu@0.5\nmodel.hidden=[4, 2]\n')
    write("job_config", "sets", b'devices = "cpu,cpu"\n[train]\nglobal_batch = 8\n' + SEPARATOR +
          b'balancer.shares=[3, 5]\nmodel.kind="mlp"\n')


def plan_json():
    ranks = [{"device": d, "device_type": "A100-40" if d < 8 else "V100-32",
              "node": "dgx-a100" if d < 8 else "dgx1-v100", "precision": "fp32",
              "memory_budget": 0, "emulated_speed": 0, "predicted_memory": 1e9}
             for d in (0, 8)]
    plan = {"version": 1, "model": "m", "devices": 2, "global_batch": 16, "micro_batches": 2,
            "seed": 1, "schedule": "1f1b", "zero_stage": 0,
            "replicas": [{"share": 10, "stages": [{"first_layer": 0, "last_layer": 64, "rank": 0,
                                                   "micro_batch": 5, "checkpoint": False}]},
                         {"share": 6, "stages": [{"first_layer": 0, "last_layer": 64, "rank": 1,
                                                  "micro_batch": 3, "checkpoint": True}]}],
            "ranks": ranks,
            "comm": {"algorithm": "ring", "intra_node_codec": "none",
                     "inter_node_codec": "int8", "sync_period": 1},
            "predicted": {"step_seconds": 0.5}, "reason": "seed"}
    cluster = open(os.path.join(ROOT, "..", "..", "examples", "clusters", "a100-v100.toml"),
                   "rb").read()
    write("plan_json", "plan", json.dumps(plan, indent=1))
    write("plan_json", "plan_cluster", json.dumps(plan, indent=1).encode() + SEPARATOR + cluster)
    pipeline = dict(plan, replicas=[{"share": 16, "stages": [
        {"first_layer": 0, "last_layer": 30, "rank": 0, "micro_batch": 4, "checkpoint": False},
        {"first_layer": 30, "last_layer": 64, "rank": 1, "micro_batch": 4, "checkpoint": True}]}])
    write("plan_json", "pipeline", json.dumps(pipeline))


def checkpoint_manifest():
    payload = b"hello"
    manifest = {"format": 1, "step": 10, "world_size": 2,
                "files": [{"name": "a.bin", "bytes": len(payload),
                           "sha256": hashlib.sha256(payload).hexdigest()}]}
    write("checkpoint_manifest", "good", json.dumps(manifest).encode() + SEPARATOR + payload)
    write("checkpoint_manifest", "empty_files", json.dumps(dict(manifest, files=[])))


def idx():
    images, count = bytes(range(256)) * 7, 2  # 2 images of 28x28 = 1568 bytes
    image_file = struct.pack(">IIII", 0x803, count, 28, 28) + images[:count * 784]
    label_file = struct.pack(">II", 0x801, count) + bytes([3, 9])
    write("idx", "plain", image_file + SEPARATOR + label_file)
    write("idx", "gzip", gzip.compress(image_file, mtime=0) + SEPARATOR +
          gzip.compress(label_file, mtime=0))


def text_corpus():
    text = (b"Call me Ishmael. Some years ago - never mind how long precisely - having little or "
            b"no money in my purse, and nothing particular to interest me on shore, I thought I "
            b"would sail about a little and see the watery part of the world.\n")
    write("text_corpus", "moby", bytes([8, 0x12]) + text)
    write("text_corpus", "short", bytes([1, 0x80]) + b"ab\xff\x00ab")


def be32(n):
    return struct.pack(">I", n)


def field(data):
    return be32(len(data)) + data


def i64(n):
    return struct.pack(">q", n)


def records(mode, items):
    return bytes([mode]) + b"".join(struct.pack(">H", len(r)) + r for r in items)


def store():
    # Requests (store_protocol.h): u8 op, then fields.
    requests = [b"\x01" + field(b"key") + field(b"value"),            # set
                b"\x02" + field(b"key") + i64(5),                      # get
                b"\x03" + field(b"n") + i64(2),                        # add
                b"\x04" + field(b"key") + field(b"value") + field(b"x"),  # compareSet
                b"\x05" + be32(2) + field(b"key") + field(b"n"),       # check
                b"\x06" + be32(1) + field(b"key") + i64(5),            # wait
                b"\x07" + field(b"key"),                               # delete
                b"\x08"]                                               # numKeys
    write("store_server", "requests", records(1, requests))
    write("store_server", "raw_after_auth", records(2, [b"\x00" * 12 + b"\x01" * 16]))
    write("store_server", "raw_handshake", records(0, [b"CHORUSv2" + b"\x00" * 64]))
    # Replies, in the client's cycle: set, get, add, compareSet, check, wait, delete, numKeys.
    replies = [b"\x00", b"\x00" + field(b"value"), b"\x00" + i64(3), b"\x00" + field(b"x"),
               b"\x00\x01", b"\x00", b"\x00\x01", b"\x00" + i64(2)]
    write("store_client", "replies", records(1, replies))
    write("store_client", "errors", records(1, [b"\x03" + field(b"boom"),
                                                b"\x02" + be32(1) + field(b"key"),
                                                b"\x04" + field(b"bad")]))
    write("store_client", "raw_handshake", records(0, [b"CHORUSv2" + b"\x07" * 32 + b"\x00"]))
    write("store_client", "raw_after_auth", records(2, [b"\x00" * 12 + b"\xff" * 16]))


if __name__ == "__main__":
    device_specs()
    config_sets()
    plan_json()
    checkpoint_manifest()
    idx()
    text_corpus()
    store()
