#!/usr/bin/python3
"""Training corpus for the small trained deepseek41 model (issue 52): the Python 3.11 standard
library source that Debian ships.

Source: every regular *.py file that dpkg lists for the packages libpython3.11-stdlib and
libpython3.11-minimal (`dpkg-query -L PKG`, i.e. /var/lib/dpkg/info/PKG:ARCH.list), below
/usr/lib/python3.11, excluding
  * site-packages/ and dist-packages/ (not part of those packages anyway),
  * test suites: any path component named test, tests, idle_test (this removes test/,
    test/support, test/libregrtest; lib2to3/tests and distutils/tests belong to other
    packages and are not listed at all),
  * symbolic links (sitecustomize.py, the _sysconfigdata alias), so no text is counted twice.
Ownership check: `dpkg -S /usr/lib/python3.11/os.py` -> libpython3.11-minimal,
`dpkg -S /usr/lib/python3.11/json/__init__.py` -> libpython3.11-stdlib. (distutils/ belongs to
python3-distutils and lib2to3/ to python3-lib2to3; they are NOT included.)
License: PSF License (Python Software Foundation License Version 2), see
/usr/share/doc/libpython3.11-stdlib/copyright (and .../libpython3.11-minimal/copyright).

Split: by file. A file is held out when the first 8 bytes of sha256("heldout:" + RELPATH),
read as a big-endian integer, are below 5% of 2^64 (RELPATH relative to /usr/lib/python3.11,
'/'-separated). Files are written in sorted RELPATH order.

Output (DIR):
  train.txt, heldout.txt  each file as a line "# file: RELPATH" followed by the file's text
                          (UTF-8, newlines as in the file; a final "\n" is added if missing).
                          The header is a Python comment, so every output is valid Python text.
  manifest.json           source, license, split rule, per-file list (relpath, package, split,
                          bytes, sha256) and per-output bytes / sha256 / file count.

CLI: python3 tools/train/corpus.py --out DIR [--root /usr/lib/python3.11] [--heldout-frac 0.05]
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

PACKAGES = ("libpython3.11-stdlib", "libpython3.11-minimal")
ROOT = "/usr/lib/python3.11"
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages"}
HEADER = "# file: {}\n"


def package_files(pkg):
    out = subprocess.run(["dpkg-query", "-L", pkg], check=True, capture_output=True, text=True)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def collect(root=ROOT, packages=PACKAGES):
    """Sorted list of (relpath, package) of the corpus files."""
    files = {}
    for pkg in packages:
        for path in package_files(pkg):
            if not path.endswith(".py") or not path.startswith(root + "/"):
                continue
            rel = path[len(root) + 1:]
            if any(part in EXCLUDED_DIRS for part in rel.split("/")[:-1]):
                continue
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            files.setdefault(rel, pkg)
    return sorted(files.items())


def is_heldout(rel, frac):
    h = int.from_bytes(hashlib.sha256(("heldout:" + rel).encode()).digest()[:8], "big")
    return h < int(frac * (1 << 64))


def build(out_dir, root=ROOT, frac=0.05):
    os.makedirs(out_dir, exist_ok=True)
    entries = []
    outs = {"train": [], "heldout": []}
    for rel, pkg in collect(root):
        with open(os.path.join(root, rel), "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8")  # the stdlib is UTF-8 (PEP 3120); fail loudly otherwise
        if not text.endswith("\n"):
            text += "\n"
        split = "heldout" if is_heldout(rel, frac) else "train"
        outs[split].append(HEADER.format(rel) + text)
        entries.append({"relpath": rel, "package": pkg, "split": split, "bytes": len(raw),
                        "sha256": hashlib.sha256(raw).hexdigest()})
    manifest = {
        "source": "Python 3.11 standard library as shipped by Debian (" + ", ".join(PACKAGES) +
                  "), *.py under " + root,
        "license": "PSF License (Python Software Foundation License Version 2); "
                   "see /usr/share/doc/libpython3.11-stdlib/copyright",
        "excluded": "path components test/tests/idle_test/site-packages/dist-packages; symlinks; "
                    "files owned by other packages (distutils, lib2to3, ...)",
        "split_rule": "heldout iff int.from_bytes(sha256('heldout:'+relpath)[:8],'big') < %r * 2^64" % frac,
        "separator": "each file is preceded by the line '# file: RELPATH'",
        "outputs": {},
        "files": entries,
    }
    for split, parts in outs.items():
        data = "".join(parts).encode("utf-8")
        name = split + ".txt"
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        manifest["outputs"][name] = {"files": len(parts), "bytes": len(data),
                                     "sha256": hashlib.sha256(data).hexdigest()}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--heldout-frac", type=float, default=0.05)
    a = ap.parse_args(argv)
    m = build(a.out, a.root, a.heldout_frac)
    for name, o in sorted(m["outputs"].items()):
        print("%s: %d files, %d bytes, sha256 %s" % (name, o["files"], o["bytes"], o["sha256"]))


if __name__ == "__main__":
    sys.exit(main())
