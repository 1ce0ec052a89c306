#!/usr/bin/env bash
# ATOM's block manager (ROCm/ATOM, not on the package index) under the block-manager harness,
# on CPU, opt-in and outside the package and its tests.
#
#   engines/atom/run.sh SRC [pytest args...]
#
# SRC: a directory holding ATOM's atom/ package, e.g. exported from a clone outside this repo:
#   git -C ATOM_CLONE archive HEAD atom | tar -x -C /tmp/atom-main
#   git -C ATOM_CLONE fetch origin pull/1358/head && git -C ATOM_CLONE archive FETCH_HEAD atom | tar -x -C /tmp/atom-pr1358
# HARNESS_ENGINE labels the source ("atom main ffdf3bb5d", "atom pr1358 ab292ea1f": the keys of
# the strict xfails in engines/lab/test_block_managers.py).
# PREFIXCACHE_BLOCK_MANAGER_IMAGES=1 passes images through (ATOM serves VLMs; its hashing is
# token-only). msgspec and xxhash (the block manager's only third-party imports) go into the
# git-ignored .engines/atom/site.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
src=$(cd "${1:?usage: run.sh SRC [pytest args...]}" && pwd); shift
site=$here/.engines/atom/site
if [ ! -d "$site/msgspec" ]; then
  "$py" -m pip install -q --target "$site" msgspec==0.22.0 xxhash==4.1.0
fi
export ATOM_SRC=$src
export HARNESS_ENGINE=${HARNESS_ENGINE:-atom (unlabelled source)}
export PYTHONPATH=$here/engines/atom:$site${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1
export PREFIXCACHE_BLOCK_MANAGER=atom_harness:block_manager
export PREFIXCACHE_SEQUENCE=atom_harness:sequence
# ATOM's own Scheduler, driven as its engine core does; PREFIXCACHE_SCHEDULER= (empty) drives the
# block manager alone, as before
export PREFIXCACHE_SCHEDULER=${PREFIXCACHE_SCHEDULER-atom_harness:scheduler}
export PREFIXCACHE_NUM_BLOCKS=${PREFIXCACHE_NUM_BLOCKS:-64}
# runs in the caller's working directory (its .prefixcache/ holds reports and shrunk failures);
# TARGETED=1 runs the targeted checks and their strict xfails (engines/lab/test_block_managers.py)
if [ "${TARGETED:-0}" = 1 ]; then
  exec "$py" -m pytest -p no:cacheprovider "$here/engines/lab/test_block_managers.py" "$@"
fi
exec "$py" -m pytest -p no:cacheprovider --prefixcache-verify \
  --prefixcache-engine=reference_engine.harness:from_env --pyargs pytest_prefixcache.suite "$@"
