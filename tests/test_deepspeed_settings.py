"""``lintdist.deepspeed_settings``: the ZeRO stage, gradient clipping and accumulation reads of DeepSpeed."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.deepspeed_settings import (
    DEFAULT_CLIPPING,
    NO_CLIPPING,
    UNKNOWN,
    deepspeed_engine,
    engine_by_api,
    gradient_clipping,
    literal_zero_stage,
    may_run_deepspeed,
    reads_accumulation_steps,
    runs_deepspeed,
    zero_stage,
)
from lintdist.facts import PythonFacts
from lintdist.launch import Launch, LaunchSettings, Said, Setting
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _settings(**values) -> LaunchSettings:
    settings = LaunchSettings()
    for name, value in values.items():
        settings.set(Setting(name, value, "config.yaml", 1, 0, "yaml"))
    return settings


PLUGIN = """
    from accelerate import Accelerator, DeepSpeedPlugin
    stage = 3
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage, gradient_clipping=0.5))
"""


def test_zero_stage_from_the_plugin_its_default_or_the_launch():
    assert zero_stage(_facts(PLUGIN), None) == 3
    assert zero_stage(_facts("from accelerate import DeepSpeedPlugin\nDeepSpeedPlugin()\n"), None) == 2
    assert zero_stage(_facts("from accelerate import DeepSpeedPlugin\nDeepSpeedPlugin(hf_ds_config=p)\n"), None) is None
    assert zero_stage(_facts("x = 1\n"), _settings(zero_stage="1")) == 1
    assert zero_stage(_facts("x = 1\n"), _settings()) is None


def test_gradient_clipping_from_the_plugin_the_launch_or_accelerate_default():
    assert gradient_clipping(_facts(PLUGIN), None, True) == 0.5
    assert gradient_clipping(_facts("x = 1\n"), _settings(gradient_clipping="2"), True) == 2.0
    assert gradient_clipping(_facts("x = 1\n"), _settings(deepspeed_config_file="ds.json"), True) is UNKNOWN
    assert gradient_clipping(_facts("x = 1\n"), None, True) == DEFAULT_CLIPPING
    assert gradient_clipping(_facts("x = 1\n"), None, False) is UNKNOWN


def test_runs_deepspeed_by_the_code_or_the_launch():
    assert runs_deepspeed(_facts(PLUGIN), _settings())
    assert runs_deepspeed(_facts("x = 1\n"), _settings(distributed_type="DEEPSPEED"))
    assert not runs_deepspeed(_facts("x = 1\n"), _settings(distributed_type="MULTI_GPU"))


def test_reads_of_the_deepspeed_accumulation_steps():
    read = cst.parse_expression
    assert reads_accumulation_steps(
        read('accelerator.state.deepspeed_plugin.deepspeed_config["gradient_accumulation_steps"]')
    )
    assert reads_accumulation_steps(read("state.deepspeed_plugin.gradient_accumulation_steps"))
    assert not reads_accumulation_steps(read("args.gradient_accumulation_steps"))
    assert not reads_accumulation_steps(read('deepspeed_config["train_batch_size"]'))


def test_literal_zero_stage_reads_dict_literals_and_dict_calls():
    assert literal_zero_stage(_facts('config = {"train_batch_size": 8, "zero_optimization": {"stage": 3}}')) == 3
    assert literal_zero_stage(_facts("config = dict(zero_optimization=dict(stage=2))")) == 2
    assert literal_zero_stage(_facts('stage = 1\nconfig = {"zero_optimization": {"stage": stage}}')) == 1
    assert literal_zero_stage(_facts('config = {"zero_optimization": {"stage": args.stage}}')) is None
    assert literal_zero_stage(_facts('config = {"stage": 3}')) is None


def test_deepspeed_engine_follows_the_first_value_of_initialize_and_its_module():
    facts = _facts(
        """
        import deepspeed
        engine, optimizer, _, _ = deepspeed.initialize(model=net, config=cfg)
        engine.module.generate(x)
        optimizer.step()
        net(x)
        """
    )
    calls = {facts.index.module.code_for_node(c.func): c for c in facts.calls}
    generate = calls["engine.module.generate"]
    assert deepspeed_engine(facts, generate.func.value, generate)
    step = calls["optimizer.step"]
    assert not deepspeed_engine(facts, step.func.value, step)
    assert not deepspeed_engine(facts, calls["net"].func, calls["net"])


def test_may_run_deepspeed_from_launcher_launch_settings_and_code():
    plain = _facts("from transformers import TrainingArguments\nargs = TrainingArguments('out', deepspeed=None)\n")
    launched = Launch(launcher=Said("deepspeed", "run.sh", 2, "`deepspeed train.py`"))
    assert may_run_deepspeed(plain, None, launched)
    assert not may_run_deepspeed(plain, None, Launch())
    assert not may_run_deepspeed(plain, None, None)
    assert may_run_deepspeed(plain, _settings(distributed_type="DEEPSPEED"), Launch())
    configured = _facts("args = TrainingArguments('out', deepspeed='z2.json')\n")
    assert may_run_deepspeed(configured, None, Launch())


ENGINE_USER = """
    class Rollout:
        def __init__(self, owner, helper):
            self.policy = owner.policy
            self.helper = helper
            self.made = build(owner)

        def sample(self, prompts):
            self.policy.module.generate(prompts)
            self.helper.module.generate(prompts)
            self.made.module.generate(prompts)

        def learn(self, loss):
            self.policy.backward(loss)
            self.policy.step()
            self.helper.step()
            self.made.backward(loss)
            self.made.step()
    """


def test_engine_by_api_needs_backward_step_and_module_on_a_value_made_out_of_sight():
    facts = _facts(ENGINE_USER)
    calls = {facts.index.module.code_for_node(c.func): c for c in facts.calls}
    policy = calls["self.policy.module.generate"]
    assert engine_by_api(facts, policy.func.value, policy) == (
        "`self.policy` is used as a DeepSpeed engine: `backward`, `module`, `step`"
    )
    helper = calls["self.helper.module.generate"]
    assert engine_by_api(facts, helper.func.value, helper) is None  # no `backward`: an optimizer-like helper
    made = calls["self.made.module.generate"]
    assert engine_by_api(facts, made.func.value, made) is None  # built by a call in sight: decided there


def test_engine_by_api_leaves_engines_made_here_to_deepspeed_engine():
    facts = _facts(
        """
        import deepspeed
        engine, *_ = deepspeed.initialize(model=net, config=cfg)
        engine.module.generate(x)
        engine.backward(loss)
        engine.step()
        """
    )
    generate = next(c for c in facts.calls if facts.method_name(c) == "generate")
    assert engine_by_api(facts, generate.func.value, generate) is None
    assert deepspeed_engine(facts, generate.func.value, generate)


def test_a_launch_line_passing_the_script_deepspeed_means_deepspeed_may_wrap_its_model(tmp_path, lintdist):
    (tmp_path / "train.py").write_text(
        "from accelerate import Accelerator, DistributedDataParallelKwargs\n\n"
        "accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])\n"
        'model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})\n'
    )
    (tmp_path / "run.sh").write_text("torchrun --nproc_per_node 2 train.py --output_dir out\n")
    found = lintdist("check", "--no-cache", "--select", "LD313", "--output-format", "concise", str(tmp_path))
    assert "train.py:4:" in found.output, "under DDP the handler turns the search on"
    (tmp_path / "run.sh").write_text(
        "torchrun --nproc_per_node 2 train.py --deepspeed ds_zero2.json --output_dir out\n"
    )
    quiet = lintdist("check", "--no-cache", "--select", "LD313", "--output-format", "concise", str(tmp_path))
    assert "LD313" not in quiet.output, "DeepSpeed wraps no DDP: accelerate hands the handler to DDP only"


def test_gradient_clipping_read_from_the_deepspeed_file_an_accelerate_config_names(tmp_path):
    def clipping(ds_json: str, **launch) -> object:
        (tmp_path / "ds.json").write_text(ds_json)
        settings = LaunchSettings()
        settings.set(Setting("deepspeed_config_file", "ds.json", str(tmp_path / "accelerate.yaml"), 1, 0, "yaml"))
        for name, value in launch.items():
            settings.set(Setting(name, value, "env", 1, 0, "env"))
        return gradient_clipping(_facts("x = 1\n"), settings, True)

    zero = '"zero_optimization": {"stage": 2}'
    assert clipping(f'{{"gradient_clipping": 0.5, {zero}}}') == 0.5
    assert clipping(f'{{"gradient_clipping": "auto", {zero}}}') is DEFAULT_CLIPPING
    assert clipping(f'{{"gradient_clipping": "auto", {zero}}}', gradient_clipping="2") == 2.0
    assert clipping(f"{{{zero}}}") is NO_CLIPPING, "accelerate fills only 'auto' values: DeepSpeed's default stays"
    assert clipping('{"not": "deepspeed"}') is UNKNOWN
