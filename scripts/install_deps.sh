#!/usr/bin/env bash
# Installs what openmla needs to build and test on a fresh Debian/Ubuntu machine (the CUDA
# toolkit itself is expected to be there already; without it the CPU-only build is used).
# System packages come from apt; Python packages go into a virtual environment at .venv
# (override with OPENMLA_VENV), pinned in scripts/requirements.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
python3 -c "import venv, ensurepip" 2>/dev/null || need_apt+=(python3-venv python3-pip)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "openmla: installing system packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

venv="${OPENMLA_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "openmla: creating the Python environment $venv"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch, nanobind, scikit_build_core, pytest, numpy, matplotlib" 2>/dev/null; then
  echo "openmla: installing Python packages into $venv (torch is large: a few minutes)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r scripts/requirements.txt
fi
