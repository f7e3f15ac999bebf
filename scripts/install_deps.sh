#!/usr/bin/env bash
# Installs the Debian packages attn's build, tests, benchmarks and example need, and the example's
# data: trans-de-en (a German-English dictionary) and apt's translated package descriptions.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
# Acquire::Languages=de,en also fetches Debian's English and German package descriptions
# (/var/lib/apt/lists/*_i18n_Translation-{en,de}), part of the example's built-in corpus.
$SUDO apt-get update -qq -o Acquire::Languages=de,en
$SUDO apt-get install -y -qq --no-install-recommends \
  g++ make cmake ca-certificates gettext-base \
  libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev \
  nlohmann-json3-dev libsentencepiece-dev libcli11-dev zlib1g-dev liblz4-dev \
  trans-de-en python3 python3-torch python3-sentencepiece libopenmpi-dev openmpi-bin >/dev/null
