#!/usr/bin/env python3
"""Checks that the code calls only downwards (docs/DESIGN.md, "Layers"). Exits 1 listing each
include that breaks a rule:

- every file of a layer (src/<layer>/, include/diffattn/<layer>/) includes headers of its own
  layer or of the layers it may use, and nothing else;
- a layer's private headers (src/<layer>/*.h, beside its sources) are included only by that
  layer: what another layer needs is a public header, include/diffattn/<layer>/;
- bench/, fuzz/ and python/ (outside the stack) include only the layers of their own allowed
  sets, and a private header only where it is named below with the reason;
- bench/'s shared cases (bench/cases/) are included only by the tools that time or test them.

tests/ may look inside any layer (white-box tests) and is not checked."""
import os
import re
import sys

# What each layer may include besides itself: the stack, bottom to top (each layer uses the
# ones below it), with viz, http, grammar and tokenize (chat templates) beside it (they know no
# model; only the tools above them use them).
STACK = ['base', 'kernels', 'nn', 'model', 'infer', 'data', 'train', 'eval']
BESIDE = {'viz', 'http', 'grammar', 'tokenize'}
USES = {layer: set(STACK[:i]) for i, layer in enumerate(STACK)}
for side in BESIDE:
    USES[side] = {'base'}
USES['eval'] |= {'viz'}
for top in ('explorer', 'serve', 'cli'):
    USES[top] = set(STACK) | BESIDE
USES['cli'] |= {'explorer', 'serve', 'bench'}

# Outside the stack: the folders and the layers each may include.
#   bench   timings of the library's layers (not of the tools built on them)
#   fuzz    a harness per reader of outside input, wherever the reader lives (not the CLI)
#   python  the bindings of the library (no servers, no CLI)
OUTSIDE = {
    'bench': set(STACK) | BESIDE | {'serve', 'bench'},
    'fuzz': set(STACK) | BESIDE | {'serve', 'explorer'},
    'python': set(STACK) | {'viz', 'tokenize', 'grammar'},
}
# Private headers that a folder outside the stack may include, each with its reason.
PRIVATE_OK = {
    ('bench', 'grammar/program.h'): 'bench_grammar times the compiled automaton itself',
    ('bench', 'kernels/indexing.h'): 'the naive float32 oracle of the cases indexes as the kernels do',
    ('fuzz', 'serve/openai.h'): "fuzz_openai_request fuzzes the request reader behind the server",
    ('fuzz', 'http/request_head.h'): 'fuzz_http_head fuzzes the request-head framing check',
}
KNOWN = set(USES) | {'bench'}

# Namespaces follow folders: every namespace a layer's file opens is diffattn::<layer> or
# inside it (anonymous namespaces, and the Highway conventions hwy/hn, aside). Only the layer
# below uses the project's root namespace `diffattn`, named with why.
ROOT_NAMESPACE_OK = {
    'base': 'the project-wide vocabulary (errors, files, dtypes) every layer names unqualified',
}
NAMESPACE = re.compile(r'^namespace ([A-Za-z_][\w:]*) *\{', re.M)
IGNORED_NAMESPACES = {'hwy', 'hn', 'detail', 'jinja', 'HWY_NAMESPACE'}

INCLUDE = re.compile(r'^#include "((?:diffattn/)?([a-z_]+)/[^"]+)"', re.M)
SOURCES = ('.cpp', '.h', '.cc', '.hpp')


def owner_of(path):
    """(kind, name) of a file: ('layer', L) in the stack, ('outside', folder), or None."""
    parts = path.split('/')
    if parts[0] == 'src' and len(parts) > 2:
        return 'layer', parts[1]
    if parts[:2] == ['include', 'diffattn'] and len(parts) > 3:
        return 'layer', parts[2]
    if parts[0] in OUTSIDE and len(parts) > 1:
        return 'outside', parts[0]
    return None


def private_headers(root):
    """{"<layer>/<name>.h"} of the headers beside the layers' sources."""
    out = set()
    src = os.path.join(root, 'src')
    for dirpath, _, names in os.walk(src):
        for name in names:
            if name.endswith(('.h', '.hpp')):
                out.add(os.path.relpath(os.path.join(dirpath, name), src).replace(os.sep, '/'))
    return out


def check(root):
    bad = []
    private = private_headers(root)
    tops = ['src', os.path.join('include', 'diffattn')] + sorted(OUTSIDE)
    for top in tops:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, '/')
                owner = owner_of(path)
                if owner is None:
                    continue
                kind, who = owner
                if kind == 'layer' and who not in USES:
                    bad.append(f'{path}: layer "{who}" is not in the stack (scripts/check_layers.py)')
                    continue
                allowed = USES[who] if kind == 'layer' else OUTSIDE[who]
                text = open(os.path.join(root, path), encoding='utf-8').read()
                if kind == 'layer':
                    for m in NAMESPACE.finditer(text):
                        ns = m.group(1)
                        parts = ns.split('::')
                        # Namespaces nested where the file opened them (no diffattn prefix) and
                        # Highway's per-target ones are the file's own business.
                        if parts[0] != 'diffattn' or IGNORED_NAMESPACES & set(parts):
                            continue
                        if who in ROOT_NAMESPACE_OK and len(parts) > 1 and parts[1] != who and parts[1] not in USES:
                            continue  # a root-namespace layer's own inner namespace (diffattn::fused)
                        if ns == f'diffattn::{who}' or ns.startswith(f'diffattn::{who}::'):
                            continue
                        if ns == 'diffattn' and who in ROOT_NAMESPACE_OK:
                            continue
                        bad.append(f'{path}: {who} opens namespace {ns} (namespaces follow folders: '
                                   f'diffattn::{who})')
                for m in INCLUDE.finditer(text):
                    inc, used = m.group(1), m.group(2)
                    if used not in KNOWN:
                        continue  # a third-party header (hwy/, nlohmann/, ...)
                    if used != who and used not in allowed:
                        where = 'the layers it may use' if kind == 'layer' else f'the allowed set of {who}/'
                        bad.append(f'{path}: {who} includes {inc} ({used} is not among {where})')
                        continue
                    if inc in private and used != who and (who, inc) not in PRIVATE_OK:
                        bad.append(f'{path}: {who} includes {inc}, a private header of {used} '
                                   f'(src/{inc}); a public one belongs in include/diffattn/{used}/')
    return bad


def main(root):
    bad = check(root)
    for b in bad:
        print(b)
    print(f'check_layers: {len(bad)} include(s) against the layers')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
