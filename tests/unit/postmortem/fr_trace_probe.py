"""Run torch's own flight-recorder analyzer (torch.distributed.flight_recorder, fr_trace) on a dump directory and
print, as JSON, the collectives it flags: sequence, missing ranks, and the ranks of mismatched collectives.

Runs under .venv-torch's Python (tests/unit/postmortem/test_real_torch.py); prints {"error": ...} when fr_trace fails.
"""

import json
import sys

from torch.distributed.flight_recorder.components.builder import build_db
from torch.distributed.flight_recorder.components.config_manager import JobConfig
from torch.distributed.flight_recorder.components.loader import read_dir


def main(directory, prefix):
    args = JobConfig().parse_args([directory, "-p", prefix, "--allow-incomplete-ranks"])
    try:
        details, version = read_dir(args)
        db = build_db(details, args, version)
    except Exception as exc:  # report, do not hide: the test compares this with our analysis
        print(json.dumps({"error": "%s: %s" % (type(exc).__name__, exc)}))
        return
    flagged = []
    for c in db.collectives:
        if c.pass_check and not c.missing_ranks:  # "not all ranks joining" comes back as pass_check + missing_ranks
            continue
        flagged.append({"seq": c.collective_seq_id, "name": c.collective_name,
                        "missing": sorted(c.missing_ranks or []),
                        "mismatch": {str(rank): [m.collective_name, str(m.type_of_mismatch)]
                                     for rank, m in (c.mismatch_collectives or {}).items()}})
    print(json.dumps({"version": version, "flagged": flagged}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
