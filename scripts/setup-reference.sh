#!/usr/bin/env bash
# Builds and installs the reference TOPLOC implementation (`toploc` 0.1.6 from PyPI) into .venv.
# The interop tests and bench/toploc.py compare our crypto/toploc.py against it byte for byte.
# Its published wheel was compiled against an older torch and fails to import with torch 2.13
# (C++ ABI), so we compile its sdist against the torch already in .venv (--no-build-isolation:
# an isolated build would fetch a different torch). Idempotent: does nothing when a working
# toploc 0.1.6 already imports.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
version=0.1.6

if $py -c "import toploc, sys; sys.exit(toploc.__version__ != '$version')" 2>/dev/null; then
    echo "reference toploc $version already installed"
    exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The build needs a compiler and Python headers on the machine, and setuptools in .venv (70.1 or
# later builds wheels without the separate `wheel` package; a no-op when already satisfied).
$py -m pip install -q "setuptools>=70.1"
MAX_JOBS="$(nproc)" $py -m pip wheel -q --no-deps --no-build-isolation --no-binary toploc \
    -w "$tmp" "toploc==$version"
$py -m pip install -q --no-deps --force-reinstall "$tmp"/toploc-*.whl
$py -c "import toploc; assert toploc.__version__ == '$version'"
echo "reference toploc $version built and installed"
