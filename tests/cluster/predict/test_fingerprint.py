"""Fingerprints: what makes two commands the same job (exact) or the same sweep (family)."""

from __future__ import annotations

import pytest

from cluster.predict.fingerprint import command_fingerprints, fingerprints, normalise_args, script_hash

H = script_hash(b"print('train')\n")


@pytest.mark.parametrize("argv, expected", [
    (["--lr", "0.1", "--epochs", "3"], ("--epochs=3", "--lr=0.1")),  # flags sorted
    (["--lr=0.1"], ("--lr=0.1",)),
    (["--seed", "7", "--lr", "0.1"], ("--lr=0.1",)),  # seed dropped with its value
    (["--random_seed=3", "--lr", "0.1"], ("--lr=0.1",)),
    (["--output-dir", "/tmp/run7", "--lr", "0.1"], ("--lr=0.1",)),  # output path dropped
    (["--save_dir=/x", "--log-dir", "/y", "--run-name", "r1"], ()),
    (["data/2026-11-25", "--tag", "run-20261125-0349"], ("data/<ts>", "--tag=run-<ts>")),  # timestamps
    (["--tag", "2026-11-25T03:49:51"], ("--tag=<ts>",)),
    (["--shift", "-3", "--amp"], ("--amp", "--shift=-3")),  # a negative number is a value, not a flag
    (["train", "cfg.yaml"], ("train", "cfg.yaml")),  # positionals keep their order
])
def test_normalise_args(argv, expected):
    assert normalise_args(argv) == expected


@pytest.mark.parametrize("argv, expected", [
    (["--lr", "0.1", "--bs", "64"], ("--bs=<num>", "--lr=<num>")),
    (["--lr=1e-3", "--model", "resnet50"], ("--lr=<num>", "--model=resnet50")),  # a name keeps its digits
    (["--shift", "-3"], ("--shift=<num>",)),
])
def test_family_masks_numbers(argv, expected):
    assert normalise_args(argv, family=True) == expected


@pytest.mark.parametrize("a, b, same_exact, same_family", [
    (("ann", H, ["--lr", "0.1"]), ("ann", H, ["--lr", "0.1"]), True, True),
    (("ann", H, ["--lr", "0.1", "--seed", "1"]), ("ann", H, ["--seed", "2", "--lr", "0.1"]), True, True),
    (("ann", H, ["--lr", "0.1", "--out", "/a"]), ("ann", H, ["--lr=0.1", "--out", "/b"]), True, True),
    (("ann", H, ["--lr", "0.1"]), ("ann", H, ["--lr", "0.01"]), False, True),  # a sweep: one family
    (("ann", H, ["--lr", "0.1"]), ("bob", H, ["--lr", "0.1"]), False, False),  # another user
    (("ann", H, ["--lr", "0.1"]), ("ann", script_hash(b"other"), ["--lr", "0.1"]), False, False),  # another script
    (("ann", H, ["--model", "a"]), ("ann", H, ["--model", "b"]), False, False),  # not a number: another family
])
def test_fingerprints(a, b, same_exact, same_family):
    ea, fa = fingerprints(*a)
    eb, fb = fingerprints(*b)
    assert (ea == eb, fa == fb) == (same_exact, same_family)
    assert len(ea) == 16 and all(c in "0123456789abcdef" for c in ea)


@pytest.mark.parametrize("command, how", [
    (["python", "train.py", "--lr", "0.1"], "content"),
    (["python", "-m", "pkg.train", "--lr", "0.1"], "module"),
    (["python", "-c", "print(1)"], "code"),
    (["torchrun", "--nproc", "2", "train.py"], "program"),
])
def test_command_fingerprints_name_what_stands_for_the_script(command, how):
    hashed = H if how == "content" else ""
    exact, family, got = command_fingerprints("ann", command, hashed)
    assert got == how and len(exact) == len(family) == 16
    assert (exact, family) == command_fingerprints("ann", list(command), hashed)[:2]  # deterministic
    assert command_fingerprints("bob", command, hashed)[0] != exact  # the user is part of it


def test_command_fingerprints_of_a_sweep_share_the_family_not_the_exact():
    a = command_fingerprints("ann", ["python", "train.py", "--bs", "32", "--seed", "1"], H)
    b = command_fingerprints("ann", ["python", "train.py", "--seed", "2", "--bs", "64"], H)
    c = command_fingerprints("ann", ["python", "train.py", "--bs", "32"], H)
    assert a[1] == b[1] and a[0] != b[0] and a[0] == c[0]
    other_script = command_fingerprints("ann", ["python", "train.py", "--bs", "32"], script_hash(b"other"))
    assert other_script[0] != a[0] and other_script[1] != a[1]
    unhashed = command_fingerprints("ann", ["python", "train.py", "--bs", "32"], "")
    assert unhashed[2] == "path" and unhashed[0] != a[0]  # the path stands in for the content


@pytest.mark.parametrize("command, want", [
    (["python", "t.py", "--bs", "32", "--width=256", "--lr", "1e-3", "--seed", "3"], (32.0, 0.001, 256.0)),
    (["python", "t.py", "--model", "resnet50", "--out", "/r/2026-11-25"], ()),  # names and dropped flags: none
    (["python", "t.py", "cfg.yaml", "8"], (8.0,)),
])
def test_command_numbers_are_what_the_family_masks(command, want):
    from cluster.predict.fingerprint import command_numbers

    assert command_numbers(command) == want
