#!/usr/bin/env python3
"""Layout rules of src/ that the compiler does not check (run from the repository root):

1. The layers below `aggregate` never name it: no `aggregate` path in src/ffi/, src/config/,
   src/comm/{mod,producer,registry}.rs, src/record/ or src/buffer/.
2. `export` reads only the interval values of `aggregate`: a path into `aggregate` from src/export/
   names either `aggregate::interval` or a type the module re-exports at its root (a capitalised
   name), never another of its modules or functions.
3. No file cycle inside a top-level module: the graph of `use` paths (`crate::…`, `super::…`,
   `self::…`) between the files of one module has no cycle. `mod` declarations are not edges, nor
   are paths inside `#[cfg(test)]` modules.
4. When ../shared/tools/modgraph.py exists (or $MODGRAPH names it), it must hold too.

Prints each violation and exits 1 when there is one.
"""
import os
import re
import subprocess
import sys

SRC = "src"
BELOW_AGGREGATE = ["src/ffi/", "src/config/", "src/comm/mod.rs", "src/comm/producer.rs", "src/comm/registry.rs",
                   "src/record/", "src/buffer/"]
EXPORT_MAY_NAME = {"interval"}


def strip_comments(text):
    """Drops `//` comments and string literals (paths in docs or messages are not uses)."""
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def drop_test_modules(text):
    """Blanks `#[cfg(test)] mod name { … }` blocks, keeping line count."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(#\[[^\]]*\]\s*)*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        out.append(text[i:m.start()])
        out.append(re.sub(r"[^\n]", " ", text[m.start():j]))
        i = j
    out.append(text[i:])
    return "".join(out)


def module_path(path):
    """`src/a/b.rs` → ['a', 'b']; `src/a/mod.rs` → ['a']; `src/lib.rs` → []."""
    parts = os.path.relpath(path, SRC)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return parts


def inline_modules(text):
    """(start, end, name) of every inline `mod name { … }` block, for `super` inside it."""
    spans = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        spans.append((m.start(), j, m.group(1)))
    return spans


def expand(tree):
    """Expands one `use` tree (`a::{b, c::{d, e}}`) into paths."""
    tree = tree.replace(" ", "").replace("\n", "")
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    items.append(cur)
    return [p for item in items if item for p in expand(prefix + item)]


def paths_in(text):
    """(offset, path) of every `use` tree path and every inline `crate::`/`super::` path."""
    found = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        for p in expand(m.group(1)):
            found.append((m.start(), re.sub(r"\bas\b.*$", "", p)))
    for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", text):
        if not re.match(r"use\s", text[max(0, text.rfind("\n", 0, m.start()) + 1):m.start()].strip() + " "):
            found.append((m.start(), m.group(1)))
    return found


def resolve(segments, files):
    """The file a path's longest module prefix lives in."""
    best = None
    for n in range(len(segments) + 1):
        key = tuple(segments[:n])
        if key in files:
            best = files[key]
    return best


def main():
    files, texts = {}, {}
    for root, _, names in os.walk(SRC):
        for name in names:
            if name.endswith(".rs"):
                p = os.path.join(root, name)
                files[tuple(module_path(p))] = p
                texts[p] = drop_test_modules(strip_comments(open(p, encoding="utf-8").read()))
    errors = []
    edges = {p: set() for p in texts}
    for p, text in texts.items():
        here = module_path(p)
        spans = inline_modules(text)
        for offset, path in paths_in(text):
            segs = [s for s in path.split("::") if s]
            if not segs or segs[-1] == "*":
                segs = segs[:-1]
            scope = here + [name for (a, b, name) in spans if a <= offset < b]
            if segs[0] == "crate":
                target = segs[1:]
            elif segs[0] in ("super", "self"):
                base = list(scope)
                while segs and segs[0] in ("super", "self"):
                    if segs.pop(0) == "super":
                        base = base[:-1]
                target = base + segs
            else:
                continue
            dest = resolve(target, files)
            if dest is None:
                continue
            if target and target[0] == "aggregate":
                if any(p.startswith(b) if b.endswith("/") else p == b for b in BELOW_AGGREGATE):
                    errors.append(f"{p}: names {'::'.join(['crate'] + target)} (a lower layer must not use aggregate)")
                if p.startswith("src/export/") and len(target) > 1:
                    name = target[1]
                    if not (name in EXPORT_MAY_NAME or name[:1].isupper()):
                        errors.append(f"{p}: names {'::'.join(['crate'] + target)} (export reads only "
                                      f"aggregate::interval and the types aggregate re-exports)")
            if dest != p and module_path(dest)[:1] == here[:1] and here[:1]:
                edges[p].add(dest)
    # Tarjan's strongly connected components over each module's file graph.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    for scc in sccs:
        errors.append("file cycle: " + " ↔ ".join(scc))
    modgraph = os.environ.get("MODGRAPH", "../shared/tools/modgraph.py")
    if os.path.exists(modgraph):
        run = subprocess.run([sys.executable, modgraph, SRC], capture_output=True, text=True)
        if run.returncode != 0:
            errors.append("modgraph: " + run.stdout.strip().splitlines()[-1])
    else:
        print(f"{modgraph} not found: top-level module graph and file sizes not checked here")
    for e in errors:
        print(e)
    print(f"layout: {len(texts)} files, {sum(map(len, edges.values()))} file edges inside modules, "
          f"{len(errors)} violation(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
