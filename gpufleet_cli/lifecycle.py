"""gpufleet quarantine|repair|release NODE: the lifecycle playbook (kentino.gpufleet.lifecycle) for one node, through
the same runner as `gpufleet run` (ansible-runner, the clone's ansible.cfg, the events under the report directory).

    gpufleet quarantine NODE [--reason TEXT] [--code CODE] [--gpu GPU] [--dry-run]
    gpufleet repair NODE [--dry-run]        (the ladder's next rung, then its validation; back to Slurm on a pass)
    gpufleet release NODE [--reason TEXT] [--dry-run]   (only after a passing validation, only a gpufleet drain)

Exit status: the playbook's (0 done; 2 refused or failed: the node stays out of service, the message says why);
2 for a usage error, naming the option.
"""

import getpass
import json

from gpufleet_cli.options import add_inventory_option, finding_code, gpu_id, node_name, reason

ACTIONS = ("quarantine", "repair", "release")


def add_parsers(sub, default_report_dir):
    for action in ACTIONS:
        p = sub.add_parser(action, help="%s a node (kentino.gpufleet.lifecycle, docs/lifecycle.md)" % action)
        p.add_argument("node", type=node_name, help="the node, as the inventory names it")
        p.add_argument("--dry-run", action="store_true", help="print every step it would take; change nothing")
        if action != "repair":
            p.add_argument("--reason", type=reason, help="why, one line (recorded in the history)")
        if action == "quarantine":
            p.add_argument("--code", type=finding_code, help="the finding code the repair ladder starts from "
                                                             "(default OPERATOR_QUARANTINE: a reboot first)")
            p.add_argument("--gpu", type=gpu_id, help="the GPU the finding is about (index or PCI address)")
        add_inventory_option(p)
        p.add_argument("-e", "--extra-vars", action="append", default=[])
        p.add_argument("--report-dir", default=default_report_dir)


def extra_vars(args):
    """The lifecycle playbook's variables of a command line (before the user's -e, which come after)."""
    extra = {"lifecycle_action": args.command, "lifecycle_node": args.node,
             "lifecycle_actor": "operator:%s" % (getpass.getuser() or "unknown")}
    if args.dry_run:
        extra["lifecycle_dry_run"] = True
    for key, name in (("lifecycle_reason", "reason"), ("lifecycle_code", "code"), ("lifecycle_gpu", "gpu")):
        if getattr(args, name, None):
            extra[key] = getattr(args, name)
    return extra


def run(args, cmd_run):
    """Run the playbook through `cmd_run` (gpufleet run's runner): its exit status. The user's -e come last."""
    # Ansible's output is the command's: every step and, on a refusal, why (no quiet mode).
    args.playbook, args.check, args.limit, args.quiet = "lifecycle", False, None, False
    args.extra_vars = [json.dumps(extra_vars(args))] + list(args.extra_vars)
    return cmd_run(args)
