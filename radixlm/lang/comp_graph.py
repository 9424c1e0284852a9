"""The graph of a compiled program (``compiler.py``): one node per traced expression, in its
stream, and the order that queues every node after the nodes it waits for."""

from __future__ import annotations

import heapq

from radixlm.lang.ir import SglExpr, SglFork, SglJoin, SglVariable
from radixlm.lang.tracer import TracerProgramState


class CompileError(TypeError):
    """The program cannot be compiled: its code depends on values that exist only when it runs.
    A TypeError, like the one SGLang raises when a traced argument is used as a value."""


class CompGraphNode:
    """One expression of the graph, in stream ``stream`` after ``prev_node``. It also waits for
    ``source_nodes``: the producer of a variable it reads, the fork that starts its branch, or
    the last expressions of the branches it joins."""

    def __init__(self, expr: SglExpr, stream: int, index: int) -> None:
        self.expr = expr
        self.stream = stream
        self.index = index
        self.prev_node: CompGraphNode | None = None
        self.source_nodes: list[CompGraphNode] = []
        self.next_nodes: list[CompGraphNode] = []

    @property
    def source_node(self) -> CompGraphNode | None:
        return self.source_nodes[0] if self.source_nodes else None

    def add_next_node(self, other: CompGraphNode) -> None:
        self.next_nodes.append(other)

    def __repr__(self) -> str:
        text = f"stream {self.stream:2d}: %{self.expr.node_id} = "
        if self.prev_node is not None:
            text += f"%{self.prev_node.expr.node_id} + "
        text += repr(self.expr)
        if isinstance(self.expr, (SglVariable, SglJoin)) and self.source_nodes:
            text += "  <- " + ", ".join(f"%{n.expr.node_id}" for n in self.source_nodes)
        return text


def collect_streams(tracer: TracerProgramState) -> list[TracerProgramState]:
    """The traced states: the program's first, then its forks and called programs, breadth
    first."""
    streams, seen = [tracer], {id(tracer)}
    for state in streams:
        for child in state.child_states:
            if id(child) not in seen:
                seen.add(id(child))
                streams.append(child)
    return streams


def topological_order(streams: list[list[CompGraphNode]]) -> list[CompGraphNode]:
    """Every node after its dependencies. Forks and joins wait on the calling thread, so they
    come as late as possible, once everything that does not depend on them is queued."""
    waiting, ready = {}, []
    for nodes in streams:
        for node in nodes:
            deps = [node.prev_node] if node.prev_node is not None else []
            deps += node.source_nodes
            for dep in deps:
                dep.add_next_node(node)
            waiting[id(node)] = len(deps)
            if not deps:
                heapq.heappush(ready, (blocks(node), node.stream, node.index, node))
    order = []
    while ready:
        node = heapq.heappop(ready)[-1]
        order.append(node)
        for after in node.next_nodes:
            waiting[id(after)] -= 1
            if waiting[id(after)] == 0:
                heapq.heappush(ready, (blocks(after), after.stream, after.index, after))
    if len(order) != len(waiting):
        raise CompileError("the program's streams wait for each other in a cycle")
    return order


def blocks(node: CompGraphNode) -> bool:
    return isinstance(node.expr, (SglFork, SglJoin))
