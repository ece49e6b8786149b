"""Topology pinned down: each refusal by its exact message, the smallest graphs (1 and 2
agents) of every builder, both ends of every range, and the spectrum of the 2-agent graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from efpsn import topology
from efpsn.topology import (
    DisconnectedGraphError,
    Graph,
    build_graph,
    describe,
    from_edge_file,
    grid,
    laplacian_spectrum,
    path,
    ring,
    star,
)


def refusal(error: type[Exception], call: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(error) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return str(info.value)


@pytest.mark.parametrize("edge", [(3, 0), (0, 3), (-1, 0), (0, -1)])
def test_either_end_of_an_edge_must_name_an_agent(edge: tuple[int, int]) -> None:
    assert refusal(ValueError, Graph, 3, (edge,)) == f"edge {edge} names an agent outside 0..2"


def test_graph_refusals_by_message() -> None:
    assert refusal(ValueError, Graph, 3, ((0, 1, 2),)) == (
        "an edge is a pair of agents, got (0, 1, 2)")
    assert refusal(ValueError, Graph, 3, ((2, 2),)) == (
        "self-loop at agent 2 (agent3): edges join two agents")
    assert refusal(ValueError, Graph, 3, ((1, 2), (2, 1))) == (
        "edge (1, 2) (agent2-agent3) is listed twice")
    for n in (0, -1, True, 2.0):
        assert refusal(ValueError, Graph, n, ()) == (
            f"n (number of agents) must be a positive integer, got {n!r}")
    assert Graph(np.int64(2), ((0, 1),)).n == 2
    assert refusal(ValueError, path(3).neighbours, 3) == "agent index must be in 0..2, got 3"
    assert refusal(ValueError, path(3).degree, -1) == "agent index must be in 0..2, got -1"


def test_the_two_agent_graph_and_its_spectrum() -> None:
    pair = path(2)
    assert pair == star(2) == topology.complete(2) == build_graph("path", 2)
    assert pair == Graph(2, ((1, 0),))
    # L = [[1, -1], [-1, 1]]: eigenvalues 0 and 2, so mu2 = mu_max = 2
    assert laplacian_spectrum(pair) == (2.0, 2.0)
    assert topology.metropolis_weights(pair).tolist() == [[0.5, 0.5], [0.5, 0.5]]
    assert describe(pair) == "path: 2 agents, 1 edges, degree 1..1, connected, mu2=2, mu_max=2"
    assert refusal(ValueError, laplacian_spectrum, path(1)) == (
        "the Laplacian spectrum (mu_2, mu_max) needs n >= 2 agents, got 1")
    assert describe(path(1)) == "path: 1 agents, 0 edges, degree 0..0, connected"


def test_the_smallest_graph_of_each_builder() -> None:
    assert ring(3).edges == ((0, 1), (0, 2), (1, 2))
    assert refusal(ValueError, ring, 2) == "a ring graph needs an integer n >= 3 agents, got 2"
    assert refusal(ValueError, star, 1) == "a star graph needs an integer n >= 2 agents, got 1"
    assert refusal(ValueError, path, 0) == "a path graph needs an integer n >= 1 agents, got 0"
    assert refusal(ValueError, topology.complete, True) == (
        "a complete graph needs an integer n >= 1 agents, got True")
    one = Graph(1, ())
    assert grid(1, 1) == build_graph("grid", 1) == build_graph("grid:1x1", 1) == one
    assert topology.erdos_renyi(1, 0.5, 0) == build_graph("erdos-renyi", 1) == one
    assert grid(1, 1).name == "grid 1x1" and topology.erdos_renyi(1, 0.5, 3).name == (
        "erdos-renyi p=0.5 seed=3")
    for label, rows, cols in (("rows", 0, 2), ("cols", 2, 0), ("rows", True, 2)):
        assert refusal(ValueError, grid, rows, cols) == (
            f"grid {label} must be a positive integer, got {rows if label == 'rows' else cols!r}")
    assert refusal(ValueError, build_graph, "grid", 0) == (
        "a grid graph needs an integer n >= 1 agents, got 0")
    assert refusal(ValueError, topology.erdos_renyi, 0, 0.5, 0) == (
        "a erdos-renyi graph needs an integer n >= 1 agents, got 0")


def test_grids_are_as_square_as_n_allows() -> None:
    assert build_graph("grid", 7) == grid(1, 7)  # prime: one row
    assert build_graph("grid", 12) == grid(3, 4)  # rows <= cols
    assert build_graph("grid", 16) == grid(4, 4)
    assert build_graph("grid:2X3", 6) == build_graph("grid: 2x3 ", 6) == grid(2, 3)
    assert grid(3, 1).edges == ((0, 1), (1, 2))
    assert refusal(ValueError, build_graph, "grid:2x", 2) == (
        "graph spec 'grid:2x': expected 'grid:RxC' like 'grid:2x3'")


def test_erdos_renyi_probability_range_and_draw_budget() -> None:
    assert topology.erdos_renyi(4, 1.0, 0) == topology.complete(4)
    for prob in (0.0, 1.5, -0.5):
        assert refusal(ValueError, topology.erdos_renyi, 4, prob, 0) == (
            f"erdos-renyi edge probability must be in (0, 1], got {prob!r}")
    assert refusal(ValueError, build_graph, "erdos-renyi:0.001", 20) == (
        "no connected erdos-renyi graph with n = 20, p = 0.001 in 1000 draws (seed 0); raise p")
    assert refusal(ValueError, topology.erdos_renyi, 6, 0.2, 1, max_tries=1) == (
        "no connected erdos-renyi graph with n = 6, p = 0.2 in 1 draws (seed 1); raise p")
    # the seeded generator is drawn from once per try: the accepted graph is the same whatever
    # the budget, once the budget reaches it
    assert topology.erdos_renyi(6, 0.4, 2, max_tries=1000) == topology.erdos_renyi(6, 0.4, 2)
    assert build_graph("ER:0.4", 6, seed=2) == topology.erdos_renyi(6, 0.4, 2)
    assert build_graph(" Erdos_Renyi ", 6, seed=2) == topology.erdos_renyi(6, 0.5, 2)
    assert refusal(ValueError, build_graph, "erdos-renyi:half", 4) == (
        "graph spec 'erdos-renyi:half': expected 'erdos-renyi:P' with a number P")


def test_build_graph_refusals_name_the_spec() -> None:
    assert refusal(ValueError, build_graph, "torus", 3) == (
        "unknown graph spec 'torus': expected one of ring, path, star, complete, grid, "
        "grid:RxC, erdos-renyi, erdos-renyi:P, edges:FILE")
    assert refusal(ValueError, build_graph, "ring:3", 3) == (
        "graph spec 'ring:3': 'ring' takes no argument")
    assert refusal(ValueError, build_graph, "edges:", 3) == (
        "graph spec 'edges:': expected 'edges:FILE'")
    assert refusal(ValueError, build_graph, "grid:2x2", 6) == (
        "graph spec 'grid:2x2': 2 x 2 = 4 agents, but n = 6")
    assert build_graph(" RING ", 4) == ring(4)
    assert refusal(DisconnectedGraphError, Graph(4, ((0, 1), (2, 3)), name="x")
                   .require_connected) == (
        "the graph 'x' on 4 agents is not connected: 2 components: {agent1, agent2}; "
        "{agent3, agent4}")
    assert refusal(DisconnectedGraphError, Graph(3, ((1, 2),)).require_connected) == (
        "the graph on 3 agents is not connected: 2 components: {agent1}; {agent2, agent3}")


def test_edge_files_by_message(tmp_path: Path) -> None:
    file = tmp_path / "g.txt"
    file.write_text("# a 4-path\nagent1, agent2\n2 3 # the middle # edge\nAGENT4 3\n\n")
    assert from_edge_file(file) == path(4)
    assert from_edge_file(file, n=5).n == 5
    assert build_graph(f"edges:{file}", 4).name == "edges from g.txt"
    assert refusal(ValueError, from_edge_file, file, n=3) == (
        f"edge file {str(file)!r} names agent4 but there are only 3 agents")
    cases = {
        "1 2 3\n": f"{file}:1: expected two agents like '1 2' or 'agent1 agent2', got '1 2 3'",
        "1 x\n": f"{file}:1: expected a 1-based agent number or name like 'agent3', got 'x'",
        "\n0 1\n": f"{file}:2: expected a 1-based agent number or name like 'agent3', got '0'",
        "2 agent2\n": f"{file}:1: self-loop '2 agent2'",
        "1 2\n2 1\n": f"edge file {str(file)!r} lists agent1-agent2 twice",
        "# nothing\n": f"edge file {str(file)!r} lists no edges",
    }
    for text, message in cases.items():
        file.write_text(text)
        assert refusal(ValueError, from_edge_file, file) == message


def test_weights_degrees_and_the_laplacian_of_an_uneven_graph() -> None:
    g = Graph(4, ((0, 1), (1, 2), (1, 3)))  # a star centred on agent 1
    assert g.degrees == (1, 3, 1, 1) and g.max_degree == 3
    w = topology.metropolis_weights(g)
    assert w[0, 1] == w[1, 0] == 0.25 and w[0, 0] == 0.75 and w[1, 1] == 0.25
    assert g.laplacian().tolist() == [[1, -1, 0, 0], [-1, 3, -1, -1], [0, -1, 1, 0],
                                      [0, -1, 0, 1]]
    assert Graph(5, ((3, 4), (0, 2))).components() == [[0, 2], [1], [3, 4]]
    unnamed = Graph(3, ())
    assert unnamed.name == "" and unnamed == Graph(3, (), name="named")  # names never compared
    assert describe(unnamed) == "graph: 3 agents, 0 edges, degree 0..0, 3 components"
