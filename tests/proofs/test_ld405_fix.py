"""LD405's fix proven by running it on 2 gloo ranks: rank 0 rotates the checkpoints (limit 1, slowly) and then
`save_state` runs on every rank. With the barrier the fix puts between the two, the new checkpoint keeps every
rank's files. In the order the fix wrote before (the save right after the guarded rotation, no barrier), rank 1
creates the new folder first, rank 0's rotation counts it and deletes it with rank 1's RNG state, and rank 0's save
then makes the folder again with its own files only."""

from __future__ import annotations

import pytest

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow

SAVE = "        accelerator.save_state(save_path)\n"
BARRIER = "        accelerator.wait_for_everyone()\n"
EVERY_RANK = {"random_states_0.pkl", "random_states_1.pkl"}


def test_barrier_after_the_rotation_keeps_the_new_checkpoint_whole(tmp_path):
    broken, fixed = fixed_copy("ld405_rotation_then_save.py", tmp_path, codes="LD405", unsafe=True)
    text = fixed.read_text()
    assert BARRIER + SAVE in text
    assert text.index("shutil.rmtree(os.path.join(root, old))") < text.index(BARRIER + SAVE)
    unordered = tmp_path / "unordered" / broken.name
    unordered.parent.mkdir()
    unordered.write_text(text.replace(BARRIER + SAVE, SAVE))

    after = run_ranks(fixed, tmp_path / "out-fixed")
    for report in after:
        assert report["folders"] == ["checkpoint-2"]  # the limit holds
        assert EVERY_RANK <= set(report["last"])

    before = run_ranks(unordered, tmp_path / "out-unordered")
    for report in before:
        assert report["folders"] == ["checkpoint-2"]
        assert "random_states_0.pkl" in report["last"]
        assert "random_states_1.pkl" not in report["last"], "rank 0's rotation deleted rank 1's part"
