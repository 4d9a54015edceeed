"""The fault's ticket through a webhook, against a real HTTP server on the loopback: a quarantine on the simulated
fleet POSTs one Jira-form create (project, summary, the fault's evidence; the bearer token in its header, never in
the output), the answer's key is kept in the history, and the same fault on the same node again within a day is a
comment on that ticket, not a new one; the generic template's JSON carries the fault; a webhook that never answers
is a named warning and the node is still quarantined and drained."""

import json
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, default_path
from helpers.lifecycle_runs import play, slurm

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TOKEN = "tok-jira-5ecret"


class Tracker(BaseHTTPRequestHandler):
    seen = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Tracker.seen.append((self.path, dict(self.headers), body))
        answer = {"id": "10007", "key": "OPS-7"} if self.path.endswith("/issue") else {"id": 42}
        data = json.dumps(answer).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("ticket")
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(root / "inv"), "--nodes",
                    "3", "--scenario", "healthy_h100", "--prefix", "tk"], check=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Tracker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts (the kernel does) and never answers
    yield root, server.server_address[1], silent.getsockname()[1]
    server.shutdown()
    silent.close()


def quarantine(root, node, settings):
    return play(root, node, "quarantine", json.dumps(dict(
        settings, lifecycle_code="XID_79", lifecycle_gpu="3", lifecycle_actor="alert",
        lifecycle_reason="XID 79 on GPU 3", gpufleet_lemon_quarantines=0)))


def test_one_ticket_per_fault_a_repeat_updates_it_and_a_dead_webhook_loses_nothing(fleet):
    root, port, silent_port = fleet
    jira = {"gpufleet_ticket_webhook_url": "http://127.0.0.1:%d/rest/api/2/issue" % port,
            "gpufleet_ticket_template": "jira", "gpufleet_ticket_project": "OPS",
            "gpufleet_ticket_headers": {"Authorization": "Bearer " + TOKEN}}

    def repeated():
        first = quarantine(root, "tk01", jira)
        # repaired and returned by an operator; then the same fault again, the same day
        with History(default_path(root / "tk01" / "history")) as history:
            for state in ("validating", "healthy"):
                lifecycle.transition(history, "tk01", state, "reseated the riser", "operator:test")
        return first, quarantine(root, "tk01", jira)

    with ThreadPoolExecutor(3) as pool:
        tk01 = pool.submit(repeated)
        tk02 = pool.submit(quarantine, root, "tk02", {"gpufleet_ticket_webhook_url": "http://127.0.0.1:%d/hook"
                                                     % silent_port, "gpufleet_ticket_timeout_s": 1})
        tk03 = pool.submit(quarantine, root, "tk03", {"gpufleet_ticket_webhook_url": "http://127.0.0.1:%d/hook" % port})
    (rc1, out1), (rc2, out2) = tk01.result()
    assert rc1 == 0 and "ticket for XID_79 GPU 3: created: jira OPS-7" in out1, out1[-3000:]
    assert rc2 == 0 and "ticket for XID_79 GPU 3: updated: jira OPS-7" in out2, out2[-3000:]
    jira_posts = [(path, headers, body) for path, headers, body in Tracker.seen if path.startswith("/rest/")]
    assert [p for p, _h, _b in jira_posts] == ["/rest/api/2/issue", "/rest/api/2/issue/OPS-7/comment"]
    created, comment = jira_posts[0][2], jira_posts[1][2]
    assert created["fields"]["project"] == {"key": "OPS"} and "tk01" in created["fields"]["summary"]
    assert "XID_79" in created["fields"]["summary"] and "XID 79 on GPU 3" in created["fields"]["description"]
    assert "came back" in comment["body"] and jira_posts[0][1]["Authorization"] == "Bearer " + TOKEN
    assert TOKEN not in out1 + out2
    with History(default_path(root / "tk01" / "history"), readonly=True) as history:
        kept = history.ticket_of("tk01", "XID_79", "3", 0)
    assert (kept["tracker"], kept["ticket"], kept["updates"]) == ("jira", "OPS-7", 1)

    rc, out = tk02.result()
    assert rc == 0 and "ticket for XID_79 GPU 3: timeout" in out and "[WARNING]" in out, out[-3000:]
    with History(default_path(root / "tk02" / "history"), readonly=True) as history:
        assert [r["to_state"] for r in history.lifecycle_of("tk02")] == ["quarantined"]
        assert history.ticket_of("tk02", "XID_79", "3", 0) is None
    assert slurm(root, "tk02")["drain"] and slurm(root, "tk02")["reason"] == "gpufleet: XID_79 3"

    rc, out = tk03.result()
    [(_path, _headers, generic)] = [s for s in Tracker.seen if s[0] == "/hook"]
    assert rc == 0 and "ticket for XID_79 GPU 3: created: generic 42" in out, out[-3000:]
    assert {k: generic[k] for k in ("action", "node", "state", "code", "gpu", "actor")} == {
        "action": "create", "node": "tk03", "state": "quarantined", "code": "XID_79", "gpu": "3", "actor": "alert"}
    assert generic["bundle"].startswith(str(root / "tk03" / "rma" / "tk03" / "gpufleet-rma-tk03-"))
