#!/usr/bin/env python3
"""Layout rules of src/ that the compiler does not check (run from the repository root):

1. The layers below `aggregate` never name it: no `aggregate` path in src/ffi/, src/config/,
   src/comm/ (the hot path: the consumer side is the telemetry thread's), src/record/ or
   src/buffer/.
2. `export` reads only the interval values of `aggregate`: a path into `aggregate` from src/export/
   names either `aggregate::interval` or a type the module re-exports at its root (a capitalised
   name), never another of its modules or functions.
3. Every instrument and attribute key is the catalogue's: outside src/export/catalogue/, no file
   builds an instrument (`u64_counter(`, `f64_histogram(`, `gauge(`, `histogram(`, `counter(` …) or
   names an attribute key as a string (`KeyValue::new("…"`); tests aside.
4. No file cycle inside a top-level module: the graph of `use` paths (`crate::…`, `super::…`,
   `self::…`) between the files of one module has no cycle. `mod` declarations are not edges, nor
   are paths inside `#[cfg(test)]` modules.
5. The top-level modules' graph (every `crate::x` path, tests included) has no cycle, and no file
   has more than 600 lines of code (non-blank lines that are not `//` comments, before a trailing
   `#[cfg(test)] mod`; the generated bindings excepted).

Prints each violation and exits 1 when there is one.
"""
import os
import re
import sys

SRC = "src"
BELOW_AGGREGATE = ["src/ffi/", "src/config/", "src/comm/", "src/record/", "src/buffer/"]
EXPORT_MAY_NAME = {"interval"}
CATALOGUE = "src/export/catalogue/"
INSTRUMENT = re.compile(r"\.(u64|f64|i64)_(counter|histogram|gauge|up_down_counter|observable_gauge|observable_counter)\(|"
                        r"(?<![\w.])(gauge|histogram|counter|f64_counter)\(\s*(meter|&)")
LITERAL_KEY = re.compile(r'KeyValue::new\(\s*"')
MAX_CODE_LINES = 600


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


def code_lines(text):
    """Non-blank lines that are not `//` comments, before a trailing `#[cfg(test)] mod`."""
    m = re.search(r"^\s*#\[cfg\(test\)\]\s*\n\s*mod\s+\w+\s*\{", text, re.M)
    body = text[: m.start()] if m else text
    return sum(1 for line in body.splitlines() if line.strip() and not line.strip().startswith("//"))


def top_graph(raw):
    """Top-level module → the top-level modules its files name (`crate::x`, tests included)."""
    graph = {}
    for p, text in raw.items():
        top = module_path(p)[:1]
        if not top:
            continue
        code = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))
        names = set(re.findall(r"\bcrate::(\w+)", code))
        for group in re.findall(r"\buse\s+crate::\{([^}]*)\}", code):
            names.update(part.strip().split("::")[0].split(" ")[0] for part in group.split(","))
        graph.setdefault(top[0], set()).update(n for n in names if n and n not in (top[0], "self"))
    return graph


def cycles(edges):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in edges:
                continue
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
    return sccs


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
    files, texts, raw = {}, {}, {}
    for root, _, names in os.walk(SRC):
        for name in names:
            if name.endswith(".rs"):
                p = os.path.join(root, name)
                files[tuple(module_path(p))] = p
                raw[p] = open(p, encoding="utf-8").read()
                texts[p] = drop_test_modules(strip_comments(raw[p]))
    errors = []
    for p, text in sorted(texts.items()):
        if p.startswith("src/export/") and not p.startswith(CATALOGUE):
            for rule, what in ((INSTRUMENT, "builds an instrument"), (LITERAL_KEY, "names an attribute key as a string")):
                if rule.search(text) or (rule is LITERAL_KEY and LITERAL_KEY.search(drop_test_modules(raw[p]))):
                    errors.append(f"{p}: {what} (the catalogue's: {CATALOGUE})")
        if not p.endswith("bindings.rs") and code_lines(raw[p]) > MAX_CODE_LINES:
            errors.append(f"{p}: {code_lines(raw[p])} lines of code (at most {MAX_CODE_LINES})")
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
    for scc in cycles(edges):
        errors.append("file cycle: " + " ↔ ".join(scc))
    top = top_graph(raw)
    for scc in cycles(top):
        errors.append("module cycle: " + " ↔ ".join(scc))
    for e in errors:
        print(e)
    print(f"layout: {len(texts)} files, {len(top)} top-level modules, {sum(map(len, edges.values()))} file edges "
          f"inside modules, largest file {max(code_lines(t) for p, t in raw.items() if not p.endswith('bindings.rs'))} "
          f"lines of code, {len(errors)} violation(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
