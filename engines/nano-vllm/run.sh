#!/usr/bin/env bash
# nano-vllm's real block manager, sequence and scheduler under the block-manager harness
# (reference_engine/harness), opt-in and outside the package and its tests.
#
#   engines/nano-vllm/run.sh fork [pytest args...]     nano-vllm-fork 20260210 from the package index
#   engines/nano-vllm/run.sh github DIR [pytest args]  a checkout of GeeeekExplorer/nano-vllm at DIR
#                                                      (HARNESS_ENGINE="nano-vllm bb823b3" labels it)
#
# nano-vllm's package __init__ imports its LLM class, hence torch, triton and a GPU model
# runner; its block manager, sequence and scheduler need none of them (numpy, xxhash and, for
# the scheduler's Config import, transformers). So the fork is installed --no-deps into the
# git-ignored .engines/nano-vllm/site, and a shim package nanovllm/ (written here, ours) whose
# __init__ only points __path__ at the real package skips that import. Nothing of nano-vllm is
# copied into the repository.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
root=$here/.engines/nano-vllm
what=${1:?usage: run.sh fork|github DIR [pytest args...]}; shift
case $what in
  fork)
    if [ ! -d "$root/site/nanovllm" ]; then
      "$py" -m pip install -q --no-deps --target "$root/site" nano-vllm-fork==20260210 xxhash==3.6.0
    fi
    real=$root/site/nanovllm; extra=$root/site
    export HARNESS_ENGINE="nano-vllm-fork 20260210" ;;
  github)
    src=${1:?usage: run.sh github DIR}; shift
    if [ ! -d "$root/xxhash/xxhash" ]; then
      "$py" -m pip install -q --target "$root/xxhash" xxhash==3.6.0
    fi
    real=$(cd "$src" && pwd)/nanovllm; extra=$root/xxhash
    export HARNESS_ENGINE=${HARNESS_ENGINE:-nano-vllm checkout} ;;
  *) echo "run.sh: $what is not fork or github" >&2; exit 2 ;;
esac
shim=$root/shim-$what
mkdir -p "$shim/nanovllm"
printf '__path__ = [%s]\n' "'$real'" > "$shim/nanovllm/__init__.py"
export PYTHONPATH=$shim:$extra${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1
export PREFIXCACHE_BLOCK_MANAGER=nanovllm.engine.block_manager:BlockManager
export PREFIXCACHE_SEQUENCE=nanovllm.engine.sequence:Sequence
export PREFIXCACHE_SCHEDULER=nanovllm.engine.scheduler:Scheduler
export PREFIXCACHE_NUM_BLOCKS=${PREFIXCACHE_NUM_BLOCKS:-64}
# runs in the caller's working directory (its .prefixcache/ holds reports and shrunk failures);
# TARGETED=1 runs the targeted checks and their strict xfails (engines/lab/test_block_managers.py)
if [ "${TARGETED:-0}" = 1 ]; then
  exec "$py" -m pytest -p no:cacheprovider "$here/engines/lab/test_block_managers.py" "$@"
fi
exec "$py" -m pytest -p no:cacheprovider --prefixcache-verify \
  --prefixcache-engine=reference_engine.harness:from_env --pyargs pytest_prefixcache.suite "$@"
