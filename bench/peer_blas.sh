# Sourced by the comparison scripts that run PyTorch: it gets the OpenBLAS kernels Troupe chose
# from the CPU's features (on a CPU newer than Debian's OpenBLAS tables, e.g. Intel family 6
# model 207, PyTorch would otherwise run the SSE3 fallback: the peer's best configuration too).
# Needs $TROUPE; exports OPENBLAS_CORETYPE (a value already set is kept) and prints it once.
if [[ -z "${OPENBLAS_CORETYPE:-}" ]]; then
  OPENBLAS_CORETYPE=$("$TROUPE" bench model --model mlp --steps 1 --warmup 0 --json |
    /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["blas_core"])')
  export OPENBLAS_CORETYPE
fi
echo "OpenBLAS kernels for Troupe and PyTorch: $OPENBLAS_CORETYPE" >&2
