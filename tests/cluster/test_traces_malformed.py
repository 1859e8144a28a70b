"""Files that are not CSV tables, through every CSV reader (job traces, node lists, topology files, Lucid's
co-location file): a field over the csv module's limit (131,072 characters) or a line without end (/dev/zero)
is one ``ValueError`` naming the file and line, never a ``csv.Error`` or a ``MemoryError``; and the commands
that read them say so in one line, exit 2."""

from __future__ import annotations

import pytest

from cluster.sim.runner import load_table
from cluster.traces import load_nodes, load_trace
from cluster.traces.topology import read_topology

BIG = "x" * 140_000  # over the csv module's field limit, under the line limit
HEADERS = {
    ("trace", "philly"): "timestamp,duration,num_gpus,gpu_time,cluster",
    ("trace", "alibaba2023"): "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                              "deletion_time,scheduled_time",
    ("trace", "pai2020"): "job_id,submit_time,user,group,num_gpu,duration,gpu_type",
    ("trace", "csv"): "submit_time,duration,num_gpus",
    ("nodes", "alibaba2023"): "sn,cpu_milli,memory_mib,gpu,model",
    ("nodes", "pai2020"): "machine,gpu_type,cap_cpu,cap_mem,cap_gpu",
    ("nodes", "csv"): "gpu_count",
    ("topology", ""): "node_id,switch",
    ("lucid", ""): ",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,model2,dataset2,gpu_num2,batchsize2,amp2,"
                   "speed2,gpu_util,gmem_util,gmem",
}


def read(kind: str, fmt: str, path: str):
    if kind == "trace":
        return load_trace(path, fmt or None)
    if kind == "nodes":
        return load_nodes(path, format=fmt or None)
    if kind == "topology":
        return read_topology(path)
    return load_table(path)


@pytest.mark.parametrize("kind, fmt", sorted(HEADERS))
def test_a_field_over_the_csv_limit_is_one_line_naming_file_and_line(tmp_path, kind, fmt):
    path = tmp_path / "big.csv"
    path.write_text(HEADERS[kind, fmt] + "\n" + BIG + "\n")
    with pytest.raises(ValueError) as e:
        read(kind, fmt, str(path))
    assert str(e.value) == f"{path}:2: malformed CSV: field larger than field limit (131072)"


@pytest.mark.parametrize("kind, fmt", sorted(HEADERS) + [("trace", ""), ("nodes", "")])
def test_dev_zero_is_refused_in_one_line(kind, fmt):
    """/dev/zero has no line break: a streaming reader stops at the line limit (it used to read until memory ran out);
    the topology reader, which reads a file whole, at the file's limit."""
    with pytest.raises(ValueError) as e:
        read(kind, fmt, "/dev/zero")
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 200
    if kind == "topology":
        assert msg.startswith("/dev/zero: a topology file of more than 64 MiB")
    else:
        assert msg.startswith("/dev/zero:1: a line longer than 1,048,576 characters")


@pytest.mark.parametrize("option", ["--topology", "--trace", "--nodes", "--colocation-data"])
def test_simulate_refuses_a_malformed_file_in_one_line(tmp_path, capsys, option):
    from colocate.cli import main

    trace = tmp_path / "ok.csv"
    trace.write_text(HEADERS["trace", "philly"] + "\n2017-10-01 00:00:09,10.0,1,10.0,a\n")
    bad = tmp_path / "bad.csv"
    kind = {"--topology": "topology", "--trace": "trace", "--nodes": "nodes", "--colocation-data": "lucid"}[option]
    bad.write_text(HEADERS[kind, "csv" if kind == "nodes" else "philly" if kind == "trace" else ""] + "\n" + BIG + "\n")
    args = {"--trace": str(trace), "--cluster": "1x8", "--colocation-data": "none"}
    args[option] = str(bad)
    if option == "--nodes":
        del args["--cluster"]
    argv = ["simulate", "--policy", "fifo", "--out", str(tmp_path / "out"), "--quiet", "--no-plots"]
    assert main(argv + [x for kv in args.items() for x in kv]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"colocate simulate: error: {bad}:2: malformed CSV: field larger than field "
                                        f"limit (131072)"]
    assert not (tmp_path / "out").exists()
