#!/usr/bin/env bash
# vLLM 0.24.0 on a GPU machine that has no network and takes at most 64 MiB a run
# (docs: fixtures/gpu/README.md, the vllm_cumem_* entry; what ran and what did not: the
# closing note of issue 33). A machine kept warm keeps /tmp between runs: start each run
# within its idle release (30 s) of the last, or start again from the first part.
#
# vLLM's allocator alone (tests/python/test_vllm_cumem_gpu.py), three steps:
#   here (network):  vllm_gpu.sh pack
#       the wheel's Python files (4 MB as .tar.xz), its allocator extension, and
#       _C_stable_libtorch.abi3.so (which the CUDA platform imports at the top: 110 MB,
#       85 MB as .xz) split in two: .gpu/p1 (52 MB), .gpu/p2 (the rest, pyzmq's wheel,
#       graphcheck's wheel from target/wheels-dev). Each fits one run beside the checkout.
#   there, run 1:    carry .gpu/p1;  vllm_gpu.sh first    (part 1 into /tmp/vparts)
#   there, run 2:    carry .gpu/p2;  vllm_gpu.sh second   (join, check, install into
#       /tmp/vsite, run the scenarios at levels 1 and 2: documents into $OUT; then the
#       import closure of vllm.LLM)
#
# The engine (vllm.LLM, tests/python/scenarios/vllm_gemma3n.py), after `pack`:
#   here:            vllm_gpu.sh pack-engine
#       the dependencies the machine lacks (vllm_engine_requirements.txt: 85 wheels, 62 MB
#       as one .tar.xz of their unpacked trees), the flash-attention package's Python
#       files, and its FA3 extension (which importing any vLLM model needs on CUDA, even
#       with TRITON_ATTN: fa_utils imports vllm.vllm_flash_attn, which raises without
#       _vllm_fa2_C or _vllm_fa3_C; FA3 is 153 MB, 8 MB as .xz), as one .tar.xz (160 MB)
#       cut into .gpu/e1 ... .gpu/e4 (48, 48, 48 and 13 MB, run here on 2026-12-02).
#   there, run k:    carry .gpu/ek;  vllm_gpu.sh engine-part     (for each but the last)
#   there, last run: carry .gpu/eN;  vllm_gpu.sh engine-run      (join, check, install into
#       /tmp/vsite2, run the Gemma3n scenario as shipped and with the four scales
#       registered, graphcheck attached by GRAPHCHECK_DIR, GRAPHCHECK_DIGESTS=1,
#       GRAPHCHECK_VERIFY_ON_REPLAY=warn; then `graphcheck verify` of each run)
#
# Measured on 2026-12-02 (nvidia-h200): `second` took 106 s of command time (join and
# install 10 s, each scenario about 12 s, the closure scan 95 s). The engine without the
# FA3 extension: install 8 s; `from vllm import LLM` imported; the model module's import
# stopped at vllm.vllm_flash_attn after 30 s.
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

pack-engine() {
    local dl=${VLLM_DL:-/tmp/vllm-dl} req=tests/python/scenarios/vllm_engine_requirements.txt
    [ -f "$dl/cst.xz" ] || { echo "run pack first"; exit 2; }
    rm -rf "$dl/deps" "$dl/unpacked" .gpu/e[0-9]* && mkdir -p "$dl/deps" "$dl/unpacked" "$dl/parts"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp -d "$dl/deps" -r "$req" \
        $(for n in 17 24 26 27 28 31 34 35; do echo --platform manylinux_2_${n}_x86_64; done) \
        --platform manylinux2014_x86_64
    for w in "$dl"/deps/*.whl; do
        mkdir -p "$dl/unpacked/$(basename "$w" .whl)" && unzip -q -o "$w" -d "$dl/unpacked/$(basename "$w" .whl)"
    done
    # One stream: the allocator's pieces, the dependencies, the flash-attention Python
    # files and FA3 extension; cut into parts that fit a run each.
    rm -rf "$dl/stage" && mkdir -p "$dl/stage/site"
    for d in "$dl"/unpacked/*/; do cp -r "$d". "$dl/stage/site/"; done
    (cd "$dl/x" && unzip -q -o "$dl"/vllm-$VLLM-*.whl 'vllm/vllm_flash_attn/*' -x 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so')
    (cd "$dl/x" && tar --exclude='*.so' --exclude='__pycache__' -cf - vllm "vllm-$VLLM.dist-info") | tar -x -C "$dl/stage/site"
    cp "$dl/x/vllm/cumem_allocator.abi3.so" "$dl/x/vllm/_C_stable_libtorch.abi3.so" \
        "$dl/x/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" "$dl/stage/"
    (cd "$dl/stage" && tar -cf - .) | xz -9 -T2 >"$dl/engine.tar.xz"
    (cd "$dl" && sha256sum engine.tar.xz) >"$dl/engine.sha256"
    rm -f "$dl"/parts/* && split -b 50000000 "$dl/engine.tar.xz" "$dl/parts/engine.part"
    local k=0
    for part in "$dl"/parts/engine.part*; do
        k=$((k + 1)) && mkdir -p ".gpu/e$k" && mv "$part" ".gpu/e$k/"
    done
    cp "$dl/engine.sha256" ".gpu/e$k/"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 -d ".gpu/e$k" pyzmq
    cp target/wheels-dev/graphcheck-*.whl ".gpu/e$k/"
    du -sh .gpu/e*
}

engine-part() {
    mkdir -p /tmp/vparts && cp .gpu/e*/engine.part* /tmp/vparts/ && ls -la /tmp/vparts
}

engine-run() {
    local site=/tmp/vsite2 last
    last=$(ls -d .gpu/e* | sort -V | tail -1)
    if [ ! -f "$site/vllm/_C_stable_libtorch.abi3.so" ]; then
        mkdir -p /tmp/vparts "$site" /tmp/estage && cp "$last"/engine.part* /tmp/vparts/
        cat /tmp/vparts/engine.part* >/tmp/engine.tar.xz
        (cd /tmp && sha256sum -c "$OLDPWD/$last/engine.sha256")
        xz -dc -T8 /tmp/engine.tar.xz | tar -x -C /tmp/estage
        cp -r /tmp/estage/site/. "$site/"
        cp /tmp/estage/cumem_allocator.abi3.so /tmp/estage/_C_stable_libtorch.abi3.so "$site/vllm/"
        cp /tmp/estage/_vllm_fa3_C.abi3.so "$site/vllm/vllm_flash_attn/"
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$last"/*.whl
    fi
    cp -r python/graphcheck/. "$site/graphcheck/"
    export GRAPHCHECK_DIGESTS=1 GRAPHCHECK_VERIFY_ON_REPLAY=warn OUT=${OUT:-/tmp/out}
    for v in shipped registered; do
        mkdir -p "$OUT/gc_$v"
        # site.addsitedir: graphcheck's .pth (GRAPHCHECK_DIR's attach) runs from a --target
        # folder too.
        GRAPHCHECK_DIR="$OUT/gc_$v" timeout "${BUDGET:-240}" python3 -c \
            'import site,sys,runpy; site.addsitedir("/tmp/vsite2"); sys.argv=sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")' \
            tests/python/scenarios/vllm_gemma3n.py $v >"$OUT/g_$v.out" 2>"$OUT/g_$v.err" \
            && echo "$v: ok" || echo "$v: rc=$?"
        grep -E "Traceback|Error|graphcheck" "$OUT/g_$v.err" | head -20
        tail -1 "$OUT/g_$v.out" | head -c 3000 && echo
        PYTHONPATH=$site python3 -m graphcheck verify "$OUT/gc_$v" 2>&1 | tail -25
    done
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

"${1:?pack, first, second, pack-engine, engine-part or engine-run}"
