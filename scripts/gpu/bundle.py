#!/usr/bin/env python3
"""The GPU bundle's manifest, checks and extraction, for scripts/gpu/pack.sh (here) and
scripts/gpu/unpack.sh (on the GPU machine). Standard library only: it runs under the GPU
machine's python3 with nothing installed. See docs/gpu.md.

  bundle.py hash-tree ROOT OUT.json                files of ROOT: {relpath: {size, sha256}}
  bundle.py manifest GPU_DIR ARCHIVE FILES.json META.json N   split ARCHIVE into N parts
                                                   GPU_DIR/p<i>/<archive>.<i>, write
                                                   GPU_DIR/p<i>/manifest.json in each
  bundle.py assemble GPU_DIR OUT_ARCHIVE           check every part, join, check the whole
  bundle.py extract ARCHIVE DEST                   untar (xz) into DEST
  bundle.py verify-tree ROOT MANIFEST              check every file against the manifest
"""
import hashlib
import json
import os
import sys
import tarfile
from pathlib import Path

CHUNK = 1 << 20


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(CHUNK)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def die(msg):
    print(f"bundle: error: {msg}", file=sys.stderr)
    sys.exit(1)


def hash_tree(root):
    root = Path(root)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                die(f"{p}: not a regular file (the bundle holds regular files only)")
            rel = p.relative_to(root).as_posix()
            out[rel] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    return out


def cmd_hash_tree(root, out):
    files = hash_tree(root)
    Path(out).write_text(json.dumps(files, indent=0, sort_keys=True) + "\n")
    print(f"bundle: {len(files)} files, {sum(f['size'] for f in files.values())} bytes")


def cmd_manifest(gpu_dir, archive, files_json, meta_json, nparts):
    gpu_dir, archive, nparts = Path(gpu_dir), Path(archive), int(nparts)
    size = archive.stat().st_size
    part_size = -(-size // nparts)
    parts = []
    h_all = hashlib.sha256()
    with open(archive, "rb") as f:
        for i in range(1, nparts + 1):
            d = gpu_dir / f"p{i}"
            d.mkdir(parents=True, exist_ok=True)
            rel = f"p{i}/{archive.name}.{i}"
            h = hashlib.sha256()
            n = 0
            with open(gpu_dir / rel, "wb") as o:
                while n < part_size:
                    b = f.read(min(CHUNK, part_size - n))
                    if not b:
                        break
                    o.write(b)
                    h.update(b)
                    h_all.update(b)
                    n += len(b)
            parts.append({"path": rel, "size": n, "sha256": h.hexdigest()})
        if f.read(1):
            die("archive longer than the parts")
    manifest = {
        "format": 1,
        "meta": json.loads(Path(meta_json).read_text()),
        "archive": {"name": archive.name, "size": size, "sha256": h_all.hexdigest()},
        "parts": parts,
        "files": json.loads(Path(files_json).read_text()),
    }
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    for i in range(1, nparts + 1):
        (gpu_dir / f"p{i}" / "manifest.json").write_text(text)
    for p in parts:
        print(f"bundle: {p['path']}  {p['size']} bytes  sha256 {p['sha256']}")
    print(f"bundle: archive {archive.name} {size} bytes sha256 {manifest['archive']['sha256']}")


def load_manifest(gpu_dir):
    found = sorted(Path(gpu_dir).glob("p*/manifest.json"))
    if not found:
        die(f"no {gpu_dir}/p*/manifest.json: carry the parts (.gpu/p1, .gpu/p2, ...) first")
    texts = {p.read_text() for p in found}
    if len(texts) != 1:
        die("the parts' manifests differ: parts of different packs (run pack.sh again, carry all)")
    return json.loads(texts.pop())


def cmd_assemble(gpu_dir, out):
    gpu_dir = Path(gpu_dir)
    m = load_manifest(gpu_dir)
    missing = [p["path"] for p in m["parts"] if not (gpu_dir / p["path"]).is_file()]
    if missing:
        die(f"missing parts: {' '.join(missing)} (.gpu/ survives only while the machine stays "
            "warm: if it went back between calls, carry every part again)")
    h_all = hashlib.sha256()
    with open(out, "wb") as o:
        for p in m["parts"]:
            path = gpu_dir / p["path"]
            h = hashlib.sha256()
            n = 0
            with open(path, "rb") as f:
                while True:
                    b = f.read(CHUNK)
                    if not b:
                        break
                    h.update(b)
                    h_all.update(b)
                    o.write(b)
                    n += len(b)
            if n != p["size"] or h.hexdigest() != p["sha256"]:
                die(f"{p['path']}: size {n} sha256 {h.hexdigest()}, manifest says "
                    f"{p['size']} {p['sha256']}")
            print(f"bundle: ok {p['path']} ({n} bytes)")
    if h_all.hexdigest() != m["archive"]["sha256"]:
        die("reassembled archive's sha256 differs from the manifest")
    print(f"bundle: ok archive {m['archive']['name']} ({m['archive']['size']} bytes)")


def cmd_extract(archive, dest):
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(dest, filter="data")
        else:
            t.extractall(dest)


def cmd_verify_tree(root, manifest_path):
    root = Path(root)
    m = json.loads(Path(manifest_path).read_text())
    bad = []
    for rel, want in sorted(m["files"].items()):
        p = root / rel
        if not p.is_file():
            bad.append(f"{rel}: missing")
        elif p.stat().st_size != want["size"] or sha256_file(p) != want["sha256"]:
            bad.append(f"{rel}: differs")
    if bad:
        die("files differ from the manifest:\n  " + "\n  ".join(bad[:20]))
    print(f"bundle: ok {len(m['files'])} files match the manifest")


def main(argv):
    cmds = {
        "hash-tree": (cmd_hash_tree, 2),
        "manifest": (cmd_manifest, 5),
        "assemble": (cmd_assemble, 2),
        "extract": (cmd_extract, 2),
        "verify-tree": (cmd_verify_tree, 2),
    }
    if len(argv) < 2 or argv[1] not in cmds or len(argv) - 2 != cmds[argv[1]][1]:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    cmds[argv[1]][0](*argv[2:])


if __name__ == "__main__":
    main(sys.argv)
