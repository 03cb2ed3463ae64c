#!/usr/bin/env python3
"""Assembles the language-model corpus from text that Debian packages ship (nothing is
downloaded here; scripts/setup.sh corpus installs the packages) and splits it into training and
held-out data by document, deterministically.

    scripts/setup.sh corpus                 # the Debian packages of scripts/packages-corpus.txt
    python3 scripts/corpus.py [--out data/corpus] [--heldout-percent 5] [--sources a,b]

Sources (docs/corpus.md lists their licences and sizes):
    kjv     the King James Bible (bible-kjv), one document per book, one verse a line
    python  the Python 3.11 documentation's reStructuredText sources (python3.11-doc), one
            document per page
    perl    Perl 5's manual pages in POD (perl-doc), one document per .pod file
    linux   the Linux kernel's documentation in reStructuredText (linux-doc-6.1), English only
            (translations/ left out), one document per .rst file

Writes into --out: train.jsonl and heldout.jsonl (one document a line: {"source", "id",
"text"}), and manifest.json (per source: package, version, licence, documents and bytes in each
split; the SHA-256 of both files). A document is held out when the first 8 bytes of
SHA-256("source/id") read as an integer modulo 10000 fall below 100 * heldout_percent: the split
depends on the document's name only, not on what else is present or the order of reading.
Text is read as UTF-8 (undecodable bytes replaced), line ends normalised to \\n.
"""

import argparse
import glob
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys

SOURCES = {
    "kjv": {"package": "bible-kjv", "licence": "public domain (the King James text; the `bible` "
            "program's data file: unrestricted use, /usr/share/doc/bible-kjv-text/copyright)"},
    "python": {"package": "python3.11-doc", "licence": "PSF-2.0 (Python Software Foundation "
               "License; /usr/share/doc/python3.11-doc/copyright)"},
    "perl": {"package": "perl-doc", "licence": "GPL-1+ or Artistic-1 (Perl's terms; "
             "/usr/share/doc/perl-doc/copyright)"},
    "linux": {"package": "linux-doc-6.1", "licence": "GPL-2 (the package's copyright file; "
              "files carry SPDX tags, a few GPL-2+ / GFDL-1.1+ / CC-BY-4.0; "
              "/usr/share/doc/linux-doc-6.1/copyright)"},
}

class CorpusError(Exception):
    pass


def _text(raw):
    return raw.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _files(pattern, what, package):
    paths = sorted(glob.glob(pattern, recursive=True))
    if not paths:
        raise CorpusError(f"corpus: no {what} at {pattern}; install the Debian package "
                          f"{package} (scripts/setup.sh corpus)")
    return paths


def kjv_documents():
    try:
        out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], stdin=subprocess.DEVNULL,
                             capture_output=True, check=False).stdout
    except FileNotFoundError:
        out = b""
    if len(out) < 1_000_000:
        raise CorpusError("corpus kjv: the `bible` command (Debian package bible-kjv) gave "
                          f"{len(out)} bytes; install it (scripts/setup.sh)")
    books = {}
    for line in _text(out).split("\n"):
        if not line.strip():
            continue
        ref, _, verse = line.partition(" ")
        m = re.fullmatch(r"(\d?[A-Za-z]+)\d+:\d+", ref)
        book = m.group(1) if m else ""
        if not book:
            raise CorpusError(f"corpus kjv: unexpected line from `bible`: {line[:60]!r}")
        books.setdefault(book, []).append(verse.strip())  # (dicts keep the books' order)
    if len(books) != 66:
        raise CorpusError(f"corpus kjv: {len(books)} books from `bible`, expected 66")
    for i, b in enumerate(books):
        yield f"{i + 1:02d}-{b}", "\n".join(books[b]) + "\n"


def python_documents():
    root = "/usr/share/doc/python3.11/html/_sources/"
    for p in _files(root + "**/*.rst.txt", "Python documentation sources", "python3.11-doc"):
        with open(p, "rb") as f:
            yield os.path.relpath(p, root), _text(f.read())


def perl_documents():
    for p in _files("/usr/share/perl/5.*/pod/*.pod", "Perl POD files", "perl-doc"):
        with open(p, "rb") as f:
            yield os.path.basename(p), _text(f.read())


def linux_documents():
    root = "/usr/share/doc/linux-doc-6.1/Documentation/"
    for p in _files(root + "**/*.rst.gz", "kernel documentation", "linux-doc-6.1"):
        rel = os.path.relpath(p, root)
        if rel.startswith("translations/"):
            continue
        with gzip.open(p, "rb") as f:
            yield rel[:-3], _text(f.read())


READERS = {"kjv": kjv_documents, "python": python_documents, "perl": perl_documents,
           "linux": linux_documents}


def held_out(source, doc_id, percent):
    h = hashlib.sha256(f"{source}/{doc_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") % 10000 < round(100 * percent)


def package_version(package):
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                           capture_output=True, text=True, check=False)
        return r.stdout.strip() or None
    except FileNotFoundError:
        return None


def build(out, sources, percent, min_chars=200):
    os.makedirs(out, exist_ok=True)
    manifest = {"format": "diffattn-corpus/1", "heldout_percent": percent,
                "split_rule": "sha256('source/id')[:8] big-endian mod 10000 < 100 * percent",
                "min_chars": min_chars, "sources": {}}
    tmp = {s: os.path.join(out, f".{s}.jsonl.tmp") for s in ("train", "heldout")}
    files = {s: open(p, "w", encoding="utf-8") for s, p in tmp.items()}
    try:
        for src in sources:
            stats = {"package": SOURCES[src]["package"],
                     "version": package_version(SOURCES[src]["package"]),
                     "licence": SOURCES[src]["licence"],
                     "train_documents": 0, "train_bytes": 0,
                     "heldout_documents": 0, "heldout_bytes": 0, "skipped_short": 0}
            for doc_id, text in READERS[src]():
                if len(text.strip()) < min_chars:
                    stats["skipped_short"] += 1
                    continue
                split = "heldout" if held_out(src, doc_id, percent) else "train"
                files[split].write(json.dumps({"source": src, "id": doc_id, "text": text},
                                              ensure_ascii=False) + "\n")
                stats[f"{split}_documents"] += 1
                stats[f"{split}_bytes"] += len(text.encode("utf-8"))
            manifest["sources"][src] = stats
            print(f"corpus: {src}: {stats['train_documents']} training documents "
                  f"({stats['train_bytes'] / 1e6:.2f} MB), {stats['heldout_documents']} "
                  f"held out ({stats['heldout_bytes'] / 1e6:.2f} MB)", file=sys.stderr)
    except BaseException:
        for f in files.values():
            f.close()
        for p in tmp.values():
            os.remove(p)
        raise
    for f in files.values():
        f.close()
    for split, p in tmp.items():
        final = os.path.join(out, f"{split}.jsonl")
        os.replace(p, final)
        with open(final, "rb") as f:
            manifest[f"{split}_sha256"] = hashlib.sha256(f.read()).hexdigest()
    for split in ("train", "heldout"):
        manifest[f"{split}_documents"] = sum(s[f"{split}_documents"]
                                             for s in manifest["sources"].values())
        manifest[f"{split}_bytes"] = sum(s[f"{split}_bytes"] for s in manifest["sources"].values())
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("DIFFATTN_DATA_DIR", "data"),
                                                  "corpus"))
    ap.add_argument("--heldout-percent", type=float, default=5.0)
    ap.add_argument("--sources", default=",".join(SOURCES),
                    help=f"comma-separated subset of {','.join(SOURCES)}")
    a = ap.parse_args(argv)
    sources = [s for s in a.sources.split(",") if s]
    bad = [s for s in sources if s not in SOURCES]
    if bad or not sources:
        ap.error(f"--sources: unknown {bad}; choose from {','.join(SOURCES)}")
    if not 0 < a.heldout_percent < 50:
        ap.error(f"--heldout-percent must lie in (0, 50), got {a.heldout_percent}")
    try:
        m = build(a.out, sources, a.heldout_percent)
    except CorpusError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"corpus: {m['train_documents']} training documents ({m['train_bytes'] / 1e6:.1f} MB),"
          f" {m['heldout_documents']} held out ({m['heldout_bytes'] / 1e6:.1f} MB) in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
