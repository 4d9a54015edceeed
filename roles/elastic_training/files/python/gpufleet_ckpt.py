"""gpufleet_ckpt for training scripts (kentino.gpufleet.elastic_training puts this directory on PYTHONPATH): save
checkpoints atomically, resume from the newest complete one. The code and its contract:
ansible_collections/kentino/gpufleet/plugins/module_utils/gpufleet_ckpt.py (docs/training.md)."""
from ansible_collections.kentino.gpufleet.plugins.module_utils.gpufleet_ckpt import *  # noqa: F401,F403
