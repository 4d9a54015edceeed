"""The order pytest-xdist hands out work units (the Makefile runs --dist loadgroup --no-loadscope-reorder).

A worker takes the next unit in collection order when it is free, so a long unit collected last runs alone at the
end while the other workers idle. The units measured longest on a 2-core machine go first, in the order given, then
the tests marked `slow`, then the rest in collection order. Only the order changes: which tests share a worker (the
groups) does not.
"""


def unit_of(item):
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker else item.nodeid


def own_items(items, suite):
    """The items of this suite (tests/<suite>/): a conftest's hook sees every collected item."""
    return [item for item in items if item.nodeid.startswith("tests/%s/" % suite)]


def longest_first(items, longest):
    """Sort items in place: units named (or prefixed) in `longest` first, in that order; then `slow` ones. Only when
    the run is one suite (the Makefile's way): a run of several keeps its collection order."""
    if len({item.nodeid.split("/", 2)[1] for item in items if item.nodeid.startswith("tests/")}) > 1:
        return
    def rank(item):
        unit = unit_of(item)
        for i, name in enumerate(longest):
            if unit == name or unit.startswith(name + "::"):
                return (0, i)
        return (1, 0) if item.get_closest_marker("slow") else (2, 0)
    items.sort(key=rank)  # stable: collection order within a rank
