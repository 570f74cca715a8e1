"""The training-loop facts (lintdist/loop.py) on small scripts: what every accumulation rule reads."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.launch import LaunchSettings, Setting
from lintdist.loop import Term, TrainingLoop
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _loop(source: str, settings: LaunchSettings | None = None) -> TrainingLoop:
    module = cst.parse_module(textwrap.dedent(source))
    index = SyntaxIndex(module)
    return TrainingLoop(PythonFacts(index, NameResolver(index)), settings)


def _code(loop: TrainingLoop, node: cst.CSTNode | None) -> str | None:
    return None if node is None else loop.facts.index.module.code_for_node(node)


def test_backward_sites_name_their_kind_loss_and_receiver():
    loop = _loop(
        """
        import torch
        from accelerate import Accelerator as Acc
        from lightning import Fabric

        acc = Acc()
        fabric = Fabric()
        loss.backward()
        acc.backward(loss / 2, retain_graph=True)
        fabric.backward(loss)
        scaler.scale(loss).backward()
        self.manual_backward(loss)
        torch.autograd.backward(loss)
        engine.backward(loss)
        """
    )
    sites = [(s.kind, _code(loop, s.loss), _code(loop, s.receiver)) for s in loop.backward_sites]
    assert sites == [
        ("tensor", "loss", None),
        ("accelerator", "loss / 2", "acc"),
        ("fabric", "loss", "fabric"),
        ("scaler", "loss", "scaler"),
        ("manual", "loss", "self"),
        ("autograd", "loss", None),
        ("engine", "loss", "engine"),
    ]


def test_steps_know_optimizers_schedulers_and_their_gates():
    loop = _loop(
        """
        import torch
        from transformers import get_scheduler

        opt = torch.optim.AdamW(model.parameters())
        warmup = get_scheduler("linear", optimizer=opt)
        model, opt2 = accelerator.prepare(model, opt)
        for step, batch in enumerate(loader):
            loss = model(batch).sum()
            loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt2.step()
                warmup.step()
                opt2.zero_grad()
            if accelerator.sync_gradients:
                scaler.step(opt)
            if micro_step == accum_steps:
                env.step()
        """
    )
    steps = [(s.kind, _code(loop, s.call.func), s.gate.kind if s.gate else None) for s in loop.steps]
    assert steps == [
        ("clip", "torch.nn.utils.clip_grad_norm_", "modulo"),
        ("optimizer", "opt2.step", "modulo"),
        ("scheduler", "warmup.step", "modulo"),
        ("zero_grad", "opt2.zero_grad", "modulo"),
        ("optimizer", "scaler.step", "sync_gradients"),
    ]  # env.step() is no optimizer: not a step, though its gate is a counter
    env_step = next(c for c in loop.facts.calls if _code(loop, c.func) == "env.step")
    assert loop.gate_of(env_step).kind == "counter"


def test_accumulate_and_no_sync_blocks():
    loop = _loop(
        """
        from contextlib import nullcontext
        from accelerate import Accelerator
        from lintdist.runtime import grad_sync

        accelerator = Accelerator(gradient_accumulation_steps=4)
        with (accelerator.accumulate(gen), accelerator.accumulate(disc)):
            inside = 1
        with accelerator.no_sync(model):
            pass
        with ddp_model.no_sync():
            pass
        with grad_sync(ddp_model, sync=last):
            pass
        ctx = ddp_model.no_sync if not last else nullcontext
        with ctx():
            pass
        context = nullcontext() if last else ddp_model.no_sync()
        with context:
            inside_context = 1
        ddp_model.require_backward_grad_sync = last
        fsdp_model.set_requires_gradient_sync(False)
        """
    )
    [block] = loop.accumulate_blocks
    assert [_code(loop, m) for m in block.models] == ["gen", "disc"]
    inside = loop.facts.index.nodes(cst.Assign)[1]
    assert loop.accumulate_block_of(inside) is block
    kinds = [(b.kind, _code(loop, b.model)) for b in loop.no_sync_blocks]
    assert kinds == [
        ("accelerator", "model"),
        ("model", "ddp_model"),
        ("grad_sync", "ddp_model"),
        ("model", "ddp_model"),
        ("model", "ddp_model"),
    ]
    inside_context = loop.facts.index.nodes(cst.Assign)[-2]
    assert loop.no_sync_of(inside_context) is loop.no_sync_blocks[-1]
    assert len(loop.sync_toggles) == 2
    assert loop.accumulates


def test_configured_accumulation_from_keyword_plugin_and_launch():
    loop = _loop(
        """
        from accelerate import Accelerator
        from accelerate.utils import GradientAccumulationPlugin

        plugin = GradientAccumulationPlugin(num_steps=8, sync_each_batch=True)
        a = Accelerator(gradient_accumulation_plugin=plugin)
        b = Accelerator(gradient_accumulation_steps=1)
        c = Accelerator(gradient_accumulation_steps=args.ga)
        a.backward(loss)
        """
    )
    a, b, c = loop.accelerators
    assert _code(loop, loop.configured_accumulation(a)) == "8"
    assert loop.configured_accumulation(b) is None
    assert _code(loop, loop.configured_accumulation(c)) == "args.ga"
    site = loop.backward_sites[0]
    assert _code(loop, loop.accelerator_accumulation(site.receiver, site.call)) == "8"
    assert loop.sync_each_batch

    plain = _loop("from accelerate import Accelerator\naccelerator = Accelerator()\n")
    assert not plain.accumulates and plain.launch_accumulation is None
    settings = LaunchSettings()
    settings.set(Setting("gradient_accumulation_steps", 4, "ds.json", 3, 5, "yaml"))
    settings.set(Setting("distributed_type", "DEEPSPEED", "cfg.yaml", 1, 1, "yaml"))
    launched = _loop("from accelerate import Accelerator\naccelerator = Accelerator()\n", settings)
    assert launched.accumulates and launched.launch_accumulation.value == 4
    assert launched.backend == "DEEPSPEED"


def test_lightning_accumulation_counts_only_above_one():
    assert _loop("import lightning as L\nL.Trainer(accumulate_grad_batches=4)\n").accumulates
    assert not _loop("import lightning as L\nL.Trainer(accumulate_grad_batches=1)\n").accumulates


def test_loss_chain_follows_bindings_helpers_and_sums_of_means():
    loop = _loop(
        """
        import torch.nn.functional as F
        from my_project.losses import token_loss

        def scaled(outputs):
            return outputs.loss / accelerator.gradient_accumulation_steps

        outputs = model(**batch)
        loss = scaled(outputs)
        accelerator.backward(loss)
        ce = F.cross_entropy(logits, labels, reduction="sum", ignore_index=-100)
        accelerator.backward(ce / num_items)
        first, parts = token_loss(logits, labels)
        second, _ = token_loss(logits_b, labels_b)
        accelerator.backward(first + second)
        """
    )
    mean, normalised, helper = (loop.chain(s.loss, loop.statement_of(s.call)) for s in loop.backward_sites)
    assert (mean.base, mean.assumed) == ("mean", False)
    assert [loop.factor(t).kind for t in mean.den] == ["accum"]
    assert normalised.base == "sum"
    assert [loop.factor(t).kind for t in normalised.den] == ["count"]
    assert (helper.base, helper.assumed) == ("mean", True)


def test_short_fixed_labels_need_a_short_max_length():
    short = _loop('labels = tokenizer(targets, max_length=3, padding="max_length", truncation=True)\n')
    long = _loop('labels = tokenizer(targets, max_length=128, padding="max_length", truncation=True)\n')
    longest_class = _loop(
        "n = max(len(tokenizer(c)['input_ids']) for c in classes)\n"
        'def encode(x):\n    labels = tokenizer(x, max_length=n, padding="max_length")["input_ids"]\n'
    )
    assert short.short_fixed_labels and longest_class.short_fixed_labels
    assert not long.short_fixed_labels


def test_model_head_through_prepare_and_to():
    loop = _loop(
        """
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

        lm = AutoModelForCausalLM.from_pretrained("x").to(device)
        lm, opt = accelerator.prepare(lm, opt)
        clf = AutoModelForSequenceClassification.from_pretrained("y")
        lm
        clf
        """
    )
    lm, clf = (e.value for e in loop.facts.index.nodes(cst.Expr))
    assert loop.head(lm, lm) == "causal"
    assert loop.head(clf, clf) == "sequence"


def test_factor_does_not_follow_an_attribute_name_as_a_variable():
    # `loss` in `model(**b).loss` is an attribute, not the variable `loss` divided by the steps further down
    loop = _loop(
        """
        for b in loader:
            loss = model(**b).loss
            accelerator.backward(loss / args.gradient_accumulation_steps)
            loss = loss / args.gradient_accumulation_steps
        factor(model(**b).loss)
        factor(loss)
        """
    )
    attribute, variable = (c.args[0].value for c in loop.facts.calls if _code(loop, c.func) == "factor")
    assert loop.factor(Term(attribute, attribute)).kind == "other"
    assert loop.factor(Term(variable, variable)).kind == "accum"


def test_accumulation_loop_is_the_inner_range_with_the_step_after_it():
    loop = _loop(
        """
        for it in range(max_iters):
            for micro_step in range(gradient_accumulation_steps):
                loss = model(x, y) / gradient_accumulation_steps
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for i in range(1):
            one.backward()
        optimizer.step()
        """
    )
    inner, single = loop.backward_sites
    window = loop.accumulation_loop(inner.call)
    assert _code(loop, window.bound) == "gradient_accumulation_steps"
    assert _code(loop, window.step.call) == "optimizer.step()"
    assert window.outer is loop.facts.loops[0]
    assert loop.accumulation_loop(single.call) is None  # `range(1)` names no accumulation


def test_accelerator_accumulation_division_and_branches():
    loop = _loop(
        """
        from accelerate import Accelerator

        accelerator = Accelerator(gradient_accumulation_steps=4)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                if use_raw:
                    loss = loss / 4
                    loss.backward()
                else:
                    accelerator.backward(loss)
                    accelerator.backward(loss / args.gradient_accumulation_steps)
        """
    )
    raw, plain, divided = loop.backward_sites
    acc = loop.accumulation(plain.receiver, plain.call)
    assert (acc.state, acc.value) == ("configured", 4)
    # the division in the `if` branch does not reach the `else` branch's backward
    assert loop.accumulation_division(plain.loss, plain.call, acc) is None
    assert _code(loop, loop.accumulation_division(raw.loss, raw.call, acc).term.expr) == "4"
    division = loop.accumulation_division(divided.loss, divided.call, acc)
    assert _code(loop, division.term.expr) == "args.gradient_accumulation_steps" and not division.exact


def test_launch_accumulation_reaches_the_accelerator_only_from_env_or_under_deepspeed():
    def settings(*values: Setting) -> LaunchSettings:
        result = LaunchSettings()
        for value in values:
            result.set(value)
        return result

    flag = Setting("gradient_accumulation_steps", "4", "launch.sh", 1, 1, "flag")
    env = Setting("gradient_accumulation_steps", "4", "launch.sh", 1, 1, "env")
    deepspeed = Setting("distributed_type", "DEEPSPEED", "config.yaml", 1, 1, "yaml")
    script = "from accelerate import Accelerator\nacc = Accelerator()\n"
    assert _loop(script, settings(flag)).launch_accumulation is None  # `--multi_gpu`: the flag goes nowhere
    assert _loop(script, settings(env)).launch_accumulation is env
    assert _loop(script, settings(flag, deepspeed)).launch_accumulation is flag
    accelerator = _loop(script, settings(flag)).accelerators[0]
    assert _loop(script, settings(flag, deepspeed)).accumulation(None, accelerator).value == 4


def test_a_prepared_model_stays_prepared_through_compile_moves_and_positions():
    loop = _loop(
        """
        import torch
        from accelerate import Accelerator

        def main(net, loader, optimizers, device):
            accelerator = Accelerator()
            parts = accelerator.prepare(net, loader, *optimizers)
            net = parts[0]
            net = net.to(device)
            net = torch.compile(net)
            keep(net, parts[0])
        """
    )
    facts = loop.facts
    keep = next(c for c in facts.calls if facts.index.module.code_for_node(c.func) == "keep")
    prepared = [_code(loop, loop.prepared_model(a.value, keep)) for a in keep.args]
    assert prepared == ["accelerator.prepare(net, loader, *optimizers)"] * 2


def test_a_model_compiled_before_nothing_prepares_it_is_not_prepared():
    loop = _loop(
        """
        import torch

        def main(net):
            net = torch.compile(net)
            keep(net)
        """
    )
    keep = next(c for c in loop.facts.calls if loop.facts.index.module.code_for_node(c.func) == "keep")
    assert loop.prepared_model(keep.args[0].value, keep) is None


def test_module_code_runs_in_order_a_later_prepare_does_not_reach_an_earlier_use():
    # A guide's plain loop and then its accelerate version, read as one program: the plain loop's model is not
    # the prepared one. A module-level loop that prepares the name again later in its body is (next iteration).
    loop = _loop(
        """
        from accelerate import Accelerator

        for batch in loader:
            keep(model)
        accelerator = Accelerator()
        model = accelerator.prepare(model)
        keep(model)
        while True:
            keep(net)
            net = accelerator.prepare(net)
        """
    )
    facts = loop.facts
    kept = [c for c in facts.calls if facts.index.module.code_for_node(c.func) == "keep"]
    found = [loop.prepared_model(c.args[0].value, c) for c in kept]
    assert found[0] is None
    assert _code(loop, found[1]) == "accelerator.prepare(model)"
    assert _code(loop, found[2]) == "accelerator.prepare(net)"
