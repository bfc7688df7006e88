"""What charlm keeps on disk and how it is read back: the checkpoint format and its one owner (checkpoint.py),
its safetensors layout (safetensors_file.py), an older charlm's .pt files read without running code
(safe_pickle.py), the int8/int4 weights of charlm compress (quantized.py) and run directories -- naming, the lock,
listing, metrics.jsonl, the resume rule (runs.py). Nothing is re-exported here: import the module you need
(charlm.storage.checkpoint, ...)."""
