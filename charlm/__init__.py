"""charlm: train small language models on a text file and watch how they remember."""

import os

# OpenMP threads that wait at a barrier sleep instead of spinning. With spinning (GNU OpenMP's default, which
# torch uses on Linux) a thread waits on a partner that a busy CPU has descheduled, burning the time that
# partner needs: beside other CPU-bound programs a tiny run did 1 step where it does hundreds (issue 40;
# benchmarks/RESULTS.md, "Speed, round five"). OpenMP reads this when torch loads, so it is set here, before
# any charlm module can import torch; a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
