"""Scenario faults scheduled in burn time: applied by the stand-in that loads the GPUs (gpu_burn, all_reduce_perf).

An event fires once per node state (a lost GPU stays lost until `sim/reset`, the simulated reboot), when a burn that
loads at least one of its GPUs reaches `at.burn_fraction`. Kinds:
  gpu_lost  GPUs fall off the bus: kernel lines in `kernel_style` (per GPU: `kernel_styles`), `spacing_ms` apart;
            nvidia-smi then reports them lost
  xid       kernel lines for one XID (`xid`, `body`, optional `repeat`, `spacing_s`); no effect on the burn
  errors    the burn sees `count` wrong results on the GPU (silent corruption): WARNING!, then FAULTY
"""


from . import klog


def pending(node, gpus, kinds=None):
    fired = node.read_json("fired.json", []) or []
    out = []
    for i, ev in enumerate(node.scen["events"]):
        if i in fired or (kinds and ev.get("kind") not in kinds):
            continue
        targets = [int(g) for g in ev.get("gpus", [ev.get("gpu", 0)])]
        if any(t in gpus for t in targets):
            out.append((i, ev, targets))
    return out


def fire(node, event_id, ev, targets, when=None):
    """Apply one event to the node's state and kernel log. Returns the GPU indices it took off the bus."""
    when = node.now() if when is None else when
    with node.lock():
        fired = node.read_json("fired.json", []) or []
        if event_id in fired:
            return []
        node.write_json("fired.json", fired + [event_id])
    kind = ev.get("kind")
    lost = []
    if kind == "gpu_lost":
        style = ev.get("kernel_style", "xid+single")
        spacing = float(ev.get("spacing_ms", 1.7)) / 1000.0
        lines = []
        for n, idx in enumerate(targets):
            gpu = node.gpus[idx]
            # A bad riser usually shows AER noise just before the GPU goes (not NVRM lines: not events).
            for pre in ev.get("pre_lines", []):
                lines.append((n * spacing, pre.format(**klog.gpu_fields(gpu)), 3))
            for line in klog.fallen_off_bus_lines(gpu, ev.get("kernel_styles", {}).get(str(idx), style)):
                lines.append((n * spacing + 0.00003, line, 4))
        lines += [(len(targets) * spacing + 0.0004, text, 4) for text in klog.CRASH_DUMP_LINES]
        node.mark_lost(targets, "gpu_lost", when)
        node.append_kernel(lines, when=when)
        lost = list(targets)
    elif kind == "xid":
        spacing = float(ev.get("spacing_s", 0.0021))
        lines = []
        for idx in targets:
            gpu = node.gpus[idx]
            for r in range(int(ev.get("repeat", 1))):
                for line in klog.xid_event_lines(gpu, int(ev["xid"]), ev.get("body", ""), ev.get("pid"),
                                                 ev.get("name"), first=ev.get("first", False) and r == 0):
                    lines.append((len(lines) * spacing, line, 4))
        node.append_kernel(lines, when=when)
    return lost
