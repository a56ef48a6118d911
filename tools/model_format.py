"""What an exported model directory's files are: the manifest's format and exporter
versions, and the fp16 vision graph converted from the fp32 one.

Shared by export_onnx.py, which writes a directory, and fuse_graph.py, which redoes the
exporter's last steps (fusion, the fp16 conversion, the exporter version) on a directory
exported without them; neither imports the other for it.
"""

FORMAT_VERSION = 1
# 2: the vision graph's attention and GELU fused (tools/fuse_graph.py).
EXPORTER_VERSION = "2"


def convert_fp16(src, dst):
    """Writes `dst`, the fp16 graph of the fp32 graph at `src`, its inputs and outputs float32."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(src)
    # keep_io_types: callers feed and read float32 whichever variant they load.
    fp16 = convert_float_to_float16(model, keep_io_types=True)
    # The converter appends its input/output Cast nodes at the end of the node list;
    # ONNX requires topological order (onnxruntime tolerates it, the checker does not).
    topological_sort(fp16.graph)
    onnx.save(fp16, dst)
    onnx.checker.check_model(dst)


def topological_sort(graph) -> None:
    """Kahn's algorithm, taking the earliest original node first so the order stays stable."""
    import heapq

    nodes = list(graph.node)
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    producer = {out: idx for idx, node in enumerate(nodes) for out in node.output}
    deps = []
    for node in nodes:
        missing = [i for i in node.input if i not in available and i not in producer]
        if missing:
            raise SystemExit(f"fp16 graph: node {node.name} reads undefined {missing}")
        deps.append({producer[i] for i in node.input if i in producer})
    users = [[] for _ in nodes]
    for idx, d in enumerate(deps):
        for j in d:
            users[j].append(idx)
    indegree = [len(d) for d in deps]
    heap = [idx for idx, n in enumerate(indegree) if n == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        idx = heapq.heappop(heap)
        order.append(idx)
        for u in users[idx]:
            indegree[u] -= 1
            if indegree[u] == 0:
                heapq.heappush(heap, u)
    if len(order) != len(nodes):
        raise SystemExit("fp16 graph has a cycle")
    copies = [type(nodes[idx])() for idx in order]
    for copy, idx in zip(copies, order):
        copy.CopyFrom(nodes[idx])
    del graph.node[:]
    graph.node.extend(copies)
