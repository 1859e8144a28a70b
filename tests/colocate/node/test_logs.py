"""colocate/node/logs.py: the node's answer to ``LogTailRequest``, for the cluster that welcomed it, from files."""

from __future__ import annotations

import os

from colocate import protocol as P
from colocate.node.logs import answer, log_file


def _log(path, text: str, mtime: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return str(path)


def test_a_log_tail_is_the_welcoming_clusters_newest_placements_never_another_clusters(tmp_path):
    """QA: job ids restart at 1 with a new scheduler state file; `colocate logs 1` in the new cluster showed the old
    cluster's job 1 (another user's output). Only the asking cluster's folder is read, the newest placement first."""
    _log(tmp_path / "1" / "worker-0.log", "secret=before-cluster-folders\n", 100)  # the layout before clusters
    _log(tmp_path / "c-old" / "1" / "worker-0.1.1.log", "secret=alices-token\n", 200)
    _log(tmp_path / "c-new" / "1" / "worker-0.1.1.log", "bob, first try\n", 300)
    newest = _log(tmp_path / "c-new" / "1" / "worker-0.1.2.log", "bob, second try\n", 400)
    _log(tmp_path / "c-new" / "1" / "worker-10.1.2.log", "rank 10\n", 500)
    req = P.LogTailRequest(request_id="q", job_id="1", rank=0)
    assert log_file(str(tmp_path), "c-new", "1", 0) == newest
    tail = answer(req, "n1", 1, str(tmp_path), "c-new")
    assert (tail.text, tail.error) == ("bob, second try\n", "")
    assert answer(req, "n1", 1, str(tmp_path), "c-old").text == "secret=alices-token\n"  # its own cluster: its own
    for cluster in ("c-third", "", None):  # no log of job 1 there, or no welcome yet: an error, nobody's text
        tail = answer(req, "n1", 1, str(tmp_path), cluster)
        assert tail.text == "" and tail.error.startswith("no log of worker 0 of job 1 on node n1: "), tail
    assert "welcomed" in answer(req, "n1", 1, str(tmp_path), None).error
    known = _log(tmp_path / "elsewhere.log", "from the worker table\n", 50)  # the table's path comes first
    assert answer(req, "n1", 1, str(tmp_path), "c-new", known).text == "from the worker table\n"
    os.symlink("/etc/passwd", tmp_path / "c-new" / "1" / "worker-1.1.2.log")  # planted by the job's account
    tail = answer(P.LogTailRequest(request_id="q", job_id="1", rank=1), "n1", 1, str(tmp_path), "c-new")
    assert tail.text == "" and tail.error.startswith("no log of worker 1 of job 1"), tail  # never followed
