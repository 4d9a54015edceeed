#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_burn
short_description: Load every GPU with gpu_burn and judge each one from the tool's own evidence
description:
  - Runs C(gpu_burn) (wilicc/gpu-burn) for O(duration) seconds through the collection's tool runner (own process
    group, the whole group killed on timeout), parses its output and returns one finding per GPU.
  - The exit code and the final C(OK) lines are not trusted. A GPU passes only if it was initialised, did work
    (processed > 0 and Gflop/s > 0), had zero calculation errors in every progress frame and was not reported FAULTY.
  - A failing GPU gives RV(verdict=fail) with C(failed=false) so the play carries on; a missing tool, a timeout or
    unreadable output gives RV(verdict=error). In check mode gpu_burn is not run (RV(verdict=skipped)).
  - Always sets C(CUDA_DEVICE_ORDER=PCI_BUS_ID). The GPUs nvidia-smi can read are passed to gpu_burn by UUID in
    C(CUDA_VISIBLE_DEVICES), so gpu_burn's device k is the k-th of them (RV(gpu_map)) and a GPU lost before the burn
    cannot shift the others' figures. Without nvidia-smi, O(gpus) (or every device) is passed by index.
version_added: "0.1.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.check_common
  - kentino.gpufleet.lease
  - kentino.gpufleet.node_module.tool_check
options:
  duration:
    description: Seconds to burn (gpu_burn's TIME argument).
    type: int
    default: 600
  gpus:
    description:
      - Indexes (as nvidia-smi numbers them) of the GPUs to burn; sets E(CUDA_VISIBLE_DEVICES). Default all GPUs.
      - Results report both the nvidia-smi C(index) and gpu_burn's own C(cuda_index).
    type: list
    elements: int
  doubles:
    description: Use double precision (C(-d)).
    type: bool
    default: false
  tensor_cores:
    description: Try to use tensor cores (C(-tc)).
    type: bool
    default: false
  memory:
    description: GPU memory to use, C(N%) of the free memory or an integer number of MB (C(-m)). Default gpu_burn's 90%.
    type: str
  expected_gpus:
    description:
      - Number of GPUs that must initialise; fewer is RV(verdict=fail). Default the number of GPUs in RV(gpu_map).
    type: int
  chdir:
    description:
      - Directory to run in, where gpu_burn finds its compare kernel (C(compare.fatbin), or C(compare.ptx) before
        gpu-burn's May 2026 Makefile). Default the executable's directory.
      - The alias O(cwd) is deprecated and will be removed in version 1.0.0; use O(chdir).
    type: path
    aliases: [cwd]
  sample:
    description:
      - Sample every GPU with C(nvidia-smi) beside the burn, from just before gpu_burn starts until it ends, as
        M(kentino.gpufleet.gpu_sample) does; the samples come back in RV(sampling), judged with these thresholds.
        One job instead of a second async sampler and a stop mark, so the samples cover exactly the load window
        however long the controller takes to reach every node.
      - Omit to burn without sampling.
    type: dict
    suboptions:
      interval:
        description: Seconds between the starts of two samples.
        type: float
        default: 5
      temp_max_c:
        description: GPU temperature limit in C (C(gpufleet_temp_max_c)).
        type: float
        default: 85.0
      temp_sustained_s:
        description: Seconds above O(sample.temp_max_c) that fail the GPU (C(gpufleet_temp_sustained_s)).
        type: float
        default: 300.0
      load_util_min_pct:
        description: Utilisation from which a sample counts as under load (C(gpufleet_load_util_min_pct)).
        type: float
        default: 50.0
      ecc_corrected_rise:
        description: Rise of volatile corrected ECC errors that warns (C(gpufleet_ecc_corrected_rise)).
        type: int
        default: 1
      thresholds:
        description:
          - The sampling judge's thresholds by their inventory names, as in M(kentino.gpufleet.gpu_sample)'s
            O(kentino.gpufleet.gpu_sample#module:thresholds); they take precedence over the options above. The burn-in
            passes the inventory's (filter C(kentino.gpufleet.check_thresholds)), so the node judges the samples as the
            fleet report does.
        type: dict
  ib_ports:
    description:
      - Read the node's InfiniBand ports (M(kentino.gpufleet.ib_ports)'s check) just before the burn and again when it
        ends, with the first read as the baseline; the error counters' rise under load, port by port, comes back in
        RV(ib_ports), judged with these thresholds. Read also when gpu_burn does not run (missing, check mode), so a
        port that is down is still seen.
      - Omit to leave InfiniBand out.
    type: dict
    suboptions:
      root:
        description: The kernel's InfiniBand class directory.
        type: path
        default: /sys/class/infiniband
      thresholds:
        description:
          - The InfiniBand judge's thresholds by their inventory names, as in M(kentino.gpufleet.ib_ports)'s
            O(kentino.gpufleet.ib_ports#module:thresholds).
        type: dict
  skip:
    description:
      - A reason not to load the GPUs (a burn switched off, GPUs refused as busy); gpu_burn does not run and
        RV(not_run) is this reason, as in check mode; the reads around the load (O(ib_ports), O(nvlink_after),
        O(xid_window)) are still made.
    type: str
    version_added: "0.3.0"
  nvlink_after:
    description:
      - After the load, read NVLink and the fabric as M(kentino.gpufleet.nvlink_facts) does (its reader, all of its
        O(kentino.gpufleet.nvlink_facts#module:gather)), with O(nvlink_after.baseline) as the read before the load;
        the result comes back in RV(nvlink_after) in nvlink_facts' result shape, and its fact C(gpufleet_nvlink) is
        set. One job instead of a module round trip of its own after the burn.
      - Omit to leave NVLink out.
    type: dict
    version_added: "0.3.0"
    suboptions:
      baseline:
        description: The read before the load (nvlink_facts' C(gpufleet_nvlink)), whose error counters the rise is
          measured from.
        type: dict
      fabric_manager_service:
        description: The fabric manager's systemd unit.
        type: str
        default: nvidia-fabricmanager
      sysfs_root:
        description: Where sysfs is mounted (NVSwitch detection).
        type: path
        default: /sys
      procfs_root:
        description: Where procfs is mounted (NVSwitch detection).
        type: path
        default: /proc
      timeout:
        description: Seconds each nvidia-smi call of the read may take.
        type: int
        default: 60
      skip:
        description: A reason not to make this read (switched off, no NVLink on the node); RV(nvlink_after) is then
          a skipped result with this reason, as a stage that does not run records it.
        type: str
  xid_window:
    description:
      - After the load (and after O(nvlink_after)), read the kernel log's XIDs since the position saved in
        O(xid_window.state_file) as M(kentino.gpufleet.xid_facts) does (its reader, source C(auto)), and save the new
        position; the result comes back in RV(xid_window) in xid_facts' result shape, and its fact C(gpufleet_xid) is
        set. A read that fails is that result's failure (with the reason), never the burn's.
      - Omit to leave the kernel log out.
    type: dict
    version_added: "0.3.0"
    suboptions:
      state_file:
        description: The position file of the read before the load (xid_facts' O(kentino.gpufleet.xid_facts#module:state_file)).
        type: path
        required: true
      severity_overrides:
        description: Severity per XID code, as xid_facts' O(kentino.gpufleet.xid_facts#module:severity_overrides).
        type: dict
        default: {}
      timeout:
        description: Seconds the journal or dmesg read may take.
        type: int
        default: 60
notes:
  - O(executable) defaults to C(gpu_burn), then C(gpu-burn), on E(PATH) or in C(/opt/gpufleet/bin), where the
    C(kentino.gpufleet.validation_tools) role installs it.
  - O(timeout) defaults to O(duration) + 120 seconds.
  - Invasive; it saturates the GPUs for O(duration) seconds. Do not run it on nodes with live jobs.
seealso:
  - module: kentino.gpufleet.gpu_sample
    description: Samples temperature, power and the PCIe link while the burn runs.
"""

EXAMPLES = r"""
- name: Burn all GPUs for 10 minutes
  kentino.gpufleet.gpu_burn:
    duration: 600
    expected_gpus: 8
  register: gpufleet_result_gpu_burn

- name: Burn two GPUs with doubles and tensor cores, 80% of memory
  kentino.gpufleet.gpu_burn:
    duration: 120
    gpus: [2, 5]
    doubles: true
    tensor_cores: true
    memory: "80%"
  register: gpufleet_result_gpu_burn
"""

RETURN = r"""
verdict:
  description:
    - The node's own verdict, V(pass), V(warn), V(fail), V(error) or V(skipped), from this check's judge with the
      thresholds given as options. The fleet report judges the same observations again with the inventory's.
  returned: always
  type: str
  sample: fail
reasons:
  description: One line per finding, naming what is wrong, where (GPU, device, path, rank) and what to do.
  returned: always
  type: list
  elements: str
not_run:
  description: Why nothing ran (check mode, a precondition), else null.
  returned: always
  type: str
output_tail:
  description: The last lines the tool printed when it timed out (where it hung), else empty.
  returned: always
  type: list
  elements: str
evidence:
  description: Raw gpu_burn lines that justify the verdict.
  returned: always
  type: list
  elements: str
tool:
  description: How gpu_burn ran (argv, rc, timed_out, duration_s, error).
  returned: always
  type: dict
gpus:
  description:
    - One entry per GPU seen in the output. C(status) is ok, faulty, died, not_initialised or no_work.
    - C(index), C(pci) and C(uuid) are nvidia-smi's, from RV(gpu_map); C(cuda_index) is gpu_burn's own device number.
    - C(errors) counts calculation errors once per summary window (gpu_burn's counters are cumulative between
      summaries); C(error_frames) is the number of progress frames that showed errors.
    - C(gflops_series) is the GPU's throughput over the run, one C([percent, gflops]) pair per progress frame (0 once
      its worker died), thinned evenly to at most 240 points (first and last frame kept).
    - When the output lacks the run's start (no C(Initialized device) lines), C(status) comes from the final
      C(GPU n OK/FAULTY) lines, the C((DIED!)) markers and the error counts, and the verdict is never pass.
  returned: when gpu_burn ran
  type: list
  elements: dict
  sample:
    - {index: 0, cuda_index: 0, status: ok, errors: 0, error_frames: 0, gflops_max: 7122.0, gflops_mean: 7109.9,
       max_temperature_c: 64, max_power_w: null, frames: 10, processed: 2670, final: OK, initialised: true,
       gflops_series: [[10.0, 7100.0], [20.0, 7111.0], [30.0, 7122.0]]}
gpu_map:
  description: gpu_burn's devices as nvidia-smi names them (cuda_index, index, pci, uuid); null without nvidia-smi.
  returned: when gpu_burn ran
  type: list
  elements: dict
gpu_map_problem:
  description: Why the map could not be read (then devices are numbered as O(gpus) or gpu_burn gives them); else null.
  returned: when gpu_burn ran
  type: str
expected_gpus:
  description: GPUs that had to initialise (O(expected_gpus), else the map's length).
  returned: always
  type: int
initialised_gpus:
  description: How many GPUs gpu_burn initialised.
  returned: when gpu_burn ran
  type: int
frames:
  description: Progress frames read.
  returned: when gpu_burn ran
  type: int
summaries:
  description: C(Summary at:) lines read (each one restarts the error counters).
  returned: when gpu_burn ran
  type: int
burn_s:
  description: Burn time gpu_burn announced.
  returned: when gpu_burn ran
  type: int
cuda_errors:
  description:
    - CUDA errors in gpu_burn's own messages (C(Error (gpu_burn-drv.cpp:298) system not yet initialized), in a
      C(Couldn't init CUDA) line or the C(what()) line of a worker killed by an uncaught exception), each once with
      how often it came (a looping gpu_burn prints them thousands of times); C(code) and C(name) are CUDA's
      (CUresult) where the text is known. Also read when gpu_burn hung and was killed at the timeout.
  returned: when gpu_burn ran
  type: list
  elements: dict
  sample: [{error: system not yet initialized, code: 802, name: CUDA_ERROR_SYSTEM_NOT_READY,
            where: "gpu_burn-drv.cpp:298", context: null, line: "what():  Error (gpu_burn-drv.cpp:298) ...",
            count: 1}]
  version_added: "0.2.0"
terminated:
  description: The C++ runtime's C(terminate called after throwing an instance of ...) lines (a gpu_burn process
    killed by an uncaught exception) and C(what()) lines that hold no CUDA error, each once with its count.
  returned: when gpu_burn ran
  type: list
  elements: dict
  version_added: "0.2.0"
unparsed:
  description: Output lines that matched no known shape (count and up to 5 samples).
  returned: when gpu_burn ran
  type: dict
problems:
  description: Lines the parser recognised but could not fully read (for example a frame cut off by a kill).
  returned: when gpu_burn ran
  type: list
  elements: dict
sampling:
  description:
    - With O(sample), the nvidia-smi samples taken beside the burn in M(kentino.gpufleet.gpu_sample)'s result shape
      (samples, per_gpu, problems, stopped_early, stop_reason, duration_s, interval_s, nvidia_smi, samples_thinned
      and samples_total past 720 samples, and that check's own verdict, reasons and evidence). The fleet report
      judges it as the gpu_sample check of a result registered as C(gpufleet_result_gpu_burn).
  returned: when O(sample) was given and gpu_burn ran
  type: dict
ib_ports:
  description:
    - With O(ib_ports), the second read of the ports in M(kentino.gpufleet.ib_ports)'s result shape (ports, baseline,
      problems, root, not_run, and that check's own verdict, reasons and evidence). The fleet report judges it as the
      ib_ports check of a result registered as C(gpufleet_result_gpu_burn).
  returned: when O(ib_ports) was given
  type: dict
nvlink_after:
  description:
    - With O(nvlink_after), M(kentino.gpufleet.nvlink_facts)' result of the read after the load (C(ansible_facts),
      C(nvidia_smi)), or C(failed) with C(msg) when the read raised, or C(skipped) with C(skip_reason) for
      O(nvlink_after.skip). The fleet report judges it as a result registered as C(gpufleet_result_nvlink_facts).
  returned: when O(nvlink_after) was given
  type: dict
xid_window:
  description:
    - With O(xid_window), M(kentino.gpufleet.xid_facts)' result of the read after the load (C(ansible_facts),
      C(tool), C(warnings)), or C(failed) with C(msg) (and C(tool), C(notes)) when the log could not be read or the
      position not saved. The fleet report judges it as a result registered as C(gpufleet_result_xid_facts).
  returned: when O(xid_window) was given
  type: dict
"""

import os
import re
import threading

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import (
    fabric_manager,
    gpu_sampling,
    ib_check,
    judge_gpu_burn,
    judge_samples,
    nvlink_read,
    xid_read,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import check_argument_spec, resolve_timeout
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import (
    LEASE_OPTIONS,
    ToolCheck,
    given_thresholds,
    planned_tool,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import module_fields
from ansible_collections.kentino.gpufleet.plugins.module_utils.gpu_burn_output import parse_gpu_burn, start_missing
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi import parse_query_gpu
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool, run_tool
from ansible_collections.kentino.gpufleet.plugins.module_utils.xid_policy import parse_overrides

MAP_FIELDS = ["index", "pci.bus_id", "uuid"]


def build_argv(executable, params):
    argv = [executable]
    if params["doubles"]:
        argv.append("-d")
    if params["tensor_cores"]:
        argv.append("-tc")
    if params["memory"]:
        argv += ["-m", params["memory"]]
    # gpu_burn reads TIME positionally after the options.
    argv.append(str(params["duration"]))
    return argv


def gpu_map(module, wanted):
    """([{cuda_index, index, pci, uuid}], problem): the GPUs nvidia-smi can read, in PCI bus order, restricted to
    `wanted` (nvidia-smi indices). gpu_burn gets exactly these, by UUID, so its device k is entry k: a GPU lost
    before the burn can never shift the others' figures."""
    smi = find_tool(module, "nvidia-smi")
    if smi is None:
        return None, "nvidia-smi not found: gpu_burn's devices cannot be matched to GPUs"
    res = run_tool([smi, "--query-gpu=" + ",".join(MAP_FIELDS), "--format=csv,noheader,nounits"], 60)
    if res.error or res.timed_out:
        return None, "nvidia-smi %s: gpu_burn's devices cannot be matched to GPUs" % (res.error or "timed out")
    rows = [dict(index=g["values"].get("index"), pci=g["values"].get("pci.bus_id"), uuid=g["values"].get("uuid"))
            for g in parse_query_gpu(res.stdout, MAP_FIELDS)["gpus"]]
    rows = [r for r in rows if r["index"] is not None and r["pci"] and r["uuid"]]
    rows.sort(key=lambda r: r["pci"])
    if wanted:
        rows = [r for r in rows if r["index"] in wanted]
    return [{"cuda_index": k, "index": r["index"], "pci": r["pci"], "uuid": r["uuid"]} for k, r in enumerate(rows)], None


class SamplerThread:
    """nvidia-smi sampling in a thread beside the burn: started before gpu_burn, stopped when it ends."""

    def __init__(self, module, options, lease, host):
        self.t = given_thresholds(module, gpu_sampling.thresholds(
            options["temp_max_c"], options["temp_sustained_s"], options["load_util_min_pct"],
            options["ecc_corrected_rise"]), given=options["thresholds"] or {})
        self.interval = options["interval"]
        self.host = host
        self.executable = find_tool(module, "nvidia-smi")
        self.timeout = module.params["timeout"]
        self.lease = lease
        self.done = threading.Event()
        self.result = None
        self.thread = threading.Thread(target=self._run, name="gpufleet-sampler")
        self.thread.daemon = True

    def _run(self):
        if self.executable is None:
            self.result = gpu_sampling.missing_tool_result(self.interval)
            return
        self.result = gpu_sampling.sample(self.executable, 30, self.interval, self.timeout, self.t,
                                          stop=lambda: "stop" if self.done.is_set() else None, lease=self.lease)

    def start(self):
        self.thread.start()

    def stop(self):
        """The sampling result with its own verdict (gpu_sample's shape)."""
        self.done.set()
        self.thread.join()
        result = self.result
        result.update(module_fields(judge_samples.judge(result, self.t, self.host), None))
        result["not_run"] = None
        return result


class PortsAroundLoad:
    """The InfiniBand ports check around the burn (option ib_ports): read when made, again at the end with the first
    read's ports as the baseline."""

    def __init__(self, module, options, host):
        problem = ib_check.root_error(options["root"])
        if problem:
            module.fail_json(msg="ib_ports." + problem)
        self.t = given_thresholds(module, given=options["thresholds"] or {})
        self.root = options["root"]
        self.host = host
        self.before = ib_check.read(self.root)

    def after(self):
        """The second read, judged (ib_ports' result shape)."""
        return ib_check.judged(ib_check.read(self.root, self.before["ports"]), self.t, self.host)


class ReadsAfterLoad:
    """The burn-in's reads after the load, made by this job (options nvlink_after, xid_window) with nvlink_facts' and
    xid_facts' own readers and result shapes: the report judges them as those modules' results. Their options are
    checked before the burn; a read that fails or raises is that read's failed result, never the burn's."""

    def __init__(self, module, params):
        self.module = module
        self.nvlink = params["nvlink_after"]
        self.xid = params["xid_window"]
        self.overrides = {}
        for name, options in (("nvlink_after", self.nvlink), ("xid_window", self.xid)):
            if options is not None and options["timeout"] < 1:
                module.fail_json(msg="%s.timeout must be at least 1 second, got %s" % (name, options["timeout"]))
        if self.xid is not None:
            try:
                self.overrides = parse_overrides(self.xid["severity_overrides"])
            except ValueError as exc:
                module.fail_json(msg="xid_window.severity_overrides: %s" % exc)

    def read(self, obs):
        """Add the parts to the observations, and the facts they set (as the modules' own tasks would)."""
        facts = {}
        for key, options, reader in (("nvlink_after", self.nvlink, self._nvlink), ("xid_window", self.xid, self._xid)):
            if options is None:
                continue
            try:
                obs[key] = reader(options)
            except Exception as exc:  # the burn's result must survive a reader's bug
                obs[key] = {"failed": True, "msg": "%s: the read raised %s: %s (a kentino.gpufleet bug: report it with "
                                                   "this message)" % (key, type(exc).__name__, exc)}
            facts.update(obs[key].get("ansible_facts") or {})
        if facts:
            obs["ansible_facts"] = facts

    def _nvlink(self, o):
        if o["skip"]:
            return {"skipped": True, "skip_reason": o["skip"]}
        params = {"executable": None, "fabric_manager_service": o["fabric_manager_service"],
                  "sysfs_root": o["sysfs_root"], "procfs_root": o["procfs_root"], "baseline": o["baseline"]}
        return nvlink_read.registered(self.module, params, nvlink_read.GATHER, o["timeout"])

    def _xid(self, o):
        return xid_read.registered(self.module, state_file=o["state_file"], timeout_s=o["timeout"],
                                   overrides=self.overrides)


def main():
    module = AnsibleModule(
        argument_spec=check_argument_spec(
            duration=dict(type="int", default=600),
            gpus=dict(type="list", elements="int"),
            doubles=dict(type="bool", default=False),
            tensor_cores=dict(type="bool", default=False),
            memory=dict(type="str"),
            expected_gpus=dict(type="int"),
            chdir=dict(type="path", aliases=["cwd"]),
            sample=dict(type="dict", options=dict(
                interval=dict(type="float", default=5),
                temp_max_c=dict(type="float", default=85.0),
                temp_sustained_s=dict(type="float", default=300.0),
                load_util_min_pct=dict(type="float", default=50.0),
                ecc_corrected_rise=dict(type="int", default=1),
                thresholds=dict(type="dict"),
            )),
            ib_ports=dict(type="dict", options=dict(
                root=dict(type="path", default=ib_check.ROOT),
                thresholds=dict(type="dict"),
            )),
            skip=dict(type="str"),
            nvlink_after=dict(type="dict", options=dict(
                baseline=dict(type="dict"),
                fabric_manager_service=dict(type="str", default=fabric_manager.SERVICE),
                sysfs_root=dict(type="path", default="/sys"),
                procfs_root=dict(type="path", default="/proc"),
                timeout=dict(type="int", default=60),
                skip=dict(type="str"),
            )),
            xid_window=dict(type="dict", options=dict(
                state_file=dict(type="path", required=True),
                severity_overrides=dict(type="dict", default={}),
                timeout=dict(type="int", default=60),
            )),
            **LEASE_OPTIONS
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["duration"] < 1:
        module.fail_json(msg="duration must be at least 1 second, got %s" % params["duration"])
    if params["memory"] is not None and not re.match(r"^[1-9][0-9]*%?$", params["memory"]):
        module.fail_json(msg="memory must be N%% or an integer number of MB (e.g. 90%% or 20000), got %r"
                             % params["memory"])
    if params["gpus"] is not None and (not params["gpus"] or min(params["gpus"]) < 0):
        module.fail_json(msg="gpus must be a non-empty list of GPU indexes >= 0, got %r" % (params["gpus"],))
    timeout = resolve_timeout(module, params["duration"] + 120)
    check = ToolCheck(module, judge_gpu_burn.judge)
    ports = PortsAroundLoad(module, params["ib_ports"], check.host) if params["ib_ports"] is not None else None
    after = ReadsAfterLoad(module, params)

    def finish(obs):
        expected = params["expected_gpus"]
        if expected is None and obs.get("gpu_map") is not None:
            expected = len(obs["gpu_map"])
        obs["expected_gpus"] = expected
        if ports is not None:
            obs["ib_ports"] = ports.after()
        after.read(obs)
        check.finish(obs, expected_gpus=expected)

    if params["skip"]:
        finish({"tool": planned_tool(build_argv(params["executable"] or "gpu_burn", params)), "not_run": params["skip"]})

    executable, missing = check.find(("gpu_burn", "gpu-burn"))
    if executable is None:
        finish({"tool": planned_tool(build_argv(params["executable"] or "gpu_burn", params), error=missing)})
    # Absolute: gpu_burn runs from its own directory (its compare kernel), where a relative PATH entry no longer resolves.
    executable = os.path.abspath(executable)
    argv = build_argv(executable, params)
    if module.check_mode:
        finish({"tool": planned_tool(argv), "not_run": "check mode: gpu_burn not run (it loads the GPUs for %s s)"
                % params["duration"]})
    cwd = params["chdir"] or os.path.dirname(executable)
    if not os.path.isdir(cwd):
        module.fail_json(msg="chdir %s is not a directory (it must hold gpu_burn's compare kernel, compare.fatbin or compare.ptx)" % cwd)

    mapping, map_problem = gpu_map(module, params["gpus"])
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if mapping:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(m["uuid"] for m in mapping)
    elif params["gpus"]:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in params["gpus"])
    sampler = None
    if params["sample"] is not None:
        if params["sample"]["interval"] <= 0:
            module.fail_json(msg="sample.interval must be a positive number of seconds, got %s"
                                 % params["sample"]["interval"])
        sampler = SamplerThread(module, params["sample"], check.lease, check.host)
        sampler.start()  # before the burn: its first sample is the idle reference, the rest cover the load
    ran, obs = check.run(argv, timeout, env=env, cwd=cwd)
    obs.update(gpu_map=mapping, gpu_map_problem=map_problem)
    if sampler is not None:
        obs["sampling"] = sampler.stop()
    if not ran.error and not ran.timed_out:
        parsed = parse_gpu_burn(ran.stdout + "\n" + ran.stderr)
        by_cuda = dict((m["cuda_index"], m) for m in mapping or [])
        # Without a map, CUDA_VISIBLE_DEVICES=<gpus> (PCI bus order) makes device k the k-th index of `gpus`.
        visible = params["gpus"] or []
        for entry in parsed["gpus"]:
            # gpu_burn numbers its devices from 0: nvidia-smi's index and the PCI address come from the map.
            known = by_cuda.get(entry["cuda_index"])
            if known:
                entry["index"] = known["index"]
            elif mapping:
                entry["index"] = None  # a device beyond the map: never guess
            elif visible:
                entry["index"] = visible[entry["cuda_index"]] if 0 <= entry["cuda_index"] < len(visible) else None
            else:
                entry["index"] = entry["cuda_index"]
            entry["pci"] = known["pci"] if known else None
            entry["uuid"] = known["uuid"] if known else None
        obs.update(gpus=parsed["gpus"], initialised_gpus=len([g for g in parsed["gpus"] if g["initialised"]]),
                   frames=parsed["frames"], summaries=parsed["summaries"], burn_s=parsed["burn_seconds"],
                   tested_gpus=parsed["tested_gpus"], last_percent=parsed["last_percent"],
                   init_failures=parsed["init_failures"], compute_failures=parsed["compute_failures"],
                   cuda_failures=parsed["cuda_failures"], aborted=parsed["aborted"], unparsed=parsed["unparsed"],
                   problems=parsed["problems"], start_missing=start_missing(parsed),
                   cuda_errors=parsed["cuda_errors"], terminated=parsed["terminated"])
    elif ran.timed_out:
        # A gpu_burn whose workers died of a CUDA error can loop until killed: what it printed says why.
        parsed = parse_gpu_burn((ran.stdout or "") + "\n" + (ran.stderr or ""))
        obs.update(cuda_errors=parsed["cuda_errors"], terminated=parsed["terminated"])
    finish(obs)


if __name__ == "__main__":
    main()
