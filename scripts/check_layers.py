#!/usr/bin/env python3
"""Checks that the code calls only downwards (docs/DESIGN.md, "Layers"): every file of a layer
(src/<layer>/, include/diffattn/<layer>/) includes headers of its own layer or of the layers
it may use, and nothing else. Exits 1 listing each include that goes up or sideways."""
import os
import re
import sys

# What each layer may include besides itself: the stack, bottom to top (each layer uses the
# ones below it), with viz, http, grammar and tokenize (chat templates) beside it (they know no
# model; only the tools above them use them).
STACK = ['base', 'kernels', 'nn', 'model', 'data', 'train', 'eval']
USES = {layer: set(STACK[:i]) for i, layer in enumerate(STACK)}
USES['viz'] = {'base'}
USES['http'] = {'base'}
USES['grammar'] = {'base'}
USES['tokenize'] = {'base'}
USES['eval'] |= {'viz'}
for top in ('explorer', 'serve', 'cli'):
    USES[top] = set(STACK) | {'viz', 'http', 'grammar', 'tokenize'}
USES['cli'] |= {'explorer', 'serve'}

INCLUDE = re.compile(r'^#include "((?:diffattn/)?([a-z_]+)/[^"]+)"', re.M)


def layer_of(path):
    parts = path.split(os.sep)
    if parts[0] == 'src' and len(parts) > 2:
        return parts[1]
    if parts[:2] == ['include', 'diffattn'] and len(parts) > 3:
        return parts[2]
    return None


def main(root):
    bad = []
    for top in ('src', os.path.join('include', 'diffattn')):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if not name.endswith(('.cpp', '.h')):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                layer = layer_of(path)
                if layer is None:
                    continue
                if layer not in USES:
                    bad.append(f'{path}: layer "{layer}" is not in the stack (scripts/check_layers.py)')
                    continue
                text = open(os.path.join(root, path), encoding='utf-8').read()
                for m in INCLUDE.finditer(text):
                    used = m.group(2)
                    if used in USES and used != layer and used not in USES[layer]:
                        bad.append(f'{path}: {layer} includes {m.group(1)} ({used} is not below {layer})')
    for b in bad:
        print(b)
    print(f'check_layers: {len(bad)} include(s) against the stack')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
