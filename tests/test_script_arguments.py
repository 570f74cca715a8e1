"""The options a launch line passes to its script."""

from lintdist.script_arguments import script_flags
from lintdist.sources import parse_launch


def _flags(text: str) -> dict:
    command = parse_launch(text).commands[0]
    return {name: flag.value for name, flag in script_flags(command, text).items()}


def test_options_after_the_script_with_values_spaced_or_joined():
    text = "deepspeed --num_gpus 8 run.py --deepspeed ds.json --per-device-train-batch-size=4 --bf16 --fp16 True\n"
    assert _flags(text) == {"deepspeed": "ds.json", "per_device_train_batch_size": "4", "bf16": None, "fp16": "True"}


def test_launcher_options_and_continued_lines():
    text = "torchrun --nproc_per_node 2 \\\n  train.py \\\n  --max_grad_norm 0.5 \\\n  --output_dir out\n"
    assert _flags(text) == {"max_grad_norm": "0.5", "output_dir": "out"}


def test_a_bare_switch_before_another_option_has_no_value():
    assert _flags("deepspeed raw.py --deepspeed --deepspeed_config ds.json\n") == {
        "deepspeed": None,
        "deepspeed_config": "ds.json",
    }


def test_no_script_no_options():
    text = "accelerate launch --num_processes 2 -m pkg.train --lr 1\n"
    commands = parse_launch(text).commands
    assert all(script_flags(c, text) == {} for c in commands if c.script is None)
