"""Find Python ops (PyFunc, PyFuncStateless, EagerPyFunc) in a tf.data input graph.

Walks the dataset's serialized graph and every function in its library, so a Python op inside a
map, a conditional branch, a from_generator or a dataset built inside an interleave is found and
named by the transformation it sits in ("map #2"). Used by the loader's tests and by diagnose.
"""
import collections

import tensorflow as tf

# --------------------------------------------------------------------------
PYFUNC_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")
_KINDS = (("FlatMap", "flat_map"), ("Interleave", "interleave"), ("MapAndBatch", "map_and_batch"),
          ("Map", "map"), ("Filter", "filter"), ("GroupBy", "group_by_window"), ("Scan", "scan"),
          ("Generator", "from_generator"), ("TakeWhile", "take_while"))


def _kind(op):
    return next((name for key, name in _KINDS if key in op), op)


def _func_refs(node):
    """Every function a node names (`f`, `key_func`, `then_branch`, lists of functions ...), in the order
    of their attributes' names, a generator's `next_func` first: protobuf's map order follows Python's
    string hash, so a from_generator's line named its next, init or finalize function by the process."""
    for key in sorted(node.attr, key=lambda k: (k != "next_func", k)):
        value = node.attr[key]
        if value.HasField("func"):
            yield value.func.name
        elif value.HasField("list"):
            yield from (f.name for f in value.list.func)


def _serialized(dataset):
    """The dataset's graph, as bytes. A distributed loader's is the dataset it wraps. A device copy
    (prefetch_to_device: the `split` placement's last transformation) is a generator over remote
    calls, which tf.data cannot serialize, and it runs no Python: the graph is then the one the copy
    reads."""
    dataset = getattr(dataset, "_original_dataset", dataset)  # a tf.distribute DistributedDataset
    if not hasattr(dataset, "_as_serialized_graph") and getattr(dataset, "_datasets", None):
        # distribute_datasets_from_function (the `multiworker` placement's loader): the dataset its
        # function made for this process's first input worker
        dataset = dataset._datasets[0]
    try:
        return dataset._as_serialized_graph().numpy()
    except tf.errors.FailedPreconditionError:
        inner = dataset
        while inner is not None and type(inner).__name__ != "_CopyToDeviceDataset":
            inner = getattr(inner, "_input_dataset", None)
        if inner is None:
            raise
        return _serialized(inner._input_dataset)


def scan_pyfunc_ops(dataset):
    """Python ops in a dataset's graph as dicts: transformation ('map #2'), op, dataset_op, function.

    Transformations are numbered per kind from the source onwards; a nested function (a branch, a
    PartitionedCall) counts for the transformation that calls it.
    """
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(_serialized(dataset))
    funcs = {f.signature.name: f for f in graph.library.function}
    nodes = {n.name: n for n in graph.node}

    order, seen = [], set()
    for start in nodes:  # post-order over inputs: upstream transformations come first
        stack = [(start, False)]
        while stack:
            n, done = stack.pop()
            if done:
                order.append(n)
            elif n in nodes and n not in seen:
                seen.add(n)
                stack.append((n, True))
                stack.extend((i.lstrip("^").split(":")[0], False) for i in reversed(nodes[n].input))

    found, counts = [], collections.Counter()
    for name in order:
        node = nodes[name]
        if node.op in PYFUNC_OPS:
            found.append({"transformation": "top-level graph", "op": node.op, "dataset_op": None, "function": None})
        refs = list(_func_refs(node))
        if not refs:
            continue
        kind = _kind(node.op)
        counts[kind] += 1
        # (function, where, dataset op): a dataset built inside a function (from_generator is a
        # GeneratorDataset inside a flat_map) is named inside its caller: 'from_generator in flat_map #1'
        todo, reached = [(f, f"{kind} #{counts[kind]}", node.op) for f in refs], set()
        while todo:
            f, where, ds_op = todo.pop(0)
            if f not in funcs or f in reached:
                continue
            reached.add(f)
            for inner in funcs[f].node_def:
                inner_where, inner_op = where, ds_op
                if "Dataset" in inner.op:
                    inner_where, inner_op = f"{_kind(inner.op)} in {where}", inner.op
                todo.extend((g, inner_where, inner_op) for g in _func_refs(inner))
                entry = {"transformation": where, "op": inner.op, "dataset_op": ds_op, "function": f}
                # one line per place and op: a generator's init/next/finalize functions are one Python source
                if inner.op in PYFUNC_OPS and not any(
                        (e["transformation"], e["op"]) == (where, inner.op) for e in found):
                    found.append(entry)
    return found


def pyfunc_line(e):
    where = f" ({e['dataset_op']}, function {e['function']})" if e["function"] else ""
    return f"{e['transformation']}: {e['op']}{where}"


def find_pyfunc_ops(dataset):
    """Python ops (PyFunc, PyFuncStateless, EagerPyFunc) in a dataset's graph, [] when clean.

    E.g. ['map #2: PyFunc (ParallelMapDatasetV2, function __inference_Dataset_map_load_17)'].
    """
    return [pyfunc_line(e) for e in scan_pyfunc_ops(dataset)]
