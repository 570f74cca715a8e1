"""How a batch's labels were built, and what kind of model head receives them.

Rules about token losses ask the same questions of a script: were the labels shifted by hand
(``labels = ids[:, 1:]`` beside ``inputs = ids[:, :-1]``), are they padded with -100, are they
all one length, does the model get ``shift_labels``, and where were they built (a loop, a
``collate_fn`` of a DataLoader, a ``.map(fn)`` preprocessing function, a Dataset's
``__getitem__``, a Trainer's ``data_collator``)? ``LabelFacts.of(facts)`` answers them once per
file from the facts' indexes (no new walk of the module), following a batch from the model
call back through its loop, ``next(iter(loader))``, ``accelerator.prepare`` and the DataLoader
to the functions that built it.

``model_head(facts, expr, at)`` says which transformers head a model expression holds (through
``from_pretrained``, PEFT, ``accelerator.prepare``, DDP, ``.to()``), and whether it shifts
``labels`` itself and hands a ``shift_labels=`` keyword to its loss (transformers 5.23).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.batch_keys import keyed
from lintdist.facts import DATALOADER_CLASSES, DDP_CLASSES, PythonFacts, argument_of, string_key, string_value

# The dictionary keys of a batch these facts track.
TRACKED_KEYS = frozenset({"labels", "shift_labels", "input_ids"})
# Calls and methods that keep what a value holds (a shifted tensor stays shifted).
KEEPING_METHODS = frozenset(
    {"clone", "contiguous", "long", "int", "to", "cuda", "cpu", "detach", "copy", "tolist", "numpy", "type"}
    | {"masked_fill", "masked_fill_", "fill_diagonal_", "pin_memory"}
)
KEEPING_FUNCTIONS = frozenset(
    {
        "torch.tensor",
        "torch.as_tensor",
        "torch.LongTensor",
        "torch.stack",
        "torch.from_numpy",
        "numpy.array",
        "numpy.asarray",
        "numpy.stack",
        "builtins.list",
    }
)
WHERE_FUNCTIONS = frozenset({"torch.where", "numpy.where"})
# Methods of a datasets.Dataset that keep its rows' columns (``map`` runs its function first).
DATASET_METHODS = frozenset(
    {"map", "filter", "shuffle", "select", "with_format", "with_transform", "remove_columns", "rename_column"}
    | {"rename_columns", "select_columns", "flatten", "sort", "train_test_split", "cast", "take", "skip"}
)
LOADER_WRAPPERS = frozenset({"skip_first_batches", "microbatch_groups", "iter", "tqdm", "enumerate"})
PARTIAL = frozenset({"functools.partial"})
DICT_BUILTIN = frozenset({"builtins.dict"})
TRAINERS = frozenset(
    {
        "transformers.Trainer",
        "transformers.trainer.Trainer",
        "transformers.Seq2SeqTrainer",
        "transformers.trainer_seq2seq.Seq2SeqTrainer",
        "trl.SFTTrainer",
        "trl.trainer.SFTTrainer",
        "trl.trainer.sft_trainer.SFTTrainer",
    }
)
# Library collators and what they do to labels (transformers 5.23): pad with -100 and copy the inputs unshifted.
IGNORE_PADDING_COLLATORS = frozenset(
    {
        "DataCollatorForLanguageModeling",
        "DataCollatorForSeq2Seq",
        "DataCollatorForTokenClassification",
        "DataCollatorForWholeWordMask",
        "DataCollatorForCompletionOnlyLM",
        "DataCollatorWithFlattening",
    }
)
# Collators that build `labels` from `input_ids` themselves, dropping any `labels` the dataset holds.
LABEL_REBUILDING_COLLATORS = frozenset({"DataCollatorForLanguageModeling", "DataCollatorForWholeWordMask"})
# Trainers whose default collator builds the labels itself (TRL's language-modeling collator).
LABEL_BUILDING_TRAINERS = frozenset({"trl.SFTTrainer", "trl.trainer.SFTTrainer", "trl.trainer.sft_trainer.SFTTrainer"})
IGNORE_INDEX = -100

# -- model heads (transformers 5.23) ----------------------------------------------------------------

CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
TOKEN_SUFFIXES = ("ForMaskedLM", "ForSeq2SeqLM", "ForTokenClassification")
SEQUENCE_SUFFIXES = (
    "ForSequenceClassification",
    "ForMultipleChoice",
    "ForQuestionAnswering",
    "ForImageClassification",
    "ForAudioClassification",
    "ForVideoClassification",
    "ForNextSentencePrediction",
)
# `*ForCausalLM` decoders of encoder-decoder families: their forward compares `logits[..., i]` with `labels[..., i]`
# ("The labels are **not shifted** inside the model"), so labels shifted by hand are right for them.
ALIGNED_DECODERS = frozenset(
    {
        "BartForCausalLM",
        "BigBirdPegasusForCausalLM",
        "BlenderbotForCausalLM",
        "BlenderbotSmallForCausalLM",
        "CpmAntForCausalLM",
        "MarianForCausalLM",
        "MBartForCausalLM",
        "MvpForCausalLM",
        "PegasusForCausalLM",
        "PLBartForCausalLM",
        "ProphetNetForCausalLM",
        "TrOCRForCausalLM",
        "WhisperForCausalLM",
    }
)
# Checkpoint names of those families, for `AutoModelForCausalLM.from_pretrained("facebook/bart-base")`.
ALIGNED_CHECKPOINT_PARTS = (
    "bart",
    "bigbird-pegasus",
    "blenderbot",
    "cpm-ant",
    "marian",
    "opus-mt",
    "pegasus",
    "prophetnet",
    "trocr",
    "whisper",
)
# Causal heads that shift inside their forward but do not hand `**kwargs` (so `shift_labels`) to the loss.
SHIFT_WITHOUT_KWARGS = frozenset({"BlipTextLMHeadModel", "ClvpForCausalLM"})
# `*ForCausalLM` classes whose labels are not plain next-token targets (codebooks, permutation LM, no labels).
OTHER_CAUSAL = frozenset(
    {
        "MusicgenForCausalLM",
        "MusicgenMelodyForCausalLM",
        "XLNetLMHeadModel",
        "Gemma4AssistantForCausalLM",
        "Gemma4UnifiedAssistantForCausalLM",
    }
)
PEFT_WRAPPERS = frozenset(
    {"peft.get_peft_model", "peft.mapping.get_peft_model", "peft.mapping_func.get_peft_model"}
    | {"peft.prepare_model_for_kbit_training", "peft.utils.other.prepare_model_for_kbit_training"}
)
PEFT_MODELS = frozenset({"peft.PeftModel", "peft.peft_model.PeftModel"})
# PEFT methods that prepend virtual tokens (labels get -100 columns in front): `shift_labels` would not line up.
PROMPT_LEARNING_CONFIGS = frozenset(
    {"PromptTuningConfig", "PrefixTuningConfig", "PromptEncoderConfig", "MultitaskPromptTuningConfig", "CPTConfig"}
)
PASS_THROUGH_METHODS = frozenset({"to", "cuda", "train", "float", "bfloat16", "half", "eval", "requires_grad_"})
PASS_THROUGH_FUNCTIONS = frozenset({"torch.compile"})
MAX_DEPTH = 8


@dataclass(frozen=True)
class Head:
    """What a transformers model does with ``labels``."""

    kind: str  # "causal" (next-token loss), "token", "sequence" or "other", as LD102 names them
    name: str  # the class name that decided it
    shifts: bool  # the model shifts `labels` itself (so `labels` must line up with `input_ids`)
    takes_shift_labels: bool  # `forward(**kwargs)` hands a `shift_labels=` keyword to `ForCausalLMLoss`
    why_not: str = ""  # why `shift_labels=` would not work, when it would not


def suffix_head(name: str) -> Head | None:
    """The head a transformers class name says, or None for a name that is no model head."""
    if name.endswith(CAUSAL_SUFFIXES) and not name.endswith("WithLMHeadModel"):
        if name in ALIGNED_DECODERS:
            return Head("token", name, shifts=False, takes_shift_labels=False)
        if name in OTHER_CAUSAL:
            return Head("other", name, shifts=False, takes_shift_labels=False)
        if name in SHIFT_WITHOUT_KWARGS:
            return Head("causal", name, True, False, f"`{name}.forward` takes no `shift_labels`")
        return Head("causal", name, shifts=True, takes_shift_labels=True)
    if name.endswith(TOKEN_SUFFIXES):
        return Head("token", name, shifts=False, takes_shift_labels=False)
    if name.endswith(SEQUENCE_SUFFIXES) and not name.startswith("Blip"):  # BLIP's VQA head is a text decoder
        return Head("sequence", name, shifts=False, takes_shift_labels=False)
    if "For" in name and name.rsplit("For", 1)[-1][:1].isupper():
        return Head("other", name, shifts=False, takes_shift_labels=False)
    return None


def head_kind(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> str | None:
    """LD102's question: "causal" (a head that shifts), "token", "sequence", "other", or None when unknown."""
    head = model_head(facts, expr, at)
    return head.kind if head is not None else None


def model_head(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> Head | None:
    """The head of the model ``expr`` holds, through ``from_pretrained``, PEFT, prepare, DDP and ``.to()``;
    None when it is unknown or its origins disagree (a custom ``nn.Module``, a model from another file)."""
    if depth > MAX_DEPTH:
        return None
    # `model = model.to(...)` after `model = accelerator.prepare(model)` makes each binding an origin of the
    # others: the memo cuts the cycle (a cycle back to this expression adds nothing).
    key = f"labels:head:{id(expr)}"
    memo = facts._memo
    if key not in memo:
        memo[key] = None
        memo[key] = _origin_head(facts, expr, at, depth)
    return memo[key]


def _origin_head(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> Head | None:
    heads: list[Head | None] = []
    for origin in facts.origins(expr, at):
        node = origin.node
        if isinstance(node, cst.Attribute) and node.attr.value == "module" and node is not expr:
            heads.append(model_head(facts, node.value, node, depth + 1))  # `ddp_model.module`
        elif isinstance(node, cst.Call):
            heads.append(_call_head(facts, node, origin.index, depth))
        else:
            heads.append(None)
    known = {h for h in heads if h is not None}
    # `model = accelerator.prepare(model)` makes every binding an origin of every other: unknown paths drop out
    kinds = {(h.kind, h.shifts) for h in known}
    if len(kinds) != 1:
        return None
    first = min(known, key=lambda h: h.name)
    refused = next((h for h in known if not h.takes_shift_labels), None)
    return Head(first.kind, first.name, first.shifts, refused is None, refused.why_not if refused else "")


def _call_head(facts: PythonFacts, call: cst.Call, index: int | None, depth: int) -> Head | None:
    method = facts.method_name(call)
    if facts.is_prepare_call(call) or facts.callee_is(call, DDP_CLASSES):
        keyword = "module" if facts.callee_is(call, DDP_CLASSES) else ""
        argument = argument_of(call, keyword, index or 0)
        return model_head(facts, argument, call, depth + 1) if argument is not None else None
    if facts.callee_is(call, PEFT_WRAPPERS | PASS_THROUGH_FUNCTIONS) or method == "unwrap_model":
        argument = argument_of(call, "model", 0)
        head = model_head(facts, argument, call, depth + 1) if argument is not None else None
        return _prompt_learned(head) if head is not None and _prompt_learning(facts, call) else head
    if method in {"from_pretrained", "from_config", "_from_config"} and isinstance(call.func, cst.Attribute):
        if not facts.qualified_names(call.func.value).isdisjoint(PEFT_MODELS):
            argument = argument_of(call, "model", 0)  # PeftModel.from_pretrained(base_model, adapter_path)
            return model_head(facts, argument, call, depth + 1) if argument is not None else None
        head = class_head(facts, call.func.value)
        checkpoint = argument_of(call, "pretrained_model_name_or_path", 0)
        if head is not None and head.kind == "causal" and _aligned_checkpoint(checkpoint):
            return Head("token", head.name, shifts=False, takes_shift_labels=False)
        return head
    if method in PASS_THROUGH_METHODS and isinstance(call.func, cst.Attribute):
        return model_head(facts, call.func.value, call, depth + 1)
    head = class_head(facts, call.func)
    if head is not None and _prompt_learning(facts, call):  # PeftModelForCausalLM(model, PromptTuningConfig(...))
        return _prompt_learned(head)
    return head


def class_head(facts: PythonFacts, expr: cst.BaseExpression) -> Head | None:
    """The head a class expression stands for: by its name, or by the bases of a class of this file that keeps
    its base's ``forward`` (one that defines its own computes its own loss: unknown)."""
    names = facts.qualified_names(expr) | {get_full_name_for_node(expr) or ""}
    return _names_head(facts, names, 0)


def _names_head(facts: PythonFacts, names: set[str], depth: int) -> Head | None:
    last = {name.rsplit(".", 1)[-1] for name in names if name}
    for part in sorted(last):
        head = suffix_head(part)
        if head is not None:
            return head
    if depth < 3:
        for part in sorted(last):
            bases = facts.local_classes().get(part)
            if bases and not _defines_forward(facts, part):
                head = _names_head(facts, bases, depth + 1)
                if head is not None:
                    return head
    return None


def _defines_forward(facts: PythonFacts, class_name: str) -> bool:
    return any(
        (cls := facts.enclosing_class(function)) is not None and cls.name.value == class_name
        for function in facts.functions.get("forward", ())
    )


def _prompt_learned(head: Head) -> Head:
    why = "PEFT prompt learning puts virtual tokens in front of the inputs, so `shift_labels` would be too short"
    return Head(head.kind, head.name, head.shifts, False, why)


def _prompt_learning(facts: PythonFacts, call: cst.Call) -> bool:
    """A PEFT wrapper given a prompt-learning config (virtual tokens in front of the inputs)."""
    config = argument_of(call, "peft_config", 1)
    if config is None:
        return False
    for origin in facts.origins(config, call):
        node = origin.node
        if isinstance(node, cst.Call):
            names = facts.qualified_names(node.func) | {get_full_name_for_node(node.func) or ""}
            if any(name.rsplit(".", 1)[-1] in PROMPT_LEARNING_CONFIGS for name in names):
                return True
    return False


def _aligned_checkpoint(checkpoint: cst.BaseExpression | None) -> bool:
    if not isinstance(checkpoint, cst.SimpleString):
        return False
    name = str(checkpoint.evaluated_value).lower()
    return any(part in name for part in ALIGNED_CHECKPOINT_PARTS)


# -- labels ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shift:
    """Labels shifted by hand for next-token prediction: ``ids[:, 1:]`` (or ``ids[..., 1:]``, ``chunk[1:]``),
    in a function that also cuts inputs to match (``ids[:, :-1]``)."""

    node: cst.Subscript  # the shifting subscript
    cut: cst.Subscript  # the inputs' cut beside it


@dataclass(frozen=True)
class LabelStore:
    """A batch key written: ``{"labels": v}``, ``dict(labels=v)`` or ``batch["labels"] = v``."""

    key: str
    value: cst.BaseExpression
    node: cst.CSTNode  # the dict element, keyword argument or assignment
    function: cst.FunctionDef | None
    container: str | None  # the name written into, for ``batch["labels"] = v``


@dataclass(frozen=True)
class Builder:
    """Something that builds a batch: a collate function, a ``.map`` function, a Dataset's ``__getitem__``, a
    library collator, a dict written in the loop, or the loop's own ``batch["labels"] = ...`` stores."""

    kind: str  # "collate", "map", "getitem", "helper", "collator" (a library class), "dict", "loop"
    node: cst.CSTNode  # the function or lambda; the collator's constructor call; the dict; the loop's function
    via: cst.CSTNode  # the DataLoader(...), .map(...), Trainer(...) or Dataset(...) call, or the batch's user
    index: int | None = None  # the element of a returned tuple that holds the labels
    container: str | None = None  # for "loop": the batch name written into


@dataclass(frozen=True)
class Received:
    """The labels a model call (or a Trainer's calls) receives."""

    shifts: tuple[Shift, ...]  # hand shifts among the values that reach it as `labels`
    shift_labels: bool  # it also gets `shift_labels` (a keyword, or a key of its batch)
    builders: tuple[Builder, ...]  # where its batch was built


class LabelFacts:
    """The label facts of one file; ``LabelFacts.of(facts)`` builds them once."""

    def __init__(self, facts: PythonFacts) -> None:
        self.facts = facts
        self._stores: dict[int, list[LabelStore]] = defaultdict(list)  # id(function) (0: module level) -> stores
        self._collect_stores()
        self._cuts: dict[int, list[cst.Subscript]] | None = None
        self._shift_memo: dict[int, tuple[Shift, ...]] = {}
        self._appends: dict[tuple[int, str], list[cst.BaseExpression]] | None = None
        self._reach: dict[int, list[cst.CSTNode]] = {}

    @classmethod
    def of(cls, facts: PythonFacts) -> LabelFacts:
        found = facts._memo.get("labels")
        if found is None:
            found = facts._memo["labels"] = cls(facts)
        return found

    # -- batch keys written ----------------------------------------------------------------------

    def _collect_stores(self) -> None:
        facts = self.facts
        for node in facts.index.nodes(cst.Dict):
            for element in node.elements:
                if isinstance(element, cst.DictElement):
                    key = string_value(element.key)
                    if key in TRACKED_KEYS:
                        self._add(LabelStore(key, element.value, element, facts.enclosing_function(node), None))
        for statement in facts.index.nodes(cst.Assign):
            for target in statement.targets:
                key = string_key(target.target)
                if key in TRACKED_KEYS:
                    container = get_full_name_for_node(target.target.value)
                    function = facts.enclosing_function(statement)
                    self._add(LabelStore(key, statement.value, statement, function, container))
        for call in facts.calls:
            if isinstance(call.func, cst.Name) and call.func.value == "dict" and facts.callee_is(call, DICT_BUILTIN):
                for arg in call.args:
                    if arg.keyword is not None and arg.keyword.value in TRACKED_KEYS:
                        function = facts.enclosing_function(call)
                        self._add(LabelStore(arg.keyword.value, arg.value, arg, function, None))

    def _add(self, store: LabelStore) -> None:
        self._stores[_key(store.function)].append(store)

    def stores(self, function: cst.CSTNode | None, key: str | None = None) -> list[LabelStore]:
        """The batch keys written in ``function`` (a def or a lambda; None: module level) and in the local
        functions it calls (two levels)."""
        found = [s for f in self._reached(function) for s in self._own_stores(f)]
        return [s for s in found if key is None or s.key == key]

    def _reached(self, function: cst.CSTNode | None) -> list[cst.CSTNode | None]:
        """``function`` and the local functions it calls, two levels deep (memoised)."""
        if function is None:
            return [None]
        key = id(function)
        if key not in self._reach:
            facts = self.facts
            callees = [f for call in facts.calls_within(function) for f in facts.local_functions(call)]
            callees += [
                f for callee in callees for call in facts.calls_within(callee) for f in facts.local_functions(call)
            ]
            self._reach[key] = list(dict.fromkeys([function, *callees]))
        return self._reach[key]

    def _own_stores(self, function: cst.CSTNode | None) -> list[LabelStore]:
        if isinstance(function, cst.Lambda):
            outer = self.facts.enclosing_function(function)
            return [s for s in self._stores.get(_key(outer), []) if self.facts.is_within(s.node, function)]
        return self._stores.get(_key(function), [])

    def built_stores(self, builder: Builder, key: str) -> list[LabelStore]:
        """The stores of ``key`` a builder makes (a tuple element is no store: see ``built_values``)."""
        if builder.kind == "collator":
            return []
        if builder.kind == "dict":
            stores = self._own_stores(self.facts.enclosing_function(builder.node))
            return [s for s in stores if s.key == key and self.facts.is_within(s.node, builder.node)]
        if builder.kind == "loop":
            return [s for s in self._own_stores(builder.node) if s.key == key and s.container == builder.container]
        return self.stores(builder.node, key)

    def built_values(self, builder: Builder, key: str) -> list[cst.BaseExpression]:
        """The values a builder puts under ``key``, or returns as element ``builder.index`` of a tuple."""
        if builder.index is not None and isinstance(builder.node, cst.FunctionDef):
            found = []
            for returned in self.facts.returns.get(builder.node, ()):
                for origin in self.facts.origins(returned, returned):
                    node = origin.node
                    if isinstance(node, (cst.Tuple, cst.List)) and builder.index < len(node.elements):
                        found.append(node.elements[builder.index].value)
            return found
        return [s.value for s in self.built_stores(builder, key)]

    # -- labels shifted by hand ------------------------------------------------------------------

    def shifts(self, expr: cst.BaseExpression, at: cst.CSTNode | None = None, depth: int = 0) -> tuple[Shift, ...]:
        """The hand shifts ``expr`` can hold: a shifting subscript (with the inputs cut beside it), kept through
        ``.clone()``/``.to()``/``torch.tensor``/``torch.where``/comprehensions and assignments, and the ``"labels"``
        of a batch built elsewhere (``batch["labels"]`` of a loader whose collate function shifted them)."""
        at = at or expr
        if depth > MAX_DEPTH:
            return ()
        key = id(expr)
        if key in self._shift_memo:
            return self._shift_memo[key]
        self._shift_memo[key] = ()
        found = tuple(dict.fromkeys(self._shifts(expr, at, depth)))
        self._shift_memo[key] = found
        return found

    def _shifts(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> list[Shift]:
        facts = self.facts
        if isinstance(expr, cst.Subscript):
            form = _slice_form(expr)
            if form is not None and form[0] == "shift":
                cut = self._cut_beside(expr, form[1])
                return [Shift(expr, cut)] if cut is not None else []
            if string_key(expr) == "labels":  # batch["labels"] of a batch built elsewhere
                return self._built_shifts(self.builders(expr.value, at, depth + 1), depth)
            return []
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
            return list(self.shifts(expr.elt, expr.elt, depth + 1))
        if isinstance(expr, (cst.List, cst.Tuple)):
            return [s for e in expr.elements for s in self.shifts(e.value, e.value, depth + 1)]
        if isinstance(expr, cst.Call):
            if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in KEEPING_METHODS:
                return list(self.shifts(expr.func.value, at, depth + 1))
            if facts.callee_is(expr, KEEPING_FUNCTIONS) and expr.args:
                return list(self.shifts(expr.args[0].value, at, depth + 1))
            if facts.callee_is(expr, WHERE_FUNCTIONS):
                return [s for arg in expr.args[1:3] for s in self.shifts(arg.value, at, depth + 1)]
            if not facts.local_functions(expr):
                return []
        if not isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.IfExp)):
            return []
        found: list[Shift] = []
        if isinstance(expr, cst.Name) and not _bound(facts, expr, at):
            loop = self._loop_of(expr, at)  # `for inputs, labels in loader:`
            if loop is not None:
                iterable, path = loop
                found.extend(self._built_shifts(self._iterated_builders(iterable, path, at, depth + 1), depth))
        for origin in facts.origins(expr, at):
            node = origin.node
            if node is expr or not isinstance(node, cst.BaseExpression):
                continue
            if origin.index is not None and isinstance(node, cst.Name):  # `inputs, labels = batch`
                loop = self._loop_of(node, at)
                if loop is not None:
                    iterable, path = loop
                    builders = self._iterated_builders(iterable, (*path, origin.index), at, depth + 1)
                    found.extend(self._built_shifts(builders, depth))
                continue
            found.extend(self.shifts(node, node, depth + 1))
        return found

    def _built_shifts(self, builders: list[Builder], depth: int) -> list[Shift]:
        return [
            s
            for b in builders
            for value in self.built_values(b, "labels")
            for s in self.shifts(value, value, depth + 1)
        ]

    def _cut_beside(self, shift: cst.Subscript, dims: str) -> cst.Subscript | None:
        """The ``[:, :-1]`` cut of the same form in the same function, preferring one of the same sequence."""
        if self._cuts is None:
            self._cuts = defaultdict(list)
            for node in self.facts.index.nodes(cst.Subscript):
                form = _slice_form(node)
                if form is not None and form[0] == "cut":
                    self._cuts[_key(self.facts.enclosing_function(node))].append(node)
        candidates = [
            c for c in self._cuts.get(_key(self.facts.enclosing_function(shift)), []) if _slice_form(c)[1] == dims
        ]
        same = [c for c in candidates if c.value.deep_equals(shift.value)]
        return (same or candidates or [None])[0]

    # -- where a batch comes from ----------------------------------------------------------------

    def builders(self, batch: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> list[Builder]:
        """The builders behind a batch expression: the stores into it where it is used, a dict it was bound to, and
        through its loop, ``next``, the loader (``accelerator.prepare``, ``skip_first_batches``,
        ``microbatch_groups``...) the loader's ``collate_fn``, its dataset's ``.map`` functions and ``__getitem__``.
        A batch that is a parameter is followed to the function's call sites."""
        if depth > MAX_DEPTH:
            return []
        facts = self.facts
        found: list[Builder] = []
        name = get_full_name_for_node(batch) if isinstance(batch, (cst.Name, cst.Attribute)) else None
        function = facts.enclosing_function(at)
        if name and any(s.container == name for s in self._own_stores(function)):
            found.append(Builder("loop", function, at, container=name))
        if isinstance(batch, cst.Name):
            rebound = [b for b in facts.bindings(batch.value, at) if _rebinds(b.statement, batch.value)]
            for binding in rebound:
                found.extend(self._value_builders(binding.value, binding.statement, binding.index, depth + 1))
            loop = self._loop_of(batch, at)
            if loop is not None:
                iterable, path = loop
                found.extend(self._iterated_builders(iterable, path, at, depth + 1))
            elif not rebound:
                parameter = facts.parameter(batch.value, at)
                if parameter is not None:
                    for call in facts.call_sites(parameter[0]):
                        argument = facts.argument_for(call, parameter[0], batch.value, parameter[1])
                        if argument is not None:
                            found.extend(self.builders(argument, call, depth + 1))
        elif isinstance(batch, cst.Call):
            found.extend(self._value_builders(batch, at, None, depth + 1))
        return list(dict.fromkeys(found))

    def _value_builders(
        self, value: cst.BaseExpression, at: cst.CSTNode, index: int | None, depth: int
    ) -> list[Builder]:
        """Builders behind a value assigned to a batch name."""
        facts = self.facts
        if isinstance(value, cst.Dict) or (isinstance(value, cst.Call) and facts.callee_is(value, DICT_BUILTIN)):
            return [Builder("dict", value, at)]
        if isinstance(value, cst.DictComp):  # {k: v.to(device) for k, v in batch.items()}
            iterated = value.for_in.iter
            if isinstance(iterated, cst.Call) and isinstance(iterated.func, cst.Attribute):
                return self.builders(iterated.func.value, at, depth + 1)
            return []
        if isinstance(value, cst.Call):
            if facts.method_name(value) == "next" and value.args:
                return self._iterated_builders(value.args[0].value, () if index is None else (index,), at, depth + 1)
            if isinstance(value.func, cst.Attribute) and value.func.attr.value in KEEPING_METHODS:
                return self.builders(value.func.value, at, depth + 1)
            helpers = facts.local_functions(value)
            if helpers and index is None:  # batch = prepare_batch(batch): the helper's stores, and what it was given
                passed = [b for arg in value.args if not arg.star for b in self.builders(arg.value, value, depth + 1)]
                return [*(Builder("helper", f, value) for f in helpers), *passed]
        if isinstance(value, (cst.Name, cst.Attribute)) and index is None:
            return self.builders(value, at, depth + 1)
        return []

    def _iterated_builders(
        self, iterable: cst.BaseExpression, path: tuple[int, ...], at: cst.CSTNode, depth: int
    ) -> list[Builder]:
        """Builders of the elements of ``iterable`` (a loader, ``iter(loader)``, a list of its batches...)."""
        if depth > MAX_DEPTH:
            return []
        found: list[Builder] = []
        index = path[0] if path else None
        for loader in self._loaders(iterable, at, depth):
            for builder in self._loader_builders(loader, depth):
                found.append(replace(builder, index=index) if index is not None else builder)
        if isinstance(iterable, cst.Name):  # batch_samples = []; batch_samples += [next(it)]; for b in batch_samples
            for element in self._appended(iterable, at):
                found.extend(self._value_builders(element, element, index, depth + 1))
        return found

    def _loaders(self, iterable: cst.BaseExpression, at: cst.CSTNode, depth: int) -> list[cst.Call]:
        """The DataLoader constructions an iterable comes from."""
        if depth > MAX_DEPTH:
            return []
        facts = self.facts
        if isinstance(iterable, cst.Name) and not _bound(facts, iterable, at):
            loop = self._loop_of(iterable, at)  # `for micro_batches in microbatch_groups(loader, k)`
            if loop is not None:
                groups, _ = loop
                return [
                    loader
                    for origin in facts.origins(groups, at)
                    if isinstance(origin.node, cst.Call)
                    and facts.method_name(origin.node) == "microbatch_groups"
                    and origin.node.args
                    for loader in self._loaders(origin.node.args[0].value, origin.node, depth + 1)
                ]
        found: list[cst.Call] = []
        for origin in facts.origins(iterable, at):
            node = origin.node
            if not isinstance(node, cst.Call):
                continue
            method = facts.method_name(node)
            if facts.is_prepare_call(node):
                position = (origin.index or 0) if method in {"prepare", "setup_dataloaders"} else 0
                argument = argument_of(node, "", position)
                if argument is not None:
                    found.extend(self._loaders(argument, node, depth + 1))
            elif method in LOADER_WRAPPERS and node.args:
                found.extend(self._loaders(node.args[0].value, node, depth + 1))
            elif facts.is_instance_of(node, DATALOADER_CLASSES, "DataLoader"):
                found.append(node)
        return found

    def _loader_builders(self, loader: cst.Call, depth: int) -> list[Builder]:
        found = []
        collate = argument_of(loader, "collate_fn", 6)
        if collate is not None:
            found.extend(self.callable_builders(collate, loader, "collate", depth + 1))
        dataset = argument_of(loader, "dataset", 0)
        if dataset is not None and not any(self.rebuilds_labels(b) for b in found):
            found.extend(self.dataset_builders(dataset, loader, depth + 1))
        return found

    def rebuilds_labels(self, builder: Builder) -> bool:
        """A library collator that sets ``labels`` from ``input_ids`` itself (the dataset's labels are dropped)."""
        if builder.kind != "collator" or not isinstance(builder.node, cst.Call):
            return False
        names = self.facts.qualified_names(builder.node.func) | {get_full_name_for_node(builder.node.func) or ""}
        return any(n.rsplit(".", 1)[-1] in LABEL_REBUILDING_COLLATORS for n in names if n)

    def dataset_builders(self, dataset: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> list[Builder]:
        """The ``.map`` functions and ``__getitem__`` behind a dataset expression."""
        if depth > MAX_DEPTH:
            return []
        facts = self.facts
        found: list[Builder] = []
        for origin in facts.origins(dataset, at):
            node = origin.node
            if isinstance(node, cst.Subscript):  # tokenized["train"]
                found.extend(self.dataset_builders(node.value, node, depth + 1))
            elif isinstance(node, cst.Call):
                method = facts.method_name(node)
                if isinstance(node.func, cst.Attribute) and method in DATASET_METHODS:
                    if method == "map":
                        function = argument_of(node, "function", 0)
                        if function is not None:
                            found.extend(self.callable_builders(function, node, "map", depth + 1))
                    found.extend(self.dataset_builders(node.func.value, node, depth + 1))
                else:
                    found.extend(Builder("getitem", f, node) for f in self._methods(node, "__getitem__"))
        return found

    def callable_builders(self, expr: cst.BaseExpression, via: cst.CSTNode, kind: str, depth: int = 0) -> list[Builder]:
        """The functions a callable expression runs: a local function, ``self.method``, a lambda (and the local
        function it calls), ``functools.partial(f, ...)``, an instance of a local class (its ``__call__``), or a
        library collator."""
        if depth > MAX_DEPTH:
            return []
        facts = self.facts
        if isinstance(expr, cst.Lambda):
            inner = facts.local_functions(expr.body) if isinstance(expr.body, cst.Call) else []
            return [Builder(kind, expr, via), *(Builder(kind, f, via) for f in inner)]
        if isinstance(expr, cst.Name) and not _bound(facts, expr, expr):
            return [Builder(kind, f, via) for f in facts.functions.get(expr.value, ()) if _visible(facts, f, expr)]
        if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
            cls = facts.enclosing_class(expr)
            functions = [f for f in facts.functions.get(expr.attr.value, ()) if facts.enclosing_class(f) is cls]
            if functions:
                return [Builder(kind, f, via) for f in functions]
        found: list[Builder] = []
        origins = [expr] if isinstance(expr, cst.Call) else [o.node for o in facts.origins(expr, expr)]
        for node in origins:
            if node is expr and not isinstance(node, cst.Call):
                continue
            if isinstance(node, cst.Call):
                if facts.callee_is(node, PARTIAL) and node.args:
                    found.extend(self.callable_builders(node.args[0].value, via, kind, depth + 1))
                    continue
                methods = self._methods(node, "__call__")
                if methods:
                    found.extend(Builder(kind, f, via) for f in methods)
                    continue
                names = facts.qualified_names(node.func) | {get_full_name_for_node(node.func) or ""}
                if any(n.rsplit(".", 1)[-1] in IGNORE_PADDING_COLLATORS for n in names if n):
                    found.append(Builder("collator", node, via))
            elif isinstance(node, (cst.Name, cst.Lambda, cst.Attribute)):
                found.extend(self.callable_builders(node, via, kind, depth + 1))
        return found

    def _methods(self, call: cst.Call, name: str) -> list[cst.FunctionDef]:
        """``name`` methods of the local class ``call`` constructs (or of its local bases)."""
        facts = self.facts
        class_name = get_full_name_for_node(call.func)
        seen: set[str] = set()
        pending = [class_name] if class_name else []
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            for cls in (c for c in facts.classes if c.name.value == current):
                methods = [f for f in facts.functions.get(name, ()) if facts.enclosing_class(f) is cls]
                if methods:
                    return methods
                pending.extend(get_full_name_for_node(b.value) or "" for b in cls.bases)
        return []

    def _appended(self, name: cst.Name, at: cst.CSTNode) -> list[cst.BaseExpression]:
        """What a list name is filled with in its function: ``xs += [e]`` and ``xs.append(e)``."""
        if self._appends is None:
            facts = self.facts
            self._appends = defaultdict(list)
            for statement in facts.index.nodes(cst.AugAssign):
                if isinstance(statement.target, cst.Name) and isinstance(statement.value, (cst.List, cst.Tuple)):
                    key = (_key(facts.enclosing_function(statement)), statement.target.value)
                    self._appends[key].extend(e.value for e in statement.value.elements)
            for call in facts.calls:
                func = call.func
                if (
                    isinstance(func, cst.Attribute)
                    and func.attr.value == "append"
                    and call.args
                    and isinstance(func.value, cst.Name)
                ):
                    key = (_key(facts.enclosing_function(call)), func.value.value)
                    self._appends[key].append(call.args[0].value)
        return self._appends.get((_key(self.facts.enclosing_function(at)), name.value), [])

    def _loop_of(self, name: cst.Name, at: cst.CSTNode) -> tuple[cst.BaseExpression, tuple[int, ...]] | None:
        """The ``for`` loop around ``at`` whose target binds ``name``: its iterable (``enumerate``/``tqdm`` removed)
        and the name's position in one element (``for step, (x, y) in enumerate(loader)``: y is (1,))."""
        facts = self.facts
        for ancestor in facts.ancestors(at):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                break
            if not isinstance(ancestor, cst.For):
                continue
            path = _target_path(ancestor.target, name.value)
            if path is None:
                continue
            iterable = ancestor.iter
            while isinstance(iterable, cst.Call) and facts.method_name(iterable) in {"enumerate", "tqdm", "iter"}:
                if facts.method_name(iterable) == "enumerate":
                    if not path or path[0] != 1:
                        return None
                    path = path[1:]
                if not iterable.args:
                    return None
                iterable = iterable.args[0].value
            return iterable, path
        return None

    # -- what a model call receives -----------------------------------------------------------------

    def received(self, call: cst.Call) -> Received:
        """The labels a model call receives: its ``labels=`` argument, else the ``"labels"`` of its ``**batch``."""
        labels = _keyword(call, "labels")
        builders = [b for arg in call.args if arg.star == "**" for b in self.builders(arg.value, call)]
        shift_labels = _keyword(call, "shift_labels") is not None or any(
            self.built_stores(b, "shift_labels") for b in builders
        )
        if labels is not None:
            shifts = self.shifts(labels, call)
        else:
            shifts = tuple(dict.fromkeys(self._built_shifts(builders, 0)))
        return Received(shifts, shift_labels, tuple(builders))

    def trainer_received(self, call: cst.Call) -> Received:
        """The labels a ``Trainer(...)``'s training steps hand its model: from ``data_collator`` and the datasets."""
        builders: list[Builder] = []
        collator = argument_of(call, "data_collator", 2)
        if collator is not None:
            builders.extend(self.callable_builders(collator, call, "collate"))
        if any(self.rebuilds_labels(b) for b in builders) or (
            collator is None and self.facts.callee_is(call, LABEL_BUILDING_TRAINERS)
        ):
            return Received((), False, tuple(builders))
        for keyword, position in (("train_dataset", 3), ("eval_dataset", 4)):
            dataset = argument_of(call, keyword, position)
            if dataset is not None:
                builders.extend(self.dataset_builders(dataset, call))
        shifts = tuple(dict.fromkeys(self._built_shifts(builders, 0)))
        shift_labels = any(self.built_stores(b, "shift_labels") for b in builders)
        return Received(shifts, shift_labels, tuple(builders))

    # -- questions of the token-loss rules -------------------------------------------------------

    def pads_with_ignore_index(self, builders: tuple[Builder, ...] | list[Builder]) -> bool:
        """Some builder pads or masks labels with -100: a library collator that does, ``-100`` or
        ``ignore_index``/``label_pad_token_id`` in a builder function."""
        for builder in builders:
            if builder.kind == "collator":
                return True
            function = builder.node if builder.kind not in {"dict"} else self.facts.enclosing_function(builder.node)
            if function is not None and _mentions_ignore_index(self.facts, function):
                return True
        return False

    def fixed_length(self, builders: tuple[Builder, ...] | list[Builder]) -> bool:
        """Some builder tokenizes or pads to one length (``padding="max_length"`` with a ``max_length``), and none
        pads another way or uses a library collator: all label rows have the same length."""
        found = False
        for builder in builders:
            if builder.kind == "collator":
                return False
            function = builder.node if builder.kind not in {"dict"} else self.facts.enclosing_function(builder.node)
            if function is None:
                continue
            for call in self.facts.calls_within(function):
                padding = _keyword(call, "padding")
                if padding is None:
                    continue
                if string_value(padding) != "max_length" or _keyword(call, "max_length") is None:
                    return False
                found = True
        return found


# -- small helpers -----------------------------------------------------------------------------------


def _key(function: cst.CSTNode | None) -> int:
    return id(function) if function is not None else 0


def _integer(expr: cst.BaseExpression | None) -> int | None:
    if isinstance(expr, cst.Integer):
        return int(expr.value)
    if (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
    ):
        return -int(expr.expression.value)
    return None


def _slice_form(node: cst.Subscript) -> tuple[str, str] | None:
    """("shift", dims) for ``x[1:]``, ``x[:, 1:]``, ``x[..., 1:]``; ("cut", dims) for ``x[:-1]``, ``x[:, :-1]``,
    ``x[..., :-1]``; dims is "1d" or "2d"."""
    elements = node.slice
    if len(elements) == 2:
        lead = elements[0].slice
        full = isinstance(lead, cst.Slice) and lead.lower is None and lead.upper is None and lead.step is None
        ellipsis = isinstance(lead, cst.Index) and isinstance(lead.value, cst.Ellipsis)
        if not (full or ellipsis):
            return None
        dims = "2d"
    elif len(elements) == 1:
        dims = "1d"
    else:
        return None
    last = elements[-1].slice
    if not isinstance(last, cst.Slice) or last.step is not None:
        return None
    if _integer(last.lower) == 1 and last.upper is None:
        return "shift", dims
    if last.lower is None and _integer(last.upper) == -1:
        return "cut", dims
    return None


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def _target_path(target: cst.BaseExpression, name: str) -> tuple[int, ...] | None:
    if isinstance(target, cst.Name):
        return () if target.value == name else None
    if isinstance(target, (cst.Tuple, cst.List)):
        for position, element in enumerate(target.elements):
            inner = _target_path(element.value, name)
            if inner is not None:
                return (position, *inner)
    return None


def _rebinds(statement: cst.CSTNode, name: str) -> bool:
    """The assignment binds ``name`` itself (not ``name["key"] = ...``, which facts record as a binding too)."""
    if isinstance(statement, cst.Assign):
        return any(_target_path(t.target, name) is not None for t in statement.targets)
    if isinstance(statement, cst.AnnAssign):
        return _target_path(statement.target, name) is not None
    return False


def _bound(facts: PythonFacts, name: cst.Name, at: cst.CSTNode) -> bool:
    return any(_rebinds(b.statement, name.value) for b in facts.bindings(name.value, at))


def _visible(facts: PythonFacts, function: cst.FunctionDef, user: cst.CSTNode) -> bool:
    """A function the name at ``user`` can mean: module level, or nested in a function around ``user``."""
    if facts.enclosing_class(function) is not None and facts.enclosing_class(function) is not facts.enclosing_class(
        user
    ):
        return False
    outer = facts.enclosing_function(function)
    return outer is None or facts.is_within(user, outer)


def _mentions_ignore_index(facts: PythonFacts, function: cst.CSTNode) -> bool:
    for node in facts.within(function, cst.UnaryOperation):
        if _integer(node) == IGNORE_INDEX:
            return True
    return any(
        arg.keyword is not None and arg.keyword.value in {"ignore_index", "label_pad_token_id"}
        for call in facts.calls_within(function)
        for arg in call.args
    )


# Trainer methods whose override computes the loss itself (not with the model's own loss).
OWN_LOSS_METHODS = frozenset({"compute_loss", "training_step"})


def model_loss_trainer(facts: PythonFacts, call: cst.Call) -> bool:
    """``call`` builds a transformers (or TRL) Trainer that trains on its model's own loss: the library class, or
    a subclass of this file that overrides neither ``compute_loss`` nor ``training_step``."""
    name = facts.method_name(call) or ""
    if "Trainer" not in name and name not in facts.local_classes():
        return False  # (a cheap test first: resolving every call's name is the expensive part)
    if facts.callee_is(call, TRAINERS):
        return True
    if not facts.is_instance_of(call, TRAINERS):
        return False
    name = (get_full_name_for_node(call.func) or "").rsplit(".", 1)[-1]
    classes = [c for c in facts.classes if c.name.value == name]
    return not any(
        facts.enclosing_class(f) in classes for method in OWN_LOSS_METHODS for f in facts.functions.get(method, ())
    )


def hands_labels(call: cst.Call) -> bool:
    """A call that can hand a model its labels: a ``labels=`` keyword or a ``**batch``."""
    return any(arg.star == "**" or (arg.keyword is not None and arg.keyword.value == "labels") for arg in call.args)


def called_head(facts: PythonFacts, call: cst.Call) -> Head | None:
    """The head of the model a call runs: ``model(...)`` or ``model.forward(...)`` (see ``model_head``)."""
    from lintdist.wrappers import forward_target

    return model_head(facts, forward_target(call), call)


# Callee roots of library functions, which take a `**batch` without being a model (`dict(**batch)`).
LIBRARY_ROOTS = ("torch.", "builtins.", "numpy.", "accelerate.", "datasets.", "deepspeed.")
MAPPING_METHODS = frozenset({"update", "get", "format", "items", "copy"})


def may_call_model(facts: PythonFacts, call: cst.Call) -> bool:
    """``call`` may run a model: it is not a call of this file's functions, a dict or string method, or a library
    function (``torch.nn.functional.cross_entropy(...)``)."""
    if facts.local_functions(call):
        return False
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in MAPPING_METHODS:
        return False
    return not any(n.startswith(LIBRARY_ROOTS) for n in facts.qualified_names(func))


def batch_holds(facts: PythonFacts, call: cst.Call, batch: cst.BaseExpression, key: str) -> bool:
    """The ``**batch`` mapping a call gets holds ``key``: read or written as ``batch["<key>"]`` in the call's
    function, or stored by what builds the batch (a collate function, a dict written in the loop...)."""
    scope = facts.enclosing_function(call) or facts.index.module
    labels = LabelFacts.of(facts)
    return keyed(facts, scope, batch, key) or any(labels.built_stores(b, key) for b in labels.received(call).builders)
