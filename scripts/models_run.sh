#!/usr/bin/env bash
# The model-level reports on the GPU machine, one after another, each time-boxed: `kforge levels`
# (the small Llama, ViT-B/16 and the PyG GraphSAGE at each optimization level), `kforge profile`
# (the Llama-1B-shaped training step, by op family, before and after kf.patch) and `kforge bench e2e`
# (whole model steps, a process per provider). Expects a built binding (scripts/gpu_run.sh OUTDIR
# build, which also installs the carried wheels into /tmp/site; or KF_PYPATH).
#
#   scripts/models_run.sh OUTDIR [--quick]
#
# --quick: levels and e2e with --quick (1-2 warm-up and 3 timed steps) and e2e on the Llama-1B
# training step only: the three commands in under 10 minutes on the H100 (each compile provider of a
# Llama-1B-sized e2e case takes 1-2 minutes of compiling in its fresh process). Without it: the
# default steps, e2e on llama_train, llama_prefill, vit_train and ltx (about 20 minutes).
#
# Writes OUTDIR/log.txt and OUTDIR/models.tar: <gpu>_levels.csv, <gpu>_levels_<model>.png,
# <gpu>_profile_<model>.csv/.png, <gpu>_e2e.csv/.png (the names benchmarks/ keeps them under; one
# archive because the device returns few files). Prints each command's seconds.
#
# Environment: KF_LEVELS_ARGS, KF_PROFILE_ARGS, KF_E2E_ARGS (extra arguments), KF_MODELS_DEADLINE
# (seconds for the whole run, default 570; the full run needs about 1500).
set -uo pipefail
export PYTHONUNBUFFERED=1
[[ $# -eq 1 || ($# -eq 2 && $2 == --quick) ]] || { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; }
QUICK=()
E2E_CASES=llama_train,llama_prefill,vit_train,ltx
[[ ${2:-} == --quick ]] && QUICK=(--quick) && E2E_CASES=llama_train
mkdir -p "$1/models" || exit 2
OUT=$(cd "$1" && pwd)
cd "$(dirname "$0")/.." || exit 2
PYPATH=${KF_PYPATH:-$PWD/python}
[[ -d /tmp/site ]] && PYPATH=$PYPATH:/tmp/site  # wheels gpu_run.sh installed from .whl/
T0=$(date +%s)
DEADLINE=$((T0 + ${KF_MODELS_DEADLINE:-570}))
LOG=$OUT/log.txt
: >"$LOG"
GPU=$(PYTHONPATH=$PYPATH python3 -c "import torch; from kernelforge.bench.report import gpu_short_name as g
print(g(torch.cuda.get_device_name()))" 2>/dev/null || echo gpu)
declare -a ROWS=()

run() {  # run NAME CAP COMMAND...: time-boxed to min(CAP, what is left)
  local name=$1 cap=$2 left t rc
  shift 2
  left=$((DEADLINE - $(date +%s)))
  ((cap > left)) && cap=$left
  if ((cap < 30)); then ROWS+=("$name|SKIP (no time left)|0"); return; fi
  echo "==== $name (cap ${cap}s): $*" | tee -a "$LOG"
  t=$(date +%s)
  PYTHONPATH=$PYPATH timeout -k 10 "$cap" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  ROWS+=("$name|$([[ $rc -eq 0 ]] && echo ok || echo "FAIL rc=$rc")|$(($(date +%s) - t))")
}

M=$OUT/models
# shellcheck disable=SC2086  # the extra arguments are word lists
run levels 330 python3 -m kernelforge.cli levels --models lm,vit,gnn --out "$M" "${QUICK[@]}" ${KF_LEVELS_ARGS:-}
# shellcheck disable=SC2086
run profile 90 python3 -m kernelforge.cli profile --model llama_train --out "$M" ${KF_PROFILE_ARGS:-}
# shellcheck disable=SC2086
run e2e 1200 python3 -m kernelforge.cli e2e --cases "$E2E_CASES" --out "$M" "${QUICK[@]}" ${KF_E2E_ARGS:-}

(cd "$M" && for f in *; do [[ $f == "${GPU}"_* ]] || mv -f "$f" "${GPU}_$f"; done)
tar -C "$M" -cf "$OUT/models.tar" . 2>>"$LOG"
{
  echo
  printf '%-10s %-24s %8s\n' step status seconds
  for r in "${ROWS[@]}"; do
    IFS='|' read -r n s secs <<<"$r"
    printf '%-10s %-24s %8s\n' "$n" "$s" "$secs"
  done
  printf '%-10s %-24s %8s\n' total "" $(($(date +%s) - T0))
  echo "files: $(cd "$M" && echo *)"
} 2>&1 | tee -a "$LOG"
for r in "${ROWS[@]}"; do [[ $r == *"|ok|"* ]] || exit 1; done
exit 0
