"""The facts' questions that several rules ask: each answered once here, tested on small scripts."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts, epoch_counter, single_pass
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, text: str) -> cst.Call:
    """The first call whose callee reads ``text``."""
    module = facts.index.module
    return next(c for c in facts.calls if module.code_for_node(c.func) == text)


# -- the Accelerator as spelled at a point -------------------------------------------------------


def test_accelerator_used_in_the_same_function_is_named_as_written():
    facts = _facts(
        """
        from accelerate import Accelerator

        def main():
            accelerator = Accelerator()
            model = accelerator.prepare(model)
            torch.save(model.state_dict(), "m.pt")
        """
    )
    assert facts.accelerator_at(_call(facts, "torch.save")) == "accelerator"


def test_accelerator_known_by_an_accelerate_only_method_it_is_called_with():
    facts = _facts(
        """
        from accelerate import Accelerator

        def setup():
            return Accelerator()

        def run(model):
            acc = setup()
            with acc.autocast():
                pass
            torch.save(model, "m.pt")
        """
    )
    assert facts.accelerator_at(_call(facts, "torch.save")) == "acc"


def test_accelerator_in_a_method_is_the_attribute_the_class_sets():
    facts = _facts(
        """
        from accelerate import Accelerator

        class Runner:
            def __init__(self):
                self.accelerator = Accelerator()

            def save(self, model):
                torch.save(model.state_dict(), "m.pt")

            @staticmethod
            def export(model):
                torch.save(model, "x.pt")
        """
    )
    saves = [c for c in facts.calls if facts.index.module.code_for_node(c.func) == "torch.save"]
    assert facts.accelerator_at(saves[0]) == "self.accelerator"
    assert facts.accelerator_at(saves[1]) is None  # a static method has no `self`


def test_a_module_level_accelerator_is_seen_from_a_function_unless_it_rebinds_the_name():
    facts = _facts(
        """
        from accelerate import Accelerator

        accelerator = Accelerator()

        def save(model):
            torch.save(model.state_dict(), "m.pt")

        def other(model):
            accelerator = make()
            torch.save(model, "x.pt")
        """
    )
    saves = [c for c in facts.calls if facts.index.module.code_for_node(c.func) == "torch.save"]
    assert facts.accelerator_at(saves[0]) == "accelerator"
    assert facts.accelerator_at(saves[1]) is None


def test_an_accelerator_known_by_its_module_level_use_is_seen_from_a_function():
    facts = _facts(
        """
        from lib import acc

        acc.wait_for_everyone()
        if acc.is_main_process:
            acc.save_state("ckpt")

        def save(model):
            torch.save(model, "x.pt")
        """
    )
    assert facts.accelerator_at(_call(facts, "torch.save")) == "acc"


def test_an_accelerator_used_only_inside_a_function_is_not_in_sight_at_module_level():
    facts = _facts(
        """
        from accelerate import Accelerator

        def main():
            accelerator = Accelerator()
            accelerator.wait_for_everyone()

        torch.save(model, "x.pt")
        """
    )
    assert facts.accelerator_at(_call(facts, "torch.save")) is None


# -- how the file spells torch.distributed ---------------------------------------------------------


def _distributed(code: str) -> str | None:
    facts = _facts(code)
    return facts.distributed_at(_call(facts, "save"))


def test_distributed_is_spelled_by_its_import_alias():
    assert _distributed("import torch\nimport torch.distributed as dist\nsave()\n") == "dist"
    assert _distributed("from torch import distributed as d\nsave()\n") == "d"
    assert _distributed("from torch import distributed\nsave()\n") == "distributed"


def test_distributed_is_reached_through_torch_when_no_alias_is_imported():
    assert _distributed("import torch\nsave()\n") == "torch.distributed"
    assert _distributed("import torch as th\nsave()\n") == "th.distributed"
    assert _distributed("import torch.nn as nn\nsave()\n") == "torch.distributed"
    assert _distributed("import os\nsave()\n") is None


def test_an_alias_wins_over_torch_wherever_it_is_imported():
    assert _distributed("import torch\nimport os\nimport torch.distributed as dist\nsave()\n") == "dist"
    assert _distributed("import torch as th\nfrom torch import distributed as dist\nsave()\n") == "dist"


def test_an_import_inside_another_function_is_not_in_sight():
    code = """
    import torch

    def setup():
        import torch.distributed as dist
        dist.init_process_group("nccl")

    def main():
        save()
    """
    assert _distributed(code) == "torch.distributed"
    inside = """
    def main():
        import torch.distributed as dist
        save()
    """
    assert _distributed(inside) == "dist"


# -- is this name read -------------------------------------------------------------------------------


def _names(facts: PythonFacts, value: str) -> list[cst.Name]:
    return [n for n in facts.index.nodes(cst.Name) if n.value == value]


def test_a_name_is_read_where_its_value_is_used():
    facts = _facts(
        """
        sd = load()
        print(sd)
        sd += 1
        model.sd.x = f(sd=sd)
        """
    )
    names = _names(facts, "sd")
    # bound, read, read and rebound (`+=`), the attribute `.sd`, the keyword `sd=`, the argument
    assert [facts.is_read(n) for n in names] == [False, True, True, False, False, True]
    assert [facts.is_variable(n) for n in names] == [True, True, True, False, False, True]


def test_binding_forms_are_not_reads():
    facts = _facts(
        """
        import a.sd
        from b import sd
        import c as sd
        a, (sd, *rest) = pair
        for sd in items:
            pass
        with open(p) as sd:
            pass
        try:
            pass
        except OSError as sd:
            pass
        ys = [sd for sd in xs]
        if (sd := f()):
            pass
        del sd
        def sd(sd, *, other=sd):
            global sd
        class sd:
            pass
        """
    )
    reads = [n for n in _names(facts, "sd") if facts.is_read(n)]
    # only the comprehension's element and the parameter default read a value
    assert [facts.index.module.code_for_node(facts.parent(n)).strip()[:12] for n in reads] == [
        "[sd for sd i",
        "other=sd",
    ]
    imported_a = _names(facts, "a")[0]  # the `a` of `import a.sd`
    assert isinstance(facts.parent(imported_a), cst.Attribute) and not facts.is_read(imported_a)


def test_reads_of_a_name_inside_a_scope():
    facts = _facts(
        """
        def main():
            state = convert()
            for state in states:
                pass

        def other():
            print(state)
        """
    )
    main = next(f for f in facts.index.nodes(cst.FunctionDef) if f.name.value == "main")
    assert facts.reads_of("state", main) == []
    assert len(facts.reads_of("state", facts.index.module)) == 1


# -- Lightning -------------------------------------------------------------------------------------


def test_a_lightning_module_is_known_under_every_import_home_and_through_local_bases():
    facts = _facts(
        """
        from pytorch_lightning.core.lightning import LightningModule
        import lightning as L

        class Old(LightningModule):
            def training_step(self, batch, batch_idx):
                return loss

        class Base(L.LightningModule):
            pass

        class Child(Base):
            def training_step(self, batch, batch_idx):
                def inner():
                    return 1
                return inner()

            x = compute()

        class Plain:
            def training_step(self, batch, batch_idx):
                return loss
        """
    )
    classes = {cls.name.value: cls for cls in facts.classes}
    assert [name for name, cls in classes.items() if facts.is_lightning_module(cls)] == ["Old", "Base", "Child"]
    code = facts.index.module.code_for_node
    inner_return = next(r for r in facts.index.nodes(cst.Return) if code(r).strip() == "return 1")
    assert facts.lightning_module_of(inner_return) is classes["Child"]
    plain_step = next(f for f in facts.functions["training_step"] if facts.enclosing_class(f) is classes["Plain"])
    assert facts.lightning_module_of(facts.returns[plain_step][0]) is None
    class_body_call = _call(facts, "compute")
    assert facts.lightning_module_of(class_body_call) is None  # in the class body, not in a method


def _devices(arguments: str, before: str = "") -> str | None:
    facts = _facts(f"import lightning as L\n{before}\ntrainer = L.Trainer({arguments})\n")
    (trainer,) = facts.lightning_trainers
    return facts.trainer_devices(trainer)


def test_a_trainer_on_one_device():
    assert _devices("devices=1") == "one"
    assert _devices('devices="1", num_nodes=1') == "one"
    assert _devices("devices=[0]") == "one"
    assert _devices("devices=n", before="n = min(1, torch.cuda.device_count())") == "one"
    assert _devices('accelerator="cpu"') == "one"
    assert _devices('devices=1, strategy="ddp"') == "one"  # one process: nothing to average


def test_a_trainer_on_several_devices():
    assert _devices("devices=4") == "several"
    assert _devices("devices=[0, 1]") == "several"
    assert _devices("devices=1, num_nodes=2") == "several"
    assert _devices("devices=gpus", before="gpus = 8") == "several"
    assert _devices('strategy="fsdp"') == "several"
    assert _devices("devices=4, **extra") == "several"


def test_a_trainer_whose_devices_are_not_known():
    assert _devices("") is None
    assert _devices("devices=args.gpus") is None
    assert _devices('devices="auto"') is None
    assert _devices("devices=1, **extra") is None  # `extra` may hold num_nodes
    assert _devices("devices=-1") is None


def test_trainers_are_found_under_every_import_home():
    facts = _facts(
        """
        import pytorch_lightning as pl
        from lightning.pytorch.trainer.trainer import Trainer

        a = pl.Trainer()
        b = Trainer(devices=2)
        c = Other()
        """
    )
    assert [facts.index.module.code_for_node(c.func) for c in facts.lightning_trainers] == ["pl.Trainer", "Trainer"]


# -- epoch loops -------------------------------------------------------------------------------------


def _loop(code: str):
    return _facts(code).loops[0]


def test_a_loop_over_one_element_or_range_1_is_a_single_pass():
    assert single_pass(_loop("for epoch in range(1):\n    train()\n"))
    assert single_pass(_loop("for epoch in [0]:\n    train()\n"))
    assert not single_pass(_loop("for epoch in range(epochs):\n    train()\n"))
    assert not single_pass(_loop("for epoch in range(2):\n    train()\n"))
    assert not single_pass(_loop("while True:\n    train()\n"))


def test_the_epoch_counter_is_the_for_target_or_a_while_loops_increment():
    assert epoch_counter(_loop("for epoch in range(3):\n    train()\n")) == "epoch"
    assert epoch_counter(_loop("for _ in range(3):\n    train()\n")) is None
    assert epoch_counter(_loop("for i, batch in enumerate(loader):\n    train()\n")) is None
    assert epoch_counter(_loop("while epoch < n:\n    train()\n    epoch += 1\n")) == "epoch"
    assert epoch_counter(_loop("while epoch < n:\n    epoch += 2\n")) is None


# -- a project's own main-process flag ---------------------------------------------------------------


def _guard_tests(facts: PythonFacts) -> dict[str, cst.If]:
    module = facts.index.module
    return {module.code_for_node(i.test): i for i in facts.index.nodes(cst.If)}


FLAG_CLASS = textwrap.dedent(
    """
    class Layout:
        def __init__(self):
            self.global_rank = int(os.environ["RANK"])
            self.loader_id = 0

        @property
        def is_global_main(self):
            return self.global_rank <= 0

        @property
        def is_main_worker(self):
            return self.loader_id == 0
    """
)


def test_a_flag_property_that_compares_the_rank_with_zero_is_a_main_process_test():
    facts = _facts(FLAG_CLASS + "\nlayout = Layout()\nif layout.is_global_main:\n    pass\n")
    test = _guard_tests(facts)["layout.is_global_main"].test
    assert facts.main_when(test, True)
    assert not facts.main_when(test, False)
    assert facts.excludes_main(test, False) and not facts.excludes_main(test, True)
    assert facts.rank_guard(_guard_tests(facts)["layout.is_global_main"].body.body[0]) is not None


def test_a_flag_whose_definition_reads_no_rank_is_not_a_main_process_test():
    facts = _facts(FLAG_CLASS + "\nlayout = Layout()\nif layout.is_main_worker:\n    pass\n")
    test = _guard_tests(facts)["layout.is_main_worker"].test
    assert facts.project_main_flag(test) is False
    assert not facts.main_when(test, True)


def test_a_flag_set_in_a_method_of_the_class_and_read_through_self():
    facts = _facts(
        """
        class Trainer:
            def setup(self):
                self.is_chief = dist.get_rank() == 0

            def fit(self):
                if self.is_chief:
                    pass
        """
    )
    assert facts.main_when(_guard_tests(facts)["self.is_chief"].test, True)


def test_a_flag_with_no_definition_in_sight_is_known_by_its_name_and_other_names_stay_unknown():
    facts = _facts(
        """
        from elsewhere import env

        if env.is_global_main:
            pass
        if env.is_main_node():
            pass
        if env.is_main_node(rank):
            pass
        if env.main_rank:
            pass
        """
    )
    tests = _guard_tests(facts)
    assert facts.project_main_flag(tests["env.is_global_main"].test) is None
    assert facts.main_when(tests["env.is_global_main"].test, True)
    assert facts.main_when(tests["env.is_main_node()"].test, True)
    assert not facts.main_when(tests["env.is_main_node(rank)"].test, True)  # a question about its argument
    assert not facts.main_when(tests["env.main_rank"].test, True)  # a number, not a flag


# -- a DDP model made by a helper whose body is not in sight ------------------------------------------


def test_a_helper_named_for_ddp_is_known_by_its_name_only_when_its_body_is_not_in_sight():
    facts = _facts(
        """
        from toolkit import init_distributed_data_parallel_model, build_model

        def wrap_ddp(model):
            return model

        a = init_distributed_data_parallel_model(net)
        b = wrap_ddp(net)
        c = build_model(net)
        """
    )
    assert facts.named_ddp_helper(_call(facts, "init_distributed_data_parallel_model")) == (
        "init_distributed_data_parallel_model"
    )
    assert facts.named_ddp_helper(_call(facts, "wrap_ddp")) is None  # its body says what it returns
    assert facts.named_ddp_helper(_call(facts, "build_model")) is None


# -- a class chosen at run time, a loader pulled through an iterator, a name bound on some paths ---------------

SAMPLERS = frozenset({"torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler"})


def test_a_name_bound_to_a_conditional_class_may_construct_either_branch():
    facts = _facts(
        """
        from torch.utils.data import RandomSampler
        from torch.utils.data.distributed import DistributedSampler

        pick = RandomSampler if local_rank == -1 else DistributedSampler
        sampler = pick(dataset)
        """
    )
    call = _call(facts, "pick")
    assert not facts.is_instance_of(call, SAMPLERS)
    assert [facts.index.module.code_for_node(c) for c in facts.class_choices(call)] == [
        "RandomSampler",
        "DistributedSampler",
    ]
    assert facts.may_construct(call, SAMPLERS)


def test_an_inline_conditional_callee_may_construct_a_distributed_sampler():
    facts = _facts(
        """
        import torch.utils.data as tud

        sampler = (tud.distributed.DistributedSampler if distributed else tud.RandomSampler)(dataset)
        """
    )
    call = next(c for c in facts.calls if isinstance(c.func, cst.IfExp))
    assert facts.may_construct(call, SAMPLERS)


def test_a_callee_lintdist_cannot_read_constructs_nothing_known():
    facts = _facts(
        """
        from torch.utils.data import RandomSampler

        pick = make_sampler_class(args)
        other = RandomSampler if shuffle else SequentialSampler
        a = pick(dataset)
        b = other(dataset)
        """
    )
    assert facts.class_choices(_call(facts, "pick")) == []
    assert not facts.may_construct(_call(facts, "pick"), SAMPLERS)
    assert not facts.may_construct(_call(facts, "other"), SAMPLERS)


def test_the_sampler_use_of_a_loader_says_its_class_was_chosen_at_run_time():
    facts = _facts(
        """
        from torch.utils.data import DataLoader, RandomSampler, DistributedSampler

        pick = RandomSampler if local_rank == -1 else DistributedSampler
        loader = DataLoader(dataset, sampler=pick(dataset))
        named = DataLoader(dataset, sampler=DistributedSampler(dataset))
        for batch in loader:
            pass
        for batch in named:
            pass
        """
    )
    (chosen_loop, chosen), (named_loop, named) = facts.data_loops()
    use = facts.distributed_sampler(chosen, chosen_loop)
    assert use is not None and use.chosen and use.shuffle
    assert facts.distributed_sampler(named, named_loop).chosen is False


def test_an_iterator_pulled_with_the_next_method_is_a_pass_over_its_loader():
    facts = _facts(
        """
        stream = iter(loader)
        for step in range(steps):
            batch = stream.next()
        """
    )
    ((loop, loader),) = facts.iterator_passes()
    assert isinstance(loop, cst.For) and facts.index.module.code_for_node(loader) == "loader"


def test_an_iterator_made_again_when_it_runs_out_has_both_starts():
    facts = _facts(
        """
        def fit(loader):
            stream = iter(loader)
            for epoch in range(epochs):
                for step in range(steps):
                    try:
                        batch = next(stream)
                    except StopIteration:
                        stream = iter(loader)
                        batch = next(stream)
        """
    )
    passes = facts.iterator_passes()
    step_loop = passes[0][0]
    assert {id(loop) for loop, _ in passes} == {id(step_loop)}
    first, restart = (c for c in facts.calls if facts.index.module.code_for_node(c.func) == "iter")
    for _, loader in passes:
        assert facts.iterator_starts(loader) == (first, restart)
    assert facts.is_within(restart, step_loop) and not facts.is_within(first, step_loop)


def test_iterator_starts_is_empty_for_a_plain_loop():
    facts = _facts(
        """
        for batch in loader:
            pass
        """
    )
    ((_, loader),) = facts.data_loops()
    assert facts.iterator_starts(loader) == ()


def test_a_name_bound_only_under_a_rank_test_may_be_unbound_after_it():
    facts = _facts(
        """
        def main(local_rank, dataset):
            if local_rank != -1:
                sampler = DistributedSampler(dataset)
            if local_rank == -1:
                both = None
            elif distributed:
                both = DistributedSampler(dataset)
            else:
                both = None
            before = None
            if local_rank != -1:
                before = DistributedSampler(dataset)
            for epoch in range(3):
                pass
            after = 1
        """
    )
    (loop,) = facts.loops
    assert not facts.surely_bound("sampler", loop)
    assert facts.surely_bound("both", loop)
    assert facts.surely_bound("before", loop)
    assert facts.surely_bound("dataset", loop)
    assert not facts.surely_bound("after", loop)


def test_a_name_bound_in_a_loop_or_a_handler_may_be_unbound_after_it():
    facts = _facts(
        """
        for shard in shards:
            last = shard
        try:
            ready = True
        except OSError:
            failed = True
        print(last, ready, failed)
        """
    )
    call = _call(facts, "print")
    assert not facts.surely_bound("last", call)
    assert facts.surely_bound("ready", call)
    assert not facts.surely_bound("failed", call)


# -- elements and items -------------------------------------------------------------------------


def _name_at(facts: PythonFacts, call_text: str, position: int = 0) -> cst.BaseExpression:
    """The ``position``-th argument of the first call whose callee reads ``call_text``."""
    return _call(facts, call_text).args[position].value


def test_an_element_taken_by_position_is_the_element_an_unpacking_would_take():
    facts = _facts(
        """
        from accelerate import Accelerator

        def main(net, loader):
            accelerator = Accelerator()
            parts = accelerator.prepare(net, loader)
            net = parts[0]
            pair = (make_encoder(), make_decoder())
            decoder = pair[1]
            keep(net, decoder)
        """
    )
    code = facts.index.module.code_for_node
    keep = _call(facts, "keep")
    net, decoder = (a.value for a in keep.args)
    [origin] = facts.origins(net, keep)
    assert (code(origin.node), origin.index) == ("accelerator.prepare(net, loader)", 0)
    assert [code(o.node) for o in facts.origins(decoder, keep)] == ["make_decoder()"]


def test_a_slice_or_a_computed_index_is_not_an_element():
    facts = _facts(
        """
        def main(parts, i):
            parts = build()
            first = parts[i]
            rest = parts[1:]
            keep(first, rest)
        """
    )
    keep = _call(facts, "keep")
    code = facts.index.module.code_for_node
    assert [code(o.node) for a in keep.args for o in facts.origins(a.value, keep)] == ["parts[i]", "parts[1:]"]


def test_storing_an_item_does_not_rebind_the_container():
    facts = _facts(
        """
        import torch

        def export(model, path):
            weights = model.state_dict()
            for name, tensor in weights.items():
                weights[name] = tensor.cpu()
            torch.save(weights, path)
        """
    )
    code = facts.index.module.code_for_node
    save = _call(facts, "torch.save")
    assert [code(o.node) for o in facts.origins(_name_at(facts, "torch.save"), save)] == ["model.state_dict()"]
    assert [b.key for b in facts.bindings("weights", save)] == ["weights"]


def test_an_empty_container_filled_by_item_stores_holds_what_was_stored():
    facts = _facts(
        """
        from datasets import DatasetDict, load_dataset

        def build(name):
            raw = DatasetDict()
            raw["train"] = load_dataset(name, split="train")
            return raw.map(tokenize)
        """
    )
    receiver = _call(facts, "raw.map").func.value
    origins = {cst.Module([]).code_for_node(o.node) for o in facts.origins(receiver)}
    assert origins == {"DatasetDict()", 'load_dataset(name, split="train")'}


def test_an_item_store_into_a_state_dict_does_not_change_what_it_is():
    facts = _facts(
        """
        def save(net, path):
            weights = net.state_dict()
            for key, value in weights.items():
                weights[key] = value.cpu()
            torch.save(weights, path)
        """
    )
    receiver = _call(facts, "torch.save").args[0].value
    assert [cst.Module([]).code_for_node(o.node) for o in facts.origins(receiver)] == ["net.state_dict()"]


# -- reach on some path --------------------------------------------------------------------------


def test_a_helper_reached_unguarded_from_one_caller_is_reached_by_every_rank_on_some_path():
    facts = _facts(
        """
        import torch.distributed as dist

        def save(x):
            torch.save(x, "x.pt")

        def run(x):
            if dist.get_rank() == 0:
                save(x)
            {last}

        if __name__ == "__main__":
            run(1)
        """.replace("{last}", "save(x)")
    )
    call = _call(facts, "torch.save")
    assert facts.all_ranks_reach(call).value is False
    assert facts.all_ranks_reach(call, some_path=True).value is True


def test_a_helper_guarded_at_every_caller_is_reached_on_no_path_by_every_rank():
    facts = _facts(
        """
        import torch.distributed as dist

        def save(x):
            torch.save(x, "x.pt")

        def run(x):
            if dist.get_rank() == 0:
                save(x)
            if dist.get_rank() == 0:
                save(x)

        if __name__ == "__main__":
            run(1)
        """
    )
    assert facts.all_ranks_reach(_call(facts, "torch.save"), some_path=True).value is False


# -- an Accelerator known by its conventional name and one attribute -----------------------------


def test_an_unbound_accelerator_is_known_by_its_name_and_one_accelerate_attribute():
    facts = _facts(
        """
        with accelerator.accumulate(generator):
            loss.backward()
        """
    )
    receiver = _call(facts, "accelerator.accumulate").func.value
    assert facts.identified(receiver, receiver, "accelerator") == (
        "`accelerator` is used as an Accelerator: its name, `accumulate`"
    )


def test_one_attribute_names_nothing_on_a_name_that_is_not_conventional():
    facts = _facts(
        """
        with helper.accumulate(generator):
            loss.backward()
        state.backward(loss)
        """
    )
    assert facts.identified(_call(facts, "helper.accumulate").func.value, facts.calls[0], "accelerator") is None
    assert facts.identified(_call(facts, "state.backward").func.value, facts.calls[0], "accelerator") is None
