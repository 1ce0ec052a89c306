# The shell the engines' run scripts share (engines/llama/run.sh, engines/vllm/run.sh,
# engines/seed/run.sh, engines/omlx/verify.sh and install.sh), sourced after they set ROOT
# (this checkout) and PYTHON (this project's Python). Defines functions and two word lists; runs nothing.

# lab_main_checkout: the main checkout of this worktree (where .engines/ lives, git-ignored and
# shared by its worktrees), or ROOT outside git
lab_main_checkout() {
  local common
  common="$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
  if [ -n "$common" ]; then dirname "$common"; else echo "$ROOT"; fi
}

# lab_combos MATRIX [NAME]...: the combination names of the matrix file, all or those NAMEs
# give (a configuration's name stands for its combinations), in that order
lab_combos() {
  "$PYTHON" - "$@" <<'PY'
import sys
from pathlib import Path
from pytest_prefixcache.session.matrix_file import read_matrix
targets = read_matrix(Path(sys.argv[1]))
for name in sys.argv[2:] or [t.name for t in targets]:
    for t in targets:
        if name in (t.name, t.base):
            print(t.name)
PY
}

# The words after "$PYTHON" that run the plugin's built-in suite as the lab does (seed 1, a
# 600 s timeout per engine call); each run adds its engine, report and examples.
LAB_SUITE=(-m pytest -p no:randomly -p no:cacheprovider -q -rfE --prefixcache-verify
  --pyargs pytest_prefixcache.suite --prefixcache-seed=1 --prefixcache-timeout=600)
# The words that run an opt-in test module's targeted checks with --runxfail: the findings need
# what really failed (the findings script compares it with the strict xfails the module
# declares); each run adds the module and its --junitxml.
LAB_CHECKS=(-m pytest -p no:randomly -p no:cacheprovider -q -rfEs --runxfail)
