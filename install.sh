#!/usr/bin/env bash
# Installs what the pipeline and its tests need into the current Python environment:
# the Python packages (requirements.txt) and espeak-ng with its library libespeak-ng1 (the phoneme
# front end, text.frontend: phonemes, loads the library through phonemizer; pipeline.make_corpus
# and the tests speak corpora with the espeak-ng command).
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v espeak-ng >/dev/null 2>&1 || ! ldconfig -p 2>/dev/null | grep libespeak-ng >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng libespeak-ng1 >/dev/null
  elif command -v sudo >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng libespeak-ng1 >/dev/null
  else
    echo "install.sh: espeak-ng (libespeak-ng1) is missing and cannot be installed without root; the phoneme front end and the tests need it" >&2
  fi
fi
python3 -m pip install -q --disable-pip-version-check -r requirements.txt
# the checkout itself, editable (no copy: the code stays here), so that `python -m pipeline.speak` and the
# other commands work from any working folder, beside a run of one's own (README: another working folder).
# Offline, without the setuptools a build fetches, it builds with the environment's own; failing that, it
# says so and goes on (the commands then work inside the checkout, as Snakemake's jobs always do).
python3 -m pip install -q --disable-pip-version-check --no-deps -e . 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . \
  || echo "install.sh: the checkout was not installed (see pip's message above): python -m pipeline.... works only inside $(pwd)" >&2

# --- headless Chromium (tests/test_serve.py drives the voice server's page with it) -----------------
# Debian's chromium and chromium-driver; without root they are not installed and that one test skips.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "install.sh: not root, so no chromium / chromium-driver: the browser test of tests/test_serve.py will skip" >&2
  fi
fi

# --- SLURM on localhost (tests/test_slurm.py, scripts/local-slurm.sh) ---------------------------
# munge, slurmctld, slurmd, slurmdbd, slurm-client and mariadb-server from Debian's packages, so
# that the SLURM test runs; it needs root, and skips without these packages (about 35 s).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  bash scripts/local-slurm.sh install
else
  echo "install.sh: not root, so no SLURM packages: tests/test_slurm.py will skip" >&2
fi
