"""Line counts of a package: total lines, docstring lines and their share, and the largest modules.

Usage: python tools/codestats.py [PACKAGE_DIR] [--all]   (default nbhelpers; --all lists every module)

A docstring line is a line of the first string statement of a module, class or function.
"""

import ast
import pathlib
import sys


def docstring_lines(tree):
    """Number of lines taken by the docstrings of a parsed module."""
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    count += body[0].end_lineno - body[0].lineno + 1
    return count


def stats(root):
    """`{relative path: (lines, docstring lines)}` for every .py file under `root`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        out[str(path.relative_to(root.parent))] = (len(text.splitlines()), docstring_lines(ast.parse(text)))
    return out


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    root = pathlib.Path(args[0] if args else "nbhelpers")
    table = stats(root)
    total = sum(n for n, _ in table.values())
    docs = sum(d for _, d in table.values())
    print(f"{root}: {total} lines, {docs} docstring lines ({100 * docs / max(total, 1):.1f} %), {len(table)} files")
    rows = sorted(table.items(), key=lambda kv: -kv[1][0])
    for name, (n, d) in rows if "--all" in argv else rows[:15]:
        print(f"{n:6d} {d:5d} {100 * d / max(n, 1):5.1f} %  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
