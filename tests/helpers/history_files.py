"""History files for the tests of its faults: a healthy one written through the store, and the same with garbage in
one page in the middle (SQLite's quick_check calls it damaged; the header and the schema page are intact)."""

import sqlite3

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History

PAGE = 4096
T0 = 1.8e9
DAY = 86400.0


def _node(host, ts, gpus):
    return {"host": host, "ts": ts, "verdict": "pass", "reachable": 1, "stage": "done", "grp": "H100",
            "driver": "570.133.20", "gpu_count": gpus, "versions": {"driver": "570.133.20"},
            "gpus": [{"pci": "0000:%02x:00" % (i + 16), "idx": i, "uuid": "GPU-%s-%d" % (host, i), "name": "H100",
                      "verdict": "pass", "ts": ts, "ecc_corr_agg": 0} for i in range(gpus)],
            "xids": [], "baselines": [], "doc": None}


def healthy_history(path, days=30, hosts=4, gpus=8, start=T0):
    """`days` nightly audits of `hosts` nodes, checkpointed into the main file (no -wal left)."""
    with History(path) as h:
        for day in range(days):
            ts = start + day * DAY
            h.record({"run_id": "r%d" % day, "playbook": "audit", "ts": ts, "verdict": "pass"},
                     [_node("n%d" % k, ts, gpus) for k in range(hosts)])
        h.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def garbage_in_the_middle(path):
    """Overwrite one page in the middle of the file, as a bad sector or a stray write would; returns the bytes."""
    data = bytearray(path.read_bytes())
    middle = (len(data) // PAGE // 2) * PAGE
    data[middle:middle + PAGE] = b"\xde\xad\xbe\xef" * (PAGE // 4)
    path.write_bytes(bytes(data))
    db = sqlite3.connect(path)
    try:  # the precondition: SQLite calls it damaged
        assert db.execute("PRAGMA quick_check").fetchone()[0] != "ok"
    except sqlite3.DatabaseError as exc:
        assert "malformed" in str(exc)
    finally:
        db.close()
    return path.read_bytes()
