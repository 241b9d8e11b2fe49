#!/usr/bin/env bash
# Creates .venv and installs intellect-node into it; `--dev` adds the test dependencies and the
# reference packages the interop tests compare against. torch goes first, pinned, so that no
# dependency range pulls a newer torch with several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
py=.venv/bin/python
$py -m pip install -q --upgrade pip
$py -m pip install -q torch==2.13.0
if [[ "${1:-}" == "--dev" ]]; then
    $py -m pip install -q -e '.[dev]'
    [[ -x scripts/setup-reference.sh ]] && scripts/setup-reference.sh
else
    $py -m pip install -q -e .
fi
echo "intellect-node installed in .venv"
