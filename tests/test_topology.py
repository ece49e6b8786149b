"""Tests for efpsn.topology: graphs, builders, Metropolis weights, Laplacian spectrum."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efpsn.topology import (
    DisconnectedGraphError,
    Graph,
    build_graph,
    complete,
    describe,
    erdos_renyi,
    from_edge_file,
    grid,
    laplacian_spectrum,
    metropolis_weights,
    path,
    ring,
    star,
)


def test_graph_normalises_and_validates_edges() -> None:
    g = Graph(4, ((2, 1), (0, 3), (1, 0)))
    assert g.edges == ((0, 1), (0, 3), (1, 2))
    assert g.neighbours(0) == (1, 3) and g.neighbours(1) == (0, 2)
    assert g.degree(1) == 2 and g.max_degree == 2
    assert g == Graph(4, ((0, 1), (0, 3), (1, 2)), name="other name")  # name not compared
    with pytest.raises(ValueError, match="self-loop"):
        Graph(3, ((1, 1),))
    with pytest.raises(ValueError, match="listed twice"):
        Graph(3, ((0, 1), (1, 0)))
    with pytest.raises(ValueError, match="outside 0..2"):
        Graph(3, ((0, 3),))
    with pytest.raises(ValueError, match="positive integer"):
        Graph(0, ())
    with pytest.raises(ValueError, match="agent index"):
        g.neighbours(4)


def test_builders() -> None:
    assert ring(5).edges == ((0, 1), (0, 4), (1, 2), (2, 3), (3, 4))
    assert path(3).edges == ((0, 1), (1, 2))
    assert star(4).edges == ((0, 1), (0, 2), (0, 3))
    assert len(complete(5).edges) == 10
    g = grid(2, 3)  # 0 1 2 / 3 4 5
    assert g.edges == ((0, 1), (0, 3), (1, 2), (1, 4), (2, 5), (3, 4), (4, 5))
    assert all(b.is_connected() for b in (ring(5), path(1), star(2), complete(1), grid(3, 3)))
    with pytest.raises(ValueError, match="n >= 3"):
        ring(2)


def test_laplacian_and_adjacency() -> None:
    g = star(4)
    lap = g.laplacian()
    np.testing.assert_array_equal(np.diag(lap), [3, 1, 1, 1])
    np.testing.assert_array_equal(lap.sum(axis=1), 0)
    np.testing.assert_array_equal(lap, lap.T)
    np.testing.assert_array_equal(g.adjacency(), np.diag(np.diag(lap)) - lap)


def test_laplacian_spectrum_of_ring_closed_form() -> None:
    # Cycle C_n: eigenvalues 2 - 2 cos(2 pi k / n).
    mu2, mu_max = laplacian_spectrum(ring(5))
    assert mu2 == pytest.approx(2 - 2 * math.cos(2 * math.pi / 5), rel=1e-13)
    assert mu_max == pytest.approx(2 - 2 * math.cos(4 * math.pi / 5), rel=1e-13)
    assert laplacian_spectrum(complete(6)) == pytest.approx((6.0, 6.0))
    assert laplacian_spectrum(star(5)) == pytest.approx((1.0, 5.0))
    with pytest.raises(ValueError, match="n >= 2"):
        laplacian_spectrum(path(1))


def test_metropolis_weights_on_star() -> None:
    w = metropolis_weights(star(4))
    # hub degree 3, leaves degree 1: w_0j = 1/(1 + 3); leaves keep 3/4, the hub 1/4.
    expected = np.array(
        [
            [0.25, 0.25, 0.25, 0.25],
            [0.25, 0.75, 0.0, 0.0],
            [0.25, 0.0, 0.75, 0.0],
            [0.25, 0.0, 0.0, 0.75],
        ]
    )
    np.testing.assert_allclose(w, expected, rtol=0, atol=1e-15)


def test_disconnected_graph_raises_naming_components(tmp_path: Path) -> None:
    g = Graph(5, ((0, 1), (2, 3)))
    assert not g.is_connected()
    assert g.components() == [[0, 1], [2, 3], [4]]
    with pytest.raises(
        DisconnectedGraphError,
        match=r"3 components: \{agent1, agent2\}; "
        r"\{agent3, agent4\}; \{agent5\}",
    ):
        g.require_connected()
    edges = tmp_path / "two.txt"
    edges.write_text("1 2\n3 4\n")
    with pytest.raises(DisconnectedGraphError):
        build_graph(f"edges:{edges}", 4)
    assert issubclass(DisconnectedGraphError, ValueError)


def test_edge_file_parsing(tmp_path: Path) -> None:
    f = tmp_path / "topo.edges"
    f.write_text(
        "# a 5-agent ring, mixed notation\n"
        "1 2\n"
        "agent2 agent3   # trailing comment\n"
        "\n"
        "Agent3 4\n"
        "4,5\n"
        "5 1\n"
    )
    g = from_edge_file(f)
    assert g == ring(5)
    assert build_graph(f"edges:{f}", 5) == ring(5)
    with pytest.raises(ValueError, match="only 4 agents"):
        build_graph(f"edges:{f}", 4)
    with pytest.raises(DisconnectedGraphError, match="agent6"):
        build_graph(f"edges:{f}", 6)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1 2 3\n", "expected two agents"),
        ("1 x\n", "expected a 1-based agent number"),
        ("0 1\n", "expected a 1-based agent number"),
        ("2 2\n", "self-loop"),
        ("1 2\n2 1\n", "twice"),
        ("# nothing\n", "no edges"),
    ],
)
def test_edge_file_errors(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "bad.edges"
    f.write_text(text)
    with pytest.raises(ValueError, match=message):
        from_edge_file(f)


def test_edge_file_missing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read edge file"):
        from_edge_file(tmp_path / "nope.txt")


def test_build_graph_specs() -> None:
    assert build_graph("ring", 5) == ring(5)
    assert build_graph("path", 4) == path(4)
    assert build_graph("star", 4) == star(4)
    assert build_graph("complete", 4) == complete(4)
    assert build_graph("grid", 6) == grid(2, 3)
    assert build_graph("grid", 9) == grid(3, 3)
    assert build_graph("grid", 5) == grid(1, 5)
    assert build_graph("grid:3x2", 6) == grid(3, 2)
    g1 = build_graph("erdos-renyi", 8, seed=4)
    assert g1 == build_graph("erdos-renyi:0.5", 8, seed=4) and g1.is_connected()
    assert build_graph("erdos-renyi:1", 5) == complete(5)
    with pytest.raises(ValueError, match="2 x 2 = 4 agents, but n = 6"):
        build_graph("grid:2x2", 6)
    with pytest.raises(ValueError, match="unknown graph spec 'torus'"):
        build_graph("torus", 6)
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        build_graph("erdos-renyi:1.5", 6)


def test_erdos_renyi_seeded_and_bounded() -> None:
    assert erdos_renyi(10, 0.3, 1) == erdos_renyi(10, 0.3, 1)
    with pytest.raises(ValueError, match="no connected erdos-renyi graph"):
        erdos_renyi(30, 0.01, 0, max_tries=5)


def test_describe() -> None:
    text = describe(ring(5))
    assert text.startswith("ring: 5 agents, 5 edges, degree 2..2, connected, mu2=1.382")
    assert "3 components" in describe(Graph(5, ((0, 1), (2, 3))))


@st.composite
def random_graphs(draw: st.DrawFn) -> Graph:
    n = draw(st.integers(1, 12))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    return Graph(n, tuple(chosen))


@settings(max_examples=80, deadline=None)
@given(random_graphs())
def test_metropolis_symmetric_doubly_stochastic(graph: Graph) -> None:
    w = metropolis_weights(graph)
    np.testing.assert_allclose(w, w.T, rtol=0, atol=0)
    np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-14)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-14)
    adjacency = graph.adjacency() > 0
    off = ~np.eye(graph.n, dtype=bool)
    assert np.array_equal(w[off] > 0, adjacency[off])
    assert (np.diag(w) > 0).all()


@settings(max_examples=80, deadline=None)
@given(random_graphs())
def test_laplacian_properties(graph: Graph) -> None:
    lap = graph.laplacian()
    np.testing.assert_array_equal(lap.sum(axis=1), 0)
    np.testing.assert_array_equal(lap, lap.T)
    eig = np.linalg.eigvalsh(lap)
    assert eig.min() > -1e-9
    # multiplicity of 0 = number of components
    assert int(np.sum(eig < 1e-9)) == len(graph.components())
    assert graph.is_connected() == (len(graph.components()) == 1)
    for i in range(graph.n):
        assert list(graph.neighbours(i)) == sorted(graph.neighbours(i))
