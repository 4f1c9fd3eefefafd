#!/usr/bin/env python3
"""The source tree's layering, read from its #include lines (docs/architecture.md,
"Pure libraries"): what each library may include, and no include cycle between
the engine's folders. Exits 1 listing every broken rule (file, include, rule).

    python3 tests/layering/check_layering.py [--root REPO]
"""
import argparse
import os
import re
import sys
from collections import defaultdict

SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# Folders whose files may include only what the rule names (beside
# themselves and system or third-party headers). A prefix ending in "/" is a
# folder, else one file.
ONLY = {
    "planner/": ("the planner depends on common/ only",
                 ["planner/", "common/"]),
    "export/": ("the HF export reads checkpoints through the engine's checkpoint files only",
                ["export/", "common/", "worker/engine/checkpoint/",
                 "worker/engine/tensor_view.h"]),
    "common/": ("common/ depends on nothing of the project but itself",
                ["common/"]),
}

# Folders that must never include these.
NEVER = {
    "client/": ("loomctl speaks the wire; it never builds the coordinator's code or the engine",
                ["coordinator/", "worker/"]),
    "tools/": ("tools use the libraries, never the coordinator's code or the engine",
               ["coordinator/service/", "coordinator/jobs/", "worker/engine/"]),
    "worker/engine/": ("the engine chooses its backend in ops_selection.cc alone",
                       ["kernels/cpu/", "kernels/cuda/"]),
    "worker/engine/tensor_parallel/": ("tensor parallelism keeps only primitives: the model "
                                       "calls them, they never call the model",
                                       ["worker/engine/model/"]),
}
# The one file allowed what NEVER forbids its folder.
EXCEPT = {"worker/engine/ops_selection.cc": ["kernels/cpu/", "kernels/cuda/"]}


def sources(root):
    skip = {".git", "build", "tests", "node_modules"}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames
                       if d not in skip and not d.startswith("build") and not d.startswith(".")]
        for name in filenames:
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.normpath(os.path.join(rel_dir, name))


def project_includes(root, path, files):
    """The includes of `path` that name a file of the tree (others are system's)."""
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        text = f.read()
    for target in INCLUDE.findall(text):
        if target in files:
            yield target


def under(path, prefix):
    return path.startswith(prefix) if prefix.endswith("/") else path == prefix


def engine_node(path):
    """A file's node in the engine's folder graph: its folder below
    worker/engine/, or the file itself for the engine's top-level files."""
    rest = path[len("worker/engine/"):]
    return "worker/engine/" + rest.split("/")[0] + ("/" if "/" in rest else "")


def find_cycle(graph):
    """One cycle of the directed graph as a list of nodes, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def check(root):
    files = set(sources(root))
    broken = []
    engine = defaultdict(set)
    edges = defaultdict(list)  # (node, node) -> example includes
    for path in sorted(files):
        for target in project_includes(root, path, files):
            for folder, (why, allowed) in ONLY.items():
                if under(path, folder) and not any(under(target, a) for a in allowed):
                    broken.append(f"{path} includes {target}: {why}")
            for folder, (why, forbidden) in NEVER.items():
                if not under(path, folder):
                    continue
                allowed = EXCEPT.get(path, [])
                if any(under(target, f) for f in forbidden) and \
                        not any(under(target, a) for a in allowed):
                    broken.append(f"{path} includes {target}: {why}")
            if path.startswith("worker/engine/") and target.startswith("worker/engine/"):
                a, b = engine_node(path), engine_node(target)
                if a != b:
                    engine[a].add(b)
                    engine[b]
                    edges[(a, b)].append(f"{path} -> {target}")
    cycle = find_cycle(engine)
    if cycle:
        hops = "; ".join(edges[(a, b)][0] for a, b in zip(cycle, cycle[1:]))
        broken.append("the engine's folders include each other in a circle: " +
                      " -> ".join(cycle) + f" ({hops})")
    return files, broken


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    root = os.path.abspath(parser.parse_args().root)
    files, broken = check(root)
    if "common/spec/job_spec.h" not in files:
        print(f"no common/spec/job_spec.h under {root}: is --root the repository?",
              file=sys.stderr)
        return 2
    for line in broken:
        print(line)
    print(f"{len(files)} files read, {len(broken)} layering rule(s) broken", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
