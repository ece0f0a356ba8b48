"""Checks a framework profile against a framework's source, without importing it.

usage: profile_check.py PROFILE.toml SOURCE_ROOT

SOURCE_ROOT holds the framework's packages (an unpacked wheel or a site-packages folder). For every
watch of the profile it checks, with Python's ast:
  - the module exists, and the qualname names a function there (methods found through the class's bases,
    a `.__wrapped__` step only on a decorated function);
  - every field's parameter is a parameter of that function;
  - every attribute of the field's path exists on the class the path has reached: a class-level annotation
    or assignment (dataclass fields), `self.NAME = ...` in one of its methods, or a property, found through
    the bases; the class an attribute leads to comes from its annotation (Optional/Union members, string
    forward references). A path through an attribute whose type is not annotated cannot be followed and fails.
It also checks that every detect_modules entry is a module of the source.

Prints one line per watch (`ok` with file:line, or `FAIL` with the reason) and exits 1 if any failed.
"""
import ast
import os
import sys
import tomllib
import warnings

# Old escape sequences in the framework's docstrings are not the check's business.
warnings.simplefilter("ignore", SyntaxWarning)

# The watch grammar (pyframe-tracer/src/watch_spec.rs): MODULE:QUALNAME[name=EXPR;...], EXPR an attribute path
# from a parameter, optionally inside len(...) or sum(...).


def parse_spec(text):
    target, fields = text, []
    if "[" in text:
        target, inner = text.split("[", 1)
        for item in inner.rstrip("]").split(";"):
            if not item.strip():
                continue
            name, expr = item.split("=", 1)
            expr = expr.strip()
            for agg in ("len(", "sum("):
                if expr.startswith(agg) and expr.endswith(")"):
                    expr = expr[len(agg):-1]
            path = expr.split(".")
            fields.append((name.strip(), path[0], path[1:]))
    module, qualname = target.split(":", 1)
    return module, qualname, fields


class Source:
    """The packages under a root, parsed on demand."""

    def __init__(self, root, tops):
        self.root = root
        self.tops = tops  # the top-level packages the class index covers
        self.trees = {}
        self._classes = None
        self.fallbacks = 0

    def file_of(self, module):
        base = os.path.join(self.root, *module.split("."))
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(path):
                return path
        return None

    def tree(self, module):
        if module not in self.trees:
            path = self.file_of(module)
            self.trees[module] = None if path is None else ast.parse(open(path, "rb").read(), path)
        return self.trees[module]

    def classes(self):
        """Every class of the packages the profile's modules live in, by name: (module, ClassDef)."""
        if self._classes is None:
            self._classes = {}
            for top in self.tops:
                for dirpath, _, files in os.walk(os.path.join(self.root, top)):
                    for f in files:
                        if not f.endswith(".py"):
                            continue
                        rel = os.path.relpath(os.path.join(dirpath, f), self.root)[:-3]
                        module = rel.replace(os.sep, ".").removesuffix(".__init__")
                        try:
                            tree = self.tree(module)
                        except SyntaxError:
                            continue
                        if tree is None:
                            continue
                        for node in ast.walk(tree):
                            if isinstance(node, ast.ClassDef):
                                self._classes.setdefault(node.name, []).append((module, node))
        return self._classes

    def imported(self, module, name):
        """Where `name`, imported into `module`, comes from: (module, name) or None."""
        tree = self.tree(module)
        for node in _top_level(tree.body) if tree else []:
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        base = node.module or ""
                        if node.level:
                            parts = module.split(".")
                            is_pkg = self.file_of(module).endswith("__init__.py")
                            parts = parts[: len(parts) - node.level + (1 if is_pkg else 0)]
                            base = ".".join(parts + ([node.module] if node.module else []))
                        return base, alias.name
        return None

    def find_class(self, module, name, seen=None):
        """The class `name` as `module` sees it: (module, ClassDef) or None."""
        seen = seen or set()
        if (module, name) in seen:
            return None
        seen.add((module, name))
        tree = self.tree(module)
        if tree is None:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        origin = self.imported(module, name)
        if origin:
            if self.file_of(origin[0]) is None:
                return None  # a class of another package (abc.ABC, msgspec.Struct, ...)
            found = self.find_class(origin[0], origin[1], seen)
            if found:
                return found
        # Last resort (a name the module never imports, e.g. reached through a module alias): the
        # one class of that name in the package, if there is exactly one.
        self.fallbacks += 1
        candidates = self.classes().get(name, [])
        return candidates[0] if len(candidates) == 1 else None

    def module_alias(self, module, name):
        """The module that `import X [as name]` binds to `name` in `module`, or None."""
        for node in _top_level(self.tree(module).body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if (alias.asname or alias.name.split(".")[0]) == name:
                        return alias.name if alias.asname else name
        return None

    def bases(self, module, cls):
        out = []
        for b in cls.bases:
            found = None
            if isinstance(b, ast.Name):
                found = self.find_class(module, b.id)
            elif isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name):
                # module.Class: followed into that module when it is part of the source.
                other = self.module_alias(module, b.value.id)
                if other and self.file_of(other):
                    found = self.find_class(other, b.attr)
            if found:
                out.append(found)
        return out

    def mro(self, module, cls):
        order, todo = [], [(module, cls)]
        while todo:
            m, c = todo.pop(0)
            if any(c is o for _, o in order):
                continue
            order.append((m, c))
            todo.extend(self.bases(m, c))
        return order

    def method(self, module, cls, name):
        for m, c in self.mro(module, cls):
            for node in c.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                    return m, c, node
        return None

    def attribute(self, module, cls, name):
        """(module, line, annotation or None) of attribute `name` on the class, or None."""
        for m, c in self.mro(module, cls):
            for node in c.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                    return m, node.lineno, node.annotation
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                    return m, node.lineno, None
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                    if any(_name(d) in ("property", "cached_property") for d in node.decorator_list):
                        return m, node.lineno, node.returns
            found = None
            for node in ast.walk(c):
                target = None
                if isinstance(node, ast.AnnAssign):
                    target = node.target
                elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                if (isinstance(target, ast.Attribute) and target.attr == name
                        and isinstance(target.value, ast.Name) and target.value.id == "self"):
                    annotation = getattr(node, "annotation", None)
                    if found is None or (found[2] is None and annotation is not None):
                        found = (m, node.lineno, annotation)
            if found:
                return found
        return None

    def types(self, module, annotation):
        """The classes an annotation names (Optional/Union members; None and containers dropped)."""
        if annotation is None:
            return []
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                return self.types(module, ast.parse(annotation.value, mode="eval").body)
            except SyntaxError:
                return []
        if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
            return self.types(module, annotation.left) + self.types(module, annotation.right)
        if isinstance(annotation, ast.Subscript) and _name(annotation.value) in ("Optional", "Union"):
            inner = annotation.slice
            parts = inner.elts if isinstance(inner, ast.Tuple) else [inner]
            return [t for p in parts for t in self.types(module, p)]
        name = _name(annotation)
        if name is None or name == "None":
            return []
        found = self.find_class(module, name)
        return [found] if found else []


def _top_level(body):
    """The module-level statements, including those inside `if` (TYPE_CHECKING) and `try` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                yield from _top_level(handler.body)


def _name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _name(node.func)
    return None


def _params(func):
    a = func.args
    return {p.arg: p for p in a.posonlyargs + a.args + a.kwonlyargs}


def check_watch(src, spec, param_types):
    """'file:line' of the watched function, or raises ValueError with the reason. `param_types` names the
    class ("module:Class") of parameters the source leaves unannotated or annotates as Any."""
    module, qualname, fields = parse_spec(spec)
    if src.tree(module) is None:
        raise ValueError("module %s not found" % module)
    parts = qualname.split(".")
    wrapped = 0
    while parts[-1] == "__wrapped__":
        parts, wrapped = parts[:-1], wrapped + 1
    owner, func, where = None, None, module
    if len(parts) == 1:
        func = next((n for n in src.tree(module).body
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == parts[0]), None)
        if func is None:
            raise ValueError("no function %s in %s" % (parts[0], module))
    else:
        found = src.find_class(module, parts[0])
        if found is None:
            raise ValueError("no class %s in %s" % (parts[0], module))
        for name in parts[1:-1]:
            inner = next((n for n in found[1].body if isinstance(n, ast.ClassDef) and n.name == name), None)
            if inner is None:
                raise ValueError("no class %s in %s" % (name, found[1].name))
            found = (found[0], inner)
        method = src.method(found[0], found[1], parts[-1])
        if method is None:
            raise ValueError("class %s (%s) has no method %s, nor its bases" % (parts[-2], found[0], parts[-1]))
        where, owner, func = method[0], (method[0], method[1]), method[2]
    if wrapped > len(func.decorator_list):
        raise ValueError("%s has %d decorators, fewer than its %d __wrapped__ steps"
                         % (func.name, len(func.decorator_list), wrapped))
    params = _params(func)
    for name, param, attrs in fields:
        if param not in params:
            raise ValueError("field %s: %s has no parameter %s (it has %s)"
                             % (name, func.name, param, ", ".join(params)))
        if not attrs:
            continue
        if param == "self":
            classes = [owner] if owner else []
        elif param in param_types:
            m, c = param_types[param].split(":")
            found = src.find_class(m, c)
            if found is None:
                raise ValueError("field %s: the profile's class %s for %s is not in the source"
                                 % (name, param_types[param], param))
            classes = [found]
        else:
            classes = src.types(where, params[param].annotation)
        if not classes:
            raise ValueError("field %s: parameter %s of %s has no class annotation to follow .%s"
                             % (name, param, func.name, ".".join(attrs)))
        for i, attr in enumerate(attrs):
            hits = [(m, c, src.attribute(m, c, attr)) for m, c in classes]
            hits = [h for h in hits if h[2]]
            if not hits:
                raise ValueError("field %s: %s has no attribute %s"
                                 % (name, " | ".join(c.name for _, c in classes), attr))
            if i + 1 < len(attrs):
                classes = [t for _, _, (m, _, ann) in hits for t in src.types(m, ann)]
                if not classes:
                    raise ValueError("field %s: %s.%s has no class annotation to follow .%s"
                                     % (name, hits[0][1].name, attr, ".".join(attrs[i + 1:])))
    return "%s:%d" % (os.path.relpath(src.file_of(where), src.root), func.lineno)


def check_modes(src, verified):
    """Checks that the enum [verified].mode_enum gives its members the values of [verified].mode_values."""
    module, name = verified["mode_enum"].split(":")
    found = src.find_class(module, name)
    if found is None:
        raise ValueError("no enum %s" % verified["mode_enum"])
    values, last = {}, 0
    for node in found[1].body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v = node.value
            if isinstance(v, ast.Call) and _name(v.func) == "auto":
                last += 1  # enum.auto(): the last value + 1, from 1
            elif isinstance(v, ast.Constant) and isinstance(v.value, int):
                last = v.value
            else:
                continue
            values[node.targets[0].id] = last
    wrong = ["%s is %s, not %d" % (m, values.get(m, "missing"), want)
             for m, want in verified.get("mode_values", {}).items() if values.get(m) != want]
    if wrong:
        raise ValueError("%s: %s" % (verified["mode_enum"], "; ".join(wrong)))
    return "%s (%s)" % (verified["mode_enum"], ", ".join("%s=%d" % kv for kv in values.items()))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    profile = tomllib.load(open(sys.argv[1], "rb"))
    src = Source(sys.argv[2], sorted({w["spec"].split(".")[0].split(":")[0] for w in profile["watch"]}))
    failed = 0
    for module in profile.get("detect_modules", []):
        if src.tree(module) is None:
            print("FAIL detect_modules: module %s not found" % module)
            failed += 1
    if "mode_enum" in profile.get("verified", {}):
        try:
            print("ok   modes %s" % check_modes(src, profile["verified"]))
        except ValueError as e:
            print("FAIL modes: %s" % e)
            failed += 1
    for w in profile["watch"]:
        try:
            print("ok   %s  (%s)" % (w["spec"], check_watch(src, w["spec"], w.get("param_types", {}))))
        except ValueError as e:
            print("FAIL %s: %s" % (w["spec"], e))
            failed += 1
    print("%d of %d watches failed (%d names found by the package-wide class index)"
          % (failed, len(profile["watch"]), src.fallbacks))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
