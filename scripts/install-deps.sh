#!/usr/bin/env bash
# Installs the Debian packages Troupe needs to build and test. Idempotent: when every package
# is already present it only runs `dpkg -s` (well under a second, no network).
# Usage: scripts/install-deps.sh [--peers]   (--peers adds the benchmark peers: PyTorch, OpenMPI)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libcaf-dev libucx-dev ucx-utils
  capnproto libcapnp-dev
  libspdlog-dev libtomlplusplus-dev nlohmann-json3-dev libcli11-dev
  libopenblas-dev
  libgtest-dev libgmock-dev
  clang libclang-rt-14-dev   # make fuzz: libFuzzer, ASan, UBSan
  base-files   # /usr/share/common-licenses/GPL-3, the quickstart's text
  python3-torch   # a test loads `troupe export` into the PyTorch twin (the benchmarks' peer too)
  libcpp-httplib-dev   # the coordinator's metrics endpoint (observability.metrics_listen)
  prometheus   # a test scrapes a running job with a real Prometheus; promtool checks the output
  chromium-headless-shell   # a test renders `troupe report`'s HTML in a real browser
  iproute2   # a test joins a coordinator through a veth pair in a network namespace of its own
)
if [[ "${1:-}" == "--peers" ]]; then
  # sentencepiece and linux-source-6.1 (a 170 MB text corpus): bench/compare_data.sh
  packages+=(openmpi-bin libopenmpi-dev hyperfine sentencepiece linux-source-6.1)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "install-deps: missing packages (${missing[*]}) and not root; install them with apt-get as root" >&2
    exit 1
  fi
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq; then
  echo "install-deps: apt-get update failed; cannot install ${missing[*]}" >&2
  exit 1
fi
if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
  echo "install-deps: apt-get install failed for: ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: done" >&2
