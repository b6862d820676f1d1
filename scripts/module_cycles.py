"""Import circles between the modules of each crate (scripts/test.sh runs it; exit 1 if any):

  python3 scripts/module_cycles.py [CRATE_DIR ...]     (default: every crate of the workspace)
  python3 scripts/module_cycles.py --self-test        (the checker on crates with and without one)

Every module of a crate (a file; `mod x;` declarations give the tree) imports the modules
that its paths name: `use` statements (braces expanded) and paths written inline in the code,
`crate::...`, `super::...`, `self::...` and paths that start with a child module's name. A path
is followed to the deepest module it names; an item a module re-exports (`pub use x::Item`,
`pub use x::*`) is followed to the module that defines it, so that a parent's re-exports do
not read as circles. A circle is a strongly connected set of two or more modules; each is
printed with the paths that close it. Needs nothing beyond Python 3.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRATES = ["core", "gpu", "cuda", "native", "web", "tests", "fuzz"]

COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING = re.compile(r'b?r#*"(?:.|\n)*?"#*|b?"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\'')
MOD_DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)
USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
INLINE = re.compile(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)")
DEFINES = re.compile(r"\b(?:struct|enum|union|trait|type|fn|const|static|macro_rules!)\s+(\w+)")


def strip(text):
    """Code without comments and string literals (their words are not paths)."""
    text = COMMENT.sub(" ", text)
    return STRING.sub('""', text)


def expand(tree):
    """The paths of a use tree `a::{b, c::{d, e as f}, *}`: lists of segments."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    out = []

    def walk(prefix, t):
        if "{" not in t:
            segs = [s for s in (prefix + "::" + t if prefix else t).split("::") if s]
            if segs:
                out.append(segs)
            return
        head, rest = t.split("{", 1)
        body = rest[: rest.rfind("}")]
        head = head.rstrip(":")
        depth, part, parts = 0, "", []
        for ch in body:
            if ch == "," and depth == 0:
                parts.append(part)
                part = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            part += ch
        parts.append(part)
        base = prefix + "::" + head if prefix and head else prefix or head
        for p in parts:
            if p:
                walk(base, p)

    walk("", tree)
    return out


class Crate:
    def __init__(self, directory):
        self.dir = directory
        self.files = {}  # module path (tuple) -> file
        self.code = {}
        src = os.path.join(directory, "src")
        root = next(os.path.join(src, f) for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f)))
        self.load((), root, src)

    def load(self, module, path, dir_of_children):
        self.files[module] = path
        with open(path, encoding="utf-8") as f:
            code = strip(f.read())
        self.code[module] = code
        for name in MOD_DECL.findall(code):
            for candidate, child_dir in ((os.path.join(dir_of_children, name + ".rs"), os.path.join(dir_of_children, name)),
                                         (os.path.join(dir_of_children, name, "mod.rs"), os.path.join(dir_of_children, name))):
                if os.path.exists(candidate):
                    self.load(module + (name,), candidate, child_dir)
                    break

    def is_module(self, module):
        return module in self.files

    def reexports(self, module):
        """{name: full path segments} of the module's `pub use`s, and its glob sources."""
        named, globs = {}, []
        for public, tree in USE.findall(self.code[module]):
            if not public:
                continue
            for segs in expand(tree):
                if segs[-1] == "*":
                    globs.append(segs[:-1])
                else:
                    named[segs[-1]] = segs
        return named, globs

    def defines(self, module, name):
        return name in DEFINES.findall(self.code[module])

    def resolve(self, module, segs, seen=None):
        """The module a path written in `module` leads to (None: another crate's)."""
        seen = seen or set()
        if segs[0] == "crate":
            at, rest = (), segs[1:]
        elif segs[0] == "super":
            at, rest = module, segs
            while rest and rest[0] == "super":
                at, rest = at[:-1], rest[1:]
        elif segs[0] == "self":
            at, rest = module, segs[1:]
        elif self.is_module(module + (segs[0],)):
            at, rest = module, segs
        else:
            return None
        while rest and self.is_module(at + (rest[0],)):
            at, rest = at + (rest[0],), rest[1:]
        # An item the module re-exports leads to where it is defined.
        if rest and (at, rest[0]) not in seen:
            seen.add((at, rest[0]))
            named, globs = self.reexports(at)
            if rest[0] in named and not self.defines(at, rest[0]):
                target = self.resolve(at, named[rest[0]][:-1] + [named[rest[0]][-1]], seen)
                if target is not None:
                    return target
            for g in globs:
                source = self.resolve(at, g + ["__glob__"], seen)
                if source is not None and source != at and self.defines(source, rest[0]):
                    return source
        return at

    def edges(self):
        """{module: {imported module: an example path}}. A path inside an inline module
        (`mod tests { ... }`) is read from there (its `super` is the file's module) and counts
        for the file."""
        graph = {m: {} for m in self.files}
        for module, code in self.code.items():
            for inner, text in inline_modules(code):
                paths = [segs for _, tree in USE.findall(text) for segs in expand(tree)]
                paths += [p.split("::") for p in INLINE.findall(text)]
                for segs in paths:
                    segs = [s for s in segs if s != "*"]
                    if not segs:
                        continue
                    target = self.resolve(module + inner, segs) if not inner else self.resolve_inner(module, inner, segs)
                    if target is not None and target != module:
                        graph[module].setdefault(target, "::".join(segs))
        return graph

    def resolve_inner(self, module, inner, segs):
        """[`resolve`] for a path written in inline module `inner` of `module`'s file."""
        ups = 0
        while ups < len(segs) and segs[ups] == "super":
            ups += 1
        if ups and ups <= len(inner):
            # `super` that stays within the file: the file's own module or an inline one.
            rest = segs[ups:]
            return self.resolve(module, ["self"] + rest) if rest else module
        if ups:
            return self.resolve(module, ["super"] * (ups - len(inner)) + segs[ups:])
        if segs[0] == "self":
            return module
        return self.resolve(module, segs)


INLINE_MOD = re.compile(r"\bmod\s+(\w+)\s*\{")


def inline_modules(code):
    """The code of a file split into (inline module path, text): the file's own text (path
    `()`), then each `mod name { ... }` block's (nested ones apart)."""
    out, own, pos = [], [], 0
    for m in INLINE_MOD.finditer(code):
        if m.start() < pos:
            continue
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        own.append(code[pos : m.start()])
        for inner, text in inline_modules(code[m.end() : i - 1]):
            out.append(((m.group(1),) + inner, text))
        pos = i
    own.append(code[pos:])
    return [((), "".join(own))] + out


def cycles(graph):
    """Strongly connected sets of two or more modules (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def self_test():
    """The checker on two small crates: one whose only circle runs through a re-export and an
    inline path, one whose parent re-exports and tests' `super::*` make no circle."""
    import tempfile

    def crate(files):
        d = tempfile.mkdtemp()
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, "src", name)), exist_ok=True)
            with open(os.path.join(d, "src", name), "w") as f:
                f.write(text)
        return Crate(d)

    circular = crate({
        "lib.rs": "mod a;\nmod b;\npub use b::Thing;\n",
        "a.rs": "use crate::Thing;\npub fn f() {}\n",
        "b.rs": "pub struct Thing;\nfn g() { crate::a::f() }\n// crate::c::h in a comment\n",
    })
    clean = crate({
        "lib.rs": "pub mod t;\npub use t::Tok;\n",
        "t/mod.rs": "mod x;\nmod y;\npub use x::*;\npub use y::Tok;\n",
        "t/x.rs": "pub struct Chars;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::t::Chars;\n}\n",
        "t/y.rs": "use super::Chars;\npub struct Tok(Chars);\n",
    })
    found = [sorted(m[-1] for m in g) for g in cycles(circular.edges())]
    assert found == [["a", "b"]], found
    assert cycles(clean.edges()) == [], cycles(clean.edges())
    print("self-test: a circle through a re-export found, none where there is none")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    dirs = sys.argv[1:] or [os.path.join(ROOT, c) for c in CRATES if os.path.isdir(os.path.join(ROOT, c, "src"))]
    found = 0
    for d in dirs:
        crate = Crate(d)
        graph = crate.edges()
        for group in cycles(graph):
            found += 1
            name = lambda m: os.path.relpath(crate.files[m], ROOT)
            print(f"circle: {' <-> '.join(name(m) for m in group)}")
            for m in group:
                for target, path in graph[m].items():
                    if target in group:
                        print(f"  {name(m)} uses {path} ({name(target)})")
    modules = sum(len(Crate(d).files) for d in dirs)
    print(f"{found} import circle{'s' if found != 1 else ''} among {modules} modules")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
