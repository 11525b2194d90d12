"""`shardfs verify` finds damage and names it; `shardfs ls` shows the tree without a mount."""

import os
import shutil

import pytest

from shardfs.storage import open_shard
from shardfs.index import shard_index
from shardfs.cli import main
from shardfs.formats.lz4shard import FORMAT


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def pack(capsys, src, out, *options):
    code, stdout, err = run(capsys, "pack", src, out, "--prefix", "train", *options)
    assert code == 0, stdout + err
    return sorted(out / n for n in os.listdir(out) if n.endswith((".tar", ".lz4shard")))


def verify(capsys, *args):
    code, out, err = run(capsys, "verify", *args)
    lines = out.strip().splitlines()
    return code, lines[:-1], lines[-1]  # problems, then the summary line


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def a_member(shard, i=3):
    ix = shard_index.build(str(shard))
    return ix.name(i).decode(), int(ix.offset[i]), int(ix.size[i])


@pytest.mark.parametrize("fmt", ["tar", "lz4"])
def test_a_clean_pack_verifies(sample_tree, tmp_path, capsys, fmt):
    pack(capsys, sample_tree, tmp_path / "out", "--format", fmt, "--shard-size", "64K", "--block-size", "4K")
    code, problems, summary = verify(capsys, tmp_path / "out", "--decode")
    assert code == 0 and problems == []
    assert "72 members" in summary and "all good" in summary


def test_flipped_byte_in_tar_data_is_a_sha256_mismatch(sample_tree, tmp_path, capsys):
    shards = pack(capsys, sample_tree, tmp_path / "out", "--shard-size", "64K")
    name, offset, size = a_member(shards[1])
    flip(shards[1], offset + size // 2)
    code, problems, summary = verify(capsys, tmp_path / "out")
    assert code == 1
    assert problems == [problems[0]] and problems[0].startswith(shards[1].name + ": sha256 mismatch")
    assert "1 problem in 1 shard" in summary


@pytest.mark.parametrize("with_manifest", [True, False])
def test_flipped_byte_in_an_lz4_block_is_a_checksum_error(sample_tree, tmp_path, capsys, with_manifest):
    shards = pack(capsys, sample_tree, tmp_path / "out", "--format", "lz4", "--shard-size", "64K",
                  "--block-size", "4K")
    if not with_manifest:
        os.unlink(tmp_path / "out" / "train.manifest.json")  # the block CRCs alone catch it
    name, offset, size = a_member(shards[0])
    layout = FORMAT.open_layout(open_shard(str(shards[0])), os.path.getsize(shards[0]))
    block = layout._blocks[(offset + size // 2) // layout.block_size]  # the block holding the member's middle
    start, length = int(block["raw"]), int(block["stored"])
    flip(shards[0], start + length // 2)  # inside the stored bytes of the block that holds the member's middle
    code, problems, _ = verify(capsys, tmp_path / "out")
    assert code == 1
    block = [p for p in problems if "checksum mismatch" in p]
    assert len(block) == 1 and block[0].startswith(shards[0].name + ": block ") and name in block[0]
    assert any("sha256 mismatch" in p for p in problems) == with_manifest


@pytest.mark.parametrize("fmt", ["tar", "lz4"])
def test_truncated_shard(sample_tree, tmp_path, capsys, fmt):
    shards = pack(capsys, sample_tree, tmp_path / "out", "--format", fmt, "--shard-size", "64K")
    truncate(shards[2], os.path.getsize(shards[2]) // 2)
    code, problems, _ = verify(capsys, tmp_path / "out")
    assert code == 1
    mine = [p for p in problems if p.startswith(shards[2].name + ": ")]
    assert any("truncated" in p for p in mine), problems
    assert any("bytes, the manifest says" in p for p in mine)


@pytest.mark.parametrize("fmt", ["tar", "lz4"])
def test_undecodable_image_is_found_with_decode(sample_tree, tmp_path, capsys, fmt):
    src = tmp_path / "src"
    shutil.copytree(sample_tree / "train" / "n00000000", src / "cls")
    (src / "cls" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG at all" * 20)
    (src / "cls" / "notes.txt").write_text("not an image: never decoded")
    pack(capsys, src, tmp_path / "out", "--format", fmt)
    code, problems, _ = verify(capsys, tmp_path / "out")
    assert code == 0 and problems == []  # structurally sound and as the manifest says
    code, problems, summary = verify(capsys, tmp_path / "out", "--decode")
    assert code == 1
    assert len(problems) == 1 and problems[0].startswith("train-000000")
    assert "member cls/broken.jpg: cannot decode" in problems[0]


def test_manifest_and_directory_must_agree(sample_tree, tmp_path, capsys):
    out = tmp_path / "out"
    shards = pack(capsys, sample_tree, out, "--shard-size", "64K")
    shutil.copy(shards[0], out / "stray-000000.tar")
    os.unlink(shards[-1])
    code, problems, _ = verify(capsys, out)
    assert code == 1
    assert f"{shards[-1].name}: listed in train.manifest.json but missing" in problems
    assert "stray-000000.tar: not listed in train.manifest.json" in problems

    for shard in shards[:-1]:
        os.unlink(shard)
    os.unlink(out / "stray-000000.tar")
    code, problems, _ = verify(capsys, out)  # no shard left at all: still a finding, not a usage error
    assert code == 1 and len(problems) == len(shards)


def test_verify_usage_errors(tmp_path, capsys):
    code, _, err = run(capsys, "verify", tmp_path / "nope")
    assert code == 2 and "no such file" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "verify", tmp_path / "empty")
    assert code == 2 and "no shard found" in err


def test_ls_shows_the_merged_tree(sample_tree, tmp_path, capsys):
    out = tmp_path / "out"
    pack(capsys, sample_tree, out, "--shard-members", "30", "--mtime", "1700000000")
    code, stdout, err = run(capsys, "ls", out)
    assert (code, stdout, err) == (0, "train\n", "")
    classes = [f"n{c:08d}" for c in range(6)]
    code, stdout, _ = run(capsys, "ls", out, "train")
    assert stdout.split() == classes
    code, stdout, _ = run(capsys, "ls", out, "/train/n00000001/", "-l")
    lines = stdout.splitlines()
    assert len(lines) == 12
    names = sorted(p.name for p in (sample_tree / "train" / "n00000001").iterdir())
    for line, name in zip(lines, names):
        mode, size, day, hour, shard, shown = line.split()
        assert (mode, shown) == ("-rw-r--r--", name)
        assert int(size) == (sample_tree / "train" / "n00000001" / name).stat().st_size
        assert shard in ("train-000000.tar", "train-000001.tar")  # images 12..23 straddle shards 0 and 1
    code, stdout, _ = run(capsys, "ls", out, "train/n00000005/n00000005_3.JPEG", "-l")
    assert stdout.split()[-2:] == ["train-000002.tar", "train/n00000005/n00000005_3.JPEG"]

    code, stdout, _ = run(capsys, "ls", out, "-R")
    blocks = stdout.split("\n\n")
    assert blocks[0] == ".:\ntrain" and blocks[1] == "train:\n" + "\n".join(classes)
    assert [b.splitlines()[0] for b in blocks[2:]] == [f"train/{c}:" for c in classes]
    assert sum(len(b.splitlines()) - 1 for b in blocks[2:]) == 72

    code, _, err = run(capsys, "ls", out, "train/nope")
    assert code == 2 and "no such file or directory" in err


def test_ls_warns_about_problems_on_stderr(sample_tree, tmp_path, capsys):
    out = tmp_path / "out"
    shards = pack(capsys, sample_tree, out, "--shard-members", "30")
    truncate(shards[1], os.path.getsize(shards[1]) - 4000)
    code, stdout, err = run(capsys, "ls", out, "train")
    assert code == 0 and stdout.split() == [f"n{c:08d}" for c in range(6)]
    # After the log line that its index is stale (the shard changed): loaded in this process now.
    assert "\nshardfs: warning: train-000001.tar: truncated" in err


def test_ls_previews_a_merge_of_several_sources(tmp_path, sample_tree, capsys):
    from benchlib import sample

    first, second = tmp_path / "first", tmp_path / "second"
    sample.pack_tar_round_robin(str(sample_tree), str(first), shards=2)
    extra = tmp_path / "extra" / "val"
    extra.mkdir(parents=True)
    (extra / "only.bin").write_bytes(b"x" * 10)
    sample.pack_tar_round_robin(str(tmp_path / "extra"), str(second), shards=1, prefix="val")
    code, stdout, _ = run(capsys, "ls", str(first), str(second))
    assert code == 0 and stdout.split() == ["train", "val"]
    code, stdout, _ = run(capsys, "ls", str(first), str(second / "val-000000.tar"), "--path", "val", "-l")
    assert code == 0 and "only.bin" in stdout and "val-000000.tar" in stdout
    code, stdout, _ = run(capsys, "ls", str(first), str(second), "val")  # the short form: PATH last
    assert code == 0 and stdout.split() == ["only.bin"]
