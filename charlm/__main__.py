"""`python -m charlm`: how torchrun starts charlm (`charlm train --nproc N` starts torchrun that way too)."""

import os

from charlm.cli import main

try:
    main()
except SystemExit as e:
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        raise
    from charlm.training.distributed import exit_process

    exit_process(e.code)
