"""Node lists (Alibaba 2023, PAI 2020, generic CSV) and NxG shapes."""

from __future__ import annotations

import pytest

from cluster.spec import NodeSpec
from cluster.traces import detect_node_format, load_nodes, parse_shape


def write(tmp_path, text, name="nodes.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_alibaba_nodes_keep_cpu_only_machines(tmp_path):
    p = write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\n"
                        "n0,32000,262144,0,\n" "n1,96000,393216,8,G2\n" "n2,16000,122880,0,T4\n")
    r = load_nodes(p)
    assert r.format == "alibaba2023"
    assert r.nodes == [NodeSpec("n0", 0, "", 0, 32000, 262144), NodeSpec("n1", 8, "G2", 0, 96000, 393216),
                       NodeSpec("n2", 0, "", 0, 16000, 122880)]
    r = load_nodes(p, gpu_only=True)
    assert [n.node_id for n in r.nodes] == ["n1"] and r.skipped == {"cpu-only node": 2}


def test_pai_units(tmp_path):
    p = write(tmp_path, "machine,gpu_type,cap_cpu,cap_mem,cap_gpu\n"
                        "m0,CPU,96,512,0\n" "m1,P100,64,512,2\n" "m2,V100M32,96,384,8\n" "m3,CPU,96,512,2\n")
    r = load_nodes(p)
    assert r.format == "pai2020"
    assert r.nodes == [NodeSpec("m0", 0, "", 0, 96000, 512 * 1024), NodeSpec("m1", 2, "P100", 0, 64000, 512 * 1024),
                       NodeSpec("m2", 8, "V100M32", 0, 96000, 384 * 1024)]
    assert r.skipped == {"bad gpu_type": 1}


def test_generic_node_csv(tmp_path):
    p = write(tmp_path, "gpu_model,gpu_count,cpu,memory,count,node_id,gpu_mem\n"
                        "V100,8,48,512GiB,2,big,32GiB\n" "T4,2,16.5,64GiB,,,\n" ",0,8,32768MiB,,,\n")
    r = load_nodes(p)
    assert r.format == "csv"
    assert r.nodes == [NodeSpec("big-0", 8, "V100", 32 << 30, 48000, 512 * 1024),
                       NodeSpec("big-1", 8, "V100", 32 << 30, 48000, 512 * 1024),
                       NodeSpec("node-0002", 2, "T4", 0, 16500, 64 * 1024),
                       NodeSpec("node-0003", 0, "", 0, 8000, 32768)]


def test_generic_node_csv_minimal(tmp_path):
    p = write(tmp_path, "gpu_count\n4\n4\n")
    assert load_nodes(p).nodes == [NodeSpec("node-0000", 4), NodeSpec("node-0001", 4)]


@pytest.mark.parametrize("row,reason", [
    ("V100,8,48,512GiB,1,a", "wrong field count"),
    ("V100,x,48,512GiB,1,a,", "bad gpu_count"),
    ("V100,-8,48,512GiB,1,a,", "bad gpu_count"),
    ("V100,8,many,512GiB,1,a,", "bad cpu"),
    ("V100,8,48,512,1,a,", "bad memory"),
    ("V100,8,48,lots,1,a,", "bad memory"),
    ("V100,8,48,512GiB,0,a,", "bad count"),
    ("V100,8,48,512GiB,1,a,huge", "bad gpu_mem"),
    ("V100,8,48,512GiB,1,g,", "duplicate node_id"),
])
def test_generic_bad_rows(tmp_path, row, reason):
    header = "gpu_model,gpu_count,cpu,memory,count,node_id,gpu_mem\n"
    p = write(tmp_path, header + "V100,8,48,512GiB,1,g,\n" + row + "\n" + "V100,8,48,512GiB,1,h,\n")
    r = load_nodes(p)
    assert r.rows == 3 and [n.node_id for n in r.nodes] == ["g", "h"]
    assert dict(r.skipped) == {reason: 1}
    assert r.problems[0].startswith(f"{p}:3: {reason}")


@pytest.mark.parametrize("row,reason", [
    ("n9,32000,262144,x,", "bad gpu"),
    (",32000,262144,8,G2", "bad sn"),
    ("n9,-1,262144,8,G2", "bad cpu_milli"),
    ("n0,32000,262144,8,G2", "duplicate node_id"),
])
def test_alibaba_bad_rows(tmp_path, row, reason):
    p = write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\n" "n0,1,1,1,T4\n" + row + "\n")
    r = load_nodes(p)
    assert len(r.nodes) == 1 and dict(r.skipped) == {reason: 1}


@pytest.mark.parametrize("text,expected", [
    ("2x8", [NodeSpec("node-0000", 8), NodeSpec("node-0001", 8)]),
    ("1X4:T4", [NodeSpec("node-0000", 4, "T4")]),
    ("1x8:V100:32GiB", [NodeSpec("node-0000", 8, "V100", 32 << 30)]),
    ("1x8::16GiB", [NodeSpec("node-0000", 8, "", 16 << 30)]),
    ("1x8:A100+2x0", [NodeSpec("node-0000", 8, "A100"), NodeSpec("node-0001", 0), NodeSpec("node-0002", 0)]),
])
def test_shapes(text, expected):
    assert parse_shape(text) == expected


def test_shape_sizes_and_ids():
    nodes = parse_shape("64x8")
    assert len(nodes) == 64 and sum(n.gpus for n in nodes) == 512 and nodes[-1].node_id == "node-0063"
    assert parse_shape("10001x1")[-1].node_id == "node-10000"


@pytest.mark.parametrize("text", ["", "64", "x8", "64x", "0x8", "64x8:V100:lots", "64x8+", "-1x8", "64*8"])
def test_bad_shapes(text):
    with pytest.raises(ValueError, match="shape"):
        parse_shape(text)


@pytest.mark.parametrize("text, error", [
    # were taken as models named so
    ("2x4:V100|T4", "cluster shape '2x4:V100|T4': GPU model 'V100|T4' must be 1-64 letters, digits or ._- "
                    "(one model per group: 32x8:V100+16x2:T4)"),
    ("2x4:T4@0.6", "GPU model 'T4@0.6' must be 1-64 letters, digits or ._-"),
    ("2x4:" + "a" * 500, "GPU model 'a" + "a" * 39 + "'... (500 characters) must be 1-64"),
    ("2x4:" + "a" * 65, "must be 1-64 letters"),
    ("2x4:Vé100", "GPU model 'Vé100' must be"),
    ("1x8:A100+2x4:V1/00", "GPU model 'V1/00' must be"),
    # was taken as GPUs of no stated model
    ("2x4:", "cluster shape '2x4:': no GPU model after ':' (a model is 1-64 letters, digits or ._-; for GPUs of no "
             "stated model leave the ':' out)"),
    # said "malformed size 'T4'"
    ("2x4:V100,2x4:T4", "cluster shape '2x4:V100,2x4:T4': groups are joined by +, not by commas "
                        "(e.g. 32x8:V100+16x2:T4)"),
])
def test_a_shape_s_gpu_models_are_checked(text, error):
    with pytest.raises(ValueError) as e:
        parse_shape(text)
    assert error in str(e.value) and len(str(e.value)) < 250


def test_a_shape_s_model_rule_takes_the_traces_models():
    for model in ("V100", "V100M32", "A10", "T4", "P100", "MISC", "G2", "A100-SXM4-80GB", "rtx_3090", "H100.nvl", "M" * 64):
        assert parse_shape(f"1x8:{model}")[0].gpu_model == model


def test_node_format_detection(tmp_path):
    assert detect_node_format(write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\n", "a.csv")) == "alibaba2023"
    assert detect_node_format(write(tmp_path, "machine,gpu_type,cap_cpu,cap_mem,cap_gpu\n", "b.csv")) == "pai2020"
    assert detect_node_format(write(tmp_path, "gpu_model,gpu_count\n", "c.csv")) == "csv"
    p = write(tmp_path, "host,gpus\n", "d.csv")
    with pytest.raises(ValueError, match="unknown node list format") as e:
        detect_node_format(p)
    assert str(p) in str(e.value)
    with pytest.raises(ValueError, match="missing columns 'cap_cpu', 'cap_mem', 'cap_gpu'"):
        load_nodes(write(tmp_path, "machine,gpu_type\n", "e.csv"), format="pai2020")
    with pytest.raises(ValueError, match="unknown node list format"):
        load_nodes(p, format="slurm")
