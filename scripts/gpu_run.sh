#!/usr/bin/env bash
# One call on the GPU machine: build, C++ tests, Python tests, kforge check, compute-sanitizer
# memcheck of the C++ GPU tests (every candidate plan of every family) and racecheck of the norm and
# softmax block and cluster reductions, kforge bench --save. Every step is time-boxed and
# the run goes on after a failed step; the whole run keeps inside KF_DEADLINE seconds (default 570:
# the device's 10-minute limit per command, less a margin). Run from anywhere; it works in the
# repository root.
#
#   scripts/gpu_run.sh OUTDIR [STEP ...]    STEP: build ctest pytest check sanitizer racecheck bench
#                                           (default all)
#
# OUTDIR gets few files (the device returns at most 8, two folder levels deep):
#   OUTDIR/log.txt                    every step's output, concatenated in order, with headers
#   OUTDIR/bench/bench.csv            one row per (op, mode, shape, dtype, provider)
#   OUTDIR/bench/summary.txt          the bench summary table
#   OUTDIR/bench/<op>.png             GB/s per shape and provider, copy bandwidth line
#   OUTDIR/bench/<gpu>.csv            benchmarks/<gpu>.csv as `kforge bench --save` rewrote it (the
#                                     device's copy of the tree does not come back: commit this file)
# The last lines printed are the key results and a table: step, status, seconds.
#
# Environment:
#   KF_DEADLINE=570            seconds for the whole run (the bench stops starting cases in time)
#   KF_BENCH_ARGS="..."        extra arguments for `kforge bench` (e.g. "rms_norm --quick")
#   KF_CHECK_ARGS="..."        extra arguments for `kforge check`
#   KF_CTEST_ARGS="..."        extra arguments for ctest (e.g. "-R 'softmax|ce_'")
#   KF_CTEST_JOBS=4            ctest -j (the GPU tests share the GPU; their host references use the cores)
#   KF_PYTEST_JOBS=1           pytest -n when > 1 (pytest-xdist, if importable; 4 measured slower than serial)
#   KF_PYTEST_ARGS="..."       the pytest paths/options (default tests/python: everything; the whole suite
#                              takes about 10 minutes on the H100, so split it over two calls by file)
#   KF_PYTEST_BOX=320          seconds for the pytest step
#   KF_SANITIZER_FILTER=...    gtest filter for the memcheck run (default '*Gpu*': every C++ GPU test,
#                              which runs every candidate plan of every family)
#   KF_RACECHECK_BOX=120       seconds for the racecheck step
#   KF_RACECHECK_FILTER=...    gtest filter for the racecheck run (default: the norm and softmax GPU
#                              tests whose plans reduce across a block or a cluster, a subset that
#                              fits the step's time box)
#   KF_COMMIT=<sha>            commit stamped into the CSV when the tree has no .git
#   KF_JOBS, KF_CUDA_ARCHS     build parallelism (default nproc) and arch (default 90a-real)
# Carried extras (name them in the device call's `carry`):
#   .whl/*.whl                 wheels (liger_kernel, diffusers, kernels; nvidia_cutlass: its headers build the
#                              sm_90a grouped GEMM) installed into /tmp/site, best effort
#   .gtest/                    a GoogleTest source tree, used when the machine has none installed
set -uo pipefail
export PYTHONUNBUFFERED=1

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
shift
ALL_STEPS=(build ctest pytest check sanitizer racecheck bench)
STEPS=("$@")
[[ ${#STEPS[@]} -eq 0 ]] && STEPS=("${ALL_STEPS[@]}")
for s in "${STEPS[@]}"; do
  [[ " ${ALL_STEPS[*]} " == *" $s "* ]] || { echo "gpu_run.sh: unknown step '$s' (steps: ${ALL_STEPS[*]})"; exit 2; }
done
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
T0=$(date +%s)
DEADLINE=$((T0 + ${KF_DEADLINE:-570}))
LOG=$OUT/log.txt
TMPD=$(mktemp -d /tmp/kf_gpu_run.XXXXXX)
touch "$TMPD/start"  # files newer than this were written by this run
: >"$LOG"
declare -a ROWS=()

say() { echo "$*" | tee -a "$LOG"; }

# ---- preflight: what machine, which tools ------------------------------------------------------
{
  echo "==== preflight $(date -u +%FT%TZ) host $(hostname) repo $ROOT"
  nvidia-smi || echo "!! nvidia-smi failed"
  python3 - <<'EOF' || echo "!! python3 / torch failed"
import sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| gpu available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "| SMs", p.multi_processor_count, "| L2 MiB",
          getattr(p, "L2_cache_size", 0) / 2**20, "| mem GiB", round(p.total_memory / 2**30, 1))
for mod in ("triton", "matplotlib", "pytest", "transformers", "diffusers"):
    try:
        m = __import__(mod)
        print(f"{mod} {getattr(m, '__version__', '?')}")
    except Exception as e:
        print(f"{mod}: missing ({type(e).__name__}: {e})")
EOF
  for tool in nvcc cmake ninja ctest compute-sanitizer; do
    if command -v "$tool" >/dev/null; then
      echo "$tool: $(command -v "$tool") | $("$tool" --version 2>&1 | grep -m1 -iE 'version|release|^[0-9]' || true)"
    else
      echo "!! $tool: not found"
    fi
  done
} 2>&1 | tee -a "$LOG"

# KF_COMMIT, else a carried .commit file (the device's copy may hold a stale .git), else git.
COMMIT=${KF_COMMIT:-$(cat "$ROOT/.commit" 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || true)}
export KF_COMMIT=$COMMIT
say "commit: ${COMMIT:-unknown (no .git here; pass KF_COMMIT=<sha>)}"

# GoogleTest: installed, else a carried .gtest/ source tree, else build without the C++ tests.
GTEST_NOTE=""
have_gtest() {
  [[ -f /usr/src/googletest/CMakeLists.txt ]] && return 0
  local g
  for g in /usr/lib*/cmake/GTest/GTestConfig.cmake /usr/lib/*/cmake/GTest/GTestConfig.cmake \
           /usr/local/lib*/cmake/GTest/GTestConfig.cmake /usr/lib*/libgtest.* /usr/lib/*/libgtest.* \
           /usr/local/lib*/libgtest.*; do
    [[ -e $g ]] && return 0
  done
  return 1
}
if have_gtest; then
  GTEST_NOTE="GoogleTest: installed"
elif [[ -f $ROOT/.gtest/CMakeLists.txt ]]; then
  export KF_CMAKE_ARGS="${KF_CMAKE_ARGS:-} -DKF_GTEST_SOURCE_DIR=$ROOT/.gtest"
  GTEST_NOTE="GoogleTest: carried .gtest/"
else
  GTEST_NOTE="GoogleTest: none seen (no /usr/src/googletest, no carried .gtest/); if CMake finds none
  either, the build step retries without the C++ tests (ctest and memcheck are then skipped)"
fi
say "$GTEST_NOTE"

# Wheels carried in .whl/ (liger_kernel for the bench): best effort.
PYPATH=$ROOT/python
if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target /tmp/site "$ROOT"/.whl/*.whl >>"$LOG" 2>&1; then
    PYPATH=$PYPATH:/tmp/site
    say "wheels: installed into /tmp/site:$(for w in "$ROOT"/.whl/*.whl; do printf ' %s' "${w##*/}"; done)"
    for mod in liger_kernel diffusers; do  # the carried packages import with the image's own dependencies
      say "  $mod: $(cd / && PYTHONPATH=/tmp/site python3 -c "import $mod as m; print(getattr(m, '__version__', 'ok'))" 2>&1 | tail -1)"
    done
  else
    say "!! wheels: install failed (see log); going on without them"
  fi
fi
export PYPATH
# CUTLASS's headers for the sm_90a grouped GEMM: from the carried nvidia-cutlass wheel when there is one
if [[ -z ${KF_CUTLASS_DIR:-} && -f /tmp/site/cutlass_library/source/include/cute/tensor.hpp ]]; then
  export KF_CUTLASS_DIR=/tmp/site/cutlass_library/source
  say "CUTLASS: $KF_CUTLASS_DIR"
fi

# ---- steps --------------------------------------------------------------------------------------
# run_step NAME CAP_SECONDS COMMAND: time-boxed by `timeout`, output to log.txt (and TMPD/NAME.log)
run_step() {
  local name=$1 cap=$2 cmd=$3
  local now left t start rc status secs
  now=$(date +%s)
  left=$((DEADLINE - now - 15))
  t=$((cap < left ? cap : left))
  if ((t < 20)); then
    ROWS+=("$name|SKIP (no time left)|0")
    say "==== [$name] skipped: no time left before the deadline"
    return
  fi
  say "==== [$name] $(date -u +%T) timeout ${t}s"
  echo "\$ $cmd" >>"$LOG"
  start=$(date +%s)
  STEP_TIMEOUT=$t timeout -k 10 "$t" bash -c "$cmd" 2>&1 | tee "$TMPD/$name.log" >>"$LOG"
  rc=${PIPESTATUS[0]}
  secs=$(($(date +%s) - start))
  case $rc in
    0) status=ok ;;
    124 | 137) status="TIMEOUT (${t}s)" ;;
    *) status="FAIL (rc $rc)" ;;
  esac
  ROWS+=("$name|$status|$secs")
  say "==== [$name] $status in ${secs}s"
}

want() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }

# ctest and pytest run side by side after the build when KF_PARALLEL=1 (default): neither times
# anything, and one after another the correctness steps leave the bench no time (on the H100: ctest
# 97 s, pytest 166 s, check 25 s, memcheck > 150 s; side by side ctest 124 s, pytest 233 s). check
# and the sanitizers run alone after them: the GPU time-slices between processes, and check beside
# other GPU processes ran past 150 s (25 s alone). Each background step's output goes to its own
# file, appended to log.txt in step order once all have ended.
declare -a BG=()
bg_step() {  # bg_step NAME CAP COMMAND: run_step in the background (KF_PARALLEL=1) or in place
  if [[ ${KF_PARALLEL:-1} != 1 ]]; then
    run_step "$@"
    return
  fi
  local name=$1
  (
    LOG=$TMPD/$name.full
    : >"$LOG"
    ROWS=()
    run_step "$@" >/dev/null
    printf '%s\n' "${ROWS[@]}" >"$TMPD/$name.row"
  ) &
  BG+=("$name")
  say "==== [$name] started in the background"
}
join_steps() {
  wait
  local n r
  for n in "${BG[@]}"; do
    cat "$TMPD/$n.full" >>"$LOG"
    while IFS= read -r r; do [[ -n $r ]] && ROWS+=("$r"); done <"$TMPD/$n.row"
    grep -E '^==== \[' "$TMPD/$n.full" | tail -n 1
  done
  BG=()
}
# memcheck: every C++ GPU test (each runs every candidate plan of its shapes through launch_with_plan).
export SAN_FILTER='*Gpu*'
# racecheck (shared-memory hazards) is ~10-100x slower than memcheck: the norm and softmax forward
# and backward tests of the shapes whose plans reduce across a block (rows of thousands of elements)
# or a cluster (the longest rows), every dtype.
export RACE_FILTER='*NormGpu.RmsNorm/*:*NormGpu.RmsNormBackward/*:*NormGpu.LayerNormBackward/*:*SoftmaxGpu.Forward/*:*SoftmaxGpu.Backward/*'

# C++ tests are skipped only when the build was configured without them
tests_built() { ! grep -qs '^KF_BUILD_TESTS:BOOL=OFF' _build/dev/CMakeCache.txt; }

# shellcheck disable=SC2016  # expanded by the step's own bash
want build && run_step build 330 '
  export KF_CUDA_ARCHS=${KF_CUDA_ARCHS:-90a-real} KF_JOBS=${KF_JOBS:-$(nproc)}
  out=$(mktemp)
  scripts/dev_build.sh 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if [[ $rc -ne 0 ]] && grep -qE "need GoogleTest|holds no CMakeLists" "$out"; then
    echo "!! no GoogleTest on this machine: building without the C++ tests (carry .gtest/ to get them)"
    KF_CMAKE_ARGS="${KF_CMAKE_ARGS:-} -DKF_GTEST_SOURCE_DIR= -DKF_BUILD_TESTS=OFF" scripts/dev_build.sh
    rc=$?
  fi
  exit $rc'

if want ctest; then
  if tests_built; then
    bg_step ctest 240 "KF_REQUIRE_GPU=1 ctest --test-dir _build/dev --output-on-failure --timeout 200 -j ${KF_CTEST_JOBS:-4} ${KF_CTEST_ARGS:-}"
  else
    ROWS+=("ctest|SKIP (tests not built)|0")
  fi
fi

# pytest-xdist, where installed and asked for: KF_PYTEST_JOBS workers, one test file per worker at a time
# (default 1, serial: with 4 workers the suite took longer than its 180 s box, serial 120-140 s)
XDIST=""
if [[ ${KF_PYTEST_JOBS:-1} -gt 1 ]] && PYTHONPATH=$PYPATH python3 -c "import xdist" 2>/dev/null; then
  XDIST="-n ${KF_PYTEST_JOBS} --dist loadfile"
fi
want pytest && bg_step pytest "${KF_PYTEST_BOX:-320}" \
  "PYTHONPATH=\$PYPATH KF_REQUIRE_GPU=1 python3 -m pytest ${KF_PYTEST_ARGS:-tests/python} $XDIST -q -rfE -p no:cacheprovider"


join_steps

want check && run_step check 120 "PYTHONPATH=\$PYPATH python3 -m kernelforge.cli check ${KF_CHECK_ARGS:-}"

if want sanitizer; then
  if tests_built; then
    # shellcheck disable=SC2016  # expanded by the step's own bash
    run_step sanitizer 200 '
      bin=$(find _build/dev/tests/cpp _build/dev -maxdepth 3 -type f -perm -u+x -name kf_tests 2>/dev/null | head -n1)
      [[ -n $bin ]] || bin=$(find _build/dev/tests/cpp -maxdepth 2 -type f -perm -u+x -name "*test*" 2>/dev/null | head -n1)
      [[ -n $bin ]] || { echo "no C++ test binary under _build/dev/tests/cpp"; exit 3; }
      echo "memcheck: $bin --gtest_filter=${KF_SANITIZER_FILTER:-$SAN_FILTER}"
      KF_REQUIRE_GPU=1 compute-sanitizer --tool memcheck --error-exitcode 86 --print-limit 50 \
        "$bin" --gtest_filter="${KF_SANITIZER_FILTER:-$SAN_FILTER}"'
  else
    ROWS+=("sanitizer|SKIP (tests not built)|0")
  fi
fi

# racecheck of the block and cluster reductions: shared-memory and distributed-shared-memory hazards.
if want racecheck; then
  if tests_built; then
    # shellcheck disable=SC2016  # expanded by the step's own bash
    run_step racecheck ${KF_RACECHECK_BOX:-120} '
      bin=$(find _build/dev/tests/cpp -maxdepth 2 -type f -perm -u+x -name kf_tests 2>/dev/null | head -n1)
      [[ -n $bin ]] || { echo "no kf_tests under _build/dev/tests/cpp"; exit 3; }
      echo "racecheck: $bin --gtest_filter=${KF_RACECHECK_FILTER:-$RACE_FILTER}"
      KF_REQUIRE_GPU=1 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 86 \
        --print-limit 50 "$bin" --gtest_filter="${KF_RACECHECK_FILTER:-$RACE_FILTER}"'
  else
    ROWS+=("racecheck|SKIP (tests not built)|0")
  fi
fi

# The bench gets what is left (up to 480 s) and stops starting new cases 75 s before its timeout,
# so the CSV, the PNGs and the summary are always written. --save rewrites benchmarks/<gpu>.csv,
# copied to OUTDIR/bench/ because the device's tree does not come back.
# shellcheck disable=SC2016  # expanded by the step's own bash
want bench && run_step bench 480 '
  PYTHONPATH=$PYPATH python3 -m kernelforge.cli bench --save --out "'"$OUT"'/bench" \
    --max-seconds $((STEP_TIMEOUT > 150 ? STEP_TIMEOUT - 75 : STEP_TIMEOUT / 2)) ${KF_BENCH_ARGS:-}
  rc=$?
  for f in benchmarks/*.csv; do [[ $f -nt "'"$TMPD"'/start" ]] && cp -f "$f" "'"$OUT"'/bench/"; done
  exit $rc'

# ---- results ------------------------------------------------------------------------------------
excerpt() {  # excerpt STEP PATTERN MAXLINES
  [[ -f $TMPD/$1.log ]] || return 0
  echo "--- $1"
  grep -E "$2" "$TMPD/$1.log" | tail -n "$3"
}
{
  echo
  echo "==== results"
  excerpt build 'error|Error|built:' 15
  excerpt ctest 'tests passed|tests failed|Failed|\*\*\*' 15
  excerpt pytest '(passed|failed|error|skipped)( |,|$)|^FAILED|^ERROR' 25
  excerpt check '^(PASS|FAIL) |^ {8}|kforge check|Error' 40
  excerpt sanitizer 'ERROR SUMMARY|Invalid|memcheck:|PASSED|FAILED' 15
  excerpt racecheck 'ERROR SUMMARY|RACECHECK SUMMARY|[Hh]azard|racecheck:|PASSED|FAILED' 15
  if [[ -f $OUT/bench/summary.txt ]]; then
    echo "--- bench ($OUT/bench)"
    head -n 90 "$OUT/bench/summary.txt"
  else
    excerpt bench 'kforge bench|Traceback|Error' 10
  fi
  echo
  printf '%-10s %-24s %8s\n' step status seconds
  for r in "${ROWS[@]}"; do
    IFS='|' read -r n s secs <<<"$r"
    printf '%-10s %-24s %8s\n' "$n" "$s" "$secs"
  done
  printf '%-10s %-24s %8s\n' total "" $(($(date +%s) - T0))
} 2>&1 | tee -a "$LOG"
rm -rf "$TMPD"
for r in "${ROWS[@]}"; do [[ $r == *"|ok|"* || $r == *"|SKIP"* ]] || exit 1; done
exit 0
