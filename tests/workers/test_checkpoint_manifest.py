"""Signed checkpoint manifests (issue 11, finding 10): a checkpoint verifies only with the key of the
job that saved it and only while its files are exactly those it saved; every refusal names the
checkpoint and the file. (The end-to-end case, a DeepSpeed partition replaced by a pickle that runs
code and refused before anything unpickles it, is in engines/training/test_elastic.py.)"""

from __future__ import annotations

import pathlib

import pytest

from plrl_workers import checkpoint_manifest as manifest

KEY = manifest.signing_key("job-token")


@pytest.fixture
def ckpt(tmp_path: pathlib.Path) -> pathlib.Path:
    d = tmp_path / "step-00000004"
    (d / "deepspeed" / "state").mkdir(parents=True)
    (d / "deepspeed" / "state" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(
        b"\x80\x04partition"
    )
    (d / "meta.json").write_text('{"step": 4}')
    manifest.write(d, KEY)
    return d


def test_an_untouched_checkpoint_verifies(ckpt: pathlib.Path) -> None:
    manifest.verify(ckpt, KEY)


def test_a_changed_file_is_refused_by_name(ckpt: pathlib.Path) -> None:
    part = ckpt / "deepspeed" / "state" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    part.write_bytes(b"\x80\x04partitioN")  # same size, one byte differs
    with pytest.raises(
        manifest.CheckpointRefused, match=rf"checkpoint {ckpt}: deepspeed/state/zero_pp_rank_0.*changed"
    ):
        manifest.verify(ckpt, KEY)


def test_added_and_removed_files_are_refused(ckpt: pathlib.Path) -> None:
    (ckpt / "deepspeed" / "extra.pt").write_bytes(b"x")
    with pytest.raises(manifest.CheckpointRefused, match=r"deepspeed/extra\.pt was added after it was saved"):
        manifest.verify(ckpt, KEY)
    (ckpt / "deepspeed" / "extra.pt").unlink()
    (ckpt / "meta.json").unlink()
    with pytest.raises(manifest.CheckpointRefused, match=r"meta\.json is signed but missing"):
        manifest.verify(ckpt, KEY)


def test_another_jobs_key_a_rewritten_manifest_or_none_at_all_is_refused(ckpt: pathlib.Path) -> None:
    with pytest.raises(manifest.CheckpointRefused, match="not signed with this job's token"):
        manifest.verify(ckpt, manifest.signing_key("another-job"))
    # Whoever replaces a file cannot re-sign without the token: a manifest signed with another key.
    (ckpt / "meta.json").write_text('{"step": 5}')
    manifest.write(ckpt, manifest.signing_key("attacker"))
    with pytest.raises(manifest.CheckpointRefused, match="not signed with this job's token"):
        manifest.verify(ckpt, KEY)
    (ckpt / manifest.MANIFEST).write_text("{not json")
    with pytest.raises(manifest.CheckpointRefused, match="unreadable"):
        manifest.verify(ckpt, KEY)
    (ckpt / manifest.MANIFEST).unlink()
    with pytest.raises(manifest.CheckpointRefused, match=r"no manifest\.json"):
        manifest.verify(ckpt, KEY)


def test_a_symlink_in_a_checkpoint_is_refused(ckpt: pathlib.Path, tmp_path: pathlib.Path) -> None:
    (tmp_path / "elsewhere.pt").write_bytes(b"x")
    (ckpt / "link.pt").symlink_to(tmp_path / "elsewhere.pt")
    with pytest.raises(manifest.CheckpointRefused, match=r"link\.pt is not a regular file"):
        manifest.verify(ckpt, KEY)
