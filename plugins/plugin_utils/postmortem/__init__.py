# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Job post-mortem (controller side): which rank stopped a hung training job, on which node and GPU, and why.

  dump_reader  flight-recorder dumps: restricted unpickling with size, time and memory limits -> compact per-rank data
  flight       cross-rank analysis of the dumps: per process group the sequences, who never joined, mismatches
  logs         the same questions from the watchdog lines alone (node-parsed, merged across nodes, in a window)
  topology     rank -> host -> local rank -> GPU (index, PCI, UUID)
  hardware     that GPU's XIDs, lost GPUs and PSU rails in the window
  verdict      one verdict with its confidence and every piece of evidence
  findings     the findings in the collection's contract (severity, code, gpu, pci, check, message, action, evidence)
  analysis     all of the above from the nodes' job_evidence results
  document     the post-mortem JSON (versioned schema) and its Markdown / HTML renderings
Everything but document is stdlib-only and pure: limits and windows are arguments, bad input never raises.
"""
