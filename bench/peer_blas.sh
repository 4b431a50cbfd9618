# Sourced by the comparison scripts that run PyTorch: it gets the OpenBLAS kernels Troupe chose
# from the CPU's features (on a CPU newer than Debian's OpenBLAS tables, e.g. Intel family 6
# model 207, PyTorch would otherwise run the SSE3 fallback: the peer's best configuration too).
# An OPENBLAS_CORETYPE already in the environment (some hosts set Haswell for every process) is
# replaced by Troupe's choice, which Troupe itself ran under it; PEER_OPENBLAS_CORETYPE forces one.
# Needs $TROUPE; exports OPENBLAS_CORETYPE and prints it once.
if [[ -n "${PEER_OPENBLAS_CORETYPE:-}" ]]; then
  OPENBLAS_CORETYPE=$PEER_OPENBLAS_CORETYPE
else
  preset=${OPENBLAS_CORETYPE:-}
  OPENBLAS_CORETYPE=$("$TROUPE" bench model --model mlp --steps 1 --warmup 0 --json |
    /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["blas_core"])')
  if [[ -n "$preset" && "$preset" != "$OPENBLAS_CORETYPE" ]]; then
    echo "OPENBLAS_CORETYPE=$preset in the environment: replaced by Troupe's choice for both" >&2
  fi
fi
export OPENBLAS_CORETYPE
echo "OpenBLAS kernels for Troupe and PyTorch: $OPENBLAS_CORETYPE" >&2
