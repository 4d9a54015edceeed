"""gpufleet_metrics for training scripts (kentino.gpufleet.elastic_training puts this directory on PYTHONPATH):
per-rank training health metrics for node_exporter's textfile collector. The code:
ansible_collections/kentino/gpufleet/plugins/module_utils/gpufleet_metrics.py (docs/training.md)."""
from ansible_collections.kentino.gpufleet.plugins.module_utils.gpufleet_metrics import *  # noqa: F401,F403
