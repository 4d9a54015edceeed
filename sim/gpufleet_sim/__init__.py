"""gpufleet-sim: stand-in GPU tools answering from a per-node scenario (stdlib only, Python >= 3.8).

A test and demo instrument for kentino.gpufleet: never imported by the collection's modules, which find these
stand-ins on PATH exactly as they find the real tools. See sim/README.md.
"""

VERSION = "1.0.0"
