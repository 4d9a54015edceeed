# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The fabric search (controller side): pairs of nodes in parallel rounds -> the culprit node or leaf switch.
search.py plans the rounds; the rule that judges them is plugins/module_utils/judge_fabric.py (docs/fabric.md)."""
