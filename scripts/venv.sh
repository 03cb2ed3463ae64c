#!/usr/bin/env bash
# Makes the test environment .venv/ at the repository root (git-ignored) from the machine's
# Python 3.11 and installs requirements-test.txt into it (again only when that file changed).
# `make test` then installs diffattn itself into it (`pip install -e .`) and runs pytest with it.
#   scripts/venv.sh            PYTHON=/path/to/python3.11 picks the interpreter
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
reqs="$root/requirements-test.txt"

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
  for p in python3.11 /usr/bin/python3.11 python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      command -v "$p"; return
    fi
  done
  echo "diffattn venv: no Python 3.11 found (the pinned torch==2.13.0 is a cp311 build); set PYTHON=" >&2
  exit 1
}

if [[ ! -x "$venv/bin/python" ]]; then
  py=$(pick_python)
  echo "diffattn venv: creating .venv from $py ($("$py" --version 2>&1))"
  "$py" -m venv "$venv" || {
    echo "diffattn venv: '$py -m venv' failed (Debian's Python needs python3-venv: scripts/setup.sh test installs it)" >&2
    exit 1
  }
fi
want=$(sha256sum "$reqs" | cut -d' ' -f1)
stamp="$venv/.requirements.sha256"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  # About 2.3 GB land in .venv (torch, triton, transformers), about 1 GB in the build trees. A
  # full disk fails deep inside pip ("No space left on device"): say so first, naming the folder.
  free_kb=$(df -Pk "$root" | awk 'NR == 2 {print $4}')
  if [[ -n "$free_kb" && "$free_kb" -lt $((3 * 1024 * 1024)) ]]; then
    echo "diffattn venv: $((free_kb / 1024)) MB free on the disk of $root; the test environment" \
         "(2.3 GB) and the builds (1 GB) need about 3.5 GB: free some space and run again" >&2
    exit 1
  fi
  echo "diffattn venv: pip install -r requirements-test.txt"
  # --no-cache-dir: the wheels are not kept a second time in pip's cache.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir -r "$reqs"
  echo "$want" > "$stamp"
fi
