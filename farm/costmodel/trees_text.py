"""LightGBM's text model checked before LightGBM reads it.

LightGBM's loader trusts its text: a ``tree_sizes`` that does not match the trees, or a tree whose arrays are
shorter than its ``num_leaves`` says, ends the process in C++ (``terminate``, SIGABRT) instead of raising. A
model file is data from disk (a cache, a run folder, a user's file), so its trees are checked here first, and a
malformed one is refused with the reason, never handed to LightGBM.
"""

from __future__ import annotations

import re

_TREE = re.compile(r"^Tree=(\d+)$", re.M)
_END = "end of trees"
_SPLIT_ARRAYS = ("split_feature", "threshold", "decision_type", "left_child", "right_child")
_CATEGORICAL = 1  # decision_type's bit of a categorical split


def booster_text_problem(text: str) -> str:
    """Why LightGBM must not read ``text`` ('' when its trees are consistent)."""
    if not isinstance(text, str) or not text.startswith("tree\n"):
        return "it is not LightGBM's text model (no 'tree' header)"
    head = _fields(text[:text.find("\nTree=") if "\nTree=" in text else len(text)])
    features = _int(head.get("max_feature_idx"))
    if features is None or features < 0:
        return "max_feature_idx is missing or not a count"
    starts = [m.start() for m in _TREE.finditer(text)]
    end = text.find(_END)
    if end < 0:
        return f"'{_END}' is missing (the text is cut short)"
    if any(s > end for s in starts):
        return f"a tree after '{_END}'"
    sizes = head.get("tree_sizes")
    if sizes is not None:
        declared = [_int(x) for x in sizes.split()]
        actual = [len(text[a:b].encode()) for a, b in zip(starts, [*starts[1:], end])]
        if declared != actual:
            return f"tree_sizes ({len(declared)} trees) does not match the trees ({len(actual)})"
    for n, (a, b) in enumerate(zip(starts, [*starts[1:], end])):
        why = _tree_problem(_fields(text[a:b]), features)
        if why:
            return f"tree {n}: {why}"
    return ""


def _tree_problem(tree: dict[str, str], max_feature: int) -> str:
    leaves = _int(tree.get("num_leaves"))
    if leaves is None or leaves < 1:
        return "num_leaves is missing or below 1"
    if len(_values(tree, "leaf_value")) != leaves:
        return f"leaf_value has not num_leaves ({leaves}) values"
    if leaves == 1:
        return ""
    arrays = {name: _values(tree, name) for name in _SPLIT_ARRAYS}
    short = [name for name, v in arrays.items() if len(v) != leaves - 1]
    if short:
        return f"{', '.join(short)} {'has' if len(short) == 1 else 'have'} not num_leaves - 1 ({leaves - 1}) values"
    ints = {name: [_int(x) for x in arrays[name]] for name in ("split_feature", "decision_type", "left_child",
                                                                "right_child")}
    if any(x is None for v in ints.values() for x in v):
        return "a split's feature, type or child is not an integer"
    if any(not 0 <= f <= max_feature for f in ints["split_feature"]):
        return "a split reads a feature past max_feature_idx"
    if any(not -leaves <= c <= leaves - 2 for c in ints["left_child"] + ints["right_child"]):
        return "a child index is out of the tree"
    cats = _int(tree.get("num_cat", "0"))
    if cats is None or cats < 0:
        return "num_cat is not a count"
    categorical = [i for i, d in enumerate(ints["decision_type"]) if d & _CATEGORICAL]
    if not cats:
        return "a categorical split with no categories (num_cat=0)" if categorical else ""
    bounds = [_int(x) for x in _values(tree, "cat_boundaries")]
    if len(bounds) != cats + 1 or None in bounds or bounds[0] != 0 or \
            any(b < a for a, b in zip(bounds, bounds[1:])):  # type: ignore[operator]
        return "cat_boundaries do not bound num_cat categories"
    if len(_values(tree, "cat_threshold")) != bounds[-1]:
        return "cat_threshold has not as many values as cat_boundaries says"
    for i in categorical:
        index = _float(arrays["threshold"][i])
        if index is None or not 0 <= index < cats:
            return "a categorical split names a category set past num_cat"
    return ""


def _fields(block: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in block.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _values(tree: dict[str, str], name: str) -> list[str]:
    return tree.get(name, "").split()


def _int(x: object) -> int | None:
    try:
        return int(str(x))
    except ValueError:
        return None


def _float(x: str) -> float | None:
    try:
        return float(x)
    except ValueError:
        return None
