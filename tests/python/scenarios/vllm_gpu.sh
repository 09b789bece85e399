#!/usr/bin/env bash
# vLLM 0.24.0 on a GPU machine that has no network and takes at most 64 MiB a run
# (docs: ../../../fixtures/gpu/README.md, the vllm_cumem_* entry). Three steps:
#
#   here (network):  tests/python/scenarios/vllm_gpu.sh pack
#       downloads the vLLM wheel (279 MB), keeps its Python files (4 MB as .tar.xz), its
#       sleep allocator's extension and _C_stable_libtorch.abi3.so (which the CUDA
#       platform imports at the top: 110 MB, 85 MB as .xz), and splits the latter in two
#       parts, into .gpu/p1 (52 MB) and .gpu/p2 (the rest, the Python files, pyzmq's
#       wheel, graphcheck's wheel from target/wheels-dev). Each folder fits one run
#       beside the 9 MB of the checkout.
#   there, run 1:    carry .gpu/p1;  tests/python/scenarios/vllm_gpu.sh first
#       keeps part 1 in /tmp/vparts (a machine kept warm keeps /tmp between runs: start
#       run 2 within the machine's idle release, 30 s).
#   there, run 2:    carry .gpu/p2;  tests/python/scenarios/vllm_gpu.sh second
#       joins and checks the parts, installs into /tmp/vsite, runs the allocator
#       scenarios at levels 1 and 2 (documents into $OUT) and the import closure of
#       vllm.LLM (what else the engine needs that the machine lacks).
#
# Measured on 2026-12-02 (nvidia-h200): run 1 took 11 s of command time (83 s of device
# time with the machine's start), run 2 106 s (the join and install 10 s, each scenario
# about 12 s, the closure scan 95 s).
set -euo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
VLLM=0.24.0

pack() {
    local dl=${VLLM_DL:-/tmp/vllm-dl}
    mkdir -p "$dl" .gpu/p1 .gpu/p2
    python3 -m pip download -q --no-deps -d "$dl" "vllm==$VLLM"
    rm -rf "$dl/x" && mkdir -p "$dl/x"
    (cd "$dl/x" && unzip -q "$dl"/vllm-$VLLM-*.whl -x 'vllm/vllm_flash_attn/*' 'vllm/vllm-rs' \
        'vllm/third_party/fmha_sm100/*' 'vllm/third_party/deep_gemm/*')
    (cd "$dl/x" && tar --exclude='*.so' --exclude='__pycache__' -cf - vllm "vllm-$VLLM.dist-info" \
        | xz -6 -T2 >"$OLDPWD/.gpu/p2/vllm_py.tar.xz")
    (cd "$dl/x" && tar -cJf "$OLDPWD/.gpu/p2/vllm_so_small.tar.xz" vllm/cumem_allocator.abi3.so)
    xz -9e -T2 -c "$dl/x/vllm/_C_stable_libtorch.abi3.so" >"$dl/cst.xz"
    (cd "$dl" && sha256sum cst.xz) >.gpu/p2/cst.sha256
    rm -f .gpu/p1/cst.xz.part* .gpu/p2/cst.xz.part*
    split -b 52000000 "$dl/cst.xz" "$dl/cst.xz.part"
    mv "$dl/cst.xz.partaa" .gpu/p1/ && mv "$dl/cst.xz.partab" .gpu/p2/
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        -d .gpu/p2 pyzmq
    cp target/wheels-dev/graphcheck-*.whl .gpu/p2/
    du -sh .gpu/p1 .gpu/p2
}

first() {
    mkdir -p /tmp/vparts && cp .gpu/p1/cst.xz.partaa /tmp/vparts/ && ls -la /tmp/vparts
}

second() {
    if [ ! -f /tmp/vsite/vllm/_C_stable_libtorch.abi3.so ]; then
        cat /tmp/vparts/cst.xz.partaa .gpu/p2/cst.xz.partab >/tmp/cst.xz
        (cd /tmp && sha256sum -c "$OLDPWD/.gpu/p2/cst.sha256")
        mkdir -p /tmp/vsite
        tar -xJf .gpu/p2/vllm_py.tar.xz -C /tmp/vsite
        tar -xJf .gpu/p2/vllm_so_small.tar.xz -C /tmp/vsite
        xz -dc -T8 /tmp/cst.xz >/tmp/vsite/vllm/_C_stable_libtorch.abi3.so
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite .gpu/p2/*.whl
    fi
    cp -r python/graphcheck/. /tmp/vsite/graphcheck/
    export PYTHONPATH=/tmp/vsite GRAPHCHECK_GPU_TESTS=1 GRAPHCHECK_GPU_OUT=${OUT:-/tmp}
    for level in 1 2; do
        timeout 150 python3 tests/python/scenarios/vllm_cumem.py $level \
            >"$GRAPHCHECK_GPU_OUT/l$level.out" 2>"$GRAPHCHECK_GPU_OUT/l$level.err" \
            && echo "level $level: ok" || echo "level $level: rc=$?"
        tail -1 "$GRAPHCHECK_GPU_OUT/l$level.out"
    done
    timeout 120 python3 tests/python/scenarios/vllm_import_closure.py vllm.entrypoints.llm 90
}

"${1:?pack, first or second}"
