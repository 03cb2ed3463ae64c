#!/usr/bin/env bash
# Installs the Debian packages listed in scripts/packages.txt (build and demo) that are not
# installed yet; `scripts/setup.sh test` adds scripts/packages-test.txt (what only the tests need).
# `scripts/setup.sh corpus` adds scripts/packages-corpus.txt (the text scripts/corpus.py reads).
# Safe to run again: with everything present it does nothing. Needs root only to install.
# The tests' Python packages come from pip into .venv/ (scripts/venv.sh), not from here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lists=("$here/packages.txt")
case "${1:-}" in
  "") ;;
  test) lists+=("$here/packages-test.txt") ;;
  corpus) lists+=("$here/packages-corpus.txt") ;;
  *) echo "usage: scripts/setup.sh [test|corpus]" >&2; exit 2 ;;
esac
mapfile -t wanted < <(cat "${lists[@]}" | grep -v -E '^\s*(#|$)')

missing=()
for p in "${wanted[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "diffattn setup: missing Debian packages: ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "diffattn setup: installing them needs root. Run as root, or ask an administrator for:" >&2
  echo "  apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists; a failed update is retried once (mirrors flake).
apt-get update -q || { sleep 5; apt-get update -q; }
apt-get install -y -q --no-install-recommends "${missing[@]}"
