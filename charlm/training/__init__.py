"""Training a model: the Trainer (trainer.py: set-up, the loop, evaluation, saving, DDP) and its parts, each in its
own module -- the optimizer (optim.py), the learning-rate and evaluation schedule (schedule.py), Ctrl-C and the
other signals (stopping.py), distillation from a teacher (distill.py), torchrun's process group (distributed.py),
the events a run reports (events.py), the memory estimate made before any work (memory.py) and the run a resume
continues (resume.py). Nothing is re-exported here: import the module you need (charlm.training.trainer, ...)."""
