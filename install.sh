#!/usr/bin/env bash
# Installs what the pipeline and its tests need into the current Python environment:
# the Python packages (requirements.txt) and espeak-ng (speaks corpora for the tests and
# pipeline.make_corpus; the demo corpus ships pre-spoken, so training needs no espeak-ng).
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v espeak-ng >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng >/dev/null
  elif command -v sudo >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng >/dev/null
  else
    echo "install.sh: espeak-ng is missing and cannot be installed without root; the tests need it" >&2
  fi
fi
python3 -m pip install -q --disable-pip-version-check -r requirements.txt

# --- SLURM on localhost (tests/test_slurm.py, scripts/local-slurm.sh) ---------------------------
# munge, slurmctld, slurmd, slurmdbd, slurm-client and mariadb-server from Debian's packages, so
# that the SLURM test runs; it needs root, and skips without these packages (about 35 s).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  bash scripts/local-slurm.sh install
else
  echo "install.sh: not root, so no SLURM packages: tests/test_slurm.py will skip" >&2
fi
