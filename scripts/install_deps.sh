#!/usr/bin/env bash
# Installs the Debian packages attn's build, tests, benchmarks and example need.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  g++ make cmake ca-certificates gettext-base \
  libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev \
  nlohmann-json3-dev libsentencepiece-dev libcli11-dev zlib1g-dev \
  libopenmpi-dev openmpi-bin >/dev/null
