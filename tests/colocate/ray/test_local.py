"""``colocate.ray.local.LocalCluster``'s folder: removed by ``close()``, kept when the start failed (its error
names the node's log there)."""

import os

import pytest

pytest.importorskip("ray")

from colocate.ray.local import LocalCluster


def test_close_removes_the_clusters_folder():
    cluster = LocalCluster()
    assert os.path.isdir(cluster.dir)
    cluster.close()
    assert not os.path.exists(cluster.dir)


def test_a_failed_start_keeps_the_folder_with_the_nodes_log():
    cluster = LocalCluster(policy="no-such-policy")  # the node refuses it and exits
    try:
        with pytest.raises(RuntimeError, match="did not start") as err:
            cluster.start()
        assert cluster.dir in str(err.value) and os.path.exists(os.path.join(cluster.dir, "node.log"))
    finally:
        import shutil

        shutil.rmtree(cluster.dir, ignore_errors=True)
