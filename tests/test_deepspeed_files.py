"""A DeepSpeed config named by a script or a launch line."""

from lintdist.deepspeed_files import ABSENT, named_deepspeed_config, top_value


def test_reads_the_config_beside_the_file_that_names_it(tmp_path):
    (tmp_path / "ds.json").write_text('{"gradient_clipping": "auto", "zero_optimization": {"stage": 3}}\n')
    found = named_deepspeed_config("ds.json", tmp_path / "train.py")
    assert found is not None
    path, document = found
    assert path == tmp_path / "ds.json"
    assert top_value(document, "gradient_clipping") == "auto"
    assert top_value(document, "train_micro_batch_size_per_gpu") is ABSENT
    assert document.key_position("zero_optimization", "stage") == (1, 53)


def test_missing_files_shell_values_and_other_configs_are_none(tmp_path):
    (tmp_path / "other.json").write_text('{"name": "not deepspeed"}\n')
    beside = tmp_path / "train.sh"
    assert named_deepspeed_config("missing.json", beside) is None
    assert named_deepspeed_config("$DS_CONFIG", beside) is None
    assert named_deepspeed_config("configs/{stage}.json", beside) is None
    assert named_deepspeed_config("other.json", beside) is None
    assert named_deepspeed_config("train.py", beside) is None
