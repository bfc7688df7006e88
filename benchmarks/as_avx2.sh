#!/usr/bin/env bash
# Run a command as it runs on an AVX2-only CPU (AMD Zen 1-3), on an AVX-512 one (Zen 4): PyTorch's own
# kernels, oneDNN and MKL limited to AVX2, and no native bf16 (so --precision auto picks fp32, as there).
# The kernels and dtypes are what differ between the two kinds of CPU the team gets, so a test suite or a
# lab result checked this way is checked for both on whichever machine a session has:
#   benchmarks/as_avx2.sh python -m pytest -q
#   benchmarks/as_avx2.sh charlm lab recall --seeds 3 --json
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
# the compiled decode step (models/_decode_kernel.py): AVX2 + FMA code only (numba caches it apart)
export NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES="+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,+popcnt,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave"
export PYTHONPATH="$here/as_avx2${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
