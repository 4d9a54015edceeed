# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""CUDA's error texts as the tools print them, and what error 802 means for a node (stdlib only; node and controller).

DRIVER_ERRORS: cuGetErrorString's text -> (CUresult, cuGetErrorName) for the errors that stop a burn or a job at start
(CUDA driver API, cuda.h). NOT_READY matches error 802 (CUDA_ERROR_SYSTEM_NOT_READY, the runtime's
cudaErrorSystemNotReady) in every spelling torch, the CUDA runtime and the driver API print: on an NVSwitch machine it
means the GPUs are not registered with the NVLink fabric, i.e. the fabric manager is not running at the driver's
version.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

SYSTEM_NOT_READY = 802
DRIVER_ERRORS = {
    "system not yet initialized": (802, "CUDA_ERROR_SYSTEM_NOT_READY"),
    "initialization error": (3, "CUDA_ERROR_NOT_INITIALIZED"),
    "no cuda-capable device is detected": (100, "CUDA_ERROR_NO_DEVICE"),
    "os call failed or operation not supported on this os": (304, "CUDA_ERROR_OPERATING_SYSTEM"),
    "out of memory": (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    "unknown error": (999, "CUDA_ERROR_UNKNOWN"),
}
NOT_READY = re.compile(r"Error 802\b|\(802\)|system not yet initialized|cudaErrorSystemNotReady|"
                       r"CUDA_ERROR_SYSTEM_NOT_READY", re.I)


def driver_error(text):
    """(CUresult, name) of a cuGetErrorString text, or (None, None) for a text not in DRIVER_ERRORS."""
    return DRIVER_ERRORS.get(" ".join(str(text or "").split()).rstrip(".").lower(), (None, None))


def not_ready_action(host):
    """What the operator does about error 802 on `host` (the dry run's and the burn's findings say the same)."""
    return ("start the fabric manager at exactly the driver's version on %s (systemctl enable --now "
            "nvidia-fabricmanager; kentino.gpufleet.fabric_manager installs and pins it), wait until every GPU's "
            "fabric state is Completed (nvidia-smi -q | grep -A 3 Fabric), then rerun; the nvlink check's FABRIC_* "
            "findings say what is wrong" % host)
