"""Qualified names, resolved by lintdist from the syntax index instead of libcst's scope metadata.

``import torch.distributed as dist`` ... ``dist.barrier()`` resolves to
``torch.distributed.barrier``, ``from torch.utils.data import DataLoader as DL`` ... ``DL(...)``
to ``torch.utils.data.DataLoader``, a name bound in the file to its local qualified name
(``f.<locals>.x``, ``C.x``), a builtin to ``builtins.name``, and a conventional name nothing binds to its
conventional meaning (``dist.barrier()`` in a snippet without imports: ``torch.distributed.barrier``, see
``lintdist.conventions``). Apart from that last rule, which libcst does not have, the answers follow libcst's
``QualifiedNameProvider`` (the oracle in ``tests/test_names.py``): scopes are the module,
classes, functions, lambdas and comprehensions; a class body is invisible to the functions in
it; decorators, defaults, annotations, base classes and a comprehension's first iterable belong
to the enclosing scope; ``global``/``nonlocal`` redirect bindings; a name read in the scope
that binds it sees only the bindings before it (else the enclosing scopes'). Work is done only
for the nodes rules ask about: scopes are built on the first question.
"""

from __future__ import annotations

import builtins
from collections import defaultdict
from dataclasses import dataclass, field

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.conventions import CONVENTIONAL_NAMES, conventional_meaning
from lintdist.syntax import SyntaxIndex

COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
COMPREHENSION_CLASSES = frozenset(COMPREHENSIONS)
NO_NAMES = frozenset({cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal})
NAME_PARTS = frozenset({cst.Attribute, cst.Name, cst.ImportAlias, cst.AsName, cst.NameItem})
# Statements whose bindings take effect when the statement ends (``x = f(x)`` reads the old ``x``).
STATEMENTS = (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.NamedExpr, cst.Import, cst.ImportFrom)


@dataclass(eq=False)
class Scope:
    owner: cst.CSTNode  # the Module, ClassDef, FunctionDef, Lambda or comprehension
    parent: Scope | None
    prefix: str
    bindings: dict[str, list[Binding]] = field(default_factory=lambda: defaultdict(list))
    globals: set[str] = field(default_factory=set)
    nonlocals: set[str] = field(default_factory=set)

    @property
    def is_class(self) -> bool:
        return isinstance(self.owner, cst.ClassDef)


@dataclass(frozen=True, eq=False)
class Binding:
    name: str  # the bound name; dotted for ``import a.b`` (which binds "a.b" and "a")
    node: cst.CSTNode  # the Name bound, or the Import/ImportFrom statement
    scope: Scope
    position: int  # pre-order number after which the binding holds
    alias: cst.ImportAlias | None = None

    def qualified_names(self, full_name: str) -> set[str]:
        if isinstance(self.node, (cst.Import, cst.ImportFrom)):
            return _import_names(self.node, self.alias, full_name)
        return {f"{self.scope.prefix}.{full_name}" if self.scope.prefix else full_name}


class NameResolver:
    def __init__(self, index: SyntaxIndex) -> None:
        self.index = index
        self._scopes: dict[int, Scope] | None = None
        self._stored: dict[int, Binding] = {}
        self._deferred: list[tuple[cst.Name, cst.CSTNode, int]] | None = None
        self._memo: dict[int, frozenset[str]] = {}
        self._block_scopes: dict[int, Scope] = {}
        # a star import or a `global`/`nonlocal` declaration of a name: the file binds it in ways not tracked here
        self._star_import = False
        self._declared_names: set[str] = set()
        self._unbound_conventional: frozenset[str] | None = None

    # -- questions ---------------------------------------------------------------------------

    def qualified_names(self, node: cst.CSTNode) -> frozenset[str]:
        key = id(node)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = frozenset(self._qualified_names(node))
        return found

    def unbound_conventional(self) -> frozenset[str]:
        """The conventional names (``dist``, ``DDP``) the file reads somewhere with their conventional meaning."""
        if self._unbound_conventional is None and not self._conventional_candidates():
            self._unbound_conventional = frozenset()  # every conventional name read is imported at module level
        if self._unbound_conventional is None:
            self._build()
            module = self._scope_of_owner(self.index.module)
            found = set()
            for node in self.index.nodes(cst.Name):
                name = node.value
                # a module-level binding is visible everywhere: no read of the name is unbound
                if name in found or name not in CONVENTIONAL_NAMES or name in module.bindings:
                    continue
                if CONVENTIONAL_NAMES[name] in self.qualified_names(node):
                    found.add(name)
            self._unbound_conventional = frozenset(found)
        return self._unbound_conventional

    def _conventional_candidates(self) -> set[str]:
        """The conventional names the file reads that no module-level import binds: only these can be unbound, and
        most files have none, so the scopes need not be built to answer (a library tree is mostly such files)."""
        read = {node.value for node in self.index.nodes(cst.Name) if node.value in CONVENTIONAL_NAMES}
        if not read:
            return read
        for statement in self.index.nodes(cst.Import, cst.ImportFrom):
            if isinstance(statement.names, cst.ImportStar) or any(
                isinstance(a, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) for a in self.index.ancestors(statement)
            ):
                continue
            for alias in statement.names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                read.discard((get_full_name_for_node(bound) or "").split(".", 1)[0])
        return read

    def module_bindings(self, name: str) -> list[Binding]:
        """The bindings of ``name`` at module level."""
        return self._scope_of_owner(self.index.module).bindings.get(name, [])

    # -- resolution --------------------------------------------------------------------------

    def _qualified_names(self, node: cst.CSTNode) -> set[str]:
        full_name = get_full_name_for_node(node)
        if full_name is None or not self._has_scope(node):
            return set()
        scope = self.scope_of(node)
        if isinstance(node, cst.Name):
            stored = self._stored.get(id(node))
            if stored is not None:
                return stored.qualified_names(full_name)
            if self._is_read(node):
                position = self.index.order(node)
                found = self._access(node.value, scope, position)
                if found:
                    return {q for b in found for q in b.qualified_names(node.value)}
                return self._conventional(node.value, scope)
        prefix: str | None = full_name
        while prefix:
            found = self._lookup(prefix, scope)
            if found:
                return {q for b in found for q in b.qualified_names(full_name)}
            cut = prefix.rfind(".")
            prefix = None if cut < 0 else prefix[:cut]
        return self._conventional(full_name, scope)

    def _conventional(self, full_name: str, scope: Scope) -> set[str]:
        """The conventional meaning of ``full_name`` read in ``scope``, where nothing in the file binds its first
        part: no binding in any scope visible from there (a later one in the same scope included), no
        ``global``/``nonlocal`` declaration of it, no star import (which may bind anything)."""
        meaning = conventional_meaning(full_name)
        if meaning is None or self._star_import:
            return set()
        root = full_name.partition(".")[0]
        if root in self._declared_names or self._lookup(root, scope):
            return set()
        return {meaning}

    def _has_scope(self, node: cst.CSTNode) -> bool:
        """libcst resolves no names in an attribute's ``attr``, a keyword argument's name, an import
        statement or a ``global``/``nonlocal`` list: neither does lintdist."""
        child = node
        for ancestor in self.index.ancestors(node):
            kind = ancestor.__class__
            if kind is cst.Attribute and ancestor.attr is child:
                return False
            if kind is cst.Arg and ancestor.keyword is child:
                return False
            if kind in NO_NAMES:
                return False
            if kind not in NAME_PARTS:
                return True
            child = ancestor
        return True

    def _is_read(self, node: cst.Name) -> bool:
        """A name read as a value, not the name a ``def``, ``class`` or parameter binds (targets are in ``_stored``)."""
        parent = self.index.parent(node)
        return not (isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Param)) and parent.name is node)

    def _access(self, name: str, scope: Scope, position: int) -> list[Binding]:
        """The bindings a read of ``name`` at ``position`` in ``scope`` refers to (libcst's ``Access.referents``)."""
        home = self._declared(name, scope)
        own = home.bindings.get(name, [])
        if own and home is not scope:
            return list(own)
        earlier = [b for b in own if b.position <= position]
        return earlier or self._from_parent(name, scope, scope)

    def _from_parent(self, name: str, scope: Scope, reader: Scope) -> list[Binding]:
        parent = self._visible_parent(scope, reader)
        if parent is None:
            return _builtin(name, scope)
        return self._lookup_from(name, parent, reader)

    def _lookup_from(self, name: str, scope: Scope, reader: Scope) -> list[Binding]:
        home = self._declared(name, scope)
        own = home.bindings.get(name)
        if own:
            return list(own)
        if scope.parent is None:
            return _builtin(name, scope)
        return self._from_parent(name, scope, reader)

    def _lookup(self, name: str, scope: Scope) -> list[Binding]:
        """All bindings of ``name`` visible from ``scope`` (libcst's ``scope[name]``), order aside."""
        return self._lookup_from(name, scope, scope)

    def _visible_parent(self, scope: Scope, reader: Scope) -> Scope | None:
        parent = scope.parent
        while parent is not None and parent.is_class and reader is not parent:
            parent = parent.parent
        return parent

    def _declared(self, name: str, scope: Scope) -> Scope:
        """The scope a ``global``/``nonlocal`` declaration sends ``name`` to, else ``scope``."""
        if name in scope.globals:
            return self._scope_of_owner(self.index.module)
        if name in scope.nonlocals:
            parent = scope.parent
            while parent is not None and (parent.is_class or name not in parent.bindings) and parent.parent is not None:
                parent = parent.parent
            return parent or scope
        return scope

    # -- scopes ------------------------------------------------------------------------------

    def scope_of(self, node: cst.CSTNode) -> Scope:
        """The scope whose names ``node`` reads."""
        self._build()
        child, skip_function, outer_iterable = node, False, False
        for ancestor in self.index.ancestors(node):
            kind = ancestor.__class__  # class identity: isinstance on libcst's ABC-based classes is slow here
            if kind is cst.IndentedBlock:
                # no flag is pending at a block: everything in it reads the block's scope (memoised)
                key = id(ancestor)
                scope = self._block_scopes.get(key)
                if scope is None:
                    scope = self._block_scopes[key] = self.scope_of(ancestor)
                return scope
            if kind is cst.Param:
                if child is ancestor.default or child is ancestor.annotation:
                    skip_function = True
            elif kind is cst.FunctionDef or kind is cst.Lambda:
                if not skip_function and (child is ancestor.body or child is ancestor.params):
                    return self._scope_of_owner(ancestor)
                skip_function = False
            elif kind is cst.ClassDef:
                if child is ancestor.body:
                    return self._scope_of_owner(ancestor)
            elif kind is cst.CompFor:
                if child is ancestor.iter and self.index.parent(ancestor).__class__ in COMPREHENSION_CLASSES:
                    outer_iterable = True
            elif kind in COMPREHENSION_CLASSES:
                if not outer_iterable:
                    return self._scope_of_owner(ancestor)
                outer_iterable = False
            child = ancestor
        return self._scope_of_owner(self.index.module)

    def _scope_of_owner(self, owner: cst.CSTNode) -> Scope:
        self._build()
        return self._scopes[id(owner)]

    def _build(self) -> None:
        if self._scopes is not None:
            return
        self._scopes = {}
        index = self.index
        module_scope = Scope(index.module, None, "")
        self._scopes[id(index.module)] = module_scope
        owners = index.nodes(cst.ClassDef, cst.FunctionDef, cst.Lambda, *COMPREHENSIONS)
        for owner in owners:  # source order: a parent scope exists before its children
            parent = self.scope_of(owner)
            if isinstance(owner, cst.ClassDef):
                prefix = _join(parent.prefix, owner.name.value)
            elif isinstance(owner, cst.FunctionDef):
                prefix = _join(parent.prefix, owner.name.value, "<locals>")
            elif isinstance(owner, cst.Lambda):
                prefix = _join(parent.prefix, "<locals>")
            else:
                prefix = _join(parent.prefix, "<comprehension>")
            self._scopes[id(owner)] = Scope(owner, parent, prefix)
        for statement in index.nodes(cst.Global):
            self.scope_of(statement).globals.update(item.name.value for item in statement.names)
        for statement in index.nodes(cst.Nonlocal):
            self.scope_of(statement).nonlocals.update(item.name.value for item in statement.names)
        for statement in index.nodes(cst.Global, cst.Nonlocal):
            self._declared_names.update(item.name.value for item in statement.names)
        self._deferred = []
        for statement in index.nodes(cst.Import, cst.ImportFrom):
            self._bind_import(statement)
        for node in index.nodes(cst.FunctionDef, cst.ClassDef):
            self._bind(node.name, node, index.order(node))
        for param in index.nodes(cst.Param):
            self._bind(param.name, param, index.order(param))
        for node in index.nodes(cst.AssignTarget):
            self._bind_target(node.target, self._statement_end(node))
        for node in index.nodes(cst.AnnAssign, cst.AugAssign, cst.NamedExpr):
            self._bind_target(node.target, self._statement_end(node))
        for node in index.nodes(cst.For):
            self._bind_target(node.target, index.end(node.target))
        for node in index.nodes(cst.CompFor):
            # libcst binds a comprehension's targets before it reads the element written in front of them
            owner = next(a for a in index.ancestors(node) if isinstance(a, COMPREHENSIONS))
            self._bind_target(node.target, index.order(owner))
        for node in index.nodes(cst.WithItem):
            if node.asname is not None:
                self._bind_target(node.asname.name, index.end(node.asname))
        for node in index.nodes(cst.ExceptHandler, cst.ExceptStarHandler):
            if node.name is not None:
                self._bind_target(node.name.name, index.order(node.body))
        for node in index.nodes(cst.MatchAs, cst.MatchStar):
            if node.name is not None:
                self._bind_target(node.name, index.end(node))
        # A ``nonlocal`` name goes to the nearest enclosing function that binds it, which may do so further down.
        deferred, self._deferred = self._deferred, None
        for name, node, position in deferred:
            self._bind(name, node, position)
        for scope in self._scopes.values():
            for bindings in scope.bindings.values():
                bindings.sort(key=lambda b: b.position)

    def _statement_end(self, node: cst.CSTNode) -> int:
        for ancestor in (node, *self.index.ancestors(node)):
            if isinstance(ancestor, STATEMENTS):
                return self.index.end(ancestor)
        return self.index.end(node)

    def _bind_target(self, target: cst.BaseExpression, position: int) -> None:
        if isinstance(target, cst.Name):
            self._bind(target, target, position)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind_target(element.value, position)
        elif isinstance(target, cst.StarredElement):
            self._bind_target(target.value, position)

    def _bind(self, name: cst.Name, node: cst.CSTNode, position: int) -> None:
        scope = self.scope_of(name)
        if self._deferred is not None and name.value in scope.nonlocals:
            self._deferred.append((name, node, position))
            return
        home = self._declared(name.value, scope)
        binding = Binding(name.value, node, home, position)
        home.bindings[name.value].append(binding)
        # a target Name resolves to its own binding; as in libcst, the name of a def, class or parameter
        # resolves like any other use instead
        if node is name:
            self._stored[id(name)] = binding

    def _bind_import(self, statement: cst.Import | cst.ImportFrom) -> None:
        if isinstance(statement.names, cst.ImportStar):
            self._star_import = True
            return
        scope = self.scope_of(statement)
        position = self.index.end(statement)
        for alias in statement.names:
            bound = alias.asname.name if alias.asname is not None else alias.name
            dotted = get_full_name_for_node(bound) or ""
            parts = dotted.split(".")
            for length in range(len(parts), 0, -1):
                name = ".".join(parts[:length])
                home = self._declared(name, scope)
                home.bindings[name].append(Binding(name, statement, home, position, alias))


def _join(*parts: str) -> str:
    return ".".join(part for part in parts if part)


def _builtin(name: str, scope: Scope) -> list[Binding]:
    if hasattr(builtins, name):
        return [_BuiltinBinding(name, scope.owner, scope, -1)]
    return []


class _BuiltinBinding(Binding):
    def qualified_names(self, full_name: str) -> set[str]:
        return {f"builtins.{self.name}"}


def _import_names(statement: cst.Import | cst.ImportFrom, alias: cst.ImportAlias, full_name: str) -> set[str]:
    """libcst's rule: the longest dotted prefix of the imported name that ``full_name`` starts with."""
    module = ""
    if isinstance(statement, cst.ImportFrom):
        if statement.module is not None:
            module = get_full_name_for_node(statement.module) or ""
        if statement.relative:
            module = "." * len(statement.relative) + module
    real = get_full_name_for_node(alias.name) or ""
    parts = real.split(".")
    for length in range(len(parts), 0, -1):
        real_name = as_name = ".".join(parts[:length])
        if module.endswith("."):
            real_name = f"{module}{real_name}"
        elif module:
            real_name = f"{module}.{real_name}"
        if alias.asname is not None:
            as_name = get_full_name_for_node(alias.asname.name) or as_name
        if full_name.startswith(as_name):
            remaining = full_name.split(as_name, 1)[1]
            if remaining and not remaining.startswith("."):
                continue
            remaining = remaining.lstrip(".")
            return {f"{real_name}.{remaining}" if remaining else real_name}
    return set()
